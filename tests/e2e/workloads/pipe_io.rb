# Workload: three threads blocking on pipe reads; the main thread feeds them with pauses in between.
# Protocol: see cpu_sleep.rb.
$stdout.write("ready\n"); $stdout.flush
$stdin.gets
pipes = 3.times.map { IO.pipe }
readers = pipes.map do |r, _w|
  Thread.new do
    got = 0
    while (chunk = r.readpartial(64) rescue nil)
      got += chunk.bytesize
    end
    got
  end
end
10.times do |i|
  pipes.each { |_r, w| w.write("x" * (i + 1)) }
  sleep 0.01
end
pipes.each { |_r, w| w.close }
total = readers.map(&:value).sum
raise "pipe_io: lost bytes (#{total})" unless total == 3 * 55
$stdout.write("done\n"); $stdout.flush
