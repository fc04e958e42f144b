#!/usr/bin/env python3
"""`rvbpfd dump --pid PID [--json]` (docs/dump.md) on a stuck process, per test Ruby.

workloads/dump_stuck.rb: two threads (lock_a, lock_b) lock two Mutexes in opposite order, "cpu" counts in
Worker.crunch forever, "pipe" reads a pipe nobody writes, "queue" pops an empty Queue, "szq" pushes to a full
SizedQueue, "cv" waits on a ConditionVariable, "mon" waits to enter a Monitor the main thread holds, the main thread
sleeps. Each names itself and records CRuby's own frames (tests/golden's RvGolden.capture) on the line where it
blocks. Then:
  - `dump --json` (taken again, up to DUMP_SETTLE_S, until every thread shows the state it is stuck in) lists the six
    threads by name, each with its frames equal to the golden ones below the leaf (label, path, line: the golden
    capture's leaf is RvGolden.capture, the dump's the blocking call; the cpu thread's leaf is Worker.crunch in both,
    at the loop's line, 0 under YJIT) and the expected leaf,
    state, reason and waiting_for kind; each lock thread waits for a Mutex owned by the other (owner_native_tid);
    `deadlocks` is exactly one cycle, the two lock threads; the cpu thread holds the GVL; native tids are the
    threads' (Thread#native_thread_id, from the golden capture); the pipe thread's io names a pipe; the queue, szq,
    cv and mon threads' waiting_for names the object Ruby's inspect names (type; pop / push), the Monitor's owner is
    the main thread, and `waited_on` lists each of the four with its waiter (the SizedQueue's as a push waiter);
  - the target keeps running: the cpu thread's CPU time grows after the dump and the process is not stopped;
  - the text output names the deadlock (both lock threads on DEADLOCK lines), the SizedQueue's push waiter and
    Worker.crunch;
  - exit statuses: 3 for a pid that does not exist, 4 for a process that is not Ruby;
  - `dump --core` of a `gcore` core of the same process (gdb's gcore) gives what the live dump gave: the same
    threads (names, native tids), frames (the cpu thread's leaf may stand on another line), states, reasons,
    waiting_for kinds, Mutex owners, io descriptors, GVL holder, and exactly the one deadlock; the text names the
    deadlock; its notes say it comes from a core; with --libruby/--exe naming a file of another build-id it fails
    with exit 6 naming both build-ids;
  - `dump --core` of the kernel's core of a Ruby process that crashed (Process.kill(:SEGV, $$): CRuby's [BUG] report,
    then abort; RLIMIT_CORE unlimited, kernel.core_pattern pointed at the test's directory and restored after): the
    sleeping thread blocked in Kernel#sleep by name, the main thread's stack with Process.kill under <main>.
  - in a container: the same workload under Debian trixie's own ruby3.3 (stripped libruby-3.3 that hides
    ruby_current_vm_ptr) in a pid + mount namespace chrooted into tools/make-trixie-root.sh's root, with the root's
    build of tests/golden: the same checks (frames, states, reasons, owners, one deadlock, the target keeps running,
    the text), ns_tid being Thread#native_thread_id and native_tid the host's; the notes say the VM was found through
    ruby_vm_at_exit's code; and `dump --core` of a gcore core of it, with the root's libruby given (--libruby: the
    core names the container's path), gives what the live dump gave, in the namespace's tids (but io descriptors:
    gcore names the threads' registers by host tid; the notes say so). Skipped (SKIP line) when the root is not
    built.
Needs root or ptrace access to a child (no BPF), and gcore (Debian's gdb) for the core part.
"""
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rvlib  # noqa: E402

DUMP_SETTLE_S = 30.0
# name -> (leaf label, state, reason, waiting_for kind)
EXPECTED = {
    "main": ("Kernel#sleep", "blocked", "sleep", "sleep"),
    "lock_a": ("Thread::Mutex#lock", "blocked", "mutex", "mutex"),
    "lock_b": ("Thread::Mutex#lock", "blocked", "mutex", "mutex"),
    "cpu": ("Worker.crunch", "running", None, None),
    "pipe": ("IO#read", "blocked", "io", "io"),
    "queue": ("Thread::Queue#pop", "blocked", "queue", "queue"),
    "szq": ("Thread::SizedQueue#push", "blocked", "queue", "queue"),
    "cv": ("Thread::Mutex#sleep", "blocked", "condition_variable", "condvar"),
    "mon": ("Monitor#synchronize", "blocked", "mutex", "monitor"),
}
# Frames the dump has above the golden capture's beyond the leaf (ConditionVariable#wait calls Mutex#sleep).
EXTRA_TOP = {"cv": ["Thread::ConditionVariable#wait"]}
# name -> (waiting_for's object_type, operation) of the threads waiting on a queue, condvar or monitor.
WAITED = {"queue": ("Thread::Queue", "pop"), "szq": ("Thread::SizedQueue", "push"),
          "cv": ("Thread::ConditionVariable", None), "mon": ("Monitor", None)}


