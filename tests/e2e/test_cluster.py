#!/usr/bin/env python3
"""The Rails app of test_rails.py on Puma in cluster mode (`-w 2`, preload_app!), under Debian's own ruby3.3 in its
pid+mount namespace root, followed by rvbpfd from before the boot and from after the workers exist (issue 46 item 6).

tests/e2e/apps/rails_app/puma_cluster.rb: the master loads the app and forks two workers, each with a pool of
PUMA_THREADS threads; each worker loads the in-process reference recorder (rvref) itself in on_worker_boot, writing
its own file when it exits (the master does not load it: applib.App(rvref=False)). Loopback clients on the host send
test_rails' request mix (LedgerCruncher, ActiveRecord, sleeps, a contended Mutex); SIGTERM to the master stops the
cluster gracefully.

  boot    `rvbpfd --pid MASTER --follow` attaches while the master waits before requiring Puma (the serve.rb
          protocol of test_rails), so the Rails boot in the master is recorded and both workers are forked after the
          attach: what launch mode's following does for a forking server, from the master's first line of Puma on.
          (Launch mode itself cannot start this command: its root, unshare, is not Ruby, and rvbpfd plans a launch
          from the launched executable's VM.)
  attach  the cluster is started alone; once both workers have booted, `rvbpfd --pid MASTER --follow` attaches; then
          the first worker that booted gets SIGTERM, and the master forks its replacement after the attach.

Checks, in each mode:
  - processes: the master (its host pid, traced, with its Ruby version) and, as the master's children in the trace
    (`parent`), exactly the workers Puma logged, by host pid (namespace pids mapped through /proc); in attach mode the
    two there at the attach have no `cause` and t_ns 0, the re-forked worker has cause fork; every worker has a
    process_end;
  - every worker that served requests: its threads have scheduler events, its stacks at release inside actions name
    LedgerController# frames and hold no <unresolved frame, and its releases in Kernel#sleep under LedgerController#nap
    are 50 to 100 frames deep;
  - per worker, scheduler, GC and probe events identical to that worker's own reference per thread (rvlib's
    comparison on the worker's part of the trace, threads paired by rb_thread_t since the reference loads after
    Puma's first worker thread; namespace tids one to one; probes by rule MUTEX_LOCK_WORKER; a worker there at the
    attach from its first event, rule ATTACH_ADOPTION); a worker that Puma
    killed at shutdown wrote none (rule WORKER_SHUTDOWN_HANG); in boot mode the master's part holds rvbpfd's trace
    invariants.

Then the fleet agent: `rvbpfd agent --interval 1 --include label:service=e2e-cluster` pushing to fake_pyroscope, the
cluster started after it (RVBPF_SERVICE=e2e-cluster, inherited by the workers) and under the same load. Checked: the
master and both workers have uploads with their host pid, `parent_pid` (the workers': the master's pid; the
master's: the namespace init's) and `process_role` (`worker` on every worker upload; `master` on the master's once
its workers were profiled, none on its boot's interval: the role is derived at each cut), and a worker's cpu profile
names LedgerCruncher.reconcile.
"""
import glob
import os
import re
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import applib  # noqa: E402
import fake_pyroscope  # noqa: E402
import rvlib  # noqa: E402
import test_agent  # noqa: E402  (its Agent driver and upload decoding)
import test_rails  # noqa: E402  (its loopback clients: get, load)

PUMA_THREADS = 4
WORKERS = 2
DEPTH = (50, 100)
AGENT_SERVICE = "e2e-cluster"
# Rule WORKER_SHUTDOWN_HANG: a Puma 6.6 worker under Debian's ruby 3.3 sometimes never finishes its graceful shutdown:
# its server thread waits forever in IO#close of its wakeup pipe (Puma::Server#handle_servers; rb_io_close waiting in
# rb_mutex_sleep for a thread it believes blocked on that fd), and the master SIGKILLs it after
# worker_shutdown_timeout, before rvref can write its file. Seen without rvbpfd (4 of 7 workers forked by the
# master's loop, after a worker's exit or on SIGTTIN) and with it (4 of 16 workers forked at boot). So puma_cluster.rb
# has each worker exit through its main thread (SystemExit: the at_exit handlers run) one second after its pool's
# threads are gone, and a worker killed all the same is recognised in rvbpfd's trace by threads that never exited:
# each other worker must have written its reference, and at least one worker per run is compared.
WORKER_SHUTDOWN_HANG_RULE = ("WORKER_SHUTDOWN_HANG: a Puma worker can hang in IO#close at shutdown (seen without "
                             "rvbpfd) and be killed by its master before its reference is written")
