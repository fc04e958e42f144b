# Transition-heavy: two threads pass 20,000 bytes one at a time through a pipe (each read and write releases and
# reacquires the GVL). Same protocol as cpu4.rb.
$stdout.puts "ready"
$stdout.flush
$stdin.gets
t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
r, w = IO.pipe
n = 400_000
writer = Thread.new { n.times { w.write("x") }; w.close }
reader = Thread.new { got = 0; got += 1 while r.read(1); got }
writer.join
reader.join
puts "elapsed=#{Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0}"
