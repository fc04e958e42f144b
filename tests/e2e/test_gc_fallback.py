#!/usr/bin/env python3
"""GC fallback: with --gc-probes=fallback, GC enter/exit come from entry and return probes on the GC functions
(gc_start, gc_rest.part.0, gc_continue; src/sites FindGcFunctionSites) instead of the VM's GC hook checks, and must
still equal what the in-process hook sees.

For each test Ruby (3.3.8-shared, 3.4.5-static, 3.4.5-shared-yjit) x gc_threads (GC.start in two threads, allocation in between, so
lazy-sweep steps too) with 1:1 threads and with RUBY_MN_THREADS=1 (Ruby threads that can change native threads, where
a return probe on a function that switches threads would SIGILL the target) x {attach, launch}, the workload runs with
the reference
recorder (tests/refrecorder) and rvbpfd --gc-probes=fallback at the same time, and rvlib.compare_traces must find:
  - the GC enter/exit sequence equal (and attributed to the same threads), over the common window;
  - everything else equal as in test_fidelity.py (the fallback changes only the GC sites);
and the run must show GC (gc_threads: at least min_gc pairs) so the comparison is not vacuous. That the fallback was
in effect is checked from rvbpfd's "attached N probes" line: N must be the default site count (`rvbpfd sites
--binary VM`) minus its gc-hook-site lines plus the 6 GC function probes (3 entries, 3 returns). The target must exit
0 (a return probe on a function that returned on another native thread would have killed it with SIGILL).
Rules for legitimate differences:
  - GC_FALLBACK_EARLY_RETURN: a gc_start that returns without collecting (an allocation-triggered GC while
    GC.disable is in effect, or before the heap exists) gives an enter/exit pair the VM does not report. The
    workloads never disable GC, so no such pair is allowed here (any extra pair fails the comparison).
  - TEARDOWN_TRACEPOINTS (rvlib.py) as in test_fidelity.py.
"""
import glob
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rvlib  # noqa: E402

MODES = ("attach", "launch")
# (workload, extra environment, label)
VARIANTS = (("gc_threads", {}, "gc_threads"), ("gc_threads", {"RUBY_MN_THREADS": "1"}, "gc_threads M:N"))
GC_FALLBACK_EARLY_RETURN_RULE = (
    "GC_FALLBACK_EARLY_RETURN: function-level GC probes report a gc_start that returns without collecting (GC "
    "disabled, no heap yet) as an enter/exit pair; these workloads never disable GC, so none may appear")


def expected_probe_count(rvbpfd, ruby):
    """Probes a --gc-probes=fallback recording attaches: the default sites without the GC hook checks, plus an entry
    and a return probe on each of gc_start, gc_rest.part.0 and gc_continue."""
    libs = sorted(glob.glob(os.path.join(ruby.prefix, "lib", "libruby.so.*.*.*")))
    vm = libs[0] if libs else ruby.bin
    out = subprocess.run([rvbpfd, "sites", "--binary", vm], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise rvlib.Fatal(f"rvbpfd sites --binary {vm} failed: {out.stderr}")
    rows = [l for l in out.stdout.splitlines() if l.startswith("0x")]
    gc_hook = [l for l in rows if "(gc-hook-site," in l]
    gc_functions = [l for l in rows if "(gc-function-" in l]
    if not gc_hook:
        # The finder found no GC hook check (none of the test Rubies; a build of another shape), so the default
        # sites are the fallback already: the same 6 function probes.
        if len(gc_functions) != 6:
            raise rvlib.Fatal(f"{vm} has no GC hook-check sites and {len(gc_functions)} GC function probes, not 6")
        return len(rows)
    return len(rows) - len(gc_hook) + 6


def main():
    args, res, rvbpfd, rubies = rvlib.begin(__doc__, lambda ap: ap.add_argument("--mode", action="append", choices=MODES))
    print(f"rule {GC_FALLBACK_EARLY_RETURN_RULE}")
    print(f"rule {rvlib.TEARDOWN_TRACEPOINTS_RULE}")
    outdirs = []
    variants = [v for v in VARIANTS if not args.workload or v[0] in args.workload]
    for ruby in rubies:
        try:
            want_probes = expected_probe_count(rvbpfd, ruby)
        except (rvlib.Fatal, OSError, subprocess.TimeoutExpired) as e:
            res.check(f"gc fallback {ruby.name}: site count", [str(e)])
            continue
        for wl, env, label in variants:
            spec = rvlib.FIDELITY_WORKLOADS[wl]
            # One directory per variant: run_workload names files by Ruby, workload and mode only, and a trace left
            # by the previous variant must never stand in for one this run failed to write.
            outdir = rvlib.make_outdir(args, "gcfallback")
            outdirs.append(outdir)
            for mode in args.mode or MODES:
                name = f"gc fallback {ruby.name} {label} {mode} (reference + rvbpfd --gc-probes=fallback)"
                try:
                    run = rvlib.run_workload(ruby, wl, mode, outdir, ref=True, probes=True, rvbpfd=rvbpfd,
                                             rv_args=("--gc-probes=fallback",), env_extra={**spec["env"], **env})
                except rvlib.RunError as e:
                    res.check(name, [str(e)])
                    continue
                problems = list(run.problems)
                # Launch mode: the target is rvbpfd's child, which reports how it ended.
                for sig in re.findall(r"command killed by signal (\d+)", run.rv_stderr or ""):
                    problems.append(f"the target was killed by signal {sig}")
                for status in re.findall(r"command exited with status (\d+)", run.rv_stderr or ""):
                    if status != "0":
                        problems.append(f"the target exited with status {status}")
                m = re.search(r"attached (\d+) probes", run.rv_stderr or "")
                if not m:
                    problems.append("no 'attached N probes' line from rvbpfd")
                elif int(m.group(1)) != want_probes:
                    problems.append(f"rvbpfd attached {m.group(1)} probes, the fallback set has {want_probes}: "
                                    "--gc-probes=fallback was not in effect")
                if run.rv is not None:
                    for check, probs in rvlib.compare_traces(run.ref, run.rv, probes=True).items():
                        problems += [f"[{check}] {p}" for p in probs]
                    lo, hi = rvlib.comparison_window(run.ref, run.rv)
                    tp = run.ref.tracepoint_window()
                    ref_gc = rvlib.in_window(run.ref.named(rvlib.GC_EVENTS), lo, hi, tp)
                    rv_gc = rvlib.in_window(run.rv.named(rvlib.GC_EVENTS), lo, hi, tp)
                    enters = sum(1 for e in ref_gc if e["event"] == "gc_enter")
                    if enters < spec.get("min_gc", 0):
                        problems.append(f"only {enters} GC runs in the common window, the workload makes at least "
                                        f"{spec['min_gc']}: the comparison would not cover the fallback")
                    # Every GC event of the whole trace is one probe hit (entry or return probe): the summary's
                    # trap count must cover them, or the GC events did not come from probes of this recording.
                    all_gc = len(run.rv.named(rvlib.GC_EVENTS))
                    hits = run.rv.summary.get("probe_hits")
                    if hits is None:
                        problems.append("the rvbpfd trace summary has no probe_hits")
                    elif hits < all_gc:
                        problems.append(f"probe_hits {hits} < {all_gc} GC events")
                    print(f"  {label}: {enters} GC runs compared ({len(ref_gc)} reference / {len(rv_gc)} rvbpfd GC "
                          f"events) over {(hi - lo) / 1e6:.1f} ms")
                res.check(name, problems)
    for outdir in outdirs:
        rvlib.cleanup_outdir(args, outdir)
    res.finish()


if __name__ == "__main__":
    main()
