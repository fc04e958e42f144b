#!/usr/bin/env python3
"""What `rvbpfd dump` costs (a benchmark, not a test): its wall time on a process of many deep threads, and what it
takes from the target while it reads it.

Target (issue 48): under 1 s for 100 threads of 100 frames, no measurable slowdown of the target.

The target: THREADS threads (default 100), each DEPTH frames deep (default 100: Queue#pop, DEPTH - 2 frames of a
recursive Ruby method, its block) blocked in Queue#pop on one empty Queue, and one thread counting in a Ruby loop.
  dump    RUNS dumps (default 9) of `rvbpfd dump --pid P --json` with a --cache-dir of its own, one after the
          other; reports the first (cold: the VM binary's stack and dump layouts computed, from DWARF when it has
          some) and the median and range of the others (warm: both from the cache): wall time, fork to reap, and
          the dump process's CPU time (user + system), which depends less on what else the machine runs. Each dump's JSON is checked: THREADS + 2 threads, every worker DEPTH frames deep, the
          Queue listing THREADS waiters.
  target  the counting thread's rate (iterations/s, read from the target over a pipe) in WINDOW-second windows,
          ROUNDS of each kind, interleaved: idle; with dumps of the target back to back; and with dumps of a twin
          process (the same workload) back to back, which loads the machine as much without reading the target. The
          twin windows are the reference: on a loaded 2-core machine the dumps' own CPU time slows every process,
          what reading the target costs it is the difference between the target and twin windows.

Usage: sudo benchmarks/dump_cost.py --rvbpfd build/rvbpfd --ruby /var/cache/rvbpfd/rubies/3.4.5-static/bin/ruby
       [--threads 100] [--depth 100] [--runs 9] [--rounds 5] [--window 1.0] [--json out.json]
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

TARGET_S = 1.0

WORKLOAD = r"""
$stdout.sync = true
threads, depth = Integer(ARGV[0]), Integer(ARGV[1])
def dive(n, q) = n <= 0 ? q.pop : dive(n - 1, q)
q = Thread::Queue.new
$count = 0
Thread.new { Thread.current.name = "counter"; loop { $count += 1 } }
waiting = Thread::Queue.new
threads.times { |i| Thread.new { Thread.current.name = "w#{i}"; waiting << i; dive(depth - 3, q) } }
threads.times { waiting.pop }
Thread.pass until q.num_waiting == threads
puts "ready"
while $stdin.gets
  puts $count
end
"""


CACHE_DIR = tempfile.mkdtemp(prefix="rvbpfd-dump-cost-")


CPU_S = []  # the CPU time (user + system) of each dump process


def dump_once(rvbpfd, pid):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    p = subprocess.run([rvbpfd, "--cache-dir", CACHE_DIR, "dump", "--pid", str(pid), "--json"], capture_output=True,
                       text=True)
    elapsed = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU_S.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    if p.returncode != 0:
        sys.exit(f"rvbpfd dump exited {p.returncode}: {p.stderr.strip()}")
    return elapsed, json.loads(p.stdout)


def check(d, threads, depth):
    workers = [t for t in d["threads"] if (t.get("name") or "").startswith("w")]
    if len(d["threads"]) != threads + 2 or len(workers) != threads:
        sys.exit(f"the dump lists {len(d['threads'])} threads ({len(workers)} workers), expected {threads} + 2")
    shallow = [t["name"] for t in workers if len(t["frames"]) != depth]
    if shallow:
        sys.exit(f"workers without {depth} frames: {shallow[:5]} ({len(workers[0]['frames'])} frames)")
    queues = [o for o in d.get("waited_on", []) if o["type"] == "Thread::Queue"]
    if not queues or len(queues[0]["waiters_native_tids"]) != threads:
        sys.exit(f"the Queue does not list {threads} waiters: {queues[:1]}")


def count(target):
    target.stdin.write("\n")
    target.stdin.flush()
    return int(target.stdout.readline())


def rate(target, window, during=None):
    """The counting thread's iterations per second over `window` seconds, running `during` (a callable) meanwhile."""
    t0, c0 = time.monotonic(), count(target)
    deadline = t0 + window
    while time.monotonic() < deadline:
        if during:
            during()
        else:
            time.sleep(0.01)
    t1, c1 = time.monotonic(), count(target)
    return (c1 - c0) / (t1 - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rvbpfd", required=True)
    ap.add_argument("--ruby", required=True)
    ap.add_argument("--threads", type=int, default=100)
    ap.add_argument("--depth", type=int, default=100)
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--window", type=float, default=1.0)
    ap.add_argument("--json")
    a = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("RUBYOPT", "RUBY_YJIT_ENABLE", "RUBY_MN_THREADS")}
    def start():
        return subprocess.Popen([a.ruby, "-e", WORKLOAD, str(a.threads), str(a.depth)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env=env)
    target, twin = start(), start()
    try:
        if target.stdout.readline().strip() != "ready" or twin.stdout.readline().strip() != "ready":
            sys.exit("the target never printed 'ready'")
        times = []
        for _ in range(a.runs):
            elapsed, d = dump_once(a.rvbpfd, target.pid)
            check(d, a.threads, a.depth)
            times.append(elapsed)
        warm = times[1:] or times
        print(f"dump of {a.threads} threads x {a.depth} frames ({d['ruby_version']}): first (cold) "
              f"{times[0] * 1000:.0f} ms, then (warm) median {statistics.median(warm) * 1000:.0f} ms ({min(warm) * 1000:.0f}-{max(warm) * 1000:.0f}), "
              f"target {TARGET_S * 1000:.0f} ms; CPU time first {CPU_S[0] * 1000:.0f} ms, then median "
              f"{statistics.median(CPU_S[1:] or CPU_S) * 1000:.0f} ms")
        idle, busy, control = [], [], []
        for _ in range(a.rounds):
            idle.append(rate(target, a.window))
            busy.append(rate(target, a.window, during=lambda: dump_once(a.rvbpfd, target.pid)))
            control.append(rate(target, a.window, during=lambda: dump_once(a.rvbpfd, twin.pid)))
        m = {k: statistics.median(v) for k, v in (("idle", idle), ("busy", busy), ("control", control))}
        print(f"target's counting thread (medians of {a.rounds} {a.window:g} s windows): idle {m['idle'] / 1e6:.2f} "
              f"M/s; dumping the twin {m['control'] / 1e6:.2f} M/s; dumping the target {m['busy'] / 1e6:.2f} M/s "
              f"({(m['busy'] / m['control'] - 1) * 100:+.1f} % against the twin windows)")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"threads": a.threads, "depth": a.depth, "dump_s": times, "idle_rate": idle,
                           "target_dumped_rate": busy, "twin_dumped_rate": control}, f)
    finally:
        for p in (target, twin):
            p.kill()
            p.wait()
        shutil.rmtree(CACHE_DIR, ignore_errors=True)


if __name__ == "__main__":
    main()
