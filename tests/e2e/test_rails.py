#!/usr/bin/env python3
"""A real Rails application on Puma in a container, under Debian's own ruby3.3, recorded by rvbpfd in attach mode.

tests/e2e/apps/rails_app: Rails 7.2 (ActionController, ActiveRecord on sqlite3 in the container's /tmp) from Debian
trixie's packages, without Bundler, served by Debian's Puma in single mode with a thread pool (-t 8:8) on 127.0.0.1,
in the root of tools/make-trixie-root.sh --apps, in new pid and mount namespaces (applib, rvlib.Container), with the
in-process reference recorder loaded. rvbpfd attaches before Puma is even required (the serve.rb protocol), so the
Rails boot, the load and the shutdown are all recorded. Loopback clients on the host (threads with keep-alive
connections; no network namespace is made, so the container's 127.0.0.1 is the host's) send a bounded mix of requests:
~20 ms of pure-Ruby work (LedgerCruncher.reconcile), ActiveRecord queries, sleeps and a contended Mutex. Then
requests block at known points (Kernel#sleep in two, a Mutex holder and two waiters) while /golden captures
rb_profile_frames of every thread (tests/golden), and SIGTERM stops Puma gracefully.

Checks:
  - every request answered 200;
  - scheduler, GC and Kernel#sleep / Mutex#lock probe events identical to the reference per thread (namespace tids
    one to one with the host's) and rvbpfd's trace holds the invariants;
  - stacks at release equal rb_profile_frames: for every thread but the capturing one, its last gvl_released before
    the capture (CLOCK_MONOTONIC, written by the app around RvGolden.capture) carries exactly the captured frames; the
    five blocked request threads are among them and their stacks are 50 to 100 frames deep;
  - LedgerCruncher.reconcile is named in on-CPU samples;
  - recorded at --hz 19 (the fleet agent's rate, where most GVL holds get no sample), gvl_blame (pprof export) has
    LedgerCruncher.reconcile in the stacks of at least half of all blame: contended READYs carry the holder's stack,
    so blame names the CPU action, not IO#wait_readable where its thread later gave the lock up (issue 47 item 1);
  - Puma's pool threads carry their names ("puma srv tp 001"...) in the trace and in inspect's rows.
  - every frame of every stack is named, the boot's and the shutdown's included (no `<unresolved` frame; issue 46
    item 4: the attached target is held by --hold's default at its main thread's GCs and at its exit), up to rule
    NON_MAIN_GC_NOT_HELD (applib.py);
  - endpoints (issue 47 item 3; model/endpoint.h): the pprof export's `endpoint` label names exactly the
    LedgerController actions requested (rule rails_action), inspect's endpoints section lists each; `rvbpfd agent`,
    run beside the recording (selected by RVBPF_SERVICE, 2 s intervals), labels its profiles with the MIX's actions;
    the report of the recording renders in headless Chromium with its endpoint filter working
    (tests/browser/report_endpoints.test.mjs, ~15 s).
Launch mode is not covered: a container command starts through unshare and chroot, whose exec rvbpfd does not
follow yet (issue 46 items 1 and 3). One recording is kept at /tmp/rails.rvtrace for other tools.
"""
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import applib  # noqa: E402
import pprof_decode  # noqa: E402
import rvlib  # noqa: E402

PUMA_THREADS = 8
CLIENTS = 8
REQUESTS_PER_CLIENT = 10
MIX = ("/cpu", "/db", "/nap?ms=20", "/locked?ms=3")
# The blocked requests of the golden capture: path, what its thread is blocked in.
# Margins for a loaded machine: the holder has the lock 0.3 s before a waiter comes, the capture is ~1.7 s after the
# first request, every blocked request ends 2.5 s after its start.
BLOCKED = (("/nap?ms=2500", "Kernel#sleep"), ("/nap?ms=2500", "Kernel#sleep"), ("/hold?ms=2500", "Kernel#sleep"),
           ("/locked?ms=1", "Thread::Mutex#synchronize"), ("/locked?ms=1", "Thread::Mutex#synchronize"))
