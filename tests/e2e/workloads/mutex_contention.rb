# Workload: four threads contending on one Mutex (each holds it across a short sleep, so the others block on it).
# Protocol: see cpu_sleep.rb.
$stdout.write("ready\n"); $stdout.flush
$stdin.gets
m = Mutex.new
counter = 0
threads = 4.times.map do
  Thread.new do
    15.times do
      m.synchronize do
        counter += 1
        sleep 0.002
      end
      m.lock
      counter += 1
      m.unlock
    end
  end
end
threads.each(&:join)
raise "mutex_contention: counter #{counter}" unless counter == 4 * 30
$stdout.write("done\n"); $stdout.flush
