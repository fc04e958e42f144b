# Four CPU-bound threads (few GVL transitions: one per 100 ms timeslice). Protocol for benchmarks/overhead.py:
# print "ready", wait for a line on stdin (the tracer attaches meanwhile), run, print the elapsed seconds.
def work(n)
  x = 0
  n.times { |i| x += i * i % 7 }
  x
end
$stdout.puts "ready"
$stdout.flush
$stdin.gets
t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
c0 = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
# ~3 s on a quiet 2-core VM: long enough that a 1-3% cost is not lost in run-to-run noise.
4.times.map { Thread.new { work(15_000_000) } }.each(&:join)
# cpu: CPU time of the whole process (all threads, user + system): traps and BPF programs run in the target's
# context and count here, while time lost waiting for a CPU on a loaded machine does not.
puts "elapsed=#{Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0} " \
     "cpu=#{Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) - c0}"