def run_dump(rvbpfd, pid, json_out=True, cache_dir=None):
    cmd = [rvbpfd, "dump", "--pid", str(pid)] + (["--json"] if json_out else []) + \
        (["--cache-dir", cache_dir] if cache_dir else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def settled(d):
    """Whether every thread shows the state and leaf it is stuck in (a thread may be between its capture and its
    blocking call when the dump reads it)."""
    by_name = {t.get("name"): t for t in d.get("threads", [])}
    for name, (leaf, state, _, _) in EXPECTED.items():
        t = by_name.get(name)
        if t is None or t["state"] != state or not t["frames"] or t["frames"][0]["label"] != leaf:
            return False
    return len(d.get("deadlocks", [])) == 1


def golden_frames(gout, name):
    """The capturing thread's own frames from its capture file (by Thread#name), below the capture's frames."""
    with open(os.path.join(gout, f"{name}.json")) as f:
        g = json.load(f)
    for t in g["threads"]:
        if t["name"] == name:
            frames = [{"label": fr["label"], "path": fr["path"], "line": fr["line"]} for fr in t["frames"]]
            if not frames or frames[0]["label"] != "RvGolden.capture":
                raise rvlib.RunError(f"{name}.json: the capturing thread's leaf is not RvGolden.capture: {frames[:1]}")
            frames.pop(0)
            return frames, t["native_tid"]
    raise rvlib.RunError(f"{name}.json has no thread named {name}")


def check_json(d, gout, pid, ruby, in_container=False):
    """Problems of one settled `dump --json`. In a container the golden capture's tids (Thread#native_thread_id) are
    the pid namespace's: they must equal the dump's ns_tid, and its native_tid must be another (the host's)."""
    p = []
    tid_key = "ns_tid" if in_container else "native_tid"
    if d.get("pid") != pid or d.get("ruby_version") != ruby.version:
        p.append(f"pid/ruby_version {d.get('pid')}/{d.get('ruby_version')}, expected {pid}/{ruby.version}")
    by_name = {t.get("name"): t for t in d["threads"]}
    if sorted(n for n in by_name if n) != sorted(EXPECTED):
        p.append(f"thread names {sorted(str(n) for n in by_name)}, expected {sorted(EXPECTED)}")
        return p
    tids = {}  # host tids
    for name, (leaf, state, reason, kind) in EXPECTED.items():
        t = by_name[name]
        want, tid = golden_frames(gout, name)
        tids[name] = t["native_tid"]
        got = t["frames"]
        where = f"thread {name}"
        if t[tid_key] != tid:
            p.append(f"{where}: {tid_key} {t[tid_key]}, Thread#native_thread_id {tid}")
        if in_container and t["native_tid"] == t["ns_tid"]:
            p.append(f"{where}: native_tid {t['native_tid']} equals its ns_tid: not translated to the host's")
        if name == "cpu":
            # Its leaf is its own method, captured at the loop's line (JIT code: 0, as rb_profile_frames says).
            leaf_ok = got and want and got[0]["path"] == want[0]["path"] and (
                got[0]["line"] == want[0]["line"] or (ruby.yjit and got[0]["line"] == 0))
            if not leaf_ok or got[1:] != want[1:]:
                p.append(f"{where}: frames differ from rb_profile_frames:\n  dump   {got}\n  golden {want}")
        else:
            extra = EXTRA_TOP.get(name, [])
            if [f["label"] for f in got[1:1 + len(extra)]] != extra or got[1 + len(extra):] != want:
                p.append(f"{where}: frames below the leaf{' and ' + str(extra) if extra else ''} differ from "
                         f"rb_profile_frames:\n  dump   {got}\n  golden {want}")
        if not got or got[0]["label"] != leaf:
            p.append(f"{where}: leaf {got[:1]}, expected {leaf}")
        if (t["state"], t["reason"]) != (state, reason):
            p.append(f"{where}: state/reason {t['state']}/{t['reason']}, expected {state}/{reason}")
        w = t["waiting_for"]
        if (w or {}).get("kind") != kind:
            p.append(f"{where}: waiting_for {w}, expected kind {kind}")
        if t["holds_gvl"] != (name == "cpu"):
            p.append(f"{where}: holds_gvl {t['holds_gvl']}")
    for a, b in (("lock_a", "lock_b"), ("lock_b", "lock_a")):
        owner = (by_name[a]["waiting_for"] or {}).get("owner_native_tid")
        if owner != tids[b]:
            p.append(f"{a} waits for a Mutex owned by tid {owner}, expected {b}'s {tids[b]}")
    want_cycle = sorted([tids["lock_a"], tids["lock_b"]])
    if [sorted(c) for c in d["deadlocks"]] != [want_cycle]:
        p.append(f"deadlocks {d['deadlocks']}, expected exactly one: {want_cycle}")
    p += check_waited_on(d, gout, by_name, tids)
    pipe = by_name["pipe"]["waiting_for"] or {}
    if not str(pipe.get("fd_target", "")).startswith("pipe:"):
        p.append(f"the pipe thread's io names no pipe: {pipe}")
    if d["gvl"]["holder_native_tid"] != tids["cpu"]:
        p.append(f"GVL holder {d['gvl']['holder_native_tid']}, expected the cpu thread {tids['cpu']}")
    return p


def check_waited_on(d, gout, by_name, tids):
    """The Queue, SizedQueue, ConditionVariable and Monitor waiters: each thread's waiting_for names the object Ruby
    names (its inspect address), with its type and operation; the Monitor's owner is the main thread; "waited_on"
    lists each object once with its waiters."""
    p = []
    with open(os.path.join(gout, "objects.json")) as f:
        objects = {k: int(v, 16) for k, v in json.load(f).items()}
    for name, (otype, op) in WAITED.items():
        w = by_name[name]["waiting_for"] or {}
        if int(w.get("object", "0"), 16) != objects[name] or w.get("object_type") != otype or \
                w.get("operation") != op:
            p.append(f"thread {name}: waiting_for {w}, expected {otype} 0x{objects[name]:x}, operation {op}")
    mon = by_name["mon"]["waiting_for"] or {}
    if mon.get("owner_native_tid") != tids["main"]:
        p.append(f"the mon thread waits for a Monitor owned by {mon.get('owner_native_tid')}, expected main's "
                 f"{tids['main']}")
    listed = {int(o["object"], 16): o for o in d.get("waited_on", [])}
    want = {objects["queue"]: ("Thread::Queue", "waiters_native_tids", "queue"),
            objects["szq"]: ("Thread::SizedQueue", "push_waiters_native_tids", "szq"),
            objects["cv"]: ("Thread::ConditionVariable", "waiters_native_tids", "cv"),
            objects["mon"]: ("Monitor", "waiters_native_tids", "mon")}
    for addr, (otype, key, name) in want.items():
        o = listed.get(addr)
        if o is None or o["type"] != otype or o.get(key) != [tids[name]]:
            p.append(f"waited_on: {otype} 0x{addr:x} is {o}, expected {key} [{tids[name]}] ({name})")
    if listed.get(objects["mon"], {}).get("owner_native_tid") != tids["main"]:
        p.append(f"waited_on: the Monitor's owner is not the main thread: {listed.get(objects['mon'])}")
    return p


def compare_core(live, core, pid, skip_waiting=()):
    """Problems where `dump --core --json` of a gcore core differs from the live dump of the same stuck process."""
    p = []
    if core.get("pid") != pid or core.get("ruby_version") != live.get("ruby_version"):
        p.append(f"core: pid/ruby_version {core.get('pid')}/{core.get('ruby_version')}, expected {pid}/"
                 f"{live.get('ruby_version')}")
    lt = {t.get("name"): t for t in live["threads"]}
    ct = {t.get("name"): t for t in core["threads"]}
    if sorted(str(n) for n in ct) != sorted(str(n) for n in lt):
        return p + [f"core: thread names {sorted(str(n) for n in ct)}, live {sorted(str(n) for n in lt)}"]
    for name in EXPECTED:
        a, b = lt[name], ct[name]
        where = f"core: thread {name}"
        for k in ("native_tid", "state", "reason", "holds_gvl"):
            if a[k] != b[k]:
                p.append(f"{where}: {k} {b[k]}, live {a[k]}")
        fa, fb = a["frames"], b["frames"]
        leaf_a = [(f["label"], f["path"]) for f in fa[:1]]
        leaf_b = [(f["label"], f["path"]) for f in fb[:1]]
        if fa[1:] != fb[1:] or leaf_a != leaf_b or (name != "cpu" and fa[:1] != fb[:1]):
            p.append(f"{where}: frames differ from the live dump's:\n  core {fb}\n  live {fa}")
        wa, wb = a["waiting_for"] or {}, b["waiting_for"] or {}
        for k in ("kind", "owner_native_tid", "mutex", "fd", "object", "object_type", "operation"):
            if k in skip_waiting:
                continue
            if wa.get(k) != wb.get(k):
                p.append(f"{where}: waiting_for.{k} {wb.get(k)}, live {wa.get(k)}")
    if sorted(sorted(c) for c in core["deadlocks"]) != sorted(sorted(c) for c in live["deadlocks"]) or \
            len(core["deadlocks"]) != 1:
        p.append(f"core: deadlocks {core['deadlocks']}, live {live['deadlocks']} (exactly one expected)")
    if core["gvl"]["holder_native_tid"] != live["gvl"]["holder_native_tid"]:
        p.append(f"core: GVL holder {core['gvl']['holder_native_tid']}, live {live['gvl']['holder_native_tid']}")
    if not any("core file" in n for n in core.get("notes", [])):
        p.append(f"core: the notes do not say what a core cannot tell: {core.get('notes')}")
    return p


def check_core(rvbpfd, ruby, live, pid, outdir):
    """gcore the stuck process, dump the core and compare it with the live dump."""
    prefix = os.path.join(outdir, f"{ruby.name}.core")
    r = subprocess.run(["gcore", "-o", prefix, str(pid)], capture_output=True, text=True, timeout=300)
    core = f"{prefix}.{pid}"
    try:
        if r.returncode != 0 or not os.path.exists(core):
            return [f"gcore failed ({r.returncode}): {r.stderr[-1000:]}"]
        cmd = [rvbpfd, "dump", "--core", core]
        j = subprocess.run(cmd + ["--json"], capture_output=True, text=True, timeout=120)
        if j.returncode != 0:
            return [f"rvbpfd dump --core --json exited {j.returncode}: {j.stderr.strip()}"]
        d = json.loads(j.stdout)
        print(f"  {ruby.name}: core dump notes {d.get('notes')}")
        p = compare_core(live, d, pid)
        t = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if t.returncode != 0 or "DEADLOCK among 2 threads:" not in t.stdout or "Worker.crunch" not in t.stdout:
            p.append(f"rvbpfd dump --core (text) exited {t.returncode} without the deadlock and Worker.crunch: "
                     f"{t.stderr.strip()}\n{t.stdout[:3000]}")
        # A file of another build-id given as the VM binary: refused, naming both build-ids.
        flag = "--libruby" if ruby.shared else "--exe"
        w = subprocess.run(cmd + [flag, "/bin/true"], capture_output=True, text=True, timeout=120)
        if w.returncode != 6 or w.stderr.count("build-id") < 2:
            p.append(f"dump --core {flag} /bin/true exited {w.returncode} ({w.stderr.strip()}), expected 6 naming "
                     f"both build-ids")
        return p
    finally:
        if os.path.exists(core):
            os.unlink(core)


CRASH_RB = """
t = Thread.new { Thread.current.name = "sleeper"; sleep }
Thread.pass until t.status == "sleep"
Process.kill(:SEGV, $$)
"""
CORE_PATTERN = "/proc/sys/kernel/core_pattern"


def check_crash_core(rvbpfd, ruby, outdir):
    """A kernel core of a crashed Ruby process, dumped."""
    d = tempfile.mkdtemp(prefix="crash-", dir=outdir)
    with open(CORE_PATTERN) as f:
        saved = f.read().strip()
    env = dict(os.environ)
    for k in ("RUBYOPT", "RUBY_YJIT_ENABLE", "RUBY_MN_THREADS"):
        env.pop(k, None)
    env.update(ruby.env)
    try:
        with open(CORE_PATTERN, "w") as f:
            f.write(os.path.join(d, "core.%p"))
        r = subprocess.run([ruby.bin, "-e", CRASH_RB], capture_output=True, text=True, timeout=60, cwd=d, env=env,
                           preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY,) * 2))
    finally:
        with open(CORE_PATTERN, "w") as f:
            f.write(saved)
    cores = [os.path.join(d, n) for n in os.listdir(d) if n.startswith("core.")]
    try:
        if not cores:
            return [f"the crash left no core in {d} (exit {r.returncode}): {r.stderr[-500:]}"]
        j = subprocess.run([rvbpfd, "dump", "--core", cores[0], "--json"], capture_output=True, text=True, timeout=120)
        if j.returncode != 0:
            return [f"rvbpfd dump --core of a crash core exited {j.returncode}: {j.stderr.strip()}"]
        dump = json.loads(j.stdout)
        by_name = {t.get("name"): t for t in dump["threads"]}
        p = []
        s = by_name.get("sleeper")
        if not s or (s["state"], s["reason"]) != ("blocked", "sleep") or not s["frames"] or \
                s["frames"][0]["label"] != "Kernel#sleep":
            p.append(f"crash core: the sleeper thread is not blocked in Kernel#sleep: {s}")
        main = dump["threads"][0] if dump["threads"] else {}
        labels = [f["label"] for f in main.get("frames", [])]
        if labels[-2:] != ["Process.kill", "<main>"]:
            p.append(f"crash core: the main thread's frames end {labels}, expected Process.kill under <main>")
        return p
    finally:
        for c in cores:
            os.unlink(c)


