#!/usr/bin/env python3
"""GVL blame and wall clock on a hog + IO-threads workload (workloads/gvl_hog.rb), 3.3.8-shared and 3.4.5-static.

gvl_hog: HogKlass.spin holds the GVL for ~1 s in a CPU loop while four threads do one-byte pipe round trips, each of
which ends with a wait for the lock. Recorded in attach mode with on-CPU samples (--hz 99). For each Ruby:
  pprof:   `go tool pprof -sample_index=gvl_blame -top` lists HogKlass.spin first (flat); the gvl_blame values sum to
           the gvl_wait values (every counted wait is blamed on someone); the samples carrying HogKlass.spin are
           labelled with the hog's thread as holder (the thread whose on-CPU samples are in HogKlass.spin);
  wall:    per thread, the `wall` values sum to the thread's lifetime computed here from the trace's events (first
           event to thread_exited, or the last event) within 2%, and so does the total; the unknown state is under 5%
           of the total;
  inspect: `rvbpfd inspect` is at most 40 lines, its top blocker line names the hog's thread and HogKlass.spin;
  stats:   `rvbpfd stats` has a blame line for the hog's thread naming HogKlass.spin;
  folded:  `export --folded --weight gvl_blame`: HogKlass.spin is the heaviest leaf frame.

Contention under the budget (issue 14 item 4): the same workload with HOG_LOCK_EVERY=1000 (the hog also locks an
uncontended mutex of its own every 1,000 iterations, so every run traps ~20,000 times a second), recorded twice:
complete, and with `--max-overhead 1`, which must pause the scheduler probes for at least a third of the run (else
the check proves nothing). Samples read the VM's GVL (holder, queue) from memory, and in paused windows the GVL wait
and blame are estimated from those readings. For the budgeted recording:
  - the samples carry GVL readings (summary gvl_readings > 0; the hog's samples name the hog as holder and the IO
    threads as queued);
  - `go tool pprof -sample_index=gvl_blame -top` lists HogKlass.spin first; blame samples labelled
    provenance=inferred exist, those with leaf HogKlass.spin name the hog's thread as holder, and no inferred sample
    is labelled observed or derived;
  - the total GVL wait (pprof gvl_wait: observed + inferred) is within 30% of the complete recording's, and the
    gvl_blame total equals it;
  - the `wall` values hold inferred gvl_wait (the estimate, out of the unknown time, at most all of it) and still sum
    to the threads' lifetimes within 2%;
  - `rvbpfd inspect` names the hog and HogKlass.spin as top blocker and says how much was estimated.
"""
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pprof_decode  # noqa: E402
import rvlib  # noqa: E402

HOG = "HogKlass.spin"


