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
4.times.map { Thread.new { work(2_500_000) } }.each(&:join)
puts "elapsed=#{Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0}"