def check_stuck(rvbpfd, ruby, pid, gout, in_container=False):
    """Dumps the stuck workload (pid: its host pid) until it settles and checks the JSON, that the target keeps
    running, and the text output. Returns (problems, the settled dump or None)."""
    p = []
    deadline = time.monotonic() + DUMP_SETTLE_S
    d, attempts, rc, stderr = None, 0, 0, ""
    while time.monotonic() < deadline:
        attempts += 1
        rc, stdout, stderr = run_dump(rvbpfd, pid)
        if rc != 0:
            break
        d = json.loads(stdout)
        if settled(d):
            break
        time.sleep(0.5)
    if rc != 0:
        return [f"rvbpfd dump --json exited {rc}: {stderr.strip()}"], None
    print(f"  {ruby.name}: {attempts} dump(s) until settled; reading attempts {d.get('attempts')}, "
          f"notes {d.get('notes')}")
    p += check_json(d, gout, pid, ruby, in_container)
    cpu_tid = next((t["native_tid"] for t in d["threads"] if t.get("name") == "cpu"), None)
    if cpu_tid:
        before = rvlib.thread_cpu_ticks(pid, cpu_tid)
        own_cache = tempfile.mkdtemp(prefix="rvbpfd-dump-cache-")  # root's, 0700: passes the cache checks
        rc2, text, stderr2 = run_dump(rvbpfd, pid, json_out=False, cache_dir=own_cache)
        if not os.listdir(own_cache):  # the binary's content hash at least; a DWARF-derived layout too
            p.append(f"`dump --cache-dir {own_cache}` left no cache entry there (the global cache was used)")
        shutil.rmtree(own_cache, ignore_errors=True)
        time.sleep(1.0)
        after = rvlib.thread_cpu_ticks(pid, cpu_tid)
        if after <= before:
            p.append(f"the cpu thread stopped counting: {before} -> {after} ticks across a dump")
        if rvlib.process_state(pid) in ("T", "t"):
            p.append("the target is stopped after the dump")
        if rc2 != 0:
            p.append(f"rvbpfd dump (text) exited {rc2}: {stderr2.strip()}")
        dead = [l for l in text.splitlines() if l.startswith("  thread ")]
        if "DEADLOCK among 2 threads:" not in text or not any('"lock_a"' in l for l in dead) or \
                not any('"lock_b"' in l for l in dead):
            p.append(f"the text output does not name the deadlock of lock_a and lock_b:\n{text[:3000]}")
        if not any(l.startswith("  Thread::SizedQueue ") and 'waiting to push: thread' in l and '"szq"' in l
                   for l in text.splitlines()):
            p.append(f"the text output does not list the SizedQueue's push waiter szq:\n{text[:3000]}")
        if "Worker.crunch" not in text:
            p.append(f"the text output does not name the cpu thread's method Worker.crunch:\n{text[:3000]}")
    return p, d


