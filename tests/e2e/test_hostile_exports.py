#!/usr/bin/env python3
"""Exports of a hostile trace run in bounded memory. No BPF, no Ruby and no root needed.

A target controls its frame labels and how deep it recurses, so a trace it was recorded from can hold one 64 KiB
label repeated down 16 stacks 4,096 frames deep: about 240 KB of trace, but 4 GiB of folded lines and, as
Perfetto's per-slice stack args, 32 GiB. Every export (perfetto, speedscope, pprof, folded with each weight, the
HTML report) of that trace is run under an address-space limit (RLIMIT_AS) with --max-output-bytes 64M, and must
either succeed with an output within the cap, or stop with exit 14 and one 'rvbpfd: output-too-large: ...' line,
leaving no file (nor a temporary) behind. The Perfetto export must hit the cap (its stack args alone exceed it).
The folded export is also run with the default cap into /dev/null and must succeed within the limit.
"""
import json
import os
import re
import resource
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rvlib  # noqa: E402

MEMORY_LIMIT = 768 << 20  # address space of each export: rvbpfd's own mappings plus a generous working set
OUTPUT_CAP = 64 << 20
EXIT_OUTPUT_TOO_LARGE = 14
BIG_LABEL_BYTES = 64 << 10
STACKS = 16
DEPTH = 4096
ROUNDS = 64


def hostile_trace(path):
    """The trace a deep recursion through one method with a 64 KiB name gives (docs/rvtrace.md): frame 1 is that
    method, frames 2..17 the leaves; stack i is leaf i over 4,095 copies of frame 1. Two threads hand the GVL to each
    other 64 times; each turn has a sample and a gvl_released carrying one of the stacks."""
    lines = [{"rvtrace": 1, "recorder": "rvbpfd", "recorder_version": "0.1.0", "pid": 4242, "ruby_version": "3.4.5",
              "clock": "monotonic", "origin_ns": 1000, "started_at": "2026-12-07T00:00:00.000000Z",
              "channels": ["thread_hook_site", "gc_hook_site", "probe", "perf_event"], "main_thread": 1,
              "sample_hz": 99, "stacks": "release"}]
    lines.append({"frame": {"id": 1, "label": "Deep#" + "r" * (BIG_LABEL_BYTES - 5), "path": "/app/deep.rb",
                            "line": 7, "kind": "ruby"}})
    for i in range(STACKS):
        lines.append({"frame": {"id": 2 + i, "label": f"Leaf#l{i}", "path": "/app/leaf.rb", "line": 1 + i,
                                "kind": "ruby"}})
    for i in range(STACKS):
        lines.append({"stack": {"id": 1 + i, "frames": [2 + i] + [1] * (DEPTH - 1)}})
    t = 0

    def ev(thread, name, cruby, source="thread_hook_site", **extra):
        nonlocal t
        t += 1000
        e = {"t_ns": t, "ruby_thread": thread, "native_tid": 4242 + thread - 1, "probe_tid": 4242 + thread - 1,
             "event": name, "cruby_event": cruby, "source": source, "provenance": "observed"}
        e.update(extra)
        return e

    lines.append({"t_ns": 0, "ruby_thread": None, "native_tid": None, "probe_tid": None, "event": "tracing_started",
                  "cruby_event": None, "source": "daemon", "provenance": "observed"})
    lines.append({"thread": {"ruby_thread": 1, "main": True}})
    lines.append(ev(1, "gvl_acquired", "RUBY_INTERNAL_THREAD_EVENT_RESUMED"))
    lines.append({"thread": {"ruby_thread": 2, "main": False}})
    lines.append(ev(2, "thread_started", "RUBY_INTERNAL_THREAD_EVENT_STARTED"))
    cur = 1
    for k in range(ROUNDS):
        other = 3 - cur
        stack = 1 + k % STACKS
        lines.append(ev(cur, "sample", None, "perf_event", stack=stack))
        lines.append(ev(other, "wants_gvl", "RUBY_INTERNAL_THREAD_EVENT_READY"))
        lines.append(ev(cur, "gvl_released", "RUBY_INTERNAL_THREAD_EVENT_SUSPENDED", reason="timeslice",
                        reason_provenance="derived", stack=stack))
        lines.append(ev(other, "gvl_acquired", "RUBY_INTERNAL_THREAD_EVENT_RESUMED"))
        cur = other
    t += 1000
    lines.append({"t_ns": t, "ruby_thread": None, "native_tid": None, "probe_tid": None, "event": "tracing_stopped",
                  "cruby_event": None, "source": "daemon", "provenance": "observed"})
    with open(path, "w") as f:
        for line in lines:
            f.write(json.dumps(line, separators=(",", ":")) + "\n")
    return os.path.getsize(path)


