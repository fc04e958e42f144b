#!/usr/bin/env python3
"""Overhead benchmark (not a test): how much rvbpfd slows a Ruby program, measured as ratios within one run.

For each test Ruby and each workload (benchmarks/workloads: cpu4 = four CPU-bound threads, io_heavy = two threads
passing 400,000 bytes through a pipe one at a time), runs 5 interleaved rounds untraced and traced in attach mode (so
Ruby's boot is not counted: the workload waits on stdin until rvbpfd says it is attached) and prints the median
elapsed time of the workload itself, the ratio, the traced events and the cost per probe hit. The bare cost of one
uprobe hit is measured in the same run (bench_uprobe_cost), so "cost per event / bare hit" is comparable across
machines. io_heavy is also run with --max-overhead 5 to check the budget (target: ratio <= 1 + 5% + 2%).
Also prints the attach time rvbpfd reports.

Usage: sudo benchmarks/overhead.py --build-dir build [--rounds 5] [--json out.json]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def ruby_prefix(name):
    return subprocess.check_output([os.path.join(REPO, "tools", "build-test-rubies.sh"), "--print-prefix", name],
                                   text=True).strip()


def run_once(ruby, workload, rvbpfd=None, extra=(), tmp="/tmp"):
    """Runs one round; returns (elapsed seconds, trace summary or None, attach ms or None)."""
    proc = subprocess.Popen([ruby, os.path.join(HERE, "workloads", workload + ".rb")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    tracer = None
    trace = None
    attach_ms = None
    if rvbpfd:
        trace = os.path.join(tmp, "bench-%d.rvtrace" % proc.pid)
        tracer = subprocess.Popen([rvbpfd, "--pid", str(proc.pid), "-o", trace, "--no-status", *extra],
                                  stderr=subprocess.PIPE, text=True)
        line = tracer.stderr.readline()
        if not line.startswith("rvbpfd: attached"):
            proc.kill()
            raise SystemExit("rvbpfd did not attach: " + line + tracer.stderr.read())
        m = re.search(r"in (\d+) ms", line)
        attach_ms = float(m.group(1)) if m else None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    out = proc.stdout.read()
    proc.wait()
    elapsed = float(re.search(r"elapsed=([0-9.e-]+)", out).group(1))
    summary = None
    if tracer:
        tracer.stderr.read()
        if tracer.wait() != 0:
            raise SystemExit("rvbpfd failed with status %d" % tracer.returncode)
        with open(trace) as f:
            for line in f:
                if line.startswith('{"summary"'):
                    summary = json.loads(line)["summary"]
        os.unlink(trace)
    return elapsed, summary, attach_ms


def probe_hits(summary):
    counts = summary["event_counts"]
    hits = sum(v for k, v in counts.items() if k not in ("tracing_started", "tracing_stopped", "events_dropped",
                                                         "tracing_paused", "tracing_resumed"))
    return hits + summary.get("events_dropped", 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--rubies", default="3.3.8-shared,3.4.5-static")
    args = ap.parse_args()
    rvbpfd = os.path.join(args.build_dir, "rvbpfd")
    bare = json.loads(subprocess.check_output([os.path.join(args.build_dir, "benchmarks", "bench_uprobe_cost")],
                                              text=True))
    bare_us = bare["uprobe_us_per_hit"]
    print("bare uprobe hit (same run): %.2f us" % bare_us)
    results = {"uprobe_us_per_hit": bare_us, "rubies": {}}
    for name in args.rubies.split(","):
        ruby = os.path.join(ruby_prefix(name), "bin", "ruby")
        res = {}
        # "traced" is the default recording (stacks at every gvl_released, 99 Hz sampling); the other variants split
        # the cost: no stacks at all, stacks at release only, sampling only.
        nostacks = ["--stacks=off", "--hz", "0"]
        for workload, variants in (("cpu4", [("traced", []), ("nostacks", nostacks), ("release", ["--hz", "0"]),
                                             ("sample99", ["--stacks=off"])]),
                                   ("io_heavy", [("traced", []), ("nostacks", nostacks),
                                                 ("budget5", ["--max-overhead", "5"])])):
            times = {"untraced": []}
            hits = {}
            attach = []
            for v, _ in variants:
                times[v] = []
                hits[v] = []
            for _ in range(args.rounds):  # interleaved, so drift in the machine hits every variant alike
                times["untraced"].append(run_once(ruby, workload)[0])
                for v, extra in variants:
                    t, summary, a = run_once(ruby, workload, rvbpfd, extra)
                    times[v].append(t)
                    hits[v].append(probe_hits(summary))
                    if a is not None:
                        attach.append(a)
            base = statistics.median(times["untraced"])
            row = {"untraced_s": base, "attach_ms_median": statistics.median(attach)}
            for v, _ in variants:
                med = statistics.median(times[v])
                h = statistics.median(hits[v])
                row[v] = {"median_s": med, "ratio": med / base, "probe_hits": h,
                          "us_per_hit": (med - base) / h * 1e6 if h else None}
            res[workload] = row
            for v, _ in variants:
                r = row[v]
                per = ("%.2f us/hit = %.2fx bare" % (r["us_per_hit"], r["us_per_hit"] / bare_us)) \
                    if r["us_per_hit"] else "-"
                print("%-13s %-9s %-8s untraced %.3f s  traced %.3f s  ratio %.3fx  hits %d  %s" %
                      (name, workload, v, base, r["median_s"], r["ratio"], r["probe_hits"], per))
            print("%-13s %-9s attach time (median) %.0f ms" % (name, workload, row["attach_ms_median"]))
        results["rubies"][name] = res
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