def check_ruby(rvbpfd, ruby, args, outdir):
    p = []
    gdir = rvlib.build_golden(args.build_dir, args.source_dir, ruby)
    gout = os.path.join(outdir, ruby.name)
    os.makedirs(gout, exist_ok=True)
    env = dict(os.environ)
    for k in ("RUBYOPT", "RUBY_YJIT_ENABLE", "RUBY_MN_THREADS"):
        env.pop(k, None)
    env.update(ruby.env)
    env.update({"RVGOLDEN_DIR": gdir, "RVGOLDEN_OUT": gout})
    err = open(os.path.join(outdir, f"{ruby.name}.stderr"), "w+b")
    target = subprocess.Popen([ruby.bin, rvlib.workload_path("dump_stuck")], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=err, env=env)
    try:
        out = rvlib.LineReader(target.stdout)
        if out.wait_for(lambda l: l == "ready", 60.0) is None:
            err.seek(0)
            return [f"the workload never printed 'ready': {err.read()[-2000:]!r}"]
        pid = target.pid
        q, d = check_stuck(rvbpfd, ruby, pid, gout)
        p += q
        if d is None:
            return p
        if target.poll() is not None:
            p.append(f"the target exited ({target.returncode}) during the test")
        elif shutil.which("gcore") is None:
            p.append("gcore (Debian's gdb) is not installed: tools/install-deps.sh installs it")
        else:
            p += check_core(rvbpfd, ruby, d, pid, outdir)
    finally:
        target.kill()
        target.wait()
        err.close()
    return p