# Rule ATTACH_ADOPTION: a worker already running when rvbpfd attaches with --follow is found by a /proc walk after
# the recording started (28 ms per worker on a loaded machine here) and its events are recorded only some time after
# that (here the reference's events at 62 ms were missing, the next ones at 316 ms present), while its process line
# says t_ns 0: the trace does not say from when such a process is complete. It is compared from its first event in
# rvbpfd's trace.
BOOTED = re.compile(r"- Worker (\d+) \(PID: (\d+)\) booted")


class Cluster:
    """The application's run: the App, its port, and the workers Puma logged (index, namespace pid, host pid)."""

    def __init__(self, container, apps, mode, env=None):
        self.mode = mode
        self.port = rvlib.free_port()
        self.ref_dir = os.path.join(container.workdir, f"refs-{mode}")
        os.makedirs(self.ref_dir)
        os.chmod(self.ref_dir, 0o777)
        self.app = applib.App(container, f"cluster-{mode}", f"{apps}/rails_app/serve.rb",
                              ["-t", f"{PUMA_THREADS}:{PUMA_THREADS}", "-b", f"tcp://127.0.0.1:{self.port}", "-C",
                               f"{apps}/rails_app/puma_cluster.rb", f"{apps}/rails_app/config.ru"],
                              {"RAILS_ENV": "production", "RACK_ENV": "production",
                               "LEDGER_DB": container.inside(container.workdir) + f"/ledger-{mode}.sqlite3",
                               "RVREF_WORKER_DIR": container.inside(self.ref_dir), **(env or {})},
                              rvref=False)
        self.workers = []  # (index, namespace pid, host pid) in the order Puma logged them

    def wait_booted(self, count, timeout=120):
        """Until Puma has logged `count` booted workers in all; maps each one's namespace pid to its host pid."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            booted = [BOOTED.search(l) for l in self.app.out.lines]
            booted = [(int(m[1]), int(m[2])) for m in booted if m]
            for index, nspid in booted[len(self.workers):count]:
                host = next((c for c in applib.children(self.app.host_pid) if applib.ns_pid(c) == nspid), None)
                if host is None:
                    raise rvlib.RunError(f"worker {index} (namespace pid {nspid}) is not a child of the master")
                self.workers.append((index, nspid, host))
            if len(self.workers) >= count:
                return
            if self.app.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise rvlib.RunError(f"{len(self.workers)} of {count} workers booted within {timeout} s; {self.app.stderr()}")

    def stop(self):
        """SIGTERM to the master: it stops its workers and exits 0 from its signal handler (Puma's cluster mode), so
        serve.rb's "done" is never printed; App.finish waits for the exit."""
        self.t_stop = time.monotonic()
        os.kill(self.app.host_pid, signal.SIGTERM)
        return self.app.finish(60)


def serve(c, res):
    """Loopback load (test_rails' clients) once the port listens."""
    if not applib.wait_port(c.port, c.app.proc, 90):
        raise rvlib.RunError(f"puma did not listen on 127.0.0.1:{c.port} within 90 s; {c.app.stderr()}")
    errors, counts = [], {}
    t = time.monotonic()
    test_rails.load(c.port, errors, counts)
    print(f"  load: {sum(counts.values())} requests {counts} in {time.monotonic() - t:.1f} s")
    res.check(f"{c.mode}: every request answered 200", errors)


def run_boot(rvbpfd, container, apps, res, rv_args):
    c = Cluster(container, apps, "boot")
    c.app.start()
    c.app.attach(rvbpfd, ("--follow", *rv_args))  # before Puma is required: every worker is forked after it
    c.app.go()
    c.wait_booted(WORKERS)
    serve(c, res)
    return c, c.stop()


def run_attach(rvbpfd, container, apps, res, rv_args):
    c = Cluster(container, apps, "attach")
    c.app.start()
    c.app.go()
    c.wait_booted(WORKERS)
    c.app.attach(rvbpfd, ("--follow", *rv_args))
    # A second after the attach: a worker there at the attach is recorded only from its adoption on (rule
    # ATTACH_ADOPTION), and a stop racing that would leave only the end of its shutdown to compare.
    time.sleep(1)
    os.kill(c.workers[0][2], signal.SIGTERM)  # the first worker that booted: the master forks its replacement
    c.wait_booted(WORKERS + 1)
    serve(c, res)
    return c, c.stop()


def process_problems(c, rv):
    """The master and exactly Puma's workers, as the master's children; returns (problems, worker process ids by host
    pid)."""
    p = []
    masters = [pr for pr in rv.processes.values() if pr.get("pid") == c.app.host_pid and pr.get("ruby_version")]
    if len(masters) != 1:
        return [f"{len(masters)} traced processes with the master's pid {c.app.host_pid}: {rv.processes}"], {}
    master = masters[0]
    if not str(master["ruby_version"]).startswith("3.3"):
        p.append(f"the master's process line {master}: expected Debian's ruby 3.3")
    kids = {pr.get("pid"): pr for pr in rv.processes.values() if pr.get("parent") == master["id"]}
    want = sorted(host for _, _, host in c.workers)
    if sorted(kids) != want:
        p.append(f"the master's children in the trace have pids {sorted(kids)}, Puma's workers {want}")
    for i, (index, _, host) in enumerate(c.workers):
        pr = kids.get(host)
        if pr is None:
            continue
        present = c.mode == "attach" and i < WORKERS  # there at the attach
        want_line = {"cause": None, "t_ns": 0} if present else {"cause": "fork"}
        got = {k: pr.get(k) for k in want_line}
        if got != want_line or pr.get("ruby_version") != master["ruby_version"]:
            p.append(f"worker {index} (pid {host}) is {pr}: expected {want_line} and the master's Ruby version")
        if pr["id"] not in rv.process_ends:
            p.append(f"worker {index} (pid {host}) has no process_end")
    print(f"  processes: master {master['id']} (pid {master['pid']}), workers "
          f"{[(kids[h]['id'], h) for h in want if h in kids]}; {len(rv.processes)} processes in the trace")
    return p, {h: kids[h]["id"] for h in want if h in kids}


def request_problems(rv, worker_ids):
    """Every worker that served requests: scheduler events, Rails frames at release, nothing unresolved, /nap's sleeps
    DEPTH deep. At least one worker per mode must have served (the kernel spreads connections; both usually do)."""
    p, served = [], 0
    for host, pid in sorted(worker_ids.items()):
        view = rvlib.process_view(rv, pid)
        sched = [e for e in view.events if e.get("event") in ("gvl_acquired", "gvl_released")]
        req = [e for e in view.named(("gvl_released",))
               if any(label.startswith("LedgerController#") for label in view.stack_labels(e))]
        if not req:
            print(f"  worker pid {host}: {len(sched)} scheduler events, served no request")
            continue
        served += 1
        bad = sorted({label for e in req for label in view.stack_labels(e) if label.startswith(applib.UNRESOLVED)})
        if bad:
            p.append(f"worker pid {host}: {len(bad)} distinct <unresolved frames in request stacks: {bad[:5]}")
        naps = [len(view.stack_frames(e)) for e in req if view.stack_labels(e)[:1] == ["Kernel#sleep"] and
                "LedgerController#nap" in view.stack_labels(e)]
        if not naps or not all(DEPTH[0] <= d <= DEPTH[1] for d in naps):
            p.append(f"worker pid {host}: Kernel#sleep in LedgerController#nap at depths {sorted(set(naps))}, "
                     f"expected {DEPTH[0]}..{DEPTH[1]}")
        threads = {e.get("ruby_thread") for e in sched}
        print(f"  worker pid {host}: {len(sched)} scheduler events on {len(threads)} threads, {len(req)} releases in "
              f"actions, /nap sleeps {min(naps, default=0)}..{max(naps, default=0)} frames deep, "
              f"{len(bad)} unresolved")
    if not served:
        p.append("no worker's stacks name a LedgerController# action")
    return p


def hung(rv, process_id):
    """A process whose threads other than main did not all exit (rule WORKER_SHUTDOWN_HANG)."""
    view = rvlib.process_view(rv, process_id)
    exited = {e.get("ruby_thread") for e in view.named(("thread_exited",))}
    return any(not o.get("main") and t not in exited for t, o in view.threads.items())


def reference_problems(c, rv, worker_ids):
    """Each worker's events against its own reference (the file it wrote at exit, named by its namespace pid)."""
    p = []
    host_of = {nspid: host for _, nspid, host in c.workers}
    killed = {nspid for _, nspid, host in c.workers if host in worker_ids and hung(rv, worker_ids[host])}
    required = set(host_of) - killed
    # rvref writes from a child it forks at exit, which can outlive the recording (it ends with the master).
    deadline = time.monotonic() + 30
    while True:
        found = {int(f.rsplit("-", 1)[1].split(".")[0]): f
                 for f in glob.glob(os.path.join(c.ref_dir, "worker-*.ref.rvtrace"))}
        if required <= set(found) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if not required <= set(found) or not set(found) <= set(host_of):
        p.append(f"reference files for namespace pids {sorted(found)}, workers {sorted(host_of)} (required "
                 f"{sorted(required)}: the workers that exited normally)")
    if not required:
        p.append(f"every worker was killed at shutdown [rule {WORKER_SHUTDOWN_HANG_RULE}]: nothing compared")
    for nspid in sorted(killed):
        print(f"  worker (namespace pid {nspid}) killed at shutdown, its reference not compared "
              f"[rule {WORKER_SHUTDOWN_HANG_RULE}]")
    for nspid, path in sorted(found.items()):
        pid = worker_ids.get(host_of.get(nspid))
        if pid is None:
            continue
        # Puma starts its "wrkr check" thread before on_worker_boot loads the reference: threads are paired by
        # rb_thread_t (applib.by_reference_ids).
        view = rvlib.process_view(rv, pid)
        if "cause" not in rv.processes[pid]:
            view = applib.from_first_event(view)  # rule ATTACH_ADOPTION
        probs = applib.view_event_problems(rvlib.Trace(path), view)
        p += [f"worker (namespace pid {nspid}): {x}" for x in probs]
    print(f"  references: {len(found)} workers compared")
    if c.mode == "boot":
        p += [f"master: {x}" for x in rvlib.check_invariants(rv, None, exact_window=True)]
    return p


def run_agent(rvbpfd, container, apps, res):
    """`rvbpfd agent` pushing to fake_pyroscope, selecting the cluster by its service name (RVBPF_SERVICE, which the
    workers inherit); the cluster started after the agent, under load once both workers booted. Returns the master's
    host pid, its parent's host pid, the workers' host pids and the decoded uploads."""
    recv_dir = os.path.join(container.workdir, "received")
    server = fake_pyroscope.start(recv_dir)
    agent = test_agent.Agent(rvbpfd, ["--push-url", f"http://127.0.0.1:{server.server_address[1]}", "--interval",
                                      "1", "--include", f"label:service={AGENT_SERVICE}", "--host", test_agent.HOST,
                                      "--log-format", "json"])
    c = None
    try:
        c = Cluster(container, apps, "agent", {"RVBPF_SERVICE": AGENT_SERVICE})
        c.app.start()
        c.app.go()
        c.wait_booted(WORKERS)
        pids = [c.app.host_pid] + [host for _, _, host in c.workers]
        for pid in pids:
            if agent.wait_log(lambda r: r.get("msg") == "process attached" and r.get("pid") == pid, 30) is None:
                raise rvlib.RunError(f"the agent did not attach to pid {pid} within 30 s; log tail:\n"
                                     + "\n".join(agent.log.lines[-10:]))
        serve(c, res)
        time.sleep(2.5)  # the interval in which the load ended is cut and pushed
        parent = applib.parent_pid(c.app.host_pid)
        os.kill(c.app.host_pid, signal.SIGTERM)
        c.app.proc.wait(60)
        uploads, problems = test_agent.decode_uploads(recv_dir)
        return c.app.host_pid, parent, pids[1:], uploads, problems
    finally:
        if c is not None:
            c.app.close()
        agent.stop()
        server.shutdown()


def agent_problems(master, parent, workers, uploads):
    """Every process of the cluster has uploads, each labelled with its pid and parent_pid; every worker's with
    process_role worker; the master's with process_role master from the interval in which its workers were profiled
    (its boot's, before the fork, has none: the role is derived at each cut); the workers' cpu profiles name
    LedgerCruncher.reconcile."""
    p = []
    want = {master: (parent, {"master", None}), **{w: (master, {"worker"}) for w in workers}}
    for pid, (ppid, roles) in want.items():
        mine = test_agent.by_pid(uploads, pid)
        if not mine:
            p.append(f"pid {pid}: no uploads")
            continue
        got = [(u["labels"].get("parent_pid"), u["labels"].get("process_role")) for u in mine]
        bad = sorted({g for g in got if g[0] != str(ppid) or g[1] not in roles}, key=str)
        if bad:
            p.append(f"pid {pid}: uploads labelled (parent_pid, process_role) {bad}, want parent_pid {ppid} and a "
                     f"role in {sorted(roles, key=str)}")
        if not any(role is not None for _, role in got):
            p.append(f"pid {pid}: no upload labelled with its process_role")
        print(f"  agent: pid {pid}: {len(mine)} uploads, (parent_pid, process_role) {sorted(set(got), key=str)}, "
              f"types {sorted({u['type'] for u in mine})}")
    cpu = [u for w in workers for u in test_agent.by_pid(uploads, w) if u["type"] == "cpu"]
    crunch = [u for u in cpu if any("LedgerCruncher.reconcile" in s["stack"] for s in u["pprof"]["samples"])]
    if not crunch:
        p.append("no worker's cpu profile names LedgerCruncher.reconcile")
    return p


def check(res, mode, run_fn, rvbpfd, container, apps):
    c = None
    try:
        c, run = run_fn(rvbpfd, container, apps, res, ("--cache-dir", os.path.join(container.workdir, "cache")))
        print(f"  stopped in {time.monotonic() - c.t_stop:.1f} s")
        res.check(f"{mode}: rvbpfd and the cluster ran", run.problems)
        if run.rv is None:
            return
        probs, worker_ids = process_problems(c, run.rv)
        res.check(f"{mode}: the master and both workers (and a re-forked one in attach) are processes of the trace",
                  probs)
        res.check(f"{mode}: workers' request stacks name Rails frames, 50-100 deep, nothing unresolved",
                  request_problems(run.rv, worker_ids))
        res.check(f"{mode}: each worker's events identical to its in-process reference per thread",
                  reference_problems(c, run.rv, worker_ids))
    except (rvlib.RunError, rvlib.Fatal, OSError) as e:
        res.check(f"{mode}: run", [str(e)])
    finally:
        if c is not None:
            c.app.close()


def main():
    started = time.monotonic()
    args, res, rvbpfd, container, apps = applib.begin(__doc__)
    try:
        for mode, fn in (("boot", run_boot), ("attach", run_attach)):
            t = time.monotonic()
            check(res, mode, fn, rvbpfd, container, apps)
            print(f"  {mode}: {time.monotonic() - t:.1f} s")
        t = time.monotonic()
        try:
            master, parent, workers, uploads, problems = run_agent(rvbpfd, container, apps, res)
            res.check("agent: the master and every worker profiled, labelled pid, parent_pid and process_role",
                      problems + agent_problems(master, parent, workers, uploads))
        except (rvlib.RunError, rvlib.Fatal, OSError) as e:
            res.check("agent: run", [str(e)])
        print(f"  agent: {time.monotonic() - t:.1f} s")
    finally:
        container.cleanup(args.keep)
        print(f"wall time {time.monotonic() - started:.1f} s")
    res.finish()


if __name__ == "__main__":
    main()
