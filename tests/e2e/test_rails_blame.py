#!/usr/bin/env python3
"""GVL blame on the real Rails app whatever the sampling rate: two recorders and the fleet agent on one run (issue 47
item 1).

The Rails app of test_rails.py (tests/e2e/apps/rails_app on Debian's Puma and ruby3.3, thread pool of 8, in new pid and
mount namespaces in the trixie root) is observed at once by three rvbpfd instances attached before its boot:
  - `rvbpfd --pid --hz 0`  (no on-CPU samples: blame comes only from the holder stacks that contended READYs carry),
  - `rvbpfd --pid --hz 99`,
  - `rvbpfd agent --hz 19` (the agent's default rate; --max-overhead 0 so that no wait is estimated instead of seen;
    --include label:service=... so it profiles only this app),
while 8 keep-alive loopback clients send test_rails' mix (~20 ms of pure-Ruby work in LedgerCruncher.reconcile, queries,
sleeps, a contended Mutex). test_rails.py checks the recorder at --hz 19.

Checks: in each recorder's `export --pprof` and in the agent's gvl_blame profiles of the app's pid (summed over its
intervals), LedgerCruncher.reconcile is in the stacks of at least half of all gvl_blame: a hold that got no sample is
charged to what the holder ran when the waiter arrived, not to IO#wait_readable where it later released the lock.
"""
import http.client
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import applib  # noqa: E402
import rvlib  # noqa: E402
import test_agent  # noqa: E402
import test_agent_blame  # noqa: E402
import test_rails  # noqa: E402

SERVICE = "rvbpfd-rails-blame"
ACTION = "LedgerCruncher.reconcile"
RECORDER_HZ = (0, 99)


def attach_recorder(rvbpfd, app, hz, cache):
    """`rvbpfd --pid` at `hz`, once it printed "attached"; returns (Popen, LineReader, trace path)."""
    out = os.path.join(app.container.workdir, f"rails-hz{hz}.rvtrace")
    p = subprocess.Popen([rvbpfd, "--pid", str(app.host_pid), "-o", out, "--hz", str(hz), "--cache-dir", cache],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = rvlib.LineReader(p.stderr)
    line = err.wait_for(lambda l: l.startswith("rvbpfd: attached"), 90)
    if line is None:
        p.kill()
        raise rvlib.RunError(f"rvbpfd --hz {hz} did not attach within 90 s (exit {p.poll()}): {err.text()[-2000:]}")
    print(f"  --hz {hz}: {line}")
    return p, err, out


def share_problems(what, total, action):
    print(f"  {what}: gvl_blame {total / 1e6:.1f} ms, {ACTION} in the stacks of {100.0 * action / max(total, 1):.1f}%")
    if total <= 0:
        return [f"{what}: no gvl_blame at all"]
    return [] if action >= total / 2 else [
        f"{what}: {ACTION} is in the stacks of {action / 1e6:.1f} ms of {total / 1e6:.1f} ms of gvl_blame (want at "
        f"least half)"]


def recorder_problems(rvbpfd, hz, path):
    prof, problem = rvlib.export_pprof(rvbpfd, path, path + ".pb.gz")
    if problem:
        return [problem]
    i = [t for t, _ in prof["sample_types"]].index("gvl_blame")
    total = sum(s["values"][i] for s in prof["samples"])
    action = sum(s["values"][i] for s in prof["samples"] if ACTION in s["stack"])
    return share_problems(f"recorder --hz {hz}", total, action)


def agent_problems(out_dir, pid):
    total = action = 0
    for (t, _, _), prof in test_agent_blame.profiles_of(out_dir, pid).items():
        if t != "gvl_blame":
            continue
        for s in prof["samples"]:
            total += s["values"][0]
            if ACTION in s["stack"]:
                action += s["values"][0]
    return share_problems("agent --hz 19", total, action)


def run(rvbpfd, container, apps, res):
    port = rvlib.free_port()
    cache = os.path.join(container.workdir, "cache")
    agent_dir = os.path.join(container.workdir, "agent")
    app = applib.App(container, "rails", f"{apps}/rails_app/serve.rb",
                     ["-t", f"{test_rails.PUMA_THREADS}:{test_rails.PUMA_THREADS}", "-b", f"tcp://127.0.0.1:{port}",
                      "-C", f"{apps}/rails_app/puma.rb", f"{apps}/rails_app/config.ru"],
                     {"RAILS_ENV": "production", "RACK_ENV": "production", "RVBPF_SERVICE": SERVICE,
                      "LEDGER_DB": container.inside(container.workdir) + "/ledger.sqlite3"})
    recorders, agent = [], None
    try:
        app.start()
        # One at a time: the first analyses the VM binary into the shared cache, the others find it there.
        for hz in RECORDER_HZ:
            recorders.append((hz, *attach_recorder(rvbpfd, app, hz, cache)))
        agent = test_agent.Agent(rvbpfd, ["--output-dir", agent_dir, "--interval", str(test_agent.INTERVAL),
                                          "--hz", "19", "--max-overhead", "0", "--include", f"label:service={SERVICE}",
                                          "--cache-dir", cache, "--metrics-listen", "127.0.0.1:0",
                                          "--log-format", "json"])
        if agent.wait_log(lambda r: r.get("msg") == "process attached" and r.get("pid") == app.host_pid, 60) is None:
            raise rvlib.RunError(f"the agent did not attach to Puma (host pid {app.host_pid}) within 60 s: "
                                 + "\n".join(agent.log.lines[-10:]))
        app.go()
        if not applib.wait_port(port, app.proc, 90):
            raise rvlib.RunError(f"puma did not listen on 127.0.0.1:{port} within 90 s; {app.stderr()}")
        errors, counts = [], {}
        t_load = time.monotonic()
        test_rails.load(port, errors, counts)
        print(f"  load: {sum(counts.values())} requests {counts} in {time.monotonic() - t_load:.1f} s")
        res.check("rails_blame: every request answered 200", errors)
        os.kill(app.host_pid, signal.SIGTERM)
        if app.out.wait_for(lambda l: l == "done", 60) is None:
            raise rvlib.RunError(f"puma did not stop within 60 s of SIGTERM; {app.stderr()}")
        app.proc.wait(60)
        for hz, p, err, out in recorders:
            rc = p.wait(60)
            problems = [f"rvbpfd --hz {hz} exited {rc}: {err.text()[-2000:]}"] if rc != 0 else []
            res.check(f"rails_blame: recorder --hz {hz}: {ACTION} has at least half of gvl_blame",
                      problems or recorder_problems(rvbpfd, hz, out))
        agent.p.send_signal(signal.SIGTERM)
        agent.p.wait(timeout=30)
        res.check(f"rails_blame: agent --hz 19: {ACTION} has at least half of the pushed gvl_blame",
                  agent_problems(agent_dir, app.host_pid))
    finally:
        for _, p, _, _ in recorders:
            applib.terminate(p)
        if agent is not None:
            agent.stop()
        app.close()


def main():
    started = time.monotonic()
    args, res, rvbpfd, container, apps = applib.begin(__doc__)
    try:
        run(rvbpfd, container, apps, res)
    except (rvlib.RunError, rvlib.Fatal, OSError, http.client.HTTPException, subprocess.TimeoutExpired) as e:
        res.check("rails_blame: run", [str(e)])
    finally:
        container.cleanup(args.keep)
        print(f"wall time {time.monotonic() - started:.1f} s")
    res.finish()


if __name__ == "__main__":
    main()