class DebianRuby:
    """Debian trixie's own ruby3.3 (stripped libruby-3.3, no ruby_current_vm_ptr export) as its root sees it."""
    name, version, bin, env, yjit, shared = "debian-ruby3.3", "3.3.8", "/usr/bin/ruby3.3", {}, False, True


def check_container(rvbpfd, root, outdir):
    """The stuck workload under Debian's ruby3.3 in its own pid + mount namespace chrooted into the trixie root (as
    test_container.py runs it), with the root's own build of tests/golden (/opt/rvbpfd/rvgolden): the same checks
    as on the test Rubies, the golden tids being the namespace's (the dump's ns_tid)."""
    ruby = DebianRuby()
    container = rvlib.Container(root)
    gout = os.path.join(container.workdir, "golden")
    os.makedirs(gout, mode=0o777, exist_ok=True)
    env = container.environment()
    env.update({"RVGOLDEN_DIR": "/opt/rvbpfd/rvgolden", "RVGOLDEN_OUT": container.inside(gout)})
    err = open(os.path.join(outdir, f"{ruby.name}.stderr"), "w+b")
    target = subprocess.Popen(container.wrap([ruby.bin, container.workload("dump_stuck")]),
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, env=env)
    try:
        out = rvlib.LineReader(target.stdout)
        if out.wait_for(lambda l: l == "ready", 60.0) is None:
            err.seek(0)
            return [f"the workload never printed 'ready': {err.read()[-2000:]!r}"]
        pid = container.host_pid(target)
        if pid is None:
            return [f"cannot find the host pid of the workload under unshare (pid {target.pid})"]
        p, d = check_stuck(rvbpfd, ruby, pid, gout, in_container=True)
        if d is None:
            return p
        if not any("ruby_vm_at_exit" in n for n in d.get("notes", [])):
            p.append(f"the notes do not say the VM was found through ruby_vm_at_exit's code: {d.get('notes')}")
        if target.poll() is not None:
            p.append(f"the target exited ({target.returncode}) during the test")
        elif shutil.which("gcore") is None:
            p.append("gcore (Debian's gdb) is not installed: tools/install-deps.sh installs it")
        else:
            p += check_container_core(rvbpfd, root, d, pid, outdir)
        return p
    finally:
        target.kill()
        target.wait()
        err.close()
        container.cleanup()


