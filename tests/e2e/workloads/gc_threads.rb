# Workload: GC.start called in two threads (three times each), with allocation in between.
# Protocol: see cpu_sleep.rb.
$stdout.write("ready\n"); $stdout.flush
$stdin.gets
threads = 2.times.map do
  Thread.new do
    3.times do
      junk = Array.new(20_000) { |i| "s#{i}" }
      GC.start
      junk.size
    end
  end
end
threads.each(&:join)
$stdout.write("done\n"); $stdout.flush
