# Workload for M:N scheduling: the harness runs it with RUBY_MN_THREADS=1, so the non-main Ruby threads share
# native threads. Three threads sleep, two threads block on pipes fed by the main thread.
# Protocol: see cpu_sleep.rb.
$stdout.write("ready\n"); $stdout.flush
$stdin.gets
sleepers = 3.times.map do |i|
  Thread.new do
    5.times { sleep 0.005 * (i + 1) }
  end
end
pipes = 2.times.map { IO.pipe }
readers = pipes.map do |r, _w|
  Thread.new do
    got = 0
    while (chunk = r.readpartial(16) rescue nil)
      got += chunk.bytesize
    end
    got
  end
end
8.times do
  pipes.each { |_r, w| w.write("y") }
  sleep 0.004
end
pipes.each { |_r, w| w.close }
sleepers.each(&:join)
raise "mn_threads: lost bytes" unless readers.map(&:value) == [8, 8]
$stdout.write("done\n"); $stdout.flush
