#!/usr/bin/env python3
"""GVL blame from the contention itself (issue 47 item 1) on workloads/holder_work.rb, every test Ruby.

holder_work: the cruncher runs Ledger.crunch (pure-Ruby CPU work, ~10-20 ms a round) and then gives the GVL up in
Pause.rest (Kernel#sleep, 2 ms); three threads do pipe round trips meanwhile, each ending with a wait for the lock.
Without an observation of the holder inside a hold, blame falls back to the stack of the release that ended it,
Kernel#sleep < Pause.rest: after the work. Recorded in attach mode at --hz 0 (no samples at all) and --hz 19 (the
fleet agent's rate: most holds get no sample). For each:
  trace:   the summary counts holder_stacks; wants_gvl events carry `holder` and `holder_stack`, and those naming the
           cruncher have stacks with Ledger.crunch as leaf (the READY walked the holder's own frames);
  pprof:   gvl_blame samples whose leaf is Ledger.crunch hold at least half of all blame (today's rule gave Ledger.crunch
           nothing at --hz 0, only the sampled holds' share at --hz 19), labelled blame_source=contention for some;
           gvl_blame still sums to gvl_wait;
  inspect: the top blocker is Ledger.crunch.
The fleet agent (`rvbpfd agent --hz 19 --output-dir`) on the same workload: its pushed gvl_blame profiles, summed over
the intervals, give Ledger.crunch at least half of all blame (the agent's streaming Attribution, DrainBlame included).
"""
import os
import re
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rvlib  # noqa: E402
import test_agent  # noqa: E402
import test_agent_blame  # noqa: E402

WORK = "Ledger.crunch"
RELEASE = "Pause.rest"
MIN_SHARE = 0.5  # of all gvl_blame, on WORK


def cruncher(trace):
    """The ruby_thread whose gvl_released stacks pass through Pause.rest (None when none does)."""
    for e in trace.events:
        if e.get("event") == "gvl_released" and RELEASE in trace.stack_labels(e):
            return e.get("ruby_thread")
    return None


def holder_labels(trace, e):
    return [trace.frames[f].get("label") for f in trace.stacks.get(e.get("holder_stack"), [])]


def check_trace(trace):
    p = list(trace.problems[:5])
    if not trace.summary.get("holder_stacks"):
        p.append(f"summary holder_stacks is {trace.summary.get('holder_stacks')!r}: no contended READY carried a stack")
    crunch = cruncher(trace)
    if crunch is None:
        return p + [f"no gvl_released stack passes through {RELEASE}: the workload did not run as designed"]
    contended = [e for e in trace.events if e.get("event") == "wants_gvl" and "holder_stack" in e]
    on_cruncher = [e for e in contended if e.get("holder") == crunch]
    print(f"  {len(contended)} contended wants_gvl, {len(on_cruncher)} of them found the cruncher holding")
    if not on_cruncher:
        return p + [f"no wants_gvl names the cruncher (thread {crunch}) as holder"]
    leaves = [holder_labels(trace, e)[:1] for e in on_cruncher]
    in_work = sum(1 for leaf in leaves if leaf == [WORK])
    if in_work < len(on_cruncher) / 2:
        p.append(f"of {len(on_cruncher)} holder stacks of the cruncher only {in_work} have leaf {WORK}; some: "
                 f"{[holder_labels(trace, e)[:3] for e in on_cruncher[:5]]}")
    if any(e.get("holder") == e.get("ruby_thread") for e in contended):
        p.append("a wants_gvl names its own thread as the holder")
    return p


def check_pprof(prof):
    names = [t for t, _ in prof["sample_types"]]
    if "gvl_blame" not in names or "gvl_wait" not in names:
        return [f"no gvl_blame / gvl_wait sample types in {names}"]
    i_blame, i_wait = names.index("gvl_blame"), names.index("gvl_wait")
    total = sum(s["values"][i_blame] for s in prof["samples"])
    wait = sum(s["values"][i_wait] for s in prof["samples"])
    by_leaf = {}
    for s in prof["samples"]:
        v = s["values"][i_blame]
        if v and s["stack"]:
            by_leaf[s["stack"][0]] = by_leaf.get(s["stack"][0], 0) + v
    work = by_leaf.get(WORK, 0)
    top = sorted(by_leaf.items(), key=lambda kv: -kv[1])[:4]
    print(f"  gvl_blame {total / 1e6:.1f} ms, {WORK} {100.0 * work / max(total, 1):.1f}%; top leaves "
          f"{[(k, round(100.0 * v / max(total, 1), 1)) for k, v in top]}")
    p = []
    if total <= 0:
        return ["no gvl_blame at all: the contenders never waited"]
    if total != wait:
        p.append(f"gvl_blame sums to {total} ns, gvl_wait to {wait} ns")
    if work < MIN_SHARE * total:
        p.append(f"{WORK} has {100.0 * work / total:.1f}% of gvl_blame (want at least {MIN_SHARE:.0%}); top leaves {top}")
    if not any(s["labels"].get("blame_source") == "contention" and s["values"][i_blame] > 0 for s in prof["samples"]):
        p.append("no gvl_blame sample is labelled blame_source=contention")
    return p


