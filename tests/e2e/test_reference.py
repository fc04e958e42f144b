#!/usr/bin/env python3
"""Validates the ground truth: the in-process reference recorder (tests/refrecorder) on every fidelity workload and
test Ruby, with no rvbpfd involved. If this fails, the fidelity and drop tests compare against a broken reference.

Checks per Ruby x workload: the trace is well formed, the reference lost nothing, every non-main thread runs
thread_started ... thread_exited, gvl_acquired/gvl_released alternate (rule IMPLICIT_RESUME), the workload's exact
thread count (e.g. 40 thread_started in many_threads) and exact Kernel#sleep / Mutex#lock probe counts, GC.start
counts. Needs no BPF and no root.
"""
import sys
import os

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rvlib  # noqa: E402


def main():
    args = rvlib.parse_args(__doc__)
    res = rvlib.Results()
    try:
        rubies = rvlib.setup_rubies(args)
    except rvlib.Fatal as e:
        res.check("test Rubies and rvref build", [str(e)])
        res.finish()
    outdir = rvlib.make_outdir(args, "reference")
    for ruby in rubies:
        for wl, spec in rvlib.FIDELITY_WORKLOADS.items():
            if args.workload and wl not in args.workload:
                continue
            name = f"reference {ruby.name} {wl}"
            try:
                run = rvlib.run_workload(ruby, wl, "none", outdir, ref=True, probes=True, env_extra=spec["env"])
            except rvlib.RunError as e:
                res.check(name, [str(e)])
                continue
            t = run.ref
            p = rvlib.check_invariants(t, spec, exact_window=True)
            if t.recorder != "in-process":
                p.append(f"header recorder {t.recorder!r}")
            if t.header.get("ruby_version") != ruby.version:
                p.append(f"header ruby_version {t.header.get('ruby_version')!r}")
            if t.summary.get("unpublished"):
                p.append(f"{t.summary['unpublished']} unpublished slots")
            if t.tracepoint_end() is None or t.tracepoint_start() is None:
                p.append("summary lacks tracepoints_started_t_ns/tracepoints_stopped_t_ns (TracePoint window)")
            # The counts in the summary agree with the event lines.
            for ev, n in t.summary.get("counts", {}).items():
                got = sum(1 for e in t.events if e.get("event") == ev)
                if got != n:
                    p.append(f"summary counts {ev}={n}, file has {got}")
            # native_tid: null exactly for STARTED/READY (they can run on another thread).
            for e in t.named(("thread_started", "wants_gvl")):
                if e.get("native_tid") is not None:
                    p.append(f"line {e['_line'] + 1}: {e['event']} with native_tid {e['native_tid']}")
                    break
            # Under RUBY_MN_THREADS=1 several Ruby threads share a native thread; without it each has its own.
            tids = {}
            for e in t.named(("gvl_acquired",)):
                tids.setdefault(e["ruby_thread"], set()).add(e["native_tid"])
            shared = len({x for s in tids.values() for x in s}) < len(tids)
            if wl == "mn_threads" and not shared:
                p.append(f"RUBY_MN_THREADS=1 but every Ruby thread has its own native thread: {tids}")
            if wl != "mn_threads" and any(len(s) > 1 for s in tids.values()):
                p.append(f"a Ruby thread ran on several native threads without M:N: {tids}")
            res.check(name, p)
    rvlib.cleanup_outdir(args, outdir)
    res.finish()


if __name__ == "__main__":
    main()
