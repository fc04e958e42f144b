# Workload: three threads that each block in a known way, for the release-reason test (test_stacks.py).
#   sleeper_body: Kernel#sleep            -> reason "sleep"
#   mutex_body:   Thread::Mutex#lock on a mutex the main thread holds -> reason "mutex"
#   pipe_body:    IO#read on an empty pipe -> reason "io"
# Protocol: see cpu_sleep.rb.
def sleeper_body
  3.times { sleep 0.05 }
end

def mutex_body(m)
  m.lock
  m.unlock
end

def pipe_body(r)
  r.read(4)
end

$stdout.write("ready\n"); $stdout.flush
$stdin.gets
m = Thread::Mutex.new
r, w = IO.pipe
m.lock
threads = [
  Thread.new { sleeper_body },
  Thread.new { mutex_body(m) },
  Thread.new { pipe_body(r) },
]
sleep 0.3 # every thread is blocked by now
m.unlock
w.write("ping")
threads.each(&:join)
$stdout.write("done\n"); $stdout.flush
