#!/usr/bin/env python3
"""Start and stop cost of the recorder (a benchmark, not a test): what rvbpfd adds to a short command, and how soon
an attach produces its first event.

Targets: `rvbpfd -o F -- ruby -e 1` adds at most 100 ms to `ruby -e 1`; `rvbpfd --pid P` writes its first event
within 150 ms of starting, with the site cache warm.

  launch  N runs (default 9) each of `ruby -e 1` and `rvbpfd -q -o F -- ruby -e 1`, interleaved so both see the same
          machine load; reports the medians and the median of the per-pair differences (wall time of the whole
          command, fork to reap).
  attach  N runs of `rvbpfd -q --pid P -o F` against one Ruby process that switches threads all the time
          (a thread that sleeps 1 ms at a time: a GVL hand-off every millisecond); reports
          the median time from starting rvbpfd to the first event line in F (the file is polled every 1 ms; the
          writer flushes its first events at once) and to the end of the attach phase as rvbpfd reports it.
One warm-up run of each fills the site cache (--cache-dir, a temporary directory by default) first.

Usage: sudo benchmarks/startup.py --rvbpfd build/rvbpfd --ruby /var/cache/rvbpfd/rubies/3.4.5-static/bin/ruby
       [--runs 9] [--json out.json] [--rvbpfd-arg=--stacks=off --rvbpfd-arg=--hz --rvbpfd-arg=0]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

LAUNCH_TARGET_MS = 100.0
ATTACH_TARGET_MS = 150.0

# A thread that sleeps 1 ms at a time: ~1,000 GVL hand-offs a second, and next to no CPU, so the target neither
# starves rvbpfd of the CPU nor floods the file the benchmark reads.
SWITCHER = """
$stdout.sync = true
Thread.new { loop { sleep 0.001 } }
puts "ready"
sleep
"""


def run_timed(argv, env=None):
    start = time.monotonic()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    elapsed = (time.monotonic() - start) * 1000.0
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv)} exited with {proc.returncode}: {proc.stderr.decode(errors='replace')[-500:]}")
    return elapsed


def first_event_ms(path, start, limit_s=10.0):
    """ms from `start` (time.monotonic) until `path` holds a line that is an event other than tracing_started."""
    deadline = start + limit_s
    seen = b""
    while time.monotonic() < deadline:
        try:
            with open(path, "rb") as f:
                f.seek(len(seen))
                seen += f.read()
        except FileNotFoundError:
            pass
        for line in seen.split(b"\n")[:-1]:  # whole lines only
            if b'"event"' in line and b'"tracing_started"' not in line:
                return (time.monotonic() - start) * 1000.0
        time.sleep(0.001)
    return None


def bench_launch(args, tmp):
    out = os.path.join(tmp, "launch.rvtrace")
    base_cmd = [args.ruby, "-e", "1"]
    traced_cmd = [args.rvbpfd, "-q", "--cache-dir", args.cache_dir, "-o", out] + args.rvbpfd_arg + ["--"] + base_cmd
    run_timed(traced_cmd)  # warm-up: site cache, page cache
    run_timed(base_cmd)
    bare, traced, diffs = [], [], []
    for _ in range(args.runs):
        b = run_timed(base_cmd)
        t = run_timed(traced_cmd)
        bare.append(b)
        traced.append(t)
        diffs.append(t - b)
    return {"bare_ms": statistics.median(bare), "traced_ms": statistics.median(traced),
            "added_ms": statistics.median(diffs), "added_ms_min": min(diffs), "added_ms_max": max(diffs),
            "runs": args.runs}


def bench_attach(args, tmp):
    target = subprocess.Popen([args.ruby, "-e", SWITCHER], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        if target.stdout.readline().strip() != b"ready":
            sys.exit("the switching Ruby did not start")
        firsts, attached = [], []
        for i in range(args.runs + 1):
            out = os.path.join(tmp, f"attach{i}.rvtrace")
            start = time.monotonic()
            # Plain lines, so the growing file can be polled for its first event; the format changes only how a
            # flush's bytes are encoded, not when the flush happens.
            rv = subprocess.Popen([args.rvbpfd, "--pid", str(target.pid), "--cache-dir", args.cache_dir,
                                   "--trace-format=jsonl", "-o", out] + args.rvbpfd_arg, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE)
            first = first_event_ms(out, start)
            rv.send_signal(2)
            _, err = rv.communicate(timeout=30)
            if first is None:
                sys.exit(f"no event in {out} within 10 s: {err.decode(errors='replace')[-500:]}")
            # "attached N probes (...) ... in X ms" is the attach phase alone; the first event comes after it.
            m = re.search(r" in (\d+) ms; writing ", err.decode(errors="replace"))
            attach_ms = float(m.group(1)) if m else None
            if i == 0:
                continue  # warm-up: fills the site cache
            firsts.append(first)
            if attach_ms is not None:
                attached.append(attach_ms)
        return {"first_event_ms": statistics.median(firsts), "first_event_ms_min": min(firsts),
                "first_event_ms_max": max(firsts),
                "attach_phase_ms": statistics.median(attached) if attached else None, "runs": args.runs}
    finally:
        target.kill()
        target.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rvbpfd", required=True)
    ap.add_argument("--ruby", required=True)
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--cache-dir", help="site cache (default: a fresh temporary directory, warmed first)")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--rvbpfd-arg", action="append", default=[],
                    help="extra rvbpfd option for every traced run (repeat: --rvbpfd-arg=--hz --rvbpfd-arg=0)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if not args.cache_dir:
            args.cache_dir = os.path.join(tmp, "cache")
        launch = bench_launch(args, tmp)
        attach = bench_attach(args, tmp)
    print(f"launch: ruby -e 1 {launch['bare_ms']:.0f} ms, under rvbpfd {launch['traced_ms']:.0f} ms; added "
          f"{launch['added_ms']:.0f} ms (median of {launch['runs']} pairs, {launch['added_ms_min']:.0f}-"
          f"{launch['added_ms_max']:.0f}); target <= {LAUNCH_TARGET_MS:.0f} ms: "
          f"{'met' if launch['added_ms'] <= LAUNCH_TARGET_MS else 'NOT met'}")
    attach_phase = attach["attach_phase_ms"]
    print(f"attach: first event written {attach['first_event_ms']:.0f} ms after start (median of {attach['runs']}, "
          f"{attach['first_event_ms_min']:.0f}-{attach['first_event_ms_max']:.0f}); attach phase "
          f"{attach_phase if attach_phase is not None else '?'} ms; target <= {ATTACH_TARGET_MS:.0f} ms: "
          f"{'met' if attach['first_event_ms'] <= ATTACH_TARGET_MS else 'NOT met'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"launch": launch, "attach": attach}, f, indent=2)


if __name__ == "__main__":
    main()