DEPTH = (50, 100)
SAVED = "/tmp/rails.rvtrace"


def get(port, path, conn=None, timeout=60):
    """GET path; returns (status, body, conn). A keep-alive connection is reused when given."""
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("GET", path)
    r = conn.getresponse()
    return r.status, r.read().decode("utf-8", "replace"), conn


def load(port, errors, counts):
    """CLIENTS threads, each with one keep-alive connection, REQUESTS_PER_CLIENT requests of MIX in turn."""
    lock = threading.Lock()

    def client(k):
        conn = None
        try:
            for i in range(REQUESTS_PER_CLIENT):
                path = MIX[(i + k) % len(MIX)]
                status, body, conn = get(port, path, conn)
                with lock:
                    counts[path] = counts.get(path, 0) + 1
                    if status != 200:
                        errors.append(f"{path}: {status} {body[:200]}")
        except (OSError, http.client.HTTPException) as e:
            with lock:
                errors.append(f"client {k}: {e!r}")
        finally:
            if conn:
                conn.close()

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        if t.is_alive():
            errors.append("a load client did not finish within 120 s")


def golden_phase(port, errors):
    """The BLOCKED requests, then /golden once they are blocked; waits for all of them."""
    results = []

    def one(path):
        try:
            status, body, conn = get(port, path)
            conn.close()
            results.append((path, status, body))
        except (OSError, http.client.HTTPException) as e:
            results.append((path, None, repr(e)))

    threads = []
    for path, _ in BLOCKED:
        if path.startswith("/locked"):
            time.sleep(0.3)  # the holder first
        threads.append(threading.Thread(target=one, args=(path,), daemon=True))
        threads[-1].start()
    time.sleep(0.3)
    one("/golden?ms=800")
    for t in threads:
        t.join(60)
    errors += [f"{p}: {s} {b[:200]}" for p, s, b in results if s != 200]
    if len(results) != len(BLOCKED) + 1:
        errors.append(f"{len(BLOCKED) + 1 - len(results)} golden-phase requests never returned")


def frames_of(trace, e):
    return [(f.get("label"), f.get("path"), f.get("line")) for f in trace.stack_frames(e)]


def golden_problems(trace, golden_path):
    """Each thread's last stack at release before the capture equals its captured frames (see the docstring)."""
    try:
        with open(golden_path) as f:
            golden = json.load(f)
        with open(golden_path + ".t") as f:
            t0, t1 = (int(x) for x in f.read().split())
    except (OSError, ValueError) as e:
        return [f"cannot read the golden capture {golden_path}(.t): {e}"]
    releases = {}
    for e in trace.named(("gvl_released",)):
        if isinstance(e.get("th"), str) and isinstance(e.get("abs"), int):
            releases.setdefault(int(e["th"], 16), []).append(e)
    p = []
    capturer = [g for g in golden["threads"] if any(f["label"] == "LedgerController#golden" for f in g["frames"])]
    if len(capturer) != 1:
        return [f"{len(capturer)} threads of the capture run LedgerController#golden, expected 1"]
    during = [e for e in releases.get(int(capturer[0]["th"], 16), []) if t0 <= e["abs"] <= t1]
    if during:
        p.append(f"the capturing thread released the GVL during the capture ({len(during)} times): the capture is not "
                 f"one moment")
    compared, request_depths, blocked_tops = 0, [], []
    for g in golden["threads"]:
        if g is capturer[0] or not g["frames"]:
            continue
        want = [(f["label"], f["path"] if f["path"] is not None else "<cfunc>", f["line"]) for f in g["frames"]]
        before = [e for e in releases.get(int(g["th"], 16), []) if e["abs"] < t0]
        in_request = any(label.startswith("LedgerController#") for label, _, _ in want)
        if not before:
            p.append(f"thread {g['th']} ({want[0][0]}, {len(want)} frames): no gvl_released before the capture")
            continue
        got = frames_of(trace, before[-1])
        compared += 1
        if got != want:
            i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            p.append(f"thread {g['th']} blocked in {want[0][0]}: rvbpfd's stack at its last release before the "
                     f"capture differs from rb_profile_frames at frame {i} of {len(want)} (rvbpfd {len(got)} "
                     f"frames):\n      rvbpfd: {got[max(0, i - 2):i + 3]}\n      golden: {want[max(0, i - 2):i + 3]}")
        if in_request:
            request_depths.append(len(want))
            blocked_tops.append(want[0][0])
    print(f"  golden: {compared} threads compared; blocked requests {len(request_depths)} at depths "
          f"{sorted(request_depths)}, in {sorted(blocked_tops)}")
    want_tops = sorted(top for _, top in BLOCKED)
    if sorted(blocked_tops) != want_tops:
        p.append(f"the capture has request threads blocked in {sorted(blocked_tops)}, expected {want_tops}")
    shallow = [d for d in request_depths if not DEPTH[0] <= d <= DEPTH[1]]
    if shallow:
        p.append(f"request stacks of {shallow} frames, expected {DEPTH[0]}..{DEPTH[1]}")
    return p


