# Workload: 40 short-lived threads, created in one burst, each doing a little work, then all joined.
# Protocol: see cpu_sleep.rb.
$stdout.write("ready\n"); $stdout.flush
$stdin.gets
threads = 40.times.map do |i|
  Thread.new(i) do |n|
    x = 0
    2_000.times { x += n }
    x
  end
end
values = threads.map(&:value)
raise "many_threads: wrong values" unless values == 40.times.map { |n| n * 2_000 }
$stdout.write("done\n"); $stdout.flush