def check_inspect(out):
    lines = out.splitlines()
    try:
        i = next(i for i, l in enumerate(lines) if l.startswith("top blockers"))
    except StopIteration:
        return [f"no 'top blockers' section:\n{out[-2000:]}"]
    first = lines[i + 1] if i + 1 < len(lines) else ""
    return [] if re.search(rf"(?<![\w.]){re.escape(WORK)}(?!\w)", first) else [
        f"top blocker line {first.strip()!r} does not name {WORK}"]


def agent_blame(rvbpfd, ruby, work):
    """Runs holder_work under `rvbpfd agent --hz 19`; returns (problems, {leaf: ns} of its gvl_blame profiles)."""
    out_dir = os.path.join(work, ruby.name)
    agent = test_agent.Agent(rvbpfd, ["--output-dir", out_dir, "--interval", str(test_agent.INTERVAL), "--hz", "19",
                                      "--max-overhead", "0", "--log-format", "json"])
    proc = None
    try:
        env = dict(os.environ)
        env.update(getattr(ruby, "env", {}))
        proc = subprocess.Popen([ruby.bin, rvlib.workload_path("holder_work")], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        out = rvlib.LineReader(proc.stdout)
        if out.wait_for(lambda l: l.startswith("ready"), 30) is None:
            return [f"holder_work did not start: {proc.stderr.read()[:500]!r}"], {}
        if agent.wait_log(lambda r: r.get("msg") == "process attached" and r.get("pid") == proc.pid, 15) is None:
            return [f"the agent did not attach to holder_work (pid {proc.pid}) within 15 s"], {}
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        if out.wait_for(lambda l: l.startswith("done"), 60) is None:
            return ["holder_work did not finish under the agent"], {}
        proc.wait(timeout=20)
        agent.p.send_signal(signal.SIGTERM)
        agent.p.wait(timeout=30)
        leaves = {}
        for (t, _, _), prof in test_agent_blame.profiles_of(out_dir, proc.pid).items():
            if t != "gvl_blame":
                continue
            for smp in prof["samples"]:
                leaf = smp["stack"][0] if smp["stack"] else "<none>"
                leaves[leaf] = leaves.get(leaf, 0) + smp["values"][0]
        return [], leaves
    except (subprocess.TimeoutExpired, OSError) as e:
        return [f"agent run: {e}"], {}
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        agent.stop()


def check_agent(leaves):
    total = sum(leaves.values())
    work = leaves.get(WORK, 0)
    top = sorted(leaves.items(), key=lambda kv: -kv[1])[:4]
    print(f"  agent gvl_blame {total / 1e6:.1f} ms, {WORK} {100.0 * work / max(total, 1):.1f}%; top leaves "
          f"{[(k, round(100.0 * v / max(total, 1), 1)) for k, v in top]}")
    if total <= 0:
        return ["the agent pushed no gvl_blame"]
    return [] if work >= MIN_SHARE * total else [
        f"{WORK} has {100.0 * work / total:.1f}% of the agent's gvl_blame (want at least {MIN_SHARE:.0%}); top {top}"]


def main():
    args, res, rvbpfd, rubies = rvlib.begin(__doc__)
    outdir = rvlib.make_outdir(args, "holder_blame")
    for ruby in rubies:
        for hz in (0, 19):
            name = f"{ruby.name} holder_work --hz {hz}"
            try:
                r = rvlib.run_workload(ruby, "holder_work", "attach", outdir, ref=False, rvbpfd=rvbpfd,
                                       rv_args=("--hz", str(hz)))
            except rvlib.RunError as e:
                res.check(f"record {name}", [str(e)])
                continue
            if r.problems or r.rv is None:
                res.check(f"record {name}", r.problems or ["no rvbpfd trace"])
                continue
            kept = os.path.join(outdir, f"{ruby.name}-holder_work-hz{hz}.rvtrace")
            os.replace(r.rv.path, kept)
            trace = rvlib.Trace(kept)
            res.check(f"trace {name}: contended wants_gvl carry the holder's stack, in {WORK}", check_trace(trace))
            pb = os.path.join(outdir, f"{ruby.name}-holder_work-hz{hz}.pb.gz")
            prof, problem = rvlib.export_pprof(rvbpfd, kept, pb)
            res.check(f"pprof {name}: {WORK} has at least {MIN_SHARE:.0%} of gvl_blame",
                      [problem] if problem else check_pprof(prof))
            p = subprocess.run([rvbpfd, "inspect", kept], capture_output=True, timeout=120)
            out = p.stdout.decode("utf-8", "replace")
            res.check(f"inspect {name}: {WORK} the top blocker",
                      [f"exit {p.returncode}: {p.stderr.decode('utf-8', 'replace')[-1000:]}"] if p.returncode != 0
                      else check_inspect(out))
        problems, leaves = agent_blame(rvbpfd, ruby, os.path.join(outdir, "agent"))
        res.check(f"agent {ruby.name} holder_work --hz 19: {WORK} has at least {MIN_SHARE:.0%} of the pushed gvl_blame",
                  problems or check_agent(leaves))
    rvlib.cleanup_outdir(args, outdir)
    res.finish()


if __name__ == "__main__":
    main()