def blame_problems(rvbpfd, trace):
    """gvl_blame of the pprof export: LedgerCruncher.reconcile in the stacks of at least half of it."""
    prof, problem = rvlib.export_pprof(rvbpfd, trace.path, trace.path + ".pb.gz")
    if problem:
        return [problem]
    i = [t for t, _ in prof["sample_types"]].index("gvl_blame")
    total = sum(s["values"][i] for s in prof["samples"])
    action = sum(s["values"][i] for s in prof["samples"] if "LedgerCruncher.reconcile" in s["stack"])
    print(f"  gvl_blame: {total / 1e6:.1f} ms, LedgerCruncher.reconcile in the stacks of "
          f"{100.0 * action / max(total, 1):.1f}%")
    return [] if total > 0 and action >= total / 2 else [
        f"LedgerCruncher.reconcile is in the stacks of {action / 1e6:.1f} ms of {total / 1e6:.1f} ms of gvl_blame "
        f"(want at least half)"]


def stack_problems(trace):
    p = []
    # The /cpu action's 20 ms of Ruby rarely ends in a release (a timeslice is 100 ms): its name is asked of the
    # on-CPU samples (99 Hz, ~400 ms of it), the releases inside it are counted.
    cpu = applib.released_with(trace, "LedgerCruncher.reconcile")
    sampled = [e for e in trace.named(("sample",)) if "LedgerCruncher.reconcile" in trace.stack_labels(e)]
    if not sampled:
        p.append("no on-CPU sample's stack names LedgerCruncher.reconcile")
    req = [len(trace.stack_frames(e)) for e in trace.named(("gvl_released",))
           if any(label.startswith("LedgerController#") for label in trace.stack_labels(e))]
    print(f"  stacks: {len(sampled)} samples and {len(cpu)} releases in LedgerCruncher.reconcile; "
          f"{len(req)} releases inside actions, "
          f"{min(req, default=0)}..{max(req, default=0)} frames deep; {applib.census_text(trace)}")
    return p + applib.unresolved_problems(trace)


def thread_name_problems(rvbpfd, trace):
    """Puma names its pool threads "puma srv tp 001".. (Thread#name; Ruby gives the native thread the name too, which
    is what Debian's stripped ruby3.3 leaves readable): every pool thread carries its name in the trace, and inspect's
    rows show them."""
    p = []
    # The pool's threads (the reaper, "puma srv tp reaper", is not one of them).
    names = sorted({n for t in trace.threads.values() for n in (t.get("name"), t.get("native_name"))
                    if isinstance(n, str) and re.fullmatch(r"puma srv tp \d{3}", n)})
    want = [f"puma srv tp {i:03d}" for i in range(1, PUMA_THREADS + 1)]
    if names != want:
        p.append(f"pool thread names in the trace: {names}, expected {want}")
    r = subprocess.run([rvbpfd, "inspect", trace.path], capture_output=True, text=True, timeout=300)
    shown = sorted(set(n for n in want if f"({n})" in r.stdout))
    if r.returncode != 0 or shown != want:
        p.append(f"inspect (exit {r.returncode}) labels {shown} of the pool threads by name; stdout {r.stdout[:1500]}")
    print(f"  thread names: {len(names)} pool threads named in the trace, {len(shown)} in inspect")
    return p


