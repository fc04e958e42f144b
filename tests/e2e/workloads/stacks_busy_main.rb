# Workload: the main thread is already busy in Ruby code when rvbpfd attaches and stays busy without ever releasing
# the GVL (one thread, no IO, no allocation: integer loops and the vDSO clock), so no scheduler event names it while
# it is being sampled. A sample can find its thread only through the thread's own ruby_current_ec (TLS) there; the
# old route (the thread the last scheduler event on that native thread named) has nothing yet. test_stacks.py.
#   <main> -> Spin.run -> Spin.hot (the while loop: almost every sample lands in it)
# Protocol (differs from the other workloads on purpose): print "ready", spin for BUSY_MAIN_SECONDS (default 8),
# only then read the harness's line from stdin, print "done", exit.
class Spin
  def self.hot(n)
    i = 0
    s = 0
    while i < n
      s += i
      i += 1
    end
    s
  end

  def self.run(deadline)
    hot(200_000) while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
  end
end

seconds = Float(ENV.fetch("BUSY_MAIN_SECONDS", "8"))
$stdout.write("ready\n"); $stdout.flush
Spin.run(Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds)
$stdin.gets
$stdout.write("done\n"); $stdout.flush
