#!/usr/bin/env python3
"""GVL blame on the real Rails app whatever the sampling rate: two recorders and two fleet agents on one run (issue 47
item 1).

The Rails app of test_rails.py (tests/e2e/apps/rails_app on Debian's Puma and ruby3.3, thread pool of 8, in new pid and
mount namespaces in the trixie root) is observed at once by three rvbpfd instances attached before its boot:
  - `rvbpfd --pid --hz 0`  (no on-CPU samples: blame comes only from the holder stacks that contended READYs carry),
  - `rvbpfd --pid --hz 99`,
  - `rvbpfd agent` at --hz 19 (its default rate) and 99: two agents (the agent has no --hz 0: it always samples;
    --max-overhead 0 so that no wait is estimated instead of seen; --include label:service=... so each profiles
    only this app),
while 8 keep-alive loopback clients send test_rails' mix (~20 ms of pure-Ruby work in LedgerCruncher.reconcile, queries,
sleeps, a contended Mutex). test_rails.py checks the recorder at --hz 19.

Checks:
  - in each recorder's `export --pprof` and in each agent's gvl_blame profiles of the app's pid (summed over its
    intervals), LedgerCruncher.reconcile is in the stacks of at least half of all gvl_blame: a hold that got no sample
    is charged to what the holder ran when the waiter arrived, not to IO#wait_readable where it later released the lock;
  - one reason per release (issue 47 item 2): every row of `inspect`'s top blocked stacks (--hz 99 trace) has the
    reason the trace's gvl_released events of that stack carry, and Puma's reactor thread (NIO::Selector#select <
    Puma::Reactor#select_loop) is listed as io, whose releases all say io;
  - compact traces (issue 47 item 4): each recorder's .rvtrace, boot included, takes at most 60 bytes per event.
"""
import re
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
AGENT_HZ = (19, 99)
MAX_BYTES_PER_EVENT = 60
REACTOR = ("NIO::Selector#select", "Puma::Reactor#select_loop")
# inspect's reason names -> the trace's (src/trace/release_reason.cc: "sleep" is written, "sleeping" shown).
TRACE_REASON = {"sleeping": "sleep", "waiting_mutex": "mutex"}
BLOCKED_ROW = re.compile(r"^  (\S+)\s+([\d.]+) ms\s+\d+ threads?\s+(.*)$")


