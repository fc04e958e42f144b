#!/usr/bin/env python3
"""Hostile files and caches: what a local user plants or stalls must neither steer root's probes nor hang rvbpfd.

  planted-cache  `nobody` runs its own `rvbpfd sites --binary` with a --cache-dir it owns under /tmp and moves
                 every site of the entries one byte on (what would make root probe inside an instruction). Root
                 given that --cache-dir refuses it (exit 13, one line naming the directory and its owner); root
                 given a root-owned directory that holds those entries (still nobody's) warns about them, ignores
                 them and prints the sites a fresh analysis finds; a cache directory writable by others is refused.
  big-non-elf    a 400 MiB file (real data, not sparse) that a process of nobody maps under the name
                 libruby.so.3.4: `rvbpfd sites --pid` refuses it in one line with its peak RSS far below the file's
                 size (the ELF header is read and judged before anything else of the file).
  fuse-stall     a 3.3.8-shared target (before the test Rubies are built: a `ruby` on PATH linked against a
                 libruby) whose libruby has, in its own mount namespace, a FUSE mount over it that never answers
                 (a hung FUSE/NFS server; a FIFO there is refused by fstat, see test_hostile_targets.py):
                 `rvbpfd sites --pid` ends with one error line within a few seconds, SIGINT ends a
                 `rvbpfd --pid` stuck on it within a second, and SIGTERM stops the agent within a second while
                 its start-up scan waits on it.
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
import rvlib  # noqa: E402
from test_hostile_targets import NOBODY, as_nobody, libruby_of, one_error_line, run_measured  # noqa: E402

MIB = 1 << 20
BIG_BYTES = 400 * MIB
BIG_MAX_RSS = 128 * MIB
SITES_BOUND = 120  # s: a cold analysis of an unstripped VM binary
STALL_BOUND = 20   # s: `sites --pid` on a stalled target (discovery gives up after 5 s)
SIGINT_BOUND = 1.0  # s: from SIGINT to the exit of a stuck `rvbpfd --pid`

# Mounts a FUSE file system whose root is a regular file over the file argv[1] and never answers a request (not even
# INIT): a stat or read of it waits for good, as on a FUSE server that hangs (an O_PATH open still succeeds: it asks
# the server nothing). Closing /dev/fuse (this process ending) aborts the connection.
FUSE_HOLDER = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open("/dev/fuse", os.O_RDWR)
opts = f"fd={fd},rootmode=100000,user_id=0,group_id=0".encode()
if libc.mount(b"rvbpfd-stall", sys.argv[1].encode(), b"fuse", 0, opts) != 0:
    print("mount failed", ctypes.get_errno(), flush=True)
    sys.exit(1)
print("mounted", flush=True)
time.sleep(3600)
"""


def moved_entries(cache):
    """Every site of every entry in `cache` moved one byte on, as a planted entry would; returns how many."""
    moved = 0
    for name in os.listdir(cache):
        path = os.path.join(cache, name)
        if not name.endswith(".json") or name.startswith("file-") or name.endswith(".stacks.json"):
            continue
        with open(path) as f:
            doc = json.load(f)
        for s in doc.get("sites", []):
            s["vaddr"] += 1
            s["file_offset"] += 1
            moved += 1
        with open(path, "w") as f:
            json.dump(doc, f)
    return moved


def sites_run(rvbpfd, cache, vm, as_user=False):
    argv = [rvbpfd, "--cache-dir", cache, "sites", "--binary", vm]
    p = subprocess.run(as_nobody(argv) if as_user else argv, capture_output=True, text=True, timeout=SITES_BOUND)
    return p.returncode, p.stdout, p.stderr


def check_planted_cache(res, rvbpfd, vm, work):
    rc, fresh, err = sites_run(rvbpfd, tempfile.mkdtemp(prefix="fresh-", dir=work), vm)
    if rc != 0:
        res.check("planted-cache: a fresh `sites --binary` as root", [f"exit {rc}: {err[-500:]!r}"])
        return
    evil = os.path.join(work, "nobody-cache")
    os.mkdir(evil, 0o755)
    os.chown(evil, NOBODY, NOBODY)  # the tenant's own directory, as under its home or a shared volume
    rc, _, err = sites_run(rvbpfd, evil, vm, as_user=True)
    moved = moved_entries(evil) if rc == 0 else 0
    for name in os.listdir(evil):
        os.chown(os.path.join(evil, name), NOBODY, NOBODY)
    if rc != 0 or moved == 0:
        res.check("planted-cache: nobody's own `sites --binary` fills its cache",
                  [f"exit {rc}, {moved} sites moved: {err[-500:]!r}"])
        return

    rc, out, err = sites_run(rvbpfd, evil, vm)
    p = one_error_line(err, 13, rc, r"untrusted-path: cache directory .*nobody-cache.* owned by uid 65534")
    if out.strip():
        p.append("root printed sites although the cache directory is nobody's")
    res.check(f"planted-cache: root refuses nobody's --cache-dir (rc {rc})", p)

    good = os.path.join(work, "root-cache")
    os.mkdir(good, 0o755)
    for name in os.listdir(evil):
        shutil.copy(os.path.join(evil, name), os.path.join(good, name))
        os.chown(os.path.join(good, name), NOBODY, NOBODY)
    rc, out, err = sites_run(rvbpfd, good, vm)
    p = [] if rc == 0 else [f"exit {rc}: {err[-500:]!r}"]
    if out != fresh:
        p.append("the sites printed differ from a fresh analysis's (the planted entries were used)")
    if "rvbpfd: warning: cache entry" not in err or "owned by uid 65534" not in err:
        p.append(f"no warning about the planted entries: {err[-500:]!r}")
    res.check(f"planted-cache: nobody's entries in root's directory are ignored with a warning (rc {rc})", p)

    open_dir = os.path.join(work, "open-cache")
    os.mkdir(open_dir)
    os.chmod(open_dir, 0o777)
    rc, out, err = sites_run(rvbpfd, open_dir, vm)
    res.check(f"planted-cache: a --cache-dir writable by others is refused (rc {rc})",
              one_error_line(err, 13, rc, r"open-cache.* writable by group or others \(mode 0777\)"))


