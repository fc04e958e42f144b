# Workload: three threads blocked at known points (Kernel#sleep, Thread::Mutex#lock, IO#read) while the main thread
# captures CRuby's own frames for every thread with tests/golden's RvGolden.capture (rb_profile_thread_frames +
# rb_profile_frame_full_label/path, written to $RVGOLDEN_OUT). test_stacks.py compares each blocked thread's golden
# frames with the stack rvbpfd took at the gvl_released where that thread blocked.
# Needs RVGOLDEN_DIR (the built extension) and RVGOLDEN_OUT. Protocol: see cpu_sleep.rb.
$LOAD_PATH.unshift(ENV.fetch("RVGOLDEN_DIR"))
require "rvgolden"

class Blocker
  def self.nap(q)
    [1].each do
      q << :napping
      sleep
    end
  end

  def self.take(m, q)
    q << :locking
    m.synchronize { :got }
  end

  def self.pull(r, q)
    q << :reading
    2.times.map { r.read(2) }
  end
end

$stdout.write("ready\n"); $stdout.flush
$stdin.gets
m = Thread::Mutex.new
r, w = IO.pipe
q = Thread::Queue.new
m.lock
sleeper = Thread.new { Blocker.nap(q) }
taker = Thread.new { Blocker.take(m, q) }
reader = Thread.new { Blocker.pull(r, q) }
3.times { q.pop }
sleep 0.3 # each thread has gone from "announced" to blocked
RvGolden.capture(ENV.fetch("RVGOLDEN_OUT"), false)
m.unlock
w.write("abcd")
sleeper.wakeup
[sleeper, taker, reader].each(&:join)
$stdout.write("done\n"); $stdout.flush
