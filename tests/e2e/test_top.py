#!/usr/bin/env python3
"""`rvbpfd top --pid PID` (docs/top.md): the live view, fed by the recorder's pipeline, per test Ruby.

workloads/top_busy.rb: "cpu" burns CPU in TopBusy.burn (it holds the GVL nearly all the time), "waiter1" and
"waiter2" do pipe round trips (each ends waiting for the GVL the burner holds), "sleeper" naps in Kernel#sleep. It
prints each thread's native tid. Then:
  (a) without a terminal: `top --json --iterations 3` prints three JSON objects, one per interval; in the last one
      the cpu thread held the GVL for most of the interval, each waiter waited for the GVL most of it, the sleeper
      was blocked in sleep part of it, the rows come most waiting first, the top blocker is TopBusy.burn held by the
      cpu thread, and at the end of one of the three intervals the cpu thread is the holder (gvl_holder, holds_gvl;
      an end may catch a hand-off); `top --iterations 3` (text) prints three snapshots, one naming the cpu thread as
      holder, and TopBusy.burn; nothing is written to the working directory; rvbpfd exits 0 and the target runs on
      (the cpu thread keeps counting, the process is not stopped);
  (b) in a terminal (a detached tmux session, capture-pane): the screen shows the cpu thread marked as GVL holder,
      running most of the interval, and both waiters in gvl_wait; send-keys q ends rvbpfd with status 0, and so
      does Ctrl-C (SIGINT) in a second session; after each the terminal is back in canonical mode with echo (stty
      -a) and the target runs on.
Needs root (BPF) and tmux (tools/install-deps.sh).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rvlib  # noqa: E402

SCREEN_SETTLE_S = 20.0


def target_runs_on(pid, cpu_tid, target):
    """Problems if the target exited, is stopped, or its cpu thread stopped counting."""
    if target.poll() is not None:
        return [f"the target exited ({target.returncode})"]
    p = []
    before = rvlib.thread_cpu_ticks(pid, cpu_tid)
    time.sleep(0.5)
    if rvlib.thread_cpu_ticks(pid, cpu_tid) <= before:
        p.append("the cpu thread stopped counting after rvbpfd top ended")
    if rvlib.process_state(pid) in ("T", "t"):
        p.append("the target is stopped after rvbpfd top ended")
    return p


def check_snapshot(d, tids):
    """The last interval's object: the cpu thread holds the GVL, the waiters wait, rows most waiting first."""
    p = []
    interval = d["end_ns"] - d["start_ns"]
    rows = {t["native_tid"]: t for t in d["threads"]}
    missing = [n for n in ("cpu", "waiter1", "waiter2", "sleeper") if tids[n] not in rows]
    if missing or interval <= 0:
        return [f"threads {missing} missing or empty interval in {json.dumps(d)[:3000]}"]
    cpu = rows[tids["cpu"]]
    if cpu["running_ns"] < 0.7 * interval:
        p.append(f"the cpu thread ran {cpu['running_ns'] / interval:.0%} of the interval (expected >= 70%)")
    for name in ("waiter1", "waiter2"):
        w = rows[tids[name]]
        if w["gvl_wait_ns"] < 0.5 * interval:
            p.append(f"{name} waited for the GVL {w['gvl_wait_ns'] / interval:.0%} of the interval (expected >= 50%)")
    named = {n: rows[tids[n]].get("name") for n in ("cpu", "waiter1", "waiter2", "sleeper")}
    if any(n != v for n, v in named.items()):
        p.append(f"threads not shown by their Thread#name: {named}")
    if rows[tids["sleeper"]]["blocked_ns"].get("sleep", 0) <= 0:
        p.append(f"the sleeper shows no time blocked in sleep: {rows[tids['sleeper']]}")
    waits = [t["gvl_wait_ns"] for t in d["threads"]]
    if waits != sorted(waits, reverse=True):
        p.append(f"rows are not most GVL wait first: {waits}")
    if not d["blockers"] or d["blockers"][0]["method"] != "TopBusy.burn" or \
            d["blockers"][0]["holders"][:1] != [cpu["ruby_thread"]]:
        p.append(f"the top blocker is not TopBusy.burn held by the cpu thread: {d['blockers'][:3]}")
    return p


