# Workload: two named threads, each renamed after it has run for a while (rvbpfd's thread names and namespace tids,
# tests/e2e/test_thread_names.py). Protocol: see cpu_sleep.rb. For every name it gives, prints
# "thread NAME NATIVE_THREAD_ID" on stderr (the tid as the process sees it: its pid namespace's).
def spin(seconds)
  deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
  x = 0
  while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
    2000.times { x += 1 }
    sleep 0.005
  end
  x
end

def announce
  $stderr.write("thread #{Thread.current.name} #{Thread.current.native_thread_id}\n")
  $stderr.flush
end

$stdout.write("ready\n"); $stdout.flush
$stdin.gets
workers = 2.times.map do |i|
  Thread.new do
    Thread.current.name = "worker-#{i + 1}"
    announce
    spin(1.5)
    Thread.current.name = "renamed-#{i + 1}"
    announce
    spin(1.5)
  end
end
workers.each(&:join)
$stdout.write("done\n"); $stdout.flush
