# test_follow.py: a master that forks an early worker (blocked on a pipe), prints "ready", waits for a line on stdin
# (rvbpfd attached with --follow by then), lets the early worker run a thread and forks a late worker that runs one
# thread besides its main one, waits for both, prints "LATE_PID EARLY_PID" and exits.
r, w = IO.pipe
early = fork do
  w.close
  r.read # until the master closes its end, after the attach
  Thread.new { x = 0; 50_000.times { x += 1 }; x }.join
end
r.close
$stdout.puts "ready"
$stdout.flush
$stdin.gets
w.close
worker = fork do
  t = Thread.new do
    x = 0
    100_000.times { x += 1 }
    sleep 0.005
    x
  end
  t.join
end
Process.wait(worker)
Process.wait(early)
$stdout.puts "#{worker} #{early}"
$stdout.flush