# Issue 47 item 3: every action the load and the golden phase requested, as model/endpoint.h names it.
ACTIONS = tuple(f"LedgerController#{a}" for a in ("health", "cpu", "db", "nap", "locked", "hold", "golden"))


def endpoint_problems(rvbpfd, trace):
    """The endpoint label of the pprof export holds the controller actions (rule rails_action) and nothing else that
    is named; /cpu's action has on-CPU samples and caused GVL blame; inspect's endpoints section lists every action."""
    prof, problem = rvlib.export_pprof(rvbpfd, trace.path, trace.path + ".endpoints.pb.gz")
    if problem:
        return [problem]
    types = [t for t, _ in prof["sample_types"]]
    cpu, blame, wall = types.index("samples"), types.index("gvl_blame"), types.index("wall")
    by = {}
    p = []
    for s in prof["samples"]:
        e = s["labels"].get("endpoint")
        if not isinstance(e, str):
            p.append(f"a sample without an endpoint label: {s['stack'][:3]} {s['labels']}")
            break
        if e != "-" and s["labels"].get("endpoint_rule") != "rails_action":
            p.append(f"endpoint {e} with rule {s['labels'].get('endpoint_rule')!r}, expected rails_action")
        row = by.setdefault(e, [0, 0, 0])
        row[0] += s["values"][cpu]
        row[1] += s["values"][blame]
        row[2] += s["values"][wall]
    named = sorted(e for e in by if e != "-")
    print("  endpoints: " + ", ".join(f"{e} {by[e][0]} samples, {by[e][1] / 1e6:.0f} ms blamed, "
                                      f"{by[e][2] / 1e6:.0f} ms wall" for e in named))
    if named != sorted(ACTIONS):
        p.append(f"endpoint labels {named}, expected the controller actions {sorted(ACTIONS)}")
    if by.get("LedgerController#cpu", [0, 0, 0])[0] == 0 or by.get("LedgerController#cpu", [0, 0, 0])[1] == 0:
        p.append(f"LedgerController#cpu has {by.get('LedgerController#cpu')} (samples, blame ns, wall ns): want on-CPU "
                 f"samples and GVL blame")
    r = subprocess.run([rvbpfd, "inspect", trace.path], capture_output=True, text=True, timeout=300)
    at = r.stdout.find("endpoints (derived")
    section = r.stdout[at:].split("\n\n")[0] if at >= 0 else ""
    lines = section.splitlines()
    header = next((i for i, line in enumerate(lines) if "blocked by reason" in line), len(lines))
    rows = {line.split()[0] for line in lines[header + 1:] if line.startswith("  ") and line.split()}
    missing = [a for a in ACTIONS if a not in rows]
    if r.returncode != 0 or missing or "-" not in rows:
        p.append(f"inspect (exit {r.returncode}) endpoints section lacks {missing} (or '-'): {section[:1500]!r}")
    return p


def report_endpoint_problems(rvbpfd, trace, source_dir, build_dir):
    """The report of the recording renders in headless Chromium with the endpoint filter working: tests/browser/
    report_endpoints.test.mjs on this trace (the actions offered, both flame graphs filtered, the card, the dimming, and
    Puma's thread names on the thread lanes).
    Needs node, playwright-core and chromium (tools/install-browser-deps.sh): missing, the check fails saying so."""
    node = shutil.which("node")
    if node is None:
        return ["node not found: run tools/install-browser-deps.sh (the report's endpoint filter is checked in "
                "Chromium)"]
    out_dir = os.path.join(os.path.abspath(build_dir), "rails-report-endpoints")
    os.makedirs(out_dir, exist_ok=True)
    env = dict(os.environ, RVBPFD_BIN=rvbpfd, RVBPFD_BUILD_DIR=out_dir, RVBPFD_ENDPOINTS_TRACE=trace.path,
               RVBPFD_ENDPOINTS_EXPECT=",".join(sorted(ACTIONS, key=lambda a: a != "LedgerController#cpu")))
    t0 = time.monotonic()
    r = subprocess.run([node, "--test", os.path.join(source_dir, "tests/browser/report_endpoints.test.mjs")],
                       capture_output=True, text=True, timeout=600, env=env, cwd=source_dir)
    print(f"  report endpoint filter in Chromium: exit {r.returncode} in {time.monotonic() - t0:.1f} s "
          f"(screenshot {out_dir}/report-endpoints-screenshot.png)")
    if r.returncode == 0:
        return []
    return [f"report_endpoints.test.mjs exit {r.returncode}:\n{r.stdout[-3000:]}{r.stderr[-1500:]}"]


