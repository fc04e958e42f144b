# Benchmark workload: IO-heavy; two threads pass 20,000 bytes one at a time through a pipe (each byte is a blocking
# read and a GVL release/reacquire on both sides).
# Protocol: see cpu_sleep.rb. Prints the workload's own wall time on stderr as "elapsed_s=<seconds>".
$stdout.write("ready\n"); $stdout.flush
$stdin.gets
t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
r, w = IO.pipe
n = 20_000
writer = Thread.new do
  n.times { w.write("z") }
  w.close
end
reader = Thread.new do
  got = 0
  got += 1 while r.read(1)
  got
end
writer.join
raise "bench_io: got #{reader.value}" unless reader.value == n
$stderr.write(format("elapsed_s=%.6f\n", Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0))
$stdout.write("done\n"); $stdout.flush
