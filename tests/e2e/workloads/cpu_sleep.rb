# Workload: two CPU-bound threads with a sleep in the middle of each.
# Protocol (all e2e workloads): print "ready", block on one line of stdin (the attach moment is quiescent: only the
# main thread exists and it is blocked), run, join every thread, print "done", exit.
def burn(seconds)
  deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
  x = 0
  x += 1 while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
  x
end

$stdout.write("ready\n"); $stdout.flush
$stdin.gets
threads = 2.times.map do
  Thread.new do
    burn(0.15)
    sleep 0.1
    burn(0.15)
  end
end
threads.each(&:join)
$stdout.write("done\n"); $stdout.flush