def limited():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_limited(argv, timeout=600):
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, preexec_fn=limited)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout} s"
    return p.returncode, p.stderr.decode("utf-8", "replace")


def judge(rc, err, out_dir, out_path, must_hit_cap):
    if rc is None:
        return [err]
    lines = [l for l in err.splitlines() if l.strip()]
    left = sorted(os.listdir(out_dir))
    p = []
    if rc == 0:
        if must_hit_cap:
            p.append("finished, but its output must exceed the cap")
        if not os.path.isfile(out_path):
            p.append("exit 0 but no output file")
        elif os.path.getsize(out_path) > OUTPUT_CAP:
            p.append(f"output of {os.path.getsize(out_path)} bytes passes the cap of {OUTPUT_CAP}")
        if left != [os.path.basename(out_path)]:
            p.append(f"files left in the output directory: {left}")
    elif rc == EXIT_OUTPUT_TOO_LARGE:
        if len(lines) != 1 or not re.match(r"^rvbpfd: output-too-large: .*--max-output-bytes", lines[0]):
            p.append(f"expected one 'rvbpfd: output-too-large: ... --max-output-bytes ...' line, got {lines[:5]}")
        if left:
            p.append(f"a failed export left files behind: {left}")
    else:
        p.append(f"exit {rc} (expected 0, or {EXIT_OUTPUT_TOO_LARGE} at the cap): {err[-600:]}")
    return p


def main():
    args = rvlib.parse_args(__doc__)
    res = rvlib.Results()
    try:
        rvbpfd = rvlib.require_rvbpfd(args.rvbpfd)
    except rvlib.Fatal as e:
        res.check("setup (rvbpfd binary)", [str(e)])
        res.finish()
    base = tempfile.mkdtemp(prefix="rvbpfd-e2e-hostile-exports-")
    trace = os.path.join(base, "hostile.rvtrace")
    size = hostile_trace(trace)
    print(f"  hostile trace: {size} bytes")

    cases = [("perfetto", ["export", "--perfetto"], "out.json", True),
             ("speedscope", ["export", "--speedscope"], "out.speedscope.json", False),
             ("pprof", ["export", "--pprof"], "out.pb.gz", False),
             ("report", ["report"], "out.html", False)]
    for weight in ("cpu", "gvl_wait", "gvl_blame", "wall"):
        cases.append((f"folded --weight {weight}", ["export", "--folded", "--weight", weight], "out.txt", False))
    for i, (name, argv, out_name, must_hit_cap) in enumerate(cases):
        out_dir = os.path.join(base, f"out{i}")
        os.mkdir(out_dir)
        out_path = os.path.join(out_dir, out_name)
        rc, err = run_limited([rvbpfd] + argv + [trace, "-o", out_path, "--max-output-bytes", str(OUTPUT_CAP)])
        res.check(f"{name} of a {size // 1024} KB hostile trace within {MEMORY_LIMIT >> 20} MiB of address space and "
                  f"a {OUTPUT_CAP >> 20} MiB output cap" + (" (hits the cap)" if must_hit_cap else ""),
                  judge(rc, err, out_dir, out_path, must_hit_cap))
    # The default cap, into /dev/null (nothing to remove): the folded lines, written as they are produced.
    rc, err = run_limited([rvbpfd, "export", "--folded", trace, "-o", "/dev/null"])
    res.check(f"folded of the hostile trace into /dev/null with the default cap, within {MEMORY_LIMIT >> 20} MiB",
              [] if rc == 0 else [f"exit {rc}: {err[-600:]}"])
    res.finish(base, keep=args.keep)


if __name__ == "__main__":
    main()
