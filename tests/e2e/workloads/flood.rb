# Workload: a flood of scheduler events from one thread: 50,000 pipe round trips `w.write("x"); r.read(1)`, each
# a GVL release/reacquire (about 300,000 events in all). Used with a tiny ring buffer to force drops. FLOOD_N
# changes the number of round trips (test_budget.py needs a run of several budget windows).
# Protocol: see cpu_sleep.rb.
$stdout.write("ready\n"); $stdout.flush
$stdin.gets
r, w = IO.pipe
w.sync = true
t = Thread.new do
  Integer(ENV.fetch("FLOOD_N", "50000")).times do
    w.write("x")
    r.read(1)
  end
end
t.join
$stdout.write("done\n"); $stdout.flush