def run(cmd, timeout=120):
    try:
        p = subprocess.run(cmd, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "", f"{cmd[0]} timed out"
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def hog_thread(trace):
    """The ruby_thread whose samples mostly have HogKlass.spin as leaf (None if no thread's do)."""
    counts = {}
    for e in trace.events:
        if e.get("event") == "sample":
            labels = trace.stack_labels(e)
            if labels and labels[0] == HOG:
                counts[e.get("ruby_thread")] = counts.get(e.get("ruby_thread"), 0) + 1
    return max(counts, key=counts.get) if counts else None


def thread_label(trace, tid):
    return trace.thread_label(tid)


def pprof_top(pb_path, index):
    """The flat rows' names of `go tool pprof -sample_index=INDEX -top`, or (None, problem)."""
    go = shutil.which("go")
    if go is None:
        return None, "go is not installed: `go tool pprof` cannot be checked (tools/install-deps.sh installs golang)"
    rc, out, err = run([go, "tool", "pprof", f"-sample_index={index}", "-top", pb_path])
    if rc != 0:
        return None, f"go tool pprof exit {rc}: {err[-1500:]}"
    rows, seen_header = [], False
    for line in out.splitlines():
        if re.match(r"\s*flat\s+flat%", line):
            seen_header = True
            continue
        if seen_header and line.strip():
            cols = line.split(None, 5)
            if len(cols) == 6:
                rows.append(cols[5].strip())
    return rows, None


def lifetimes(trace):
    """ruby_thread -> ns from its first event to its thread_exited (or the trace's last event)."""
    first, exited = {}, {}
    last = max((e["t_ns"] for e in trace.events if isinstance(e.get("t_ns"), int)), default=0)
    for e in trace.events:
        tid = e.get("ruby_thread")
        if tid is None or not isinstance(e.get("t_ns"), int):
            continue
        first[tid] = min(first.get(tid, e["t_ns"]), e["t_ns"])
        if e.get("event") == "thread_exited":
            exited[tid] = e["t_ns"]
    return {t: exited.get(t, last) - f for t, f in first.items()}


def check_pprof(trace, prof, pprof_path, hog):
    p = []
    names = [t for t, _ in prof["sample_types"]]
    for want in ("gvl_wait", "gvl_blame", "wall"):
        if want not in names:
            return [f"no sample type {want} in {names}"]
    i_wait, i_blame, i_wall = names.index("gvl_wait"), names.index("gvl_blame"), names.index("wall")
    wait, blame = pprof_decode.total(prof, i_wait), pprof_decode.total(prof, i_blame)
    if wait <= 0:
        p.append("no GVL wait at all: the IO threads never waited for the hog")
    elif blame != wait:
        p.append(f"gvl_blame sums to {blame} ns, gvl_wait to {wait} ns: some wait is not blamed on anyone")
    hog_holders = {s["labels"].get("holder") for s in prof["samples"]
                   if s["values"][i_blame] > 0 and s["stack"] and s["stack"][0] == HOG}
    if hog_holders != {thread_label(trace, hog)}:
        p.append(f"blame samples with leaf {HOG} have holder labels {hog_holders}, want "
                 f"{{{thread_label(trace, hog)!r}}}")
    rows, problem = pprof_top(pprof_path, "gvl_blame")
    if problem:
        return p + [problem]
    if not rows:
        p.append("go tool pprof -top printed no rows")
    elif rows[0] != HOG:
        p.append(f"go tool pprof -sample_index=gvl_blame -top: first row {rows[0]!r}, want {HOG}; top rows "
                 f"{rows[:5]}")
    # Wall clock: per thread and in total, the wall samples sum to the thread's lifetime.
    life = lifetimes(trace)
    by_thread, unknown = {}, 0
    for s in prof["samples"]:
        v = s["values"][i_wall]
        if v == 0:
            continue
        by_thread[s["labels"].get("ruby_thread")] = by_thread.get(s["labels"].get("ruby_thread"), 0) + v
        if s["labels"].get("state") == "unknown":
            unknown += v
        if "state" not in s["labels"]:
            p.append(f"a wall sample without a state label: {s['labels']}")
            break
    total_life, total_wall = sum(life.values()), sum(by_thread.values())
    if set(by_thread) != set(life):
        p.append(f"wall profile threads {sorted(by_thread, key=str)} != the trace's {sorted(life, key=str)}")
    for tid, ns in sorted(life.items()):
        got = by_thread.get(tid, 0)
        if abs(got - ns) > 0.02 * ns:
            p.append(f"thread {tid}: wall sums to {got / 1e6:.3f} ms, its lifetime is {ns / 1e6:.3f} ms")
    if total_life <= 0 or abs(total_wall - total_life) > 0.02 * total_life:
        p.append(f"wall sums to {total_wall / 1e6:.3f} ms, threads x lifetime is {total_life / 1e6:.3f} ms")
    if total_wall > 0 and unknown > 0.05 * total_wall:
        p.append(f"the unknown state is {unknown / 1e6:.3f} ms, {100.0 * unknown / total_wall:.1f}% of the wall "
                 f"clock (want < 5%)")
    return p


def check_inspect(trace, out, hog):
    p = []
    lines = out.splitlines()
    if len(lines) > 40:
        p.append(f"inspect printed {len(lines)} lines (want at most 40)")
    try:
        i = next(i for i, l in enumerate(lines) if l.startswith("top blockers"))
    except StopIteration:
        return p + [f"no 'top blockers' section:\n{out[-2000:]}"]
    first = lines[i + 1] if i + 1 < len(lines) else ""
    label = thread_label(trace, hog)
    if not (re.search(rf"(?<![\w#]){re.escape(label)}(?!\w)", first) and HOG in first):
        p.append(f"top blocker line {first.strip()!r} does not name {label} running {HOG}")
    for section in ("wall clock by thread", "gvl contention", "lost:"):
        if not any(l.startswith(section) for l in lines):
            p.append(f"no {section!r} line")
    return p


def check_stats(trace, out, hog):
    label = thread_label(trace, hog)
    rows = [l for l in out.splitlines() if re.search(rf"(?<![\w#]){re.escape(label)}(?!\w)", l) and HOG in l]
    return [] if rows else [f"no blame line naming {label} and {HOG} in stats:\n{out[-2000:]}"]


def check_folded(out):
    leaves = {}
    for line in out.splitlines():
        stack, _, v = line.rpartition(" ")
        if not stack:
            continue
        leaf = stack.split(";")[-1]
        leaves[leaf] = leaves.get(leaf, 0) + int(v)
    if not leaves:
        return ["the folded gvl_blame export is empty"]
    top = max(leaves, key=leaves.get)
    return [] if top == HOG else [f"heaviest gvl_blame leaf is {top!r} ({leaves[top]} ns), want {HOG} "
                                  f"({leaves.get(HOG, 0)} ns)"]


BUDGET_ENV = {"HOG_LOCK_EVERY": "1000"}
MIN_PAUSED_SHARE = 1 / 3  # of the budgeted run: below it the estimate is hardly exercised
MAX_WAIT_ERROR = 0.30     # the estimate's total GVL wait against the complete recording's


def check_budgeted(full, full_prof, budget, budget_prof, budget_pb, budget_inspect):
    p = []
    duration = budget.summary.get("duration_ms", 0) * 1e6
    paused = rvlib.paused_ns(budget)
    print(f"  budgeted run: paused {paused / 1e6:.0f} of {duration / 1e6:.0f} ms, "
          f"{budget.summary.get('gvl_readings')} GVL readings")
    if duration <= 0 or paused < MIN_PAUSED_SHARE * duration:
        return [f"--max-overhead 1 paused the probes for {paused / 1e6:.0f} ms of {duration / 1e6:.0f} ms: under "
                f"{MIN_PAUSED_SHARE:.0%} the estimate is not what is measured"]
    if not budget.summary.get("gvl_readings"):
        p.append(f"no GVL readings in the summary: {budget.summary.get('gvl_readings')}")
    hog = hog_thread(budget)
    if hog is None:
        return p + [f"no sample of the budgeted run has {HOG} as its leaf"]
    readings = [e["gvl"] for e in budget.events if e.get("event") == "sample" and e.get("ruby_thread") == hog
                and isinstance(e.get("gvl"), dict)]
    if not readings:
        p.append("the hog's samples carry no GVL reading")
    elif not any(g.get("holder") == hog and g.get("waiting", 0) >= 1 and g.get("queued") for g in readings):
        p.append(f"no reading of the hog's names it holder with threads queued: {readings[:3]}")
    names = [t for t, _ in budget_prof["sample_types"]]
    i_wait, i_blame = names.index("gvl_wait"), names.index("gvl_blame")
    full_names = [t for t, _ in full_prof["sample_types"]]
    full_wait = pprof_decode.total(full_prof, full_names.index("gvl_wait"))
    wait, blame = pprof_decode.total(budget_prof, i_wait), pprof_decode.total(budget_prof, i_blame)
    inferred_wait = sum(s["values"][i_wait] for s in budget_prof["samples"]
                        if s["labels"].get("provenance") == "inferred")
    print(f"  gvl_wait: complete {full_wait / 1e6:.1f} ms, budgeted {wait / 1e6:.1f} ms "
          f"({inferred_wait / 1e6:.1f} ms of it inferred), ratio {wait / full_wait if full_wait else 0:.3f}")
    if full_wait <= 0:
        p.append("the complete recording has no GVL wait")
    elif abs(wait - full_wait) > MAX_WAIT_ERROR * full_wait:
        p.append(f"budgeted GVL wait {wait / 1e6:.1f} ms is not within {MAX_WAIT_ERROR:.0%} of the complete "
                 f"recording's {full_wait / 1e6:.1f} ms")
    if inferred_wait <= 0:
        p.append("no gvl_wait sample is labelled provenance=inferred although the probes were paused")
    if blame != wait:
        p.append(f"gvl_blame sums to {blame} ns, gvl_wait to {wait} ns")
    inferred_blame = [s for s in budget_prof["samples"] if s["values"][i_blame] > 0
                      and s["labels"].get("provenance") == "inferred"]
    if not inferred_blame:
        p.append("no gvl_blame sample is labelled provenance=inferred")
    holders = {s["labels"].get("holder") for s in inferred_blame if s["stack"] and s["stack"][0] == HOG}
    if holders != {thread_label(budget, hog)}:
        p.append(f"inferred blame with leaf {HOG} names holders {holders}, want {{{thread_label(budget, hog)!r}}}")
    rows, problem = pprof_top(budget_pb, "gvl_blame")
    if problem:
        p.append(problem)
    elif not rows or rows[0] != HOG:
        p.append(f"go tool pprof -sample_index=gvl_blame -top on the budgeted run: top rows {rows[:5]}, want {HOG}")
    # The wall clock: the estimated waits come out of the unknown time as gvl_wait labelled inferred, the total still
    # the threads' lifetimes.
    i_wall = names.index("wall")
    inferred_wall = sum(s["values"][i_wall] for s in budget_prof["samples"]
                        if s["labels"].get("provenance") == "inferred" and s["labels"].get("state") == "gvl_wait")
    if inferred_wall <= 0 or inferred_wall > inferred_wait:
        p.append(f"wall has {inferred_wall} ns of inferred gvl_wait against {inferred_wait} ns estimated: want some, "
                 f"at most all of it")
    lives = sum(lifetimes(budget).values())
    wall_total = pprof_decode.total(budget_prof, i_wall)
    if abs(wall_total - lives) > 0.02 * lives:
        p.append(f"the budgeted wall sums to {wall_total / 1e6:.1f} ms, the threads' lifetimes to {lives / 1e6:.1f} ms")
    p += check_inspect(budget, budget_inspect, hog)
    if "estimated" not in budget_inspect:
        p.append("inspect does not say that part of the GVL wait was estimated")
    return p


def main():
    args, res, rvbpfd, rubies = rvlib.begin(__doc__)
    outdir = rvlib.make_outdir(args, "blame")
    for ruby in rubies:
        name = f"{ruby.name} gvl_hog HOG_LOCK_EVERY=1000"
        runs = {}
        for kind, extra in (("complete", ()), ("budget", ("--max-overhead", "1"))):
            try:
                r = rvlib.run_workload(ruby, "gvl_hog", "attach", outdir, ref=False, rvbpfd=rvbpfd,
                                       rv_args=("--hz", "99", *extra), env_extra=BUDGET_ENV)
            except rvlib.RunError as e:
                res.check(f"record {name} {kind}", [str(e)])
                break
            if r.problems or r.rv is None:
                res.check(f"record {name} {kind}", r.problems or ["no rvbpfd trace"])
                break
            # run_workload names files by Ruby, workload and mode only: keep this one apart from the next run.
            kept = os.path.join(outdir, f"{ruby.name}-gvl_hog-{kind}.rvtrace")
            os.replace(r.rv.path, kept)
            r.rv.path = kept
            pb = os.path.join(outdir, f"{ruby.name}-gvl_hog-{kind}.pb.gz")
            prof, problem = rvlib.export_pprof(rvbpfd, kept, pb)
            if problem:
                res.check(f"pprof {name} {kind}", [problem])
                break
            runs[kind] = (r.rv, prof, pb)
        if len(runs) == 2:
            (full, full_prof, _), (budget, budget_prof, budget_pb) = runs["complete"], runs["budget"]
            rc, out, err = run([rvbpfd, "inspect", budget.path])
            res.check(f"{name} with --max-overhead 1: the blame still names {HOG}, GVL wait within "
                      f"{MAX_WAIT_ERROR:.0%} of the complete recording",
                      [f"inspect exit {rc}: {err[-1000:]}"] if rc != 0 else
                      check_budgeted(full, full_prof, budget, budget_prof, budget_pb, out))
    for ruby in rubies:
        name = f"{ruby.name} gvl_hog"
        try:
            r = rvlib.run_workload(ruby, "gvl_hog", "attach", outdir, ref=False, rvbpfd=rvbpfd,
                                   rv_args=("--hz", "99"))
        except rvlib.RunError as e:
            res.check(f"record {name}", [str(e)])
            continue
        if r.problems or r.rv is None:
            res.check(f"record {name}", r.problems or ["no rvbpfd trace"])
            continue
        trace = r.rv
        hog = hog_thread(trace)
        if not res.check(f"record {name}: samples in {HOG}",
                         [] if hog is not None else [f"no on-CPU sample has {HOG} as its leaf"]):
            continue
        pb = os.path.join(outdir, f"{ruby.name}-gvl_hog.pb.gz")
        rc, _, err = run([rvbpfd, "export", "--pprof", trace.path, "-o", pb])
        if rc != 0:
            res.check(f"pprof {name}", [f"export exit {rc}: {err[-1000:]}"])
        else:
            with open(pb, "rb") as f:
                prof = pprof_decode.decode(f.read())
            res.check(f"pprof {name}: gvl_blame top is {HOG}, wall sums to the lifetimes",
                      check_pprof(trace, prof, pb, hog))
        rc, out, err = run([rvbpfd, "inspect", trace.path])
        res.check(f"inspect {name}: one screen, {HOG} the top blocker",
                  [f"exit {rc}: {err[-1000:]}"] if rc != 0 else check_inspect(trace, out, hog))
        rc, out, err = run([rvbpfd, "stats", trace.path])
        res.check(f"stats {name}: blame by holder",
                  [f"exit {rc}: {err[-1000:]}"] if rc != 0 else check_stats(trace, out, hog))
        folded = os.path.join(outdir, f"{ruby.name}-gvl_hog.blame.folded")
        rc, _, err = run([rvbpfd, "export", "--folded", "--weight", "gvl_blame", trace.path, "-o", folded])
        if rc != 0:
            res.check(f"folded {name}", [f"export exit {rc}: {err[-1000:]}"])
        else:
            with open(folded) as f:
                res.check(f"folded gvl_blame {name}: {HOG} the heaviest leaf", check_folded(f.read()))
    rvlib.cleanup_outdir(args, outdir)
    res.finish()


if __name__ == "__main__":
    main()