class AgentEndpoints:
    """`rvbpfd agent` (the fleet mode) on the host beside the recording, selecting the Rails process by its service
    name (RVBPF_SERVICE), writing its profiles every 2 s: their `endpoint` labels hold the controller actions. Its
    failures are its own check's, never the rest of the test's."""
    SERVICE = f"e2e-rails-{os.getpid()}"

    def __init__(self, rvbpfd, workdir):
        import test_agent  # noqa: E402 (the agent harness, beside this file)
        self.out_dir = os.path.join(workdir, "agent-out")
        self.problems, self.agent = [], None
        try:
            self.agent = test_agent.Agent(rvbpfd, ["--interval", "2", "--hz", "49", "--output-dir", self.out_dir,
                                                   "--cache-dir", os.path.join(workdir, "agent-cache"),
                                                   "--metrics-listen", "off", "--include",
                                                   f"label:service={self.SERVICE}"])
        except (rvlib.Fatal, OSError) as e:
            self.problems.append(f"the agent did not start: {e}")

    def wait_attached(self, pid):
        if self.agent is None:
            return
        if self.agent.wait_log(lambda r: r.get("msg") == "process attached" and r.get("pid") == pid, 60) is None:
            self.problems.append(f"the agent never attached to pid {pid}: {self.agent.records()[-5:]}")

    def endpoint_problems(self, pid):
        """Waits (up to 20 s) for profiles of `pid` naming the MIX's actions; every named endpoint is an action."""
        if self.problems or self.agent is None:
            return self.problems
        want = {"LedgerController#cpu", "LedgerController#db", "LedgerController#nap", "LedgerController#locked"}
        deadline, seen, cpu_seen = time.time() + 20, {}, set()
        while time.time() < deadline:
            seen, cpu_seen = {}, set()
            for root_dir, _, names in os.walk(self.out_dir):
                for n in names:
                    if f"-{pid}-" not in n:
                        continue
                    try:
                        with open(os.path.join(root_dir, n), "rb") as f:
                            prof = pprof_decode.decode(f.read())
                    except (OSError, ValueError):
                        continue  # being written
                    for smp in prof["samples"]:
                        e = smp["labels"].get("endpoint")
                        seen.setdefault(e, set()).add(n.split("-")[0])
                        if n.startswith("cpu-"):
                            cpu_seen.add(e)
            if want <= set(seen) and "LedgerController#cpu" in cpu_seen:
                break
            time.sleep(1)
        named = sorted(e for e in seen if e not in ("-", None))
        print(f"  agent endpoints: " + ", ".join(f"{e} ({'/'.join(sorted(seen[e]))})" for e in named))
        p = []
        if None in seen:
            p.append("agent profile samples without an endpoint label")
        if not want <= set(seen) or "LedgerController#cpu" not in cpu_seen:
            p.append(f"the agent's profiles name endpoints {named} (cpu: {sorted(e for e in cpu_seen if e)}), want "
                     f"{sorted(want)}, LedgerController#cpu in cpu")
        if any(e not in ACTIONS and e != "(other endpoints)" for e in named):
            p.append(f"named endpoints that are not the application's actions: {named}")
        return p

    def stop(self):
        if self.agent is not None:
            self.agent.stop()


