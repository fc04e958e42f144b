# Workload: one thread spends ~2 s of CPU in a known hot path, for the on-CPU sampling test (test_stacks.py).
#   Thread (block in <main>) -> Foo.bar -> Array#each -> block in Foo.bar -> Integer#times -> block -> Foo.hot
# Foo.hot is a plain while loop of integer additions (instructions only, no method frames), ~several ms per call, so
# nearly every sample lands in it. Blocks report their method's CME in rb_profile_frames, so CRuby labels the two
# blocks "Foo.bar" too: the expected stack, leaf first, is
#   Foo.hot, Foo.bar, Integer#times, Foo.bar, Array#each, Foo.bar, block in <main>
# Protocol: see cpu_sleep.rb. With STACKS_HOT_CPU_OUT set, the hot thread writes its CPU time (s) to that file.
class Foo
  def self.hot
    i = 0
    s = 0
    while i < 300_000
      s += i
      i += 1
    end
    s
  end

  def self.bar(deadline)
    [1].each do
      while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
        20.times { hot }
      end
    end
  end
end

$stdout.write("ready\n"); $stdout.flush
$stdin.gets
seconds = Float(ENV.fetch("STACKS_HOT_SECONDS", "2"))
t = Thread.new do
  Foo.bar(Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds)
  # The CPU time this thread got (s): on a shared machine it can be well under `seconds`, and the sampler can only
  # sample the time the thread was on a CPU.
  cpu = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
  File.write(ENV["STACKS_HOT_CPU_OUT"], "#{cpu}\n") if ENV["STACKS_HOT_CPU_OUT"]
end
t.join
$stdout.write("done\n"); $stdout.flush
