# Workload: GVL blame from the contention itself (test_holder_blame.py). One thread does long stretches of pure-Ruby
# CPU work in one method and gives the GVL up in another; three threads contend for the lock meanwhile.
#   - the cruncher: Ledger.crunch runs CRUNCH_ITERATIONS (default 1,000,000: ~10-20 ms) integer additions (no method
#     frames, no clock read inside), then Pause.rest sleeps 2 ms, where the cruncher releases the GVL: after its work.
#     Repeated for HOLDER_SECONDS (default 1.5) of wall time. Its holds are far shorter than the VM's 100 ms
#     timeslice, so it is never preempted inside Ledger.crunch: every hold ends in Pause.rest.
#   - three contenders: each writes one byte to its own pipe and reads it back until the cruncher is done. Every round
#     trip gives the GVL up and waits for it again, mostly while the cruncher is in Ledger.crunch.
# So the holder's work during nearly all waits is Ledger.crunch, and the stack of the release that ends each hold is
# Pause.rest's (Kernel#sleep). Protocol: see cpu_sleep.rb.
class Ledger
  def self.crunch(iterations)
    s = 0
    i = 0
    while i < iterations
      s += i
      i += 1
    end
    s
  end
end

class Pause
  def self.rest
    sleep 0.002
  end
end

$stdout.write("ready\n"); $stdout.flush
$stdin.gets
seconds = Float(ENV.fetch("HOLDER_SECONDS", "1.5"))
iterations = Integer(ENV.fetch("CRUNCH_ITERATIONS", "1000000"))
done = false
contenders = 3.times.map do
  Thread.new do
    r, w = IO.pipe
    trips = 0
    until done
      w.write("x")
      r.readpartial(1)
      trips += 1
    end
    r.close
    w.close
    trips
  end
end
cruncher = Thread.new do
  deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
  rounds = 0
  while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
    Ledger.crunch(iterations)
    Pause.rest
    rounds += 1
  end
  rounds
end
rounds = cruncher.value
done = true
trips = contenders.map(&:value)
raise "holder_work: a contender made no round trip (#{trips.inspect})" if trips.any?(&:zero?)
raise "holder_work: the cruncher made no round (#{rounds})" if rounds.zero?
$stdout.write("done\n"); $stdout.flush