def in_namespace(live):
    """The live dump with every host tid replaced by its pid namespace's (as a core of the process gives them)."""
    ns = {t["native_tid"]: t["ns_tid"] for t in live["threads"]}
    d = json.loads(json.dumps(live))
    for t in d["threads"]:
        t["native_tid"] = t["ns_tid"]
        w = t.get("waiting_for") or {}
        if w.get("owner_native_tid") is not None:
            w["owner_native_tid"] = ns.get(w["owner_native_tid"])
    d["deadlocks"] = [[ns.get(x) for x in c] for c in d["deadlocks"]]
    holder = d["gvl"]["holder_native_tid"]
    d["gvl"]["holder_native_tid"] = ns.get(holder) if holder is not None else None
    return d


def check_container_core(rvbpfd, root, live, pid, outdir):
    """A gcore core of the container's process, dumped with the root's libruby given (--libruby: the core names the
    container's path): what the live dump gave, in the namespace's tids (the tids the VM recorded)."""
    prefix = os.path.join(outdir, "debian.core")
    r = subprocess.run(["gcore", "-o", prefix, str(pid)], capture_output=True, text=True, timeout=300)
    core = f"{prefix}.{pid}"
    try:
        if r.returncode != 0 or not os.path.exists(core):
            return [f"gcore failed ({r.returncode}): {r.stderr[-1000:]}"]
        libruby = os.path.join(root, "usr/lib/x86_64-linux-gnu/libruby-3.3.so.3.3")
        j = subprocess.run([rvbpfd, "dump", "--core", core, "--libruby", libruby, "--json"], capture_output=True,
                           text=True, timeout=120)
        if j.returncode != 0:
            return [f"rvbpfd dump --core --libruby (container) exited {j.returncode}: {j.stderr.strip()}"]
        d = json.loads(j.stdout)
        # gcore, run on the host, names the threads' NT_PRSTATUS notes by host tid, the VM by the namespace's: no
        # thread's registers can be matched (the notes say so), so no io descriptor comes from them.
        p = compare_core(in_namespace(live), d, pid, skip_waiting=("fd",))
        if not any("NT_PRSTATUS" in n for n in d.get("notes", [])):
            p.append(f"the notes do not say the threads' NT_PRSTATUS notes were not found: {d.get('notes')}")
        return [f"container {x}" for x in p]
    finally:
        if os.path.exists(core):
            os.unlink(core)


