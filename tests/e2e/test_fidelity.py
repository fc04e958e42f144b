#!/usr/bin/env python3
"""Fidelity: rvbpfd records exactly the scheduler events CRuby's own hook API delivers.

For each test Ruby (3.3.8-shared, 3.4.5-static) x each fidelity workload x {attach, launch}, the workload runs with
the in-process reference recorder (tests/refrecorder, RVREF_OUT, RVREF_PROBES=1) and rvbpfd at the same time. Both
traces are restricted to the intersection of their windows on absolute CLOCK_MONOTONIC time (origin_ns + t_ns), then:
  - per Ruby thread, the sequence of STARTED/READY/RESUMED/SUSPENDED/EXITED events is equal;
  - the GC enter/exit sequence is equal (and attributed to the same thread);
  - per Ruby thread, the Kernel#sleep / Mutex#lock probe events are equal;
  - ruby_thread ids and the main flag agree; the native tid of RESUMED/SUSPENDED/EXITED agrees;
  - rvbpfd lost nothing in the window.
Rules for legitimate differences (named in the output when they apply):
  - TEARDOWN_TRACEPOINTS (rvlib.py): GC/probe events are compared only until CRuby cleared the TracePoints at exit.
  - IMPLICIT_RESUME (rvlib.py): used by the invariant checks below.
Then each workload runs with rvbpfd alone (no hook registered in the process), in attach and launch mode, and the
trace must satisfy the invariants of rvlib.check_invariants (threads start with thread_started and end with
thread_exited, GVL acquire/release alternate, exact thread and probe counts, no events_dropped, ordered timestamps).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rvlib  # noqa: E402

MODES = ("attach", "launch")


def main():
    args, res, rvbpfd, rubies = rvlib.begin(__doc__, lambda ap: ap.add_argument("--mode", action="append", choices=MODES))
    print(f"rule {rvlib.TEARDOWN_TRACEPOINTS_RULE}")
    print(f"rule {rvlib.IMPLICIT_RESUME_RULE}")
    outdir = rvlib.make_outdir(args, "fidelity")
    workloads = [w for w in rvlib.FIDELITY_WORKLOADS if not args.workload or w in args.workload]
    modes = args.mode or MODES
    for ruby in rubies:
        for wl in workloads:
            spec = rvlib.FIDELITY_WORKLOADS[wl]
            for mode in modes:
                name = f"fidelity {ruby.name} {wl} {mode} (reference + rvbpfd)"
                try:
                    run = rvlib.run_workload(ruby, wl, mode, outdir, ref=True, probes=True, rvbpfd=rvbpfd,
                                             env_extra=spec["env"])
                except rvlib.RunError as e:
                    res.check(name, [str(e)])
                    continue
                problems = list(run.problems)
                if run.rv is not None:
                    ref_problems = rvlib.check_invariants(run.ref, spec, exact_window=True)
                    if ref_problems:
                        problems.append("the reference trace itself breaks the invariants (harness problem): "
                                        + "; ".join(ref_problems[:5]))
                    for check, probs in rvlib.compare_traces(run.ref, run.rv, probes=True).items():
                        for p in probs:
                            problems.append(f"[{check}] {p}")
                    lo, hi = rvlib.comparison_window(run.ref, run.rv)
                    win = rvlib.in_window(run.ref.named(rvlib.RECORDED_EVENTS), lo, hi,
                                          run.ref.tracepoint_window())
                    started = sum(1 for e in win if e["event"] == "thread_started")
                    if started != spec["threads"]:
                        problems.append(f"the common window holds {started} thread_started events of the reference, "
                                        f"the workload creates {spec['threads']}: the comparison would not cover it")
                    kinds = {}
                    for e in win:
                        k = "scheduler" if e["event"] in rvlib.SCHED_EVENTS else (
                            "gc" if e["event"] in rvlib.GC_EVENTS else "probe")
                        kinds[k] = kinds.get(k, 0) + 1
                    print(f"  compared over {(hi - lo) / 1e6:.1f} ms: "
                          + ", ".join(f"{v} {k}" for k, v in sorted(kinds.items()))
                          + f" events of {len({e.get('ruby_thread') for e in win})} Ruby threads")
                    if problems:
                        tp_end = run.ref.tracepoint_window()
                        counts = []
                        for ev in rvlib.RECORDED_EVENTS:
                            a = sum(1 for e in rvlib.in_window(run.ref.named((ev,)), lo, hi, tp_end))
                            b = sum(1 for e in rvlib.in_window(run.rv.named((ev,)), lo, hi, tp_end))
                            counts.append(f"{ev} {a}/{b}" + ("" if a == b else " (!)"))
                        problems.append(f"events in the common window ({(hi - lo) / 1e6:.1f} ms), reference/rvbpfd: "
                                        + ", ".join(counts))
                res.check(name, problems)
            for mode in modes:
                name = f"rvbpfd alone {ruby.name} {wl} {mode} (invariants)"
                try:
                    run = rvlib.run_workload(ruby, wl, mode, outdir, ref=False, rvbpfd=rvbpfd, env_extra=spec["env"])
                except rvlib.RunError as e:
                    res.check(name, [str(e)])
                    continue
                problems = list(run.problems)
                if run.rv is not None:
                    problems += rvlib.check_invariants(run.rv, spec, exact_window=(mode == "attach"))
                res.check(name, problems)
    rvlib.cleanup_outdir(args, outdir)
    res.finish()


if __name__ == "__main__":
    main()
