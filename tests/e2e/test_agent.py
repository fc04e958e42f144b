#!/usr/bin/env python3
"""Fleet mode end to end (issue 5): `rvbpfd agent` profiles every Ruby process of the host and pushes to a
Pyroscope-style receiver on loopback (tests/e2e/fake_pyroscope.py).

Scenario, with both test Rubies (3.3.8 shared libruby, 3.4.5 static), workloads/agent_work.rb (two threads
contending for a mutex and the GVL in a per-process hot method, a third running GC.start):
  A  3.3.8, started BEFORE the agent, RVBPF_SERVICE=e2e-billing in its environment, hot method hot_a
  B  3.4.5, started after the agent (found through the exec tracepoint), hot_b
  C  3.3.8, started after the agent, hot_c; exits midway
  D  3.4.5, started after the agent inside a new mount and pid namespace (unshare --mount --pid --fork
     --mount-proc), hot_d; its host pid is not the pid it sees
  E  3.3.8, started after the agent, hot_e; it forks a worker process W (like a preforking server: W never execs)
  F  a stripped copy of 3.4.5's ruby patched so its main thread's route is 8 bytes off (test_errors.py's copy),
     started after the agent: its memory does not match the analysis of its binary
  G  3.4.5, started after the agent, workloads/gvl_hog.rb: HogKlass.spin holds the GVL for HOG_SECONDS while four
     IO threads do pipe round trips, each ending with a wait for the lock
The agent runs with --interval 2, --output-dir too, and a --config file giving push-queue 128 (one interval of these
seven processes is up to 35 uploads). Checked:
  - every pprof the receiver accepted decodes (pprof_decode.py), with the sample types of its profile;
  - every upload came through Pyroscope's push API (push.v1.PusherService/Push), and at least one push request
    carried several profiles (the agent batches a cut's profiles);
  - labels of each process's uploads: host, pid (the HOST pid, also for D), command, ruby_version, service_name
    (e2e-billing for A, the command otherwise), container_id absent unless the cgroup path names one (then equal);
  - the hot method of every live process appears in its cpu profiles; gvl_wait, gvl_held, gc and gvl_blame profiles
    appear for every live process; A and C share one libruby probe set and B and D one static-ruby set
    (binaries_probed);
  - G's gvl_blame profiles (pushed as the gvl_blame type): every sample labelled holder, waiter and blame_source; in
    each interval the same total as its gvl_wait (every ns waited is blamed, also across the interval cuts); summed
    over the intervals, HogKlass.spin is the heaviest leaf, blamed on one holder that is not main, and the waiters of
    that blame are the IO threads (not the holder itself);
  - the forked worker W is found through the fork tracepoint and profiled (its own pid label, hot_a);
  - F is refused by the live layout check: one warning naming its pid and the main thread, counted in
    rvbpfd_processes_skipped_total{reason="layout"}, no upload with its pid, and the agent goes on;
  - every VM binary was analysed in a child process (session/isolated_prepare.h): no log line says the agent
    analysed one itself;
  - after C exits, its last (partial) profile arrives and no later upload names its pid;
  - SIGHUP reloads the config file (push-queue 4 now; rvbpfd_config_reloads_total{result="ok"});
  - backend down: while DIR/REFUSE exists the receiver answers 503; the agent keeps running, retries, drops the
    oldest uploads (rvbpfd_dropped_total{reason="queue_full"} > 0 and retries > 0 on /metrics); once REFUSE is gone
    deliveries resume;
  - SIGTERM: the agent exits 0 after pushing the last partial interval (an upload whose until is after every
    upload received before the signal);
  - --output-dir got complete files too;
  - `rvbpfd agent` without a sink fails with exit 2 and one line naming --output-dir and --push-url.

Then a backend without the push API: a new receiver with DIR/NO_PUSH (it answers the push route 404, as Pyroscope
before 1.0 does), one more 3.3.8 process N (hot_a) and an agent with --interval 1 pushing to it. Checked: the agent
tried the push API (push_not_found.count >= 1) and then delivered through /ingest by itself: uploads arrive with
api "ingest", none with api "push", rvbpfd_push_failures_total stays 0, and N's uploads pass the same checks as A's.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fake_pyroscope  # noqa: E402
import pprof_decode  # noqa: E402
import rvlib  # noqa: E402
import test_errors  # noqa: E402

INTERVAL = 2
HOST = "e2e-host"
PROFILE_TYPES = {"process_cpu": "cpu", "gvl_wait": "gvl_wait", "gvl_held": "gvl_held", "gc": "gc",
                 "gvl_blame": "gvl_blame"}
HOG = "HogKlass.spin"
HOG_SECONDS = 5
CONTAINER_ID = re.compile(r"(?:^|[/-])([0-9a-f]{64})(?:\.scope)?(?:/|$)")


class Proc:
    def __init__(self, name, ruby, hot, env_extra=None, namespaced=False):
        self.name, self.ruby, self.hot, self.namespaced = name, ruby, hot, namespaced
        env = dict(os.environ)
        env.pop("RVBPF_SERVICE", None)
        env.pop("OTEL_SERVICE_NAME", None)
        env.update(env_extra or {})
        argv = [ruby.bin, os.path.join(rvlib.WORKLOAD_DIR, "agent_work.rb"), hot, "10000", "0.005"]
        if namespaced:
            argv = ["unshare", "--mount", "--pid", "--fork", "--mount-proc"] + argv
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  env=env)
        self.out = rvlib.LineReader(self.p.stdout)
        line = self.out.wait_for(lambda l: l.startswith("ready"), 30)
        if line is None:
            self.stop()
            raise rvlib.Fatal(f"{name}: workload did not start: {self.p.stderr.read()[:500]!r}")
        words = line.split()
        self.ns_pid = int(words[1])
        self.worker = int(words[3]) if len(words) >= 4 and words[2] == "worker" else None
        self.pid = self.p.pid
        if namespaced:
            # unshare forks the program: its host pid is unshare's child.
            with open(f"/proc/{self.p.pid}/task/{self.p.pid}/children") as f:
                kids = f.read().split()
            if len(kids) != 1:
                raise rvlib.Fatal(f"{name}: unshare has children {kids}, expected one")
            self.pid = int(kids[0])
        self.service = (env_extra or {}).get("RVBPF_SERVICE", "ruby")
        self.exited_at = None

    def container_id(self):
        try:
            with open(f"/proc/{self.pid}/cgroup") as f:
                text = f.read()
        except OSError:
            return None
        path = ""
        for line in text.splitlines():
            if line.startswith("0::"):
                path = line[3:]
        m = None
        for comp in path.split("/"):
            mm = re.fullmatch(r"(?:[a-z-]+-)?([0-9a-f]{64})(?:\.scope)?", comp)
            if mm:
                m = mm.group(1)
        return m

    def finish(self):
        """Ends the workload cleanly (a line on stdin) and waits for it."""
        try:
            self.p.stdin.write(b"\n")
            self.p.stdin.flush()
        except OSError:
            pass
        try:
            self.p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.stop()

    def stop(self):
        if self.p.poll() is None:
            try:
                self.p.kill()
            except OSError:
                pass
            if self.namespaced:
                try:
                    os.kill(self.pid, signal.SIGKILL)
                except OSError:
                    pass
            self.p.wait()


class HogProc:
    """workloads/gvl_hog.rb, started on a line on stdin (sent once the agent watches it)."""

    def __init__(self, name, ruby):
        self.name, self.ruby, self.hot, self.namespaced = name, ruby, None, False
        env = dict(os.environ)
        env.pop("RVBPF_SERVICE", None)
        env.pop("OTEL_SERVICE_NAME", None)
        env["HOG_SECONDS"] = str(HOG_SECONDS)
        self.p = subprocess.Popen([ruby.bin, os.path.join(rvlib.WORKLOAD_DIR, "gvl_hog.rb")], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        self.out = rvlib.LineReader(self.p.stdout)
        if self.out.wait_for(lambda l: l.startswith("ready"), 30) is None:
            self.stop()
            raise rvlib.Fatal(f"{name}: gvl_hog did not start: {self.p.stderr.read()[:500]!r}")
        self.pid = self.p.pid
        self.service = "ruby"

    def go(self):
        self.p.stdin.write(b"go\n")
        self.p.stdin.flush()

    def finish(self):
        """Waits for the workload's end ("done")."""
        done = self.out.wait_for(lambda l: l.startswith("done"), HOG_SECONDS + 60)
        try:
            self.p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.stop()
        return done is not None

    def stop(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


def judge_hog_blame(leaves, holders, waiters, what="gvl_blame"):
    """Problems with `what`: leaves (leaf frame -> ns) must have HOG heaviest, blamed on one holder that is not main,
    with at least two waiters other than that holder (the IO threads)."""
    p = []
    top = max(leaves, key=leaves.get) if leaves else None
    if top != HOG:
        p.append(f"the heaviest {what} leaf is {top!r}, want {HOG}; leaves "
                 f"{sorted(leaves.items(), key=lambda kv: -kv[1])[:5]}")
    if len(holders) != 1 or holders & {"main", "-"}:
        p.append(f"{HOG}'s {what} names holders {sorted(holders)}: want one, the hog's thread")
    if holders & waiters or len(waiters) < 2:
        p.append(f"the waiters of {HOG}'s {what} are {sorted(waiters)}: want the IO threads")
    return p


def check_blame(uploads, proc):
    """G's gvl_blame uploads: labels, the per-interval total, and HogKlass.spin the heaviest leaf, blamed on the hog."""
    p = []
    mine = by_pid(uploads, proc.pid)
    blame = [u for u in mine if u["type"] == "gvl_blame"]
    if not blame:
        return [f"{proc.name} (pid {proc.pid}): no gvl_blame upload among {len(mine)} (types "
                f"{sorted({u['type'] for u in mine})})"]
    wait_by_interval = {(u["from"], u["until"]): pprof_decode.total(u["pprof"], 0)
                        for u in mine if u["type"] == "gvl_wait"}
    leaves, holders_of_hog, waiters_of_hog = {}, set(), set()
    for u in blame:
        prof = u["pprof"]
        if prof["sample_types"] != [("gvl_blame", "nanoseconds")]:
            p.append(f"gvl_blame upload #{u['seq']} has sample types {prof['sample_types']}")
            break
        total = pprof_decode.total(prof, 0)
        want = wait_by_interval.get((u["from"], u["until"]))
        if want != total:
            p.append(f"gvl_blame upload #{u['seq']} ({u['from']}-{u['until']}) sums to {total} ns, that interval's "
                     f"gvl_wait to {want}")
        for smp in prof["samples"]:
            labels = smp["labels"]
            if not {"holder", "waiter", "blame_source"} <= set(labels):
                p.append(f"gvl_blame upload #{u['seq']}: a sample with labels {labels}")
                break
            leaf = smp["stack"][0] if smp["stack"] else "<none>"
            leaves[leaf] = leaves.get(leaf, 0) + smp["values"][0]
            if leaf == HOG:
                holders_of_hog.add(labels["holder"])
                waiters_of_hog.add(labels["waiter"])
    share = leaves.get(HOG, 0) / max(1, sum(leaves.values()))
    print(f"  {proc.name}: {len(blame)} gvl_blame uploads, {sum(leaves.values()) / 1e6:.1f} ms blamed, {HOG} "
          f"{100 * share:.1f}%, holders of {HOG} {sorted(holders_of_hog)}, waiters {sorted(waiters_of_hog)}")
    return p + judge_hog_blame(leaves, holders_of_hog, waiters_of_hog)


class Worker:
    """The worker process E forked: same Ruby, hot method and labels, its own pid."""

    def __init__(self, parent):
        self.name, self.ruby, self.hot, self.pid = "W", parent.ruby, parent.hot, parent.worker
        self.service = parent.service

    def container_id(self):
        return Proc.container_id(self)


class Agent:
    def __init__(self, rvbpfd, args):
        self.p = subprocess.Popen([rvbpfd, "agent"] + args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
        self.log = rvlib.LineReader(self.p.stderr)
        self.out = rvlib.LineReader(self.p.stdout)
        started = self.wait_log(lambda r: r.get("msg") == "agent started", 60)
        if started is None:
            self.p.kill()
            raise rvlib.Fatal("the agent did not start:\n" + "\n".join(self.log.lines[-20:]))
        self.metrics_port = started.get("metrics_port")

    def records(self):
        out = []
        for line in list(self.log.lines):
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"msg": "<not json>", "line": line})
        return out

    def wait_log(self, pred, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            for r in self.records():
                if pred(r):
                    return r
            if self.p.poll() is not None:
                return None
            time.sleep(0.1)
        return None

    def metrics(self):
        return rvlib.agent_metrics(self.metrics_port)

    def stop(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


def decode_uploads(recv_dir):
    """(uploads, problems): every accepted push with its decoded pprof."""
    problems, out = [], []
    for u in fake_pyroscope.load_uploads(recv_dir):
        try:
            u["pprof"] = pprof_decode.decode(u["body"])
        except ValueError as e:
            name = u.get("query", {}).get("name") or u.get("push_labels")
            problems.append(f"upload #{u.get('seq')} ({u.get('api')}: {name}) does not decode: {e}")
            continue
        u["type"] = PROFILE_TYPES.get(u.get("profile_name"))
        if u["type"] is None:
            problems.append(f"upload #{u.get('seq')}: unexpected profile name {u.get('profile_name')!r}")
            continue
        out.append(u)
    return out, problems


def by_pid(uploads, pid):
    return [u for u in uploads if u["labels"].get("pid") == str(pid)]


def check_process(uploads, proc):
    p = []
    mine = by_pid(uploads, proc.pid)
    if not mine:
        return [f"{proc.name} (pid {proc.pid}): no uploads"]
    want_version = proc.ruby.version
    for u in mine:
        l = u["labels"]
        bad = []
        if l.get("host") != HOST:
            bad.append(f"host={l.get('host')!r}")
        if l.get("command") != "ruby":
            bad.append(f"command={l.get('command')!r}")
        if l.get("ruby_version") != want_version:
            bad.append(f"ruby_version={l.get('ruby_version')!r} (want {want_version})")
        if u.get("service_name") != proc.service:
            bad.append(f"service_name={u.get('service_name')!r} (want {proc.service!r})")
        cid = proc.container_id()
        if cid is None and "container_id" in l:
            bad.append(f"container_id={l['container_id']!r} but the cgroup path names no container")
        if cid is not None and l.get("container_id") != cid:
            bad.append(f"container_id={l.get('container_id')!r}, want {cid}")
        if u.get("api") == "push" and u["pprof"]["duration_nanos"] <= 0:
            bad.append(f"time_nanos {u['pprof']['time_nanos']} duration_nanos {u['pprof']['duration_nanos']}")
        if u["until"] <= u["from"]:
            bad.append(f"from {u['from']} until {u['until']}")
        if bad:
            p.append(f"{proc.name}: upload #{u['seq']} ({u['type']}): " + ", ".join(bad))
            break
    types = {u["type"] for u in mine}
    for t in ("cpu", "gvl_wait", "gvl_held", "gc", "gvl_blame"):
        if t not in types:
            p.append(f"{proc.name} (pid {proc.pid}): no {t} profile among {len(mine)} uploads (types {sorted(types)})")
    hot = f"AgentWork#{proc.hot}"
    cpu = [u for u in mine if u["type"] == "cpu"]
    hot_samples = sum(s["values"][0] for u in cpu for s in u["pprof"]["samples"] if hot in s["stack"])
    all_samples = sum(s["values"][0] for u in cpu for s in u["pprof"]["samples"])
    print(f"  {proc.name}: pid {proc.pid}, {len(mine)} uploads, types {sorted(types)}, cpu samples {all_samples} "
          f"({hot_samples} in {hot})")
    if hot_samples == 0:
        names = set()
        for u in cpu:
            names |= pprof_decode.function_names(u["pprof"])
        p.append(f"{proc.name}: {hot} in none of {len(cpu)} cpu profiles; functions seen: {sorted(names)[:20]}")
    others = {f"AgentWork#hot_{x}" for x in "abcde"} - {hot}
    for u in cpu:
        leak = others & pprof_decode.function_names(u["pprof"])
        if leak:
            p.append(f"{proc.name}: cpu upload #{u['seq']} has another process's hot method {sorted(leak)}")
            break
    for u in mine:
        if u["type"] == "cpu":
            if u["pprof"]["sample_types"] != [("samples", "count"), ("cpu", "nanoseconds")]:
                p.append(f"{proc.name}: cpu sample types {u['pprof']['sample_types']}")
                break
        elif pprof_decode.total(u["pprof"], len(u["pprof"]["sample_types"]) - 1) <= 0:
            p.append(f"{proc.name}: {u['type']} upload #{u['seq']} has no weight")
            break
    return p


def end_procs(procs):
    """Ends every workload still running."""
    for proc in procs:
        if proc.p.poll() is None:
            proc.stop() if isinstance(proc, HogProc) else proc.finish()


def check_no_push(rvbpfd, ruby, work, res, procs):
    """The backend has no push API (DIR/NO_PUSH: the receiver answers the push route 404, as Pyroscope before 1.0
    does): the agent must go over to /ingest by itself and lose nothing. Started processes are added to procs."""
    recv_dir = os.path.join(work, "recv-no-push")
    os.makedirs(recv_dir)
    open(os.path.join(recv_dir, "NO_PUSH"), "w").close()
    receiver = fake_pyroscope.start(recv_dir)
    agent = None
    try:
        n = Proc("N", ruby, "hot_a")
        procs.append(n)
        agent = Agent(rvbpfd, ["--push-url", f"http://127.0.0.1:{receiver.server_address[1]}", "--interval", "1",
                               "--metrics-listen", "127.0.0.1:0", "--host", HOST, "--log-format", "json"])
        if not agent.wait_log(lambda r: r.get("msg") == "process attached" and r.get("pid") == n.pid, 10):
            res.check("no push API: the agent attaches to N", [f"no 'process attached' for N (pid {n.pid})"])
            return
        # Until N's uploads hold every profile type (check_process wants them all).
        deadline = time.time() + 30
        while time.time() < deadline:
            uploads, _ = decode_uploads(recv_dir)
            if {u["type"] for u in by_pid(uploads, n.pid)} >= set(PROFILE_TYPES.values()):
                break
            time.sleep(0.5)
        time.sleep(1.5)  # the metrics are refreshed every second
        m = agent.metrics()
        uploads, prob = decode_uploads(recv_dir)
        not_found = fake_pyroscope.read_count(recv_dir, "push_not_found")
        ingested = [u for u in uploads if u.get("api") == "ingest"]
        pushed = [u for u in uploads if u.get("api") != "ingest"]
        failures = m.get("rvbpfd_push_failures_total")
        print(f"  no push API: {not_found} pushes answered 404, then {len(ingested)} uploads through /ingest, "
              f"{len(pushed)} otherwise; push failures {failures}")
        if not_found < 1:
            prob.append("the agent never tried the push API (push_not_found.count is 0)")
        if not ingested:
            prob.append("no upload came through /ingest")
        if pushed:
            prob.append(f"{len(pushed)} uploads came through {sorted({str(u.get('api')) for u in pushed})}, "
                        "although the push route answers 404")
        if failures != 0:
            prob.append(f"rvbpfd_push_failures_total = {failures}, expected 0: the 404 lost profiles")
        res.check("a backend without the push API (404): the agent falls back to /ingest by itself, losing nothing",
                  prob)
        res.check(f"N (through /ingest): labels, profile types and hot method {n.hot}", check_process(uploads, n))
    finally:
        if agent is not None:
            agent.stop()
        receiver.shutdown()
        receiver.server_close()


def main():
    args = rvlib.parse_args(__doc__.split("\n")[0])
    res = rvlib.Results()
    rvbpfd = rvlib.require_rvbpfd(args.rvbpfd)

    # Usage: no sink. Needs no privileges, so it runs before the environment checks.
    p = subprocess.run([rvbpfd, "agent", "--interval", "2"], capture_output=True, text=True, timeout=30)
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    prob = []
    if p.returncode != 2:
        prob.append(f"exit {p.returncode}, expected 2")
    if len(lines) != 1 or "--output-dir" not in lines[0] or "--push-url" not in lines[0]:
        prob.append(f"stderr should be one line naming --output-dir and --push-url: {lines}")
    res.check("agent without a sink is a usage error naming the flags", prob)

    rvlib.require_bpf_environment()
    if shutil.which("unshare") is None:
        raise rvlib.Fatal("unshare (util-linux) is missing: apt-get install util-linux")
    rubies = {r: rvlib.Ruby(r, rvlib.find_ruby(args.source_dir, r), None) for r in rvlib.RUBIES}
    r33, r34 = rubies["3.3.8-shared"], rubies["3.4.5-static"]

    work = tempfile.mkdtemp(prefix="rvbpfd-agent-e2e-")
    recv_dir = os.path.join(work, "recv")
    out_dir = os.path.join(work, "out")
    os.makedirs(recv_dir)
    port_file = os.path.join(work, "port")
    receiver = rvlib.start_fake_pyroscope(recv_dir, port_file)
    procs = []
    agent = None
    try:
        deadline = time.time() + 20
        while not os.path.exists(port_file) and time.time() < deadline:
            time.sleep(0.05)
        if not os.path.exists(port_file):
            raise rvlib.Fatal(f"fake_pyroscope did not start: {receiver.stderr.read()[:500]!r}")
        port = int(open(port_file).read())

        a = Proc("A", r33, "hot_a", env_extra={"RVBPF_SERVICE": "e2e-billing"})
        procs.append(a)
        config = os.path.join(work, "agent.json")
        with open(config, "w") as f:
            json.dump({"push-queue": 128}, f)
        agent = Agent(rvbpfd, ["--config", config, "--push-url", f"http://127.0.0.1:{port}", "--interval",
                               str(INTERVAL), "--metrics-listen", "127.0.0.1:0", "--host", HOST,
                               "--output-dir", out_dir, "--log-format", "json"])
        def attached(pid, how=None):
            return lambda r: (r.get("msg") == "process attached" and r.get("pid") == pid and
                              (how is None or r.get("found_by") == how))
        res.check("the process started before the agent is attached at start",
                  [] if agent.wait_log(attached(a.pid, "scan"), 10)
                  else [f"no 'process attached' (found_by scan) for A (pid {a.pid})"])
        b = Proc("B", r34, "hot_b")
        c = Proc("C", r33, "hot_c")
        d = Proc("D", r34, "hot_d", namespaced=True)
        e = Proc("E", r33, "hot_e", env_extra={"AGENT_WORK_FORK": "1"})
        g = HogProc("G", r34)
        procs += [b, c, d, e, g]
        prob = []
        for proc in (b, c, d, e):
            if not agent.wait_log(attached(proc.pid, "exec"), 15):
                prob.append(f"no 'process attached' (found_by exec) for {proc.name} (host pid {proc.pid}) within 15 s")
        if e.worker is None or not agent.wait_log(attached(e.worker, "fork"), 15):
            prob.append(f"no 'process attached' (found_by fork) for E's forked worker (pid {e.worker}) within 15 s")
        if agent.wait_log(attached(g.pid, "exec"), 15):
            g.go()
        else:
            prob.append(f"no 'process attached' (found_by exec) for G (pid {g.pid}) within 15 s")
        if d.pid == d.ns_pid:
            prob.append(f"D's host pid {d.pid} equals its namespace pid: the namespace was not created")
        res.check("processes started after the agent are found through exec (one in its own pid namespace), a forked "
                  "worker through fork", prob)
        hog_done = g.finish()
        res.check("G (gvl_hog) ran to its end", [] if hog_done else [f"G did not print done: {g.out.lines[-5:]}"])

        f = None
        patched = os.path.join(work, "ruby-patched")
        prob = test_errors.patched_stripped_copy(r34.bin, patched)
        if not prob:
            patched_ruby = rvlib.Ruby(r34.name, r34.prefix, None)
            patched_ruby.bin = patched
            f = Proc("F", patched_ruby, "hot_f")
            procs.append(f)
            refused = agent.wait_log(lambda r: r.get("msg", "").startswith("not profiling a Ruby process: its memory "
                                                                            "does not match") and r.get("pid") == f.pid,
                                     60)
            if refused is None:
                prob.append(f"no layout refusal logged for F (pid {f.pid}) within 60 s")
            elif "main thread" not in refused.get("error", ""):
                prob.append(f"F's refusal does not name the main thread: {refused}")
            if agent.wait_log(attached(f.pid), 0.1):
                prob.append("F was attached although its layout does not match")
        res.check("a process whose memory does not match its binary's layout is refused (F)", prob)
        in_agent = [r for r in agent.records() if r.get("msg") == "analysing a VM binary in the agent itself"]
        res.check("every VM binary (F's new copy included) was analysed in a child process, none in the agent",
                  [f"analysed in the agent: {r}" for r in in_agent])

        time.sleep(3 * INTERVAL + 1.5)
        m = agent.metrics()
        prob = []
        if m.get("rvbpfd_processes_watched", 0) < 6:
            prob.append(f"rvbpfd_processes_watched = {m.get('rvbpfd_processes_watched')}, expected >= 6")
        bins = m.get("rvbpfd_binaries_probed", 0)
        if bins < 2:
            prob.append(f"rvbpfd_binaries_probed = {bins}, expected >= 2")
        # Only the binaries this test's own processes run: the agent watches every Ruby on the host, and under
        # `ctest -j` other tests' short-lived Rubies make their binaries be probed and unprobed again and again.
        own_pids = {p.pid for p in (a, b, c, d, e)} | ({e.worker} if e.worker else set())
        # A binary is probed again only once its set is gone: counted from the first of the test's processes on it
        # (another test's Ruby may have had the set probed, then gone, before).
        own_paths = set()
        paths = {}
        for r in agent.records():
            if r.get("msg") == "process attached" and r.get("pid") in own_pids:
                own_paths.add(r.get("vm_path"))
            elif r.get("msg") == "binary probed" and r.get("path") in own_paths:
                paths[r.get("path")] = paths.get(r.get("path"), 0) + 1
        if len(own_paths) < 2:
            prob.append(f"the test's processes ran {sorted(p for p in own_paths if p)} per 'process attached', "
                        "expected libruby and the static ruby")
        for path, n in paths.items():
            if n > 0:
                prob.append(f"{path} probed again {n} times while its processes lived: probe sets must be per binary")
        res.check("one probe set per binary (A, C, E, W share libruby, B and D the static ruby)", prob)

        # C exits midway.
        c.finish()
        c.exited_at = time.time()
        det = agent.wait_log(lambda r: r.get("msg") == "process detached" and r.get("pid") == c.pid, 10)
        res.check("the exited process is detached", [] if det else [f"no 'process detached' for C (pid {c.pid})"])
        time.sleep(3 * INTERVAL + 1.5)

        uploads, prob = decode_uploads(recv_dir)
        res.check(f"every pprof received decodes ({len(uploads)} uploads)", prob + ([] if uploads else ["none"]))
        prob = []
        other = [u for u in uploads if u.get("api") != "push"]
        if other:
            prob.append(f"{len(other)} of {len(uploads)} uploads came through "
                        f"{sorted({str(u.get('api')) for u in other})}, not the push API")
        per_request = {u["request_seq"]: u["request_uploads"] for u in uploads if u.get("api") == "push"}
        most = max(per_request.values(), default=0)
        print(f"  push API: {len(per_request)} requests, {sum(per_request.values())} profiles, at most {most} in one")
        if most <= 1:
            prob.append(f"no push request carried more than one profile ({len(per_request)} requests): the agent "
                        "does not batch a cut's profiles")
        res.check("uploads arrive through the push API, a cut's profiles batched into few requests", prob)
        for proc in (a, b, c, d, e):
            res.check(f"{proc.name}: labels, profile types and hot method {proc.hot}", check_process(uploads, proc))
        w = Worker(e)
        res.check(f"W (E's forked worker): labels, profile types and hot method {w.hot}", check_process(uploads, w))
        if f is not None:
            prob = []
            if by_pid(uploads, f.pid):
                prob.append(f"{len(by_pid(uploads, f.pid))} uploads of F, whose layout was refused")
            # The agent watches the whole host: under ctest -j other tests' processes may be refused too. Each refusal
            # is warned about once and counted once (the counter, refreshed every second, is read before the log).
            skipped = agent.metrics().get('rvbpfd_processes_skipped_total{reason="layout"}')
            refusals = [r for r in agent.records() if r.get("msg", "").startswith("not profiling a Ruby process: its "
                                                                                  "memory")]
            if skipped is None or not 1 <= skipped <= len(refusals):
                prob.append(f'rvbpfd_processes_skipped_total{{reason="layout"}} = {skipped}, expected F\'s refusal '
                            f"and at most one per refusal logged ({len(refusals)})")
            warnings = [r for r in refusals if r.get("pid") == f.pid]
            if len(warnings) != 1:
                prob.append(f"{len(warnings)} layout warnings for F, expected exactly one")
            res.check("F is never profiled, counted once as skipped (layout) and warned about once", prob)
        res.check(f"G: gvl_blame profiles name {HOG} and the hog's thread", check_blame(uploads, g))
        prob = []
        late = [u for u in by_pid(uploads, c.pid) if u["from"] > c.exited_at + 1]
        if late:
            prob.append(f"{len(late)} uploads of C start after its exit at {c.exited_at:.0f}: "
                        f"{[(u['type'], u['from'], u['until']) for u in late[:4]]}")
        after = [u for u in by_pid(uploads, c.pid) if u["received_unix_s"] > c.exited_at + INTERVAL + 3]
        if after:
            prob.append(f"{len(after)} uploads of C received more than {INTERVAL + 3} s after it exited")
        if not [u for u in by_pid(uploads, c.pid) if u["until"] >= c.exited_at - INTERVAL - 1]:
            prob.append("C's last partial interval was not uploaded")
        res.check("the exited process stops appearing", prob)

        # SIGHUP: a small queue for the outage below.
        with open(config, "w") as f:
            json.dump({"push-queue": 4}, f)
        agent.p.send_signal(signal.SIGHUP)
        rec = agent.wait_log(lambda r: r.get("msg") == "config reloaded", 10)
        prob = []
        if rec is None or "push-queue" not in str(rec.get("applied")):
            prob.append(f"no 'config reloaded' record applying push-queue: {rec}")
        time.sleep(1.5)
        m = agent.metrics()
        reloads = m.get('rvbpfd_config_reloads_total{result="ok"}')
        if reloads != 1:
            prob.append(f'rvbpfd_config_reloads_total{{result="ok"}} = {reloads}, expected 1')
        res.check("SIGHUP reloads the config file", prob)

        # Backend down.
        refuse = os.path.join(recv_dir, "REFUSE")
        open(refuse, "w").close()
        time.sleep(6 * INTERVAL)
        m = agent.metrics()
        prob = []
        if agent.p.poll() is not None:
            prob.append(f"the agent exited ({agent.p.returncode}) while the backend was down")
        dropped = m.get('rvbpfd_dropped_total{reason="queue_full"}', 0)
        retries = m.get("rvbpfd_push_retries_total", 0)
        if dropped <= 0:
            prob.append(f'rvbpfd_dropped_total{{reason="queue_full"}} = {dropped}, expected > 0')
        if retries <= 0:
            prob.append(f"rvbpfd_push_retries_total = {retries}, expected > 0")
        refused = fake_pyroscope.read_count(recv_dir, "refused")
        if refused <= 0:
            prob.append("the receiver refused nothing: the agent did not try to push during the outage")
        print(f"  outage: {refused} pushes refused, queue_full drops {dropped:.0f}, retries {retries:.0f}, "
              f"queue length {m.get('rvbpfd_push_queue_length')}")
        res.check("backend down: the agent keeps running, retries, drops oldest with the counter on /metrics", prob)

        delivered_before = m.get("rvbpfd_push_delivered_total", 0)
        n_before = len(fake_pyroscope.load_uploads(recv_dir))
        os.unlink(refuse)
        deadline = time.time() + 45  # the backoff may have grown to its 30 s cap
        n_after = n_before
        while time.time() < deadline:
            n_after = len(fake_pyroscope.load_uploads(recv_dir))
            if n_after >= n_before + 4:
                break
            time.sleep(0.5)
        time.sleep(1.5)  # the metrics are refreshed every second
        m = agent.metrics()
        prob = []
        if n_after < n_before + 4:
            prob.append(f"only {n_after - n_before} uploads accepted within 45 s of the backend's return")
        if m.get("rvbpfd_push_delivered_total", 0) <= delivered_before:
            prob.append("rvbpfd_push_delivered_total did not grow after the backend returned")
        res.check("deliveries resume when the backend returns", prob)

        # The outage's backlog drains first: were it still queued, the last interval's uploads could push its oldest
        # out while the shutdown flush waits (a counted drop, and rightly "flushed": false).
        deadline = time.time() + 60
        while time.time() < deadline and agent.metrics().get("rvbpfd_push_queue_length", 1) > 0:
            time.sleep(0.5)

        # SIGTERM in the middle of an interval: the last partial interval is pushed before the agent exits.
        # A fresh cut is recognised by a larger `until` (uploads retried from the outage's backlog carry older ones,
        # so a mere new arrival says nothing about where the agent is in its interval). Wait for one, then half an
        # interval; if another cut landed meanwhile, start over, so SIGTERM never coincides with a regular cut.
        def max_until():
            return max(u["until"] for u in fake_pyroscope.load_uploads(recv_dir))
        last_until = max_until()
        for _ in range(5):
            deadline = time.time() + 3 * INTERVAL + 5
            while time.time() < deadline and max_until() <= last_until:
                time.sleep(0.05)
            last_until = max_until()
            time.sleep(INTERVAL / 2)
            if max_until() == last_until:
                break
            last_until = max_until()
        agent.p.send_signal(signal.SIGTERM)
        try:
            rc = agent.p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            rc = None
        prob = []
        if rc != 0:
            prob.append(f"agent exit status {rc}, expected 0 after SIGTERM")
        final = [u for u in fake_pyroscope.load_uploads(recv_dir) if u["until"] > last_until]
        if not final:
            prob.append(f"no upload ends after {last_until} (the last regular cut): the partial interval was lost")
        stopped = [r for r in agent.records() if r.get("msg") == "agent stopped"]
        if not stopped or stopped[-1].get("flushed") is not True:
            prob.append(f"'agent stopped' record missing or not flushed: {stopped}")
        res.check("SIGTERM flushes the last partial interval and exits 0", prob)

        prob = []
        files = []
        for root, _, names in os.walk(out_dir):
            files += [os.path.join(root, n) for n in names]
        if not any(f"-{a.pid}-" in os.path.basename(f) for f in files):
            prob.append(f"no file of A in --output-dir ({len(files)} files)")
        for f in files:
            if not f.endswith(".pb.gz"):
                prob.append(f"unexpected file {f}")
                continue
            try:
                pprof_decode.decode(open(f, "rb").read())
            except ValueError as e:
                prob.append(f"{f}: {e}")
        res.check(f"--output-dir holds complete pprof files ({len(files)})", prob)

        end_procs(procs)  # the next agent watches the host too: only its own workload should run
        check_no_push(rvbpfd, r33, work, res, procs)
    finally:
        if agent is not None:
            agent.stop()
        end_procs(procs)
        receiver.terminate()
        receiver.wait()
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    res.finish()


if __name__ == "__main__":
    try:
        main()
    except rvlib.Fatal as e:
        print(f"FATAL: {e}")
        print("0 passed, 1 failed")
        sys.exit(1)
