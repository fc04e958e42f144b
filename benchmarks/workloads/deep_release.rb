# Workload for benchmarks/bpf_walk_cost.sh: one thread releases the GVL over and over from a deep Ruby stack, so
# nearly every probe hit that walks a stack walks a long one.
#   DEEP_DEPTH    Ruby method frames below the releasing call (default 500; rvbpfd walks up to 4,096 frames)
#   DEEP_SECONDS  how long to keep releasing (default 3 s)
# Each IO#syswrite to /dev/null runs in a blocking region, so the VM reports gvl_released (with a stack under
# --stacks=release) and gvl_acquired around it, even with a single thread. After the loop the program idles for
# 1.5 s so a poller that samples BPF stats every few hundred ms sees the final counts before the programs unload.
depth = Integer(ENV.fetch("DEEP_DEPTH", "500"))
seconds = Float(ENV.fetch("DEEP_SECONDS", "3"))

def dive(n, &blk)
  n.zero? ? blk.call : dive(n - 1, &blk)
end

null = File.open(File::NULL, "w")
deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
writes = 0
# dive(1) adds one frame per level; the block and the loop add a few more.
dive(depth - 1) do
  while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
    100.times { null.syswrite("x") }
    writes += 100
  end
end
$stderr.puts "deep_release: depth #{depth}, #{writes} writes"
t_end = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 1.5
while Process.clock_gettime(Process::CLOCK_MONOTONIC) < t_end
  x = 0
  200_000.times { x += 1 }  # on-CPU idling: sleep would release the GVL, with a stack, after the stats were read
end
