#!/usr/bin/env python3
"""The fleet agent's GVL contention under its overhead budget (issue 14 item 4), on every test Ruby.

workloads/gvl_hog.rb (HogKlass.spin holds the GVL for test_agent.HOG_SECONDS while four IO threads do pipe round
trips, each ending with a wait for the lock) runs twice under `rvbpfd agent --interval 2 --hz 99 --output-dir`:
  complete  --max-overhead 0: the scheduler sites are never paused; every wait is observed;
  budgeted  --max-overhead 0.01: the budget must pause the sites (the agent logs "tracing paused"), so most waits are
            not observed, but every sample reads the VM's GVL (who holds it, who is queued) and the agent estimates
            the hidden waits from those readings.
For the budgeted run, over the process's output files:
  - rvbpfd_gvl_readings_total > 0 on /metrics (the samples read the GVL in BPF);
  - gvl_wait and gvl_blame carry samples labelled provenance=inferred, and every gvl_blame sample is labelled
    provenance derived or inferred (nothing else);
  - in each interval gvl_blame sums to gvl_wait (observed + estimated, every ns blamed);
  - the heaviest inferred gvl_blame leaf is HogKlass.spin, blamed on one holder that is not main, and its waiters
    are the IO threads (at least two, not the holder);
  - the total GVL wait (observed + estimated) is within 30% of the complete run's (the recorder's 30% target in
    docs/benchmarks.md, here for the agent).
"""
import os
import signal
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pprof_decode  # noqa: E402
import rvlib  # noqa: E402
import test_agent  # noqa: E402

HOG = test_agent.HOG
MAX_WAIT_ERROR = 0.30


def profiles_of(out_dir, pid):
    """{(type, from, until): decoded pprof} of pid's files in --output-dir ("<type>-<pid>-<from>-<until>.pb.gz")."""
    out = {}
    for root, _, names in os.walk(out_dir):
        for n in names:
            if not n.endswith(".pb.gz"):
                continue
            parts = n[: -len(".pb.gz")].rsplit("-", 3)
            if len(parts) != 4 or parts[1] != str(pid):
                continue
            with open(os.path.join(root, n), "rb") as f:
                out[(parts[0], parts[2], parts[3])] = pprof_decode.decode(f.read())
    return out


def run_agent(rvbpfd, ruby, work, name, max_overhead):
    """Runs gvl_hog under an agent; returns (profiles, agent log records, metrics) or raises rvlib.Fatal."""
    out_dir = os.path.join(work, name)
    agent = test_agent.Agent(rvbpfd, ["--output-dir", out_dir, "--interval", str(test_agent.INTERVAL), "--hz", "99",
                                      "--max-overhead", str(max_overhead), "--metrics-listen", "127.0.0.1:0",
                                      "--log-format", "json"])
    hog = None
    try:
        hog = test_agent.HogProc(name, ruby)
        if agent.wait_log(lambda r: r.get("msg") == "process attached" and r.get("pid") == hog.pid, 15) is None:
            raise rvlib.Fatal(f"{name}: the agent did not attach to gvl_hog (pid {hog.pid}) within 15 s")
        hog.go()
        if not hog.finish():
            raise rvlib.Fatal(f"{name}: gvl_hog did not finish: {hog.out.lines[-5:]}")
        metrics = agent.metrics()
        agent.p.send_signal(signal.SIGTERM)
        try:
            agent.p.wait(timeout=30)
        except Exception:  # noqa: BLE001 (a hung agent is this check's failure)
            raise rvlib.Fatal(f"{name}: the agent did not exit within 30 s of SIGTERM")
        return profiles_of(out_dir, hog.pid), agent.records(), metrics
    finally:
        if hog is not None:
            hog.stop()
        agent.stop()


def total_wait(profiles):
    return sum(pprof_decode.total(p, 0) for (t, _, _), p in profiles.items() if t == "gvl_wait")


def check_budgeted(profiles, records, metrics, complete_wait):
    p = []
    paused = [r for r in records if r.get("msg") == "tracing paused"]
    if not paused:
        return ["the agent never logged 'tracing paused': the budget did not pause, so nothing was estimated"]
    readings = sum(v for k, v in metrics.items() if k.startswith("rvbpfd_gvl_readings_total"))
    if readings <= 0:
        p.append(f"rvbpfd_gvl_readings_total is {readings}: the samples did not read the GVL")
    inferred_wait = 0
    leaves, holders, waiters = {}, set(), set()
    for (t, frm, until), prof in sorted(profiles.items()):
        if t == "gvl_wait":
            inferred_wait += sum(s["values"][0] for s in prof["samples"] if s["labels"].get("provenance") == "inferred")
        if t != "gvl_blame":
            continue
        wait = profiles.get(("gvl_wait", frm, until))
        total = pprof_decode.total(prof, 0)
        if wait is None or pprof_decode.total(wait, 0) != total:
            p.append(f"gvl_blame {frm}-{until} sums to {total} ns, that interval's gvl_wait to "
                     f"{None if wait is None else pprof_decode.total(wait, 0)}")
        for s in prof["samples"]:
            prov = s["labels"].get("provenance")
            if prov not in ("derived", "inferred"):
                p.append(f"gvl_blame {frm}-{until}: a sample labelled provenance={prov!r}")
                break
            if prov != "inferred":
                continue
            leaf = s["stack"][0] if s["stack"] else "<none>"
            leaves[leaf] = leaves.get(leaf, 0) + s["values"][0]
            if leaf == HOG:
                holders.add(s["labels"].get("holder"))
                waiters.add(s["labels"].get("waiter"))
    wait = total_wait(profiles)
    inferred = sum(leaves.values())
    print(f"  budgeted: paused {len(paused)} times, {readings:.0f} GVL readings, gvl_wait {wait / 1e6:.1f} ms "
          f"({inferred_wait / 1e6:.1f} ms inferred) against {complete_wait / 1e6:.1f} ms complete; inferred blame "
          f"{inferred / 1e6:.1f} ms, {HOG} holders {sorted(holders)} waiters {sorted(waiters)}")
    if inferred_wait <= 0:
        p.append("no gvl_wait sample is labelled provenance=inferred although the sites were paused")
    p += test_agent.judge_hog_blame(leaves, holders, waiters, "inferred gvl_blame")
    if complete_wait <= 0:
        p.append("the complete run has no GVL wait")
    elif abs(wait - complete_wait) > MAX_WAIT_ERROR * complete_wait:
        p.append(f"budgeted GVL wait {wait / 1e6:.1f} ms is not within {MAX_WAIT_ERROR:.0%} of the complete run's "
                 f"{complete_wait / 1e6:.1f} ms")
    return p


def main():
    args, res, rvbpfd, rubies = rvlib.begin(__doc__)
    work = tempfile.mkdtemp(prefix="rvbpfd-agent-blame-")
    for ruby in rubies:
        try:
            complete, _, _ = run_agent(rvbpfd, ruby, work, f"{ruby.name}-complete", 0)
            budgeted, records, metrics = run_agent(rvbpfd, ruby, work, f"{ruby.name}-budgeted", 0.01)
        except rvlib.Fatal as e:
            res.check(f"{ruby.name}: gvl_hog under the agent", [str(e)])
            continue
        complete_wait = total_wait(complete)
        res.check(f"{ruby.name}: the agent under --max-overhead 0.01 estimates the paused waits from GVL readings and "
                  f"blames {HOG}", check_budgeted(budgeted, records, metrics, complete_wait))
    res.finish(work, getattr(args, "keep", False))


if __name__ == "__main__":
    main()