def check_big_non_elf(res, rvbpfd, work):
    big = os.path.join(work, "libruby.so.3.4")
    chunk = b"not an ELF file, only its name says libruby\n" * (MIB // 44 + 1)
    with open(big, "wb") as f:
        for _ in range(BIG_BYTES // MIB):
            f.write(chunk[:MIB])
    os.chmod(big, 0o644)
    holder = subprocess.Popen(as_nobody([sys.executable, "-c",
                                         "import mmap, sys, time\n"
                                         "f = open(sys.argv[1], 'rb')\n"
                                         "m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n"
                                         "print('ready', flush=True)\n"
                                         "time.sleep(600)\n", big]),
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        if rvlib.LineReader(holder.stdout).wait_for(lambda l: l == "ready", 30) is None:
            res.check("big-non-elf: the mapping process starts", ["it did not print ready"])
            return
        rc, _, err, secs, rss = run_measured([rvbpfd, "sites", "--pid", str(holder.pid)], SITES_BOUND)
        p = one_error_line(err, 12, rc, r"not an ELF file")
        if rss > BIG_MAX_RSS:
            p.append(f"peak RSS {rss // MIB} MiB for a {BIG_BYTES // MIB} MiB non-ELF file (read whole?)")
        res.check(f"big-non-elf: refused in one line (rc {rc}, {secs:.1f} s, peak RSS {rss // MIB} MiB)", p)
    finally:
        holder.kill()
        holder.wait()
        os.unlink(big)


class StalledTarget:
    """A Ruby in its own mount namespace whose libruby then gets a FUSE mount over it that never answers (for that
    namespace only: the path /proc/PID/maps names leads into the mount when rvbpfd resolves it in the target's
    root)."""

    def __init__(self, work, ruby_bin, libruby):
        d = os.path.join(work, "stall")
        os.makedirs(d)
        holder = os.path.join(d, "fuse_holder.py")
        with open(holder, "w") as f:
            f.write(FUSE_HOLDER)
        script = f"""set -e
"{ruby_bin}" -e '$stdout.puts "ready"; $stdout.flush; sleep' > "{d}/ruby.out" 2>&1 &
echo "pid $!"
i=0
while ! grep -q ready "{d}/ruby.out"; do i=$((i+1)); [ $i -lt 600 ] || exit 3; sleep 0.05; done
"{sys.executable}" "{holder}" "{libruby}" > "{d}/fuse.out" 2>&1 &
echo "fuse $!"
i=0
while ! grep -q mounted "{d}/fuse.out"; do i=$((i+1)); [ $i -lt 200 ] || exit 4; sleep 0.05; done
echo changed
"""
        p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], capture_output=True,
                           text=True, timeout=60)
        self.pids = {}
        for line in p.stdout.splitlines():
            k, _, v = line.partition(" ")
            if k in ("pid", "fuse") and v.isdigit():
                self.pids[k] = int(v)
        self.pid = self.pids.get("pid")
        if p.returncode != 0 or "changed" not in p.stdout or self.pid is None:
            fuse_out = open(os.path.join(d, "fuse.out")).read() if os.path.exists(os.path.join(d, "fuse.out")) else ""
            self.stop()
            raise rvlib.Fatal(f"stalled target could not be set up (rc {p.returncode}): {p.stdout[-300:]!r} "
                              f"{p.stderr[-300:]!r} {fuse_out[-300:]!r}")

    def stop(self):
        # The FUSE holder first: its end aborts the connection, so everything waiting on the mount returns.
        for k in ("fuse", "pid"):
            if k in self.pids:
                try:
                    os.kill(self.pids[k], signal.SIGKILL)
                except ProcessLookupError:
                    pass


def signal_and_wait(proc, sig):
    """Sends `sig` and waits: (exit code, seconds until it ended, stderr, problems: killed, or slower than
    SIGINT_BOUND)."""
    start = time.monotonic()
    proc.send_signal(sig)
    p = []
    try:
        rc = proc.wait(STALL_BOUND)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
        p.append(f"{signal.Signals(sig).name} did not end it within {STALL_BOUND} s (SIGKILL did)")
    took = time.monotonic() - start
    if took > SIGINT_BOUND and not p:
        p.append(f"it took {took:.2f} s after {signal.Signals(sig).name}, more than {SIGINT_BOUND} s")
    return rc, took, proc.stderr.read(), p


def check_fuse_stall(res, rvbpfd, ruby, libruby, work):
    target = StalledTarget(work, ruby, libruby)
    try:
        rc, _, err, secs, _ = run_measured([rvbpfd, "sites", "--pid", str(target.pid)], STALL_BOUND)
        p = [f"did not return within {STALL_BOUND} s"] if rc is None else one_error_line(err, 12, rc,
                                                                                         r"took more than")
        res.check(f"fuse-stall: `rvbpfd sites --pid` ends with one error line (rc {rc}, {secs:.1f} s)", p)

        out = os.path.join(work, "stall.rvtrace")
        rv = subprocess.Popen([rvbpfd, "--pid", str(target.pid), "--no-status", "-o", out], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(2)
        p = []
        if rv.poll() is not None:
            p.append(f"rvbpfd --pid was not stuck: it ended with {rv.returncode}: {rv.stderr.read()[-300:]!r}")
            res.check("fuse-stall: SIGINT ends a stuck `rvbpfd --pid`", p)
        else:
            rc, took, err, p = signal_and_wait(rv, signal.SIGINT)
            if not p:
                p += one_error_line(err, 12, rc, r"stopped by a signal")
            res.check(f"fuse-stall: SIGINT ends a stuck `rvbpfd --pid` (rc {rc}, {took:.2f} s)", p)
        check_agent_stop(res, rvbpfd, work)
    finally:
        target.stop()


def check_agent_stop(res, rvbpfd, work):
    """The agent's start-up scan waits on the stalled target's inspection (bound 5 s): SIGTERM 3 s in ends it."""
    agent = subprocess.Popen([rvbpfd, "agent", "--output-dir", os.path.join(work, "agent-out"), "--interval", "2",
                              "--log-format", "text", "--metrics-listen", "off", "--cache-dir",
                              os.path.join(work, "agent-cache")],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(3)
    rc, took, err, p = signal_and_wait(agent, signal.SIGTERM)
    if rc != 0 and not p:
        p.append(f"the agent exited {rc}: {err[-300:]!r}")
    res.check(f"fuse-stall: SIGTERM stops the agent during its scan (rc {rc}, {took:.2f} s)", p)


def shared_vm(source_dir):
    """(ruby executable, the libruby it maps) of 3.3.8-shared; before the test Rubies are built, of a `ruby` on PATH
    linked against a libruby (only the stall and size cases can use it: the cache case needs a CRuby >= 3.2)."""
    try:
        prefix = rvlib.find_ruby(source_dir, "3.3.8-shared")
        return os.path.join(prefix, "bin", "ruby"), libruby_of(prefix), True
    except rvlib.Fatal as e:
        ruby = shutil.which("ruby")
        if ruby:
            out = subprocess.run(["ldd", ruby], capture_output=True, text=True).stdout
            m = re.search(r"=> (\S*libruby\S*\.so\S*)", out)
            if m:
                return ruby, os.path.realpath(m.group(1)), False
        raise e


def main():
    args = rvlib.parse_args(__doc__.splitlines()[0])
    rvlib.require_bpf_environment()
    res = rvlib.Results()
    for tool in ("setpriv", "unshare", "ldd"):
        if shutil.which(tool) is None:
            res.check(f"setup: {tool} is installed", [f"{tool} not found (util-linux, libc-bin)"])
            res.finish()
    try:
        rvbpfd = rvlib.require_rvbpfd(args.rvbpfd)
        ruby, libruby, is_test_ruby = shared_vm(args.source_dir)
    except rvlib.Fatal as e:
        res.check("setup (rvbpfd binary, the 3.3.8-shared test Ruby)", [str(e)])
        res.finish()
    work = tempfile.mkdtemp(prefix="rvbpfd-hostile-io-")
    os.chmod(work, 0o755)  # the unprivileged tenant makes its own cache directory in it
    os.chmod(work, 0o755)
    try:
        if is_test_ruby:
            check_planted_cache(res, rvbpfd, libruby, work)
        else:
            res.check("planted-cache: the 3.3.8-shared test Ruby is built", ["tools/build-test-rubies.sh"])
        check_big_non_elf(res, rvbpfd, work)
        if os.path.exists("/dev/fuse"):
            check_fuse_stall(res, rvbpfd, ruby, libruby, work)
        else:
            res.check("fuse-stall: /dev/fuse exists (modprobe fuse)", ["no /dev/fuse"])
    except rvlib.Fatal as e:
        res.check("setup of the hostile files", [str(e)])
    res.finish(work, keep=args.keep)


if __name__ == "__main__":
    main()