def attach_recorder(rvbpfd, app, hz, cache, hold):
    """`rvbpfd --pid` at `hz`, once it printed "attached"; returns (Popen, LineReader, trace path). One process is
    traced by one tracer at most: only the first recorder holds it (--hold)."""
    out = os.path.join(app.container.workdir, f"rails-hz{hz}.rvtrace")
    p = subprocess.Popen([rvbpfd, "--pid", str(app.host_pid), "-o", out, "--hz", str(hz), "--cache-dir", cache,
                          "--hold", "on" if hold else "off"],
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


def size_problems(hz, path):
    trace = rvlib.Trace(path)
    size, events = os.path.getsize(path), len(trace.events)
    print(f"  --hz {hz}: {size} bytes, {events} events: {size / max(events, 1):.1f} bytes per event")
    return [] if events > 0 and size <= MAX_BYTES_PER_EVENT * events else [
        f"--hz {hz}: {size} bytes for {events} events (want at most {MAX_BYTES_PER_EVENT} bytes per event)"]


def reason_problems(rvbpfd, path):
    """inspect's top blocked stacks against the reasons of the trace's gvl_released events of the same stacks."""
    p = subprocess.run([rvbpfd, "inspect", path], capture_output=True, timeout=120)
    out = p.stdout.decode("utf-8", "replace")
    if p.returncode != 0:
        return [f"inspect exited {p.returncode}: {p.stderr.decode('utf-8', 'replace')[-1000:]}"]
    lines = out.splitlines()
    try:
        start = next(i for i, l in enumerate(lines) if l.startswith("top blocked stacks"))
    except StopIteration:
        return [f"inspect has no top blocked stacks section:\n{out[-2000:]}"]
    trace = rvlib.Trace(path)
    by_prefix = {}
    for e in trace.named(("gvl_released",)):
        labels = trace.stack_labels(e)
        by_prefix.setdefault(tuple(labels[:2]), set()).add(e.get("reason"))
    problems, rows = [], 0
    reactor = None
    for line in lines[start + 1:]:
        m = BLOCKED_ROW.match(line)
        if not m:
            break
        rows += 1
        shown, where = m.group(1), tuple(m.group(3).split(" < "))
        want = TRACE_REASON.get(shown, shown)
        got = by_prefix.get(where, set())
        if want not in got:
            problems.append(f"inspect lists {' < '.join(where)} as {shown}; the trace's releases there say "
                            f"{sorted(str(r) for r in got) or 'nothing (no such stack)'}")
        if where == REACTOR:
            reactor = shown
    print(f"  inspect: {rows} blocked stacks compared with the trace's reasons; the reactor thread: {reactor}")
    if rows == 0:
        problems.append("inspect's top blocked stacks section has no rows")
    if reactor != "io":
        problems.append(f"Puma's reactor ({' < '.join(REACTOR)}) is listed as {reactor!r}, not io")
    if by_prefix.get(REACTOR, {"io"}) != {"io"}:
        problems.append(f"the reactor's releases say {sorted(map(str, by_prefix[REACTOR]))}, not only io")
    return problems


def agent_problems(out_dir, pid, hz):
    total = action = 0
    for (t, _, _), prof in test_agent_blame.profiles_of(out_dir, pid).items():
        if t != "gvl_blame":
            continue
        for s in prof["samples"]:
            total += s["values"][0]
            if ACTION in s["stack"]:
                action += s["values"][0]
    return share_problems(f"agent --hz {hz}", total, action)


def run(rvbpfd, container, apps, res):
    port = rvlib.free_port()
    cache = os.path.join(container.workdir, "cache")
    agent_dir = os.path.join(container.workdir, "agent")  # one subdirectory per agent
    app = applib.App(container, "rails", f"{apps}/rails_app/serve.rb",
                     ["-t", f"{test_rails.PUMA_THREADS}:{test_rails.PUMA_THREADS}", "-b", f"tcp://127.0.0.1:{port}",
                      "-C", f"{apps}/rails_app/puma.rb", f"{apps}/rails_app/config.ru"],
                     {"RAILS_ENV": "production", "RACK_ENV": "production", "RVBPF_SERVICE": SERVICE,
                      "LEDGER_DB": container.inside(container.workdir) + "/ledger.sqlite3"})
    recorders, agents = [], []
    try:
        app.start()
        # One at a time: the first analyses the VM binary into the shared cache, the others find it there.
        for hz in RECORDER_HZ:
            recorders.append((hz, *attach_recorder(rvbpfd, app, hz, cache, hold=not recorders)))
        for hz in AGENT_HZ:
            agent = test_agent.Agent(rvbpfd, ["--output-dir", os.path.join(agent_dir, str(hz)), "--interval",
                                              str(test_agent.INTERVAL), "--hz", str(hz), "--max-overhead", "0",
                                              "--include", f"label:service={SERVICE}", "--cache-dir", cache,
                                              "--metrics-listen", "127.0.0.1:0", "--log-format", "json"])
            agents.append((hz, agent))
            if agent.wait_log(lambda r: r.get("msg") == "process attached" and r.get("pid") == app.host_pid,
                              60) is None:
                raise rvlib.RunError(f"the agent --hz {hz} did not attach to Puma (host pid {app.host_pid}) within "
                                     f"60 s: " + "\n".join(agent.log.lines[-10:]))
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
            res.check(f"rails_blame: recorder --hz {hz}: at most {MAX_BYTES_PER_EVENT} bytes per event",
                      problems or size_problems(hz, out))
            if hz == RECORDER_HZ[-1]:
                res.check("rails_blame: inspect's blocked stacks carry the trace's reasons; the reactor is io",
                          problems or reason_problems(rvbpfd, out))
        for hz, agent in agents:
            agent.p.send_signal(signal.SIGTERM)
        for hz, agent in agents:
            agent.p.wait(timeout=30)
            res.check(f"rails_blame: agent --hz {hz}: {ACTION} has at least half of the pushed gvl_blame",
                      agent_problems(os.path.join(agent_dir, str(hz)), app.host_pid, hz))
    finally:
        for _, p, _, _ in recorders:
            applib.terminate(p)
        for _, agent in agents:
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