def start_target(ruby):
    env = dict(os.environ)
    for k in ("RUBYOPT", "RUBY_YJIT_ENABLE", "RUBY_MN_THREADS"):
        env.pop(k, None)
    env.update(ruby.env)
    target = subprocess.Popen([ruby.bin, rvlib.workload_path("top_busy")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    line = rvlib.LineReader(target.stdout).wait_for(lambda l: l.startswith("{"), 60.0)
    if line is None:
        target.kill()
        target.wait()
        raise rvlib.RunError("the workload never printed its thread ids")
    return target, json.loads(line)


def check_plain(rvbpfd, ruby):
    p = []
    target, tids = start_target(ruby)
    cwd = tempfile.mkdtemp(prefix="rvbpfd-e2e-top-cwd-")
    try:
        r = subprocess.run([rvbpfd, "top", "--pid", str(target.pid), "--json", "--iterations", "3"], cwd=cwd,
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            return [f"rvbpfd top --json exited {r.returncode}: {r.stderr.strip()[-2000:]}"]
        objs = [json.loads(l) for l in r.stdout.splitlines() if l.strip()]
        if [o["interval"] for o in objs] != [1, 2, 3]:
            p.append(f"expected intervals 1, 2, 3, got {[o.get('interval') for o in objs]}")
        else:
            p += check_snapshot(objs[-1], tids)
            # The holder at an interval's end: the cpu thread but for a hand-off caught at that instant (a waiter's
            # short turn), which a loaded machine makes likelier; three ends in a row are not all one.
            holders = [(o["gvl_holder"], [t["holds_gvl"] for t in o["threads"] if t["native_tid"] == tids["cpu"]])
                       for o in objs]
            cpu_key = next((t["ruby_thread"] for t in objs[-1]["threads"] if t["native_tid"] == tids["cpu"]), None)
            if not any(h == cpu_key and marks == [True] for h, marks in holders):
                p.append(f"no interval ends with the cpu thread ({cpu_key}) as GVL holder: {holders}")
        t = subprocess.run([rvbpfd, "top", "--pid", str(target.pid), "--iterations", "3"], cwd=cwd,
                           capture_output=True, text=True, timeout=120)
        if t.returncode != 0:
            p.append(f"rvbpfd top (text) exited {t.returncode}: {t.stderr.strip()[-2000:]}")
        heads = [l for l in t.stdout.splitlines() if l.startswith("rvbpfd top  pid ")]
        if len(heads) != 3 or not any(f"(tid {tids['cpu']})" in h for h in heads) or "TopBusy.burn" not in t.stdout:
            p.append(f"the text snapshots do not name the cpu thread as holder and TopBusy.burn:\n{t.stdout[:3000]}")
        if os.listdir(cwd):
            p.append(f"rvbpfd top wrote files without -o: {os.listdir(cwd)}")
        p += target_runs_on(target.pid, tids["cpu"], target)
    finally:
        target.kill()
        target.wait()
        shutil.rmtree(cwd, ignore_errors=True)
    return p


def screen_rows(screen):
    """{native tid: (holder mark, state, run%, wait%, name)} of the thread rows on a captured screen (the workload's
    thread names are one word each)."""
    rows = {}
    for line in screen.splitlines():
        f = line.split()
        mark = bool(f) and f[0] == "*"
        if mark:
            f = f[1:]
        if len(f) >= 9 and f[0].isdigit() and f[1].isdigit() and f[4].isdigit():
            rows[int(f[1])] = (mark, f[3], int(f[4]), int(f[6]), f[2])
    return rows


def screen_problems(rows, tids):
    p = []
    cpu = rows.get(tids["cpu"])
    if cpu is None or not cpu[0] or cpu[2] < 70:
        p.append(f"the cpu thread is not shown holding the GVL most of the interval: {cpu}")
    for name in ("waiter1", "waiter2"):
        w = rows.get(tids[name])
        if w is None or w[1] != "gvl_wait" or w[3] < 50:
            p.append(f"{name} is not shown waiting for the GVL: {w}")
    for name in ("cpu", "waiter1", "waiter2"):
        r = rows.get(tids[name])
        if r is not None and r[4] != name:
            p.append(f"the {name} thread's row does not show its Thread#name: {r}")
    return p


def stty_problems(path, how):
    """The terminal's mode after rvbpfd top ended (`stty -a` written right after it): canonical input and echo."""
    if not os.path.exists(path):
        return [f"no stty output after rvbpfd top ended by {how}"]
    with open(path) as f:
        flags = f.read().split()
    return [f"the terminal is left without {flag} after rvbpfd top ended by {how}"
            for flag in ("icanon", "echo") if flag not in flags]


def tmux_session(tm, name, rvbpfd, pid, outdir):
    """Starts `rvbpfd top --pid PID` in a detached session; its exit status and the terminal's mode after it land in
    files. Returns (rc file, stty file)."""
    rc_file = os.path.join(outdir, f"{name}.rc")
    stty_file = os.path.join(outdir, f"{name}.stty")
    subprocess.run(tm + ["new-session", "-d", "-s", name, "-x", "200", "-y", "50",
                         f"{rvbpfd} top --pid {pid}; echo $? > {rc_file}; stty -a > {stty_file}; sleep 2"],
                   check=True, timeout=30)
    return rc_file, stty_file


def wait_screen(tm, name, tids):
    """Captures the pane until it shows the cpu thread holding the GVL and the waiters waiting; returns problems."""
    deadline = time.monotonic() + SCREEN_SETTLE_S
    screen, p = "", ["no screen captured"]
    while time.monotonic() < deadline:
        time.sleep(1.0)
        screen = subprocess.run(tm + ["capture-pane", "-p", "-t", name], capture_output=True, text=True,
                                timeout=30).stdout
        if "GVL holder:" not in screen:
            continue
        p = screen_problems(screen_rows(screen), tids)
        if not p:
            return []
    return p + [f"screen:\n{screen}"]


def ended_with(tm, name, key, rc_file, stty_file):
    """Sends `key` and checks rvbpfd exited 0 and restored the terminal."""
    subprocess.run(tm + ["send-keys", "-t", name, key], check=True, timeout=30)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not os.path.exists(stty_file):
        time.sleep(0.2)
    time.sleep(0.2)
    if not os.path.exists(rc_file):
        return [f"rvbpfd top did not exit after {key}"]
    with open(rc_file) as f:
        rc = f.read().strip()
    p = [f"rvbpfd top exited {rc} after {key}"] if rc != "0" else []
    return p + stty_problems(stty_file, key)


def check_tmux(rvbpfd, ruby, outdir):
    tmux = shutil.which("tmux")
    if tmux is None:
        return ["tmux is not installed (tools/install-deps.sh installs it)"]
    target, tids = start_target(ruby)
    tm = [tmux, "-L", f"rvbpfd-e2e-top-{os.getpid()}"]
    try:
        p = []
        # q, then Ctrl-C (SIGINT): each ends rvbpfd with 0, the terminal restored, the target running on.
        for key in ("q", "C-c"):
            name = f"{ruby.name}-{key}".replace(".", "_")
            rc_file, stty_file = tmux_session(tm, name, rvbpfd, target.pid, outdir)
            problems = wait_screen(tm, name, tids)
            if not problems:
                problems = ended_with(tm, name, key, rc_file, stty_file)
            p += [f"[{key}] {x}" for x in problems]
            p += target_runs_on(target.pid, tids["cpu"], target)
            if p:
                break
        return p
    finally:
        subprocess.run(tm + ["kill-server"], capture_output=True, timeout=30)
        target.kill()
        target.wait()


def main():
    args = rvlib.parse_args(__doc__)
    rvlib.require_bpf_environment()
    res = rvlib.Results()
    try:
        rvbpfd = rvlib.require_rvbpfd(args.rvbpfd)
        rubies = rvlib.setup_rubies(args, rvref=False)
    except rvlib.Fatal as e:
        res.check("setup (rvbpfd binary, test Rubies)", [str(e)])
        res.finish()
    outdir = tempfile.mkdtemp(prefix="rvbpfd-e2e-top-")
    for ruby in rubies:
        checks = (("without a terminal: snapshots, --json", lambda: check_plain(rvbpfd, ruby)),
                  ("in tmux: the screen; q and Ctrl-C end it, terminal restored",
                   lambda: check_tmux(rvbpfd, ruby, outdir)))
        for label, run in checks:
            try:
                problems = run()
            except (rvlib.RunError, OSError, ValueError, KeyError, subprocess.SubprocessError) as e:
                problems = [f"{type(e).__name__}: {e}"]
            res.check(f"top {ruby.name}: {label}", problems)
    res.finish(outdir, args.keep)


if __name__ == "__main__":
    main()
