# Workload: GVL blame from the contention itself (test_holder_blame.py). One thread does long stretches of pure-Ruby
# CPU work in one method and gives the GVL up in another; three threads contend for the lock meanwhile.
#   - the cruncher: Ledger.crunch does integer additions (no method frames) for CRUNCH_MS (default 15) ms of wall
#     time, then Pause.rest sleeps 2 ms, where the cruncher releases the GVL: after its work. Repeated for
#     HOLDER_SECONDS (default 1.5) of wall time. Its holds are far shorter than the VM's 100 ms timeslice (wall time,
#     so a loaded machine does not stretch them), so it is hardly ever preempted inside Ledger.crunch: its holds end
#     in Pause.rest.
#   - three contenders: each sleeps 1 ms, then writes one byte to its own pipe and reads it back, until the cruncher
#     is done. Every sleep and round trip gives the GVL up and waits for it again, mostly while the cruncher is in
#     Ledger.crunch; the sleeps make them come back (a READY) during the cruncher's holds, not only queue behind it.
# So the holder's work during nearly all waits is Ledger.crunch, and the stack of the release that ends each hold is
# Pause.rest's (Kernel#sleep). Protocol: see cpu_sleep.rb.
class Ledger
  # Integer additions for `seconds` of wall time, the clock read once per 10,000 of them (a READY rarely finds the
  # cruncher inside that read).
  def self.crunch(seconds)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
    s = 0
    loop do
      i = 0
      while i < 10_000
        s += i
        i += 1
      end
      break if Process.clock_gettime(Process::CLOCK_MONOTONIC) >= deadline
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
crunch = Float(ENV.fetch("CRUNCH_MS", "15")) / 1000
done = false
contenders = 3.times.map do
  Thread.new do
    r, w = IO.pipe
    trips = 0
    until done
      sleep 0.001
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
    Ledger.crunch(crunch)
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
