# Workload: one thread allocates short-lived strings for ~1.5 s, so a good share of its CPU time is spent in GC, for the
# GC pseudo-frame check of test_stacks.py (samples taken between GC_ENTER and GC_EXIT get a "(garbage collection)"
# frame on top of the thread's Ruby stack). Protocol: see cpu_sleep.rb.
class Churn
  def self.run(deadline)
    kept = nil
    while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      kept = Array.new(2000) { |i| "s#{i}" * 4 }
    end
    kept.size
  end
end

$stdout.write("ready\n"); $stdout.flush
$stdin.gets
t = Thread.new { Churn.run(Process.clock_gettime(Process::CLOCK_MONOTONIC) + 1.5) }
t.join
# Stay alive a moment: the daemon symbolizes samples from the live process (within ~20 ms of each sample), and the
# last ones must not find it gone.
sleep 0.3
$stdout.write("done\n"); $stdout.flush
