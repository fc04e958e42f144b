# Workload for benchmarks/holder_stack_cost.sh: a cruncher holds the GVL in pure-Ruby CPU work at a chosen stack
# depth while three threads do pipe round trips, so most of their READYs find the cruncher holding the lock (a
# contended READY: with --holder-stacks=on, each walks the cruncher's stack).
#   HOLDER_DEPTH    Ruby method frames below the cruncher's work (default 50)
#   HOLDER_SECONDS  how long to run (default 3 s)
# After the run the program idles on-CPU for 1.5 s, so a poller that samples BPF stats every few hundred ms sees the
# final counts before the programs unload.
depth = Integer(ENV.fetch("HOLDER_DEPTH", "50"))
seconds = Float(ENV.fetch("HOLDER_SECONDS", "3"))

def dive(n, &blk)
  n.zero? ? blk.call : dive(n - 1, &blk)
end

def crunch(iterations)
  s = 0
  i = 0
  while i < iterations
    s += i
    i += 1
  end
  s
end

done = false
contenders = 3.times.map do
  Thread.new do
    r, w = IO.pipe
    trips = 0
    until done
      w.write("x")
      r.readpartial(1)
      trips += 1
    end
    trips
  end
end
deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
rounds = 0
dive(depth - 1) do
  while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
    crunch(300_000)
    sleep 0.001
    rounds += 1
  end
end
done = true
trips = contenders.map(&:value)
$stderr.puts "contended_ready: depth #{depth}, #{rounds} rounds, #{trips.sum} round trips"
t_end = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 1.5
while Process.clock_gettime(Process::CLOCK_MONOTONIC) < t_end
  x = 0
  200_000.times { x += 1 }
end
