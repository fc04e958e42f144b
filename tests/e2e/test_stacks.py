#!/usr/bin/env python3
"""Ruby stacks from rvbpfd (docs/design.md, "Stacks" and "Release reasons").

Per test Ruby (3.3.8-shared, 3.4.5-static), rvbpfd attached to the workload with the defaults (--stacks=release,
--hz 99):
  - sampling: workloads/stacks_hot.rb runs a known hot path for 2 s in one thread. The header says
    sample_hz 99 and lists the perf_event channel; that thread has at least half the samples 99 Hz gives in 2 s, and
    at least 95% of them carry exactly the frames rb_profile_frames reports there (labels, leaf first), with the leaf's
    line inside Foo.hot's loop;
  - GC: workloads/stacks_gc.rb allocates in one thread; some of its samples carry the "(garbage collection)"
    pseudo-frame (kind gc) on top of its Ruby stack, and each of those lies inside one of its gc_enter..gc_exit;
  - release reasons: workloads/stacks_block.rb has a thread in Kernel#sleep, one blocked in Thread::Mutex#lock and
    one in IO#read on a pipe. Each thread's gvl_released events carry its stack, and the release taken in the
    blocking call has reason "sleep" / "mutex" / "io" with reason_provenance "derived";
  - every gvl_released with a known th carries a stack, every stack and frame id is defined before use;
  - --stacks=off --hz 0 records no stacks, no samples and no reasons;
  - golden: workloads/stacks_golden.rb blocks three threads (Kernel#sleep inside a block inside a class method,
    Thread::Mutex#synchronize, IO#read inside Integer#times/Enumerator) and captures CRuby's own frames for them with
    tests/golden's extension; the stack rvbpfd took when each of them released the GVL to block equals the golden
    frames exactly (label, path, line, frame for frame).
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rvlib  # noqa: E402

HOT_EXPECTED = ["Foo.hot", "Foo.bar", "Integer#times", "Foo.bar", "Array#each", "Foo.bar", "block in <main>"]
HOT_LINES = range(11, 15)  # the while loop of Foo.hot in workloads/stacks_hot.rb
HOT_SECONDS = 2.0
BLOCKERS = {  # method of the thread -> (label of the blocking call, expected reason)
    "Object#sleeper_body": ("Kernel#sleep", "sleep"),
    "Object#mutex_body": ("Thread::Mutex#lock", "mutex"),
    "Object#pipe_body": ("IO#read", "io"),
}


def common_checks(t):
    p = list(t.problems)
    for e in t.named(("gvl_released",)):
        if e.get("th") and "stack" not in e:
            p.append(f"line {e['_line'] + 1}: gvl_released with th {e['th']} has no stack")
            break
    return p


def check_hot(t):
    p = common_checks(t)
    h = t.header
    if h.get("sample_hz") != 99:
        p.append(f"header sample_hz is {h.get('sample_hz')!r}, expected 99")
    if "perf_event" not in h.get("channels", []):
        p.append(f"header channels {h.get('channels')} lack perf_event")
    started = t.named(("thread_started",))
    if len(started) != 1:
        p.append(f"{len(started)} thread_started events, expected 1")
        return p
    hot = started[0].get("ruby_thread")
    samples = [e for e in t.named(("sample",)) if e.get("ruby_thread") == hot]
    for e in samples:
        if e.get("source") != "perf_event" or e.get("provenance") != "observed":
            p.append(f"line {e['_line'] + 1}: sample source/provenance {e.get('source')}/{e.get('provenance')}")
            break
    want_min = int(99 * HOT_SECONDS * 0.5)
    if len(samples) < want_min:
        p.append(f"the hot thread has {len(samples)} samples, expected at least {want_min}")
        return p
    good = 0
    bad = {}
    for e in samples:
        frames = t.stack_frames(e)
        labels = [f.get("label") for f in frames]
        if labels == HOT_EXPECTED and frames[0].get("line") in HOT_LINES and frames[0].get("path", "").endswith(
                "stacks_hot.rb"):
            good += 1
        else:
            key = tuple((f.get("label"), f.get("line")) for f in frames[:8])
            bad[key] = bad.get(key, 0) + 1
    pct = 100.0 * good / len(samples)
    print(f"  hot thread: {len(samples)} samples, {good} ({pct:.1f}%) with exactly the expected frames")
    if pct < 95.0:
        worst = sorted(bad.items(), key=lambda kv: -kv[1])[:5]
        p.append(f"only {pct:.1f}% of {len(samples)} samples match {HOT_EXPECTED}; most common others: {worst}")
    return p


def check_gc(t):
    p = common_checks(t)
    started = t.named(("thread_started",))
    if len(started) != 1:
        return p + [f"{len(started)} thread_started events, expected 1"]
    churn = started[0].get("ruby_thread")
    samples = [e for e in t.named(("sample",)) if e.get("ruby_thread") == churn]
    in_gc = [e for e in samples if t.stack_frames(e)[:1] and t.stack_frames(e)[0].get("kind") == "gc"]
    print(f"  churn thread: {len(samples)} samples, {len(in_gc)} in GC")
    if not in_gc:
        return p + [f"none of the allocating thread's {len(samples)} samples has the GC pseudo-frame on top"]
    for e in in_gc:
        frames = t.stack_frames(e)
        if frames[0].get("label") != "(garbage collection)" or "Churn.run" not in [f.get("label") for f in frames]:
            p.append(f"line {e['_line'] + 1}: GC sample frames {[(f.get('label'), f.get('kind')) for f in frames]}")
            break
    # GC frames only while GC runs: the gc_enter/gc_exit events of the thread bracket every GC sample.
    spans = []
    open_t = None
    for e in t.events:
        if e.get("ruby_thread") != churn:
            continue
        if e["event"] == "gc_enter":
            open_t = e["t_ns"]
        elif e["event"] == "gc_exit" and open_t is not None:
            spans.append((open_t, e["t_ns"]))
            open_t = None
    outside = [e for e in in_gc if not any(lo <= e["t_ns"] <= hi for lo, hi in spans)]
    if outside:
        p.append(f"{len(outside)} GC samples lie outside every gc_enter..gc_exit of the thread "
                 f"(first at line {outside[0]['_line'] + 1})")
    return p


def check_block(t):
    p = common_checks(t)
    released = t.named(("gvl_released",))
    for method, (call, reason) in BLOCKERS.items():
        mine = [e for e in released if method in t.stack_labels(e)]
        if not mine:
            p.append(f"no gvl_released has {method} on its stack")
            continue
        blocked = [e for e in mine if t.stack_labels(e)[:1] == [call]]
        if not blocked:
            tops = sorted({tuple(t.stack_labels(e)[:2]) for e in mine})
            p.append(f"{method}: no gvl_released with {call} on top; tops seen: {tops}")
            continue
        for e in blocked:
            if e.get("reason") != reason or e.get("reason_provenance") != "derived":
                p.append(f"{method}: line {e['_line'] + 1}: release in {call} has reason {e.get('reason')!r} "
                         f"({e.get('reason_provenance')!r}), expected {reason!r} (derived)")
                break
        print(f"  {method}: {len(blocked)} release(s) in {call}, reasons "
              f"{sorted({e.get('reason') for e in blocked})}")
    for e in released:
        if e.get("reason") is not None and e.get("reason_provenance") != "derived":
            p.append(f"line {e['_line'] + 1}: reason without reason_provenance derived")
            break
    return p


def check_off(t):
    p = list(t.problems)
    if t.frames or t.stacks:
        p.append(f"--stacks=off --hz 0 wrote {len(t.frames)} frames and {len(t.stacks)} stacks")
    if t.named(("sample",)):
        p.append("--hz 0 wrote samples")
    if any("reason" in e for e in t.named(("gvl_released",))):
        p.append("--stacks=off wrote release reasons")
    if "sample_hz" in t.header or "perf_event" in t.header.get("channels", []):
        p.append(f"--hz 0 header still announces sampling: {t.header}")
    return p


def build_golden(build_dir, source_dir, ruby):
    """Builds tests/golden with this Ruby's mkmf into BUILD/golden-e2e-<ruby>; returns the directory."""
    d = os.path.join(build_dir, f"golden-e2e-{ruby.name}")
    os.makedirs(d, exist_ok=True)
    log = os.path.join(d, "build.log")
    with open(log, "w") as f:
        r = subprocess.run([ruby.bin, os.path.join(source_dir, "tests", "golden", "extconf.rb")], cwd=d, stdout=f,
                           stderr=subprocess.STDOUT)
        if r.returncode == 0:
            r = subprocess.run(["make"], cwd=d, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        raise rvlib.RunError(f"building tests/golden for {ruby.name} failed, see {log}")
    return d


def check_golden(t, golden_path):
    p = common_checks(t)
    try:
        with open(golden_path) as f:
            golden = json.load(f)
    except (OSError, ValueError) as e:
        return p + [f"cannot read the golden capture {golden_path}: {e}"]
    want_tops = {"Kernel#sleep", "Thread::Mutex#synchronize", "IO#read"}
    seen = set()
    for g in golden["threads"]:
        frames = g["frames"]
        if g.get("main") or not frames or frames[0]["label"] not in want_tops:
            continue
        top = frames[0]["label"]
        seen.add(top)
        th = int(g["th"], 16)
        rel = [e for e in t.named(("gvl_released",))
               if isinstance(e.get("th"), str) and int(e["th"], 16) == th and t.stack_labels(e)[:1] == [top]]
        if not rel:
            p.append(f"thread {g['th']} blocked in {top}: no gvl_released with that frame on top")
            continue
        got = [(f.get("label"), f.get("path"), f.get("line")) for f in t.stack_frames(rel[-1])]
        want = [(f["label"], f["path"] if f["path"] is not None else "<cfunc>", f["line"]) for f in frames]
        if got != want:
            p.append(f"thread blocked in {top}: rvbpfd's stack at release differs from rb_profile_frames:\n"
                     f"      rvbpfd: {got}\n      golden: {want}")
        else:
            print(f"  {top}: {len(got)} frames equal to rb_profile_frames")
    if seen != want_tops:
        p.append(f"the golden capture has blocked threads in {sorted(seen)}, expected {sorted(want_tops)}")
    return p


def main():
    args = rvlib.parse_args(__doc__)
    rvlib.require_bpf_environment()
    res = rvlib.Results()
    try:
        rvbpfd = rvlib.require_rvbpfd(args.rvbpfd)
        rubies = rvlib.setup_rubies(args)
    except rvlib.Fatal as e:
        res.check("setup (rvbpfd binary, test Rubies)", [str(e)])
        res.finish()
    outdir = rvlib.make_outdir(args, "stacks")
    cases = [
        ("stacks_hot", (), check_hot, {"STACKS_HOT_SECONDS": str(HOT_SECONDS)}),
        ("stacks_gc", (), check_gc, {}),
        ("stacks_block", (), check_block, {}),
        ("stacks_block", ("--stacks=off", "--hz", "0"), check_off, {}),
    ]
    for ruby in rubies:
        for wl, rv_args, check, env in cases:
            if args.workload and wl not in args.workload:
                continue
            name = f"stacks {ruby.name} {wl} {' '.join(rv_args) or '(defaults)'}"
            try:
                run = rvlib.run_workload(ruby, wl, "attach", outdir, ref=False, rvbpfd=rvbpfd, rv_args=rv_args,
                                         env_extra=env)
            except rvlib.RunError as e:
                res.check(name, [str(e)])
                continue
            problems = list(run.problems)
            if run.rv is not None:
                problems += check(run.rv)
            res.check(name, problems)
        if args.workload and "stacks_golden" not in args.workload:
            continue
        name = f"stacks {ruby.name} stacks_golden (stacks at release = rb_profile_frames)"
        try:
            gdir = build_golden(args.build_dir, args.source_dir, ruby)
            gout = os.path.join(outdir, f"{ruby.name}-golden.json")
            run = rvlib.run_workload(ruby, "stacks_golden", "attach", outdir, ref=False, rvbpfd=rvbpfd,
                                     env_extra={"RVGOLDEN_DIR": gdir, "RVGOLDEN_OUT": gout})
        except rvlib.RunError as e:
            res.check(name, [str(e)])
            continue
        problems = list(run.problems)
        if run.rv is not None:
            problems += check_golden(run.rv, gout)
        res.check(name, problems)
    rvlib.cleanup_outdir(args, outdir)
    res.finish()


if __name__ == "__main__":
    main()