def check_errors(rvbpfd):
    p = []
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        rc, _, stderr = run_dump(rvbpfd, sleeper.pid)
        if rc != 4:
            p.append(f"dump of a process that is not Ruby exited {rc} ({stderr.strip()}), expected 4 (not-ruby)")
    finally:
        sleeper.kill()
        sleeper.wait()
    rc, _, stderr = run_dump(rvbpfd, 2 ** 22 + 12345)
    if rc != 3:
        p.append(f"dump of a pid that does not exist exited {rc} ({stderr.strip()}), expected 3")
    if len(stderr.strip().splitlines()) != 1:
        p.append(f"the error is not one line: {stderr!r}")
    return p


def main():
    args = rvlib.parse_args(__doc__)
    res = rvlib.Results()
    try:
        rvbpfd = rvlib.require_rvbpfd(args.rvbpfd)
        rubies = []
        for name in (args.ruby or rvlib.RUBIES):
            ruby = rvlib.Ruby(name, rvlib.find_ruby(args.source_dir, name), None)
            rvlib.check_jit(ruby)
            rubies.append(ruby)
    except rvlib.Fatal as e:
        res.check("setup (rvbpfd binary, test Rubies)", [str(e)])
        res.finish()
    outdir = tempfile.mkdtemp(prefix="rvbpfd-e2e-dump-")
    res.check("dump errors: exit 3 no such process, 4 not Ruby", check_errors(rvbpfd))
    for ruby in rubies:
        try:
            problems = check_ruby(rvbpfd, ruby, args, outdir)
        except (rvlib.RunError, OSError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
            problems = [f"{type(e).__name__}: {e}"]
        res.check(f"dump {ruby.name}: stuck workload (deadlock, cpu, pipe, queues, condvar, monitor, sleep)", problems)
        try:
            problems = check_crash_core(rvbpfd, ruby, outdir)
        except (rvlib.RunError, OSError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
            problems = [f"{type(e).__name__}: {e}"]
        res.check(f"dump --core {ruby.name}: the kernel's core of a crashed process", problems)
    try:
        root = rvlib.trixie_root(args.source_dir)
    except rvlib.Fatal as e:
        print(f"SKIP dump of Debian's ruby3.3 in a container: {e}")
        root = None
    if root is not None:
        try:
            problems = check_container(rvbpfd, root, outdir)
        except (rvlib.RunError, OSError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
            problems = [f"{type(e).__name__}: {e}"]
        res.check("dump debian-ruby3.3 (stripped, hidden VM pointer) in a container: stuck workload", problems)
    res.finish(outdir, args.keep)


if __name__ == "__main__":
    main()
