# Benchmark workload: four CPU-bound threads (few scheduler transitions: timeslices only).
# Protocol: see cpu_sleep.rb. Prints the workload's own wall time on stderr as "elapsed_s=<seconds>".
$stdout.write("ready\n"); $stdout.flush
$stdin.gets
t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
threads = 4.times.map do
  Thread.new do
    x = 0
    2_000_000.times { |i| x += i & 7 }
    x
  end
end
threads.each(&:join)
$stderr.write(format("elapsed_s=%.6f\n", Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0))
$stdout.write("done\n"); $stdout.flush
