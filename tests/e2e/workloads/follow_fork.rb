# test_follow.py: a parent that forks a child which records itself with the in-process reference (rvref, loaded in
# the child only, writing ARGV[0]) while two threads contend for the GVL, then exits with status 3. The parent only
# waits, and exits 0 when the child's status was 3. Prints the child's pid on stdout.
child = fork do
  ENV["RVREF_OUT"] = ARGV[0]
  ENV["RVREF_PROBES"] = "1"
  require "rvref"
  spin = lambda do
    x = 0
    3.times do
      200_000.times { x += 1 }
      sleep 0.002
    end
    x
  end
  threads = 2.times.map { Thread.new(&spin) }
  threads.each(&:join)
  exit 3
end
$stdout.puts child
$stdout.flush
Process.wait(child)
exit($?.exitstatus == 3 ? 0 : 1)
