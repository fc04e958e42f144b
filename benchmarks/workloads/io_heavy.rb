# Transition-heavy: two threads pass 400,000 bytes one at a time through a pipe (each read and write releases and
# reacquires the GVL). Same protocol as cpu4.rb. IO_HEAVY_N overrides the byte count (quick runs while developing;
# benchmarks/overhead.py uses the default).
$stdout.puts "ready"
$stdout.flush
$stdin.gets
t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
c0 = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
r, w = IO.pipe
n = Integer(ENV.fetch("IO_HEAVY_N", "400000"))
writer = Thread.new { n.times { w.write("x") }; w.close }
reader = Thread.new { got = 0; got += 1 while r.read(1); got }
writer.join
reader.join
# cpu: CPU time of the whole process (all threads, user + system): traps and BPF programs run in the target's
# context and count here, while time lost waiting for a CPU on a loaded machine does not.
puts "elapsed=#{Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0} " \
     "cpu=#{Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) - c0}"
