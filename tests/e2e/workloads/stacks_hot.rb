# Workload: one thread spends ~2 s of CPU in a known hot path, for the on-CPU sampling test (test_stacks.py).
#   Thread (block in <main>) -> Foo.bar -> Array#each -> block in Foo.bar -> Integer#times -> block -> Foo.hot
# Foo.hot is a plain while loop of integer additions (instructions only, no method frames), ~several ms per call, so
# nearly every sample lands in it. Blocks report their method's CME in rb_profile_frames, so CRuby labels the two
# blocks "Foo.bar" too: the expected stack, leaf first, is
#   Foo.hot, Foo.bar, Integer#times, Foo.bar, Array#each, Foo.bar, block in <main>
# Protocol: see cpu_sleep.rb.
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
t = Thread.new { Foo.bar(Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds) }
t.join
$stdout.write("done\n"); $stdout.flush
