# Workload for test_top.py: one thread burns CPU in TopBusy.burn and so holds the GVL nearly all the time, two threads
# do pipe round trips (each write and read releases the GVL, so each trip ends waiting for the lock the burner holds),
# one thread sleeps in short naps. Runs until its stdin closes or it is killed: `rvbpfd top` watches it live.
# Prints one JSON line with each thread's native tid (Thread#native_thread_id) once every thread runs.
require "json"

class TopBusy
  def self.burn
    s = 0
    loop do
      i = 0
      while i < 100_000
        s += i
        i += 1
      end
      $burned += 1
    end
  end

  def self.pipe_trips
    r, w = IO.pipe
    loop do
      w.write("x")
      r.readpartial(1)
    end
  end

  def self.nap
    loop { sleep 0.05 }
  end
end

$burned = 0
tids = Queue.new
threads = {
  "cpu" => -> { TopBusy.burn },
  "waiter1" => -> { TopBusy.pipe_trips },
  "waiter2" => -> { TopBusy.pipe_trips },
  "sleeper" => -> { TopBusy.nap },
}.map do |name, body|
  Thread.new do
    Thread.current.name = name
    tids << [name, Thread.current.native_thread_id]
    body.call
  end
end
info = 4.times.map { tids.pop }.to_h
info["main"] = Thread.current.native_thread_id
$stdout.write(JSON.generate(info) + "\n"); $stdout.flush
$stdin.gets
exit!(0)
