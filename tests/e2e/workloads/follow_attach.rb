# test_follow.py: a parent (the master) that prints "ready", waits for a line on stdin (rvbpfd attached with --follow
# by then), forks a worker that runs one thread besides its main one and exits, waits for it, prints the worker's
# pid and exits.
$stdout.puts "ready"
$stdout.flush
$stdin.gets
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
$stdout.puts worker
$stdout.flush
