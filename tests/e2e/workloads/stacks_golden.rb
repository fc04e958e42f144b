# Workload: three threads blocked at known points (Kernel#sleep, Thread::Mutex#lock, IO#read) and one spinning in Ruby
# code while the main thread captures CRuby's own frames for every thread with tests/golden's RvGolden.capture
# (rb_profile_thread_frames + rb_profile_frame_full_label/path, written to $RVGOLDEN_OUT). test_stacks.py compares
# each blocked thread's golden frames with the stack rvbpfd took at the gvl_released where that thread blocked, and
# the spinner's with its last release inside Blocker.spin (a timeslice: the main thread took the GVL from it for the
# capture and sets the stop flag before giving it back, so the spinner leaves the loop at its next run).
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

  def self.spin(q, stop)
    q << :spinning
    x = 0
    x += 1 until stop[0]
    x
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
stop = [false]
spinner = Thread.new { Blocker.spin(q, stop) }
spinner.name = "spinner"
q.pop
sleep 0.3 # each thread has gone from "announced" to blocked (or spinning)
RvGolden.capture(ENV.fetch("RVGOLDEN_OUT"), false)
stop[0] = true
m.unlock
w.write("abcd")
sleeper.wakeup
[sleeper, taker, reader, spinner].each(&:join)
$stdout.write("done\n"); $stdout.flush