def main():
    started = time.monotonic()
    args, res, rvbpfd, container, apps = applib.begin(__doc__)
    app = agent = None
    try:
        port = rvlib.free_port()
        golden_out = os.path.join(container.workdir, "golden.json")
        app = applib.App(container, "rails", f"{apps}/rails_app/serve.rb",
                         ["-t", f"{PUMA_THREADS}:{PUMA_THREADS}", "-b", f"tcp://127.0.0.1:{port}", "-C",
                          f"{apps}/rails_app/puma.rb", f"{apps}/rails_app/config.ru"],
                         {"RAILS_ENV": "production", "RACK_ENV": "production",
                          "LEDGER_DB": container.inside(container.workdir) + "/ledger.sqlite3",
                          "RVGOLDEN_DIR": applib.RVGOLDEN_DIR, "RVGOLDEN_OUT": container.inside(golden_out),
                          "RVBPF_SERVICE": AgentEndpoints.SERVICE})
        app.start()
        agent = AgentEndpoints(rvbpfd, container.workdir)
        app.attach(rvbpfd, ("--cache-dir", os.path.join(container.workdir, "cache"), "--hz", "19"))
        agent.wait_attached(app.host_pid)
        app.go()
        t_boot = time.monotonic()
        if not applib.wait_port(port, app.proc, 90):
            raise rvlib.RunError(f"puma did not listen on 127.0.0.1:{port} within 90 s; {app.stderr()}")
        status, body, conn = get(port, "/health")
        conn.close()
        print(f"  Rails on Puma up in {time.monotonic() - t_boot:.1f} s (under rvbpfd and the reference)")
        errors, counts = [], {}
        t_load = time.monotonic()
        load(port, errors, counts)
        print(f"  load: {sum(counts.values())} requests {counts} in {time.monotonic() - t_load:.1f} s")
        golden_phase(port, errors)
        res.check(f"rails: every request answered 200 ({CLIENTS} keep-alive clients x {REQUESTS_PER_CLIENT}, "
                  f"then {len(BLOCKED) + 1} golden-phase requests)",
                  ([] if status == 200 else [f"/health: {status} {body[:200]}"]) + errors)
        res.check("rails: the fleet agent's profiles are labelled endpoint, the controller actions (issue 47 item 3)",
                  agent.endpoint_problems(app.host_pid))
        agent.stop()
        os.kill(app.host_pid, signal.SIGTERM)
        if app.out.wait_for(lambda l: l == "done", 60) is None:
            raise rvlib.RunError(f"puma did not stop within 60 s of SIGTERM; {app.stderr()}")
        run = app.finish()
        if run.rv is not None:
            shutil.copyfile(run.rv.path, SAVED)
            print(f"  rvbpfd's trace saved at {SAVED} ({os.path.getsize(SAVED)} bytes)")
        res.check("rails: events identical to the in-process reference per thread (attach, pid+mount namespaces)",
                  applib.event_problems(run))
        if run.rv is not None:
            res.check("rails: stacks at release equal rb_profile_frames, requests 50-100 frames deep",
                      golden_problems(run.rv, golden_out))
            res.check("rails: LedgerCruncher.reconcile named in on-CPU samples; every frame named, boot and exit "
                      "included", stack_problems(run.rv))
            res.check("rails: at --hz 19, LedgerCruncher.reconcile has at least half of gvl_blame",
                      blame_problems(rvbpfd, run.rv))
            res.check("rails: Puma's pool threads by their names in the trace and inspect",
                      thread_name_problems(rvbpfd, run.rv))
            res.check("rails: endpoints are the controller actions in the pprof export and inspect (issue 47 item 3)",
                      endpoint_problems(rvbpfd, run.rv))
            res.check("rails: the report renders in Chromium with the endpoint filter working (issue 47 item 3)",
                      report_endpoint_problems(rvbpfd, run.rv, args.source_dir, args.build_dir))
    except (rvlib.RunError, rvlib.Fatal, OSError, http.client.HTTPException) as e:
        res.check("rails: run", [str(e)])
    finally:
        if agent is not None:
            agent.stop()
        if app is not None:
            app.close()
        container.cleanup(args.keep)
        print(f"wall time {time.monotonic() - started:.1f} s")
    res.finish()


if __name__ == "__main__":
    main()
