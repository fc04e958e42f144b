# Workload: one thread hogs the GVL in a CPU-bound method while four threads do small pipe round trips, for the GVL
# blame test (test_blame.py).
#   - the hog: HogKlass.spin runs for HOG_SECONDS (default 1) of wall time; its loop is integer additions only (no
#     method frames), and it reads the clock once per ~100k iterations, so nearly every on-CPU sample has
#     HogKlass.spin as its leaf frame. It gives the GVL up only when the VM's timeslice preempts it.
#   - four IO threads: each writes one byte to its own pipe and reads it back, until the hog is done. Every write and
#     read releases the GVL, so each round trip ends with a wait for the lock the hog holds.
#   - HOG_LOCK_EVERY=N (default 0: never): the hog also locks and unlocks a mutex of its own every N iterations. The
#     lock is never contended, so the GVL stays with the hog, but every Mutex#lock is a probe hit: the run traps
#     enough for --max-overhead to pause the scheduler probes (test_budget.py).
# Protocol: see cpu_sleep.rb.
class HogKlass
  def self.spin(seconds, lock_every = 0)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
    lock_every = 100_001 if lock_every <= 0
    m = Mutex.new
    s = 0
    loop do
      i = 0
      while i < 100_000
        s += i
        i += 1
        if i % lock_every == 0
          m.lock
          m.unlock
        end
      end
      break if Process.clock_gettime(Process::CLOCK_MONOTONIC) >= deadline
    end
    s
  end
end

$stdout.write("ready\n"); $stdout.flush
$stdin.gets
seconds = Float(ENV.fetch("HOG_SECONDS", "1"))
done = false
io_threads = 4.times.map do
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
lock_every = Integer(ENV.fetch("HOG_LOCK_EVERY", "0"))
hog = Thread.new { HogKlass.spin(seconds, lock_every) }
hog.join
done = true
trips = io_threads.map(&:value)
raise "gvl_hog: an IO thread made no round trip (#{trips.inspect})" if trips.any?(&:zero?)
$stdout.write("done\n"); $stdout.flush
