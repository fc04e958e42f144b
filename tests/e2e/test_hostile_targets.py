#!/usr/bin/env python3
"""Hostile targets: what an unprivileged local user can put in rvbpfd's way must not hang, mislead or bloat it.

Every target here is made by the test itself, running as `nobody` (setpriv, no capabilities); the namespaced ones run
in their own user+mount namespace (unshare -Urm), where nobody is root and can mount over its own files:

  fifo-exe      a 3.4.5-static target whose executable's path is bind-mounted over with a FIFO after it started:
                `rvbpfd --pid` must not block in open(); it profiles the file the process really maps (through
                /proc/PID/map_files), so the trace's build-id is the real binary's
  fifo-libruby  the same with a 3.3.8-shared target's libruby.so
  symlink       a 3.3.8-shared target whose libruby.so path became an absolute symlink to a path that holds junk in
                its namespace but, on the host, a copy of 3.4.5-static's ruby: resolved inside the target's root, the
                host file is never read (the trace says 3.3.8 and the real libruby's build-id)
  sparse-exe    `sleep` padded to a 1 GiB sparse file (a few KB on disk): exit 4 (not Ruby) in one line, and
                rvbpfd's peak RSS stays far below the file size
  sparse-ruby   3.4.5-static's ruby padded to a 1 GiB sparse file: attached and recorded, peak RSS far below 1 GiB
  agent         the fleet agent started with all of the above alive plus one ordinary Ruby: its start-up scan
                attaches the ordinary one (the scan went on), and SIGTERM stops it within its bound although its
                helper threads (metrics server, delivery) exist
  inspect       `rvbpfd inspect` of a FIFO, /dev/zero and a directory: exit 11 at once, one line saying what it is

Each rvbpfd run is checked for its exit code, its stderr (one `rvbpfd: <name>: <message>` line for errors) and the
time it took against a bound.
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

NOBODY = 65534
MSG = re.compile(r"^rvbpfd: [A-Za-z][^:]*: \S.*$")
GIB = 1 << 30
# Bounds (s): an attach with the sites computed from scratch takes a few seconds; nothing here may wait for a writer
# or read without end.
ATTACH_BOUND = 90
ERROR_BOUND = 20
STOP_BOUND = 15


def as_nobody(argv):
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"] + argv


def run_measured(argv, timeout):
    """(rc, stdout, stderr, seconds, peak RSS in bytes) of one run; rc None when it had to be killed."""
    start = time.monotonic()
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out_r = rvlib.LineReader(p.stdout)
    err_r = rvlib.LineReader(p.stderr)
    rc, rss = None, 0
    while time.monotonic() - start < timeout:
        pid, status, usage = os.wait4(p.pid, os.WNOHANG)
        if pid == p.pid:
            rc = os.waitstatus_to_exitcode(status)
            rss = usage.ru_maxrss * 1024
            break
        time.sleep(0.05)
    if rc is None:
        p.kill()
        os.wait4(p.pid, 0)
    seconds = time.monotonic() - start
    out_r.t.join(5)
    err_r.t.join(5)
    return rc, out_r.text(), err_r.text(), seconds, rss


def one_error_line(err, want_rc, rc, must_mention):
    p = []
    if rc != want_rc:
        p.append(f"exit code {rc}, expected {want_rc}")
    lines = [l for l in err.splitlines() if l.strip()]
    if len(lines) != 1:
        p.append(f"stderr has {len(lines)} lines, expected one: {lines[:5]}")
    elif not MSG.match(lines[0]):
        p.append(f"stderr line is not 'rvbpfd: <name>: <message>': {lines[0]!r}")
    elif not re.search(must_mention, lines[0], re.I):
        p.append(f"message {lines[0]!r} does not mention {must_mention!r}")
    return p


def build_id_of(path):
    out = subprocess.run(["readelf", "-n", path], capture_output=True, text=True).stdout
    m = re.search(r"Build ID: ([0-9a-f]+)", out)
    return m.group(1) if m else None


def libruby_of(prefix):
    lib = os.path.join(prefix, "lib")
    names = sorted(n for n in os.listdir(lib) if re.match(r"libruby\.so\.\d+\.\d+\.\d+$", n))
    if not names:
        raise rvlib.Fatal(f"no libruby.so.X.Y.Z in {lib}")
    return os.path.realpath(os.path.join(lib, names[0]))


class NsTarget:
    """A Ruby started as nobody in its own user+mount namespace; `after_ready` is shell run in that namespace once
    the Ruby printed 'ready' (it changes what the Ruby's paths name, for this namespace only)."""

    def __init__(self, work, name, ruby_bin, after_ready):
        self.dir = os.path.join(work, name)
        os.makedirs(self.dir)
        os.chmod(self.dir, 0o777)
        script = f"""set -e
"{ruby_bin}" -e '$stdout.puts "ready"; $stdout.flush; sleep' > "{self.dir}/ruby.out" 2>&1 &
echo "pid $!"
i=0
while ! grep -q ready "{self.dir}/ruby.out"; do i=$((i+1)); [ $i -lt 600 ] || exit 3; sleep 0.05; done
{after_ready}
echo changed
"""
        p = subprocess.run(as_nobody(["unshare", "-Urm", "sh", "-c", script]), capture_output=True, text=True,
                           timeout=60)
        m = re.search(r"^pid (\d+)$", p.stdout, re.M)
        self.pid = int(m.group(1)) if m else None
        if p.returncode != 0 or "changed" not in p.stdout or self.pid is None:
            self.stop()
            raise rvlib.Fatal(f"namespaced target {name} could not be set up (rc {p.returncode}): "
                              f"{p.stdout[-500:]!r} {p.stderr[-500:]!r}")

    def stop(self):
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class PlainTarget:
    def __init__(self, argv):
        self.p = subprocess.Popen(as_nobody(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
        self.pid = self.p.pid
        self.out = rvlib.LineReader(self.p.stdout)

    def stop(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()


def check_attach(res, name, rvbpfd, pid, work, want_version, want_build_id, max_rss=None):
    out = os.path.join(work, f"{name}.rvtrace")
    cache = tempfile.mkdtemp(prefix="cache-", dir=work)
    rc, _, err, secs, rss = run_measured([rvbpfd, "--pid", str(pid), "-d", "1", "-o", out, "--no-status",
                                          "--cache-dir", cache], ATTACH_BOUND)
    p = []
    if rc is None:
        p.append(f"rvbpfd --pid did not return within {ATTACH_BOUND} s: {err[-500:]!r}")
    elif rc != 0:
        p.append(f"exit code {rc}: {err[-500:]!r}")
    else:
        if "rvbpfd: attached" not in err:
            p.append(f"no 'rvbpfd: attached' line: {err[-500:]!r}")
        t = rvlib.Trace(out)
        h = t.header or {}
        if h.get("ruby_version") != want_version:
            p.append(f"trace says ruby {h.get('ruby_version')!r}, the target runs {want_version}")
        if want_build_id and h.get("build_id") != want_build_id:
            p.append(f"trace build-id {h.get('build_id')!r} is not the mapped binary's {want_build_id!r}")
    if max_rss is not None and rss > max_rss:
        p.append(f"peak RSS {rss >> 20} MiB, more than {max_rss >> 20} MiB")
    res.check(f"{name}: rvbpfd --pid returns (rc {rc}, {secs:.1f} s, peak RSS {rss >> 20} MiB)", p)


def main():
    args = rvlib.parse_args(__doc__.splitlines()[0])
    rvlib.require_bpf_environment()
    res = rvlib.Results()
    for tool in ("setpriv", "unshare", "readelf"):
        if shutil.which(tool) is None:
            res.check(f"setup: {tool} is installed", [f"{tool} not found (util-linux / binutils)"])
            res.finish()
    # 3.3.8-shared is always needed; the static cases run with 3.4.5-static (both by default, --ruby to narrow).
    wanted = args.ruby or rvlib.RUBIES
    try:
        rvbpfd = rvlib.require_rvbpfd(args.rvbpfd)
        shared = rvlib.find_ruby(args.source_dir, "3.3.8-shared")
        static = rvlib.find_ruby(args.source_dir, "3.4.5-static") if "3.4.5-static" in wanted else None
    except rvlib.Fatal as e:
        res.check("setup (rvbpfd binary, test Rubies)", [str(e)])
        res.finish()
    static_ruby = os.path.realpath(os.path.join(static, "bin", "ruby")) if static else None
    shared_ruby = os.path.join(shared, "bin", "ruby")
    libruby = libruby_of(shared)
    work = tempfile.mkdtemp(prefix="rvbpfd-hostile-")
    os.chmod(work, 0o755)
    targets = []
    try:
        # --- the FIFO in place of the VM binary ---
        fifo = os.path.join(work, "fifo")
        os.mkfifo(fifo, 0o666)
        hostile = []  # (target, name) the agent must get past
        if static_ruby:
            fifo_exe = NsTarget(work, "fifo-exe", static_ruby, f'mount --bind "{fifo}" "{static_ruby}"')
            targets.append(fifo_exe)
            hostile.append((fifo_exe, "fifo-exe"))
            check_attach(res, "fifo-exe", rvbpfd, fifo_exe.pid, work, "3.4.5", build_id_of(static_ruby))
        fifo_lib = NsTarget(work, "fifo-libruby", shared_ruby, f'mount --bind "{fifo}" "{libruby}"')
        targets.append(fifo_lib)
        hostile.append((fifo_lib, "fifo-libruby"))
        check_attach(res, "fifo-libruby", rvbpfd, fifo_lib.pid, work, "3.3.8", build_id_of(libruby))
        rc, _, err, secs, _ = run_measured([rvbpfd, "sites", "--pid", str(fifo_lib.pid)], ATTACH_BOUND)
        res.check(f"fifo-libruby: rvbpfd sites --pid returns (rc {rc}, {secs:.1f} s)",
                  [] if rc == 0 else [f"exit code {rc}: {err[-300:]!r}"])

        # --- an absolute symlink in the target's root ---
        # On the host, /<work>/decoy/libruby.so is a valid VM of another version (`sleep` without 3.4.5-static); in
        # the target's namespace a tmpfs over <work>/decoy holds junk there, and the target's libruby path is a
        # symlink to it.
        decoy_dir = os.path.join(work, "decoy")
        os.makedirs(decoy_dir)
        shutil.copy(static_ruby or shutil.which("sleep"), os.path.join(decoy_dir, "libruby.so"))
        lib_dir = os.path.dirname(libruby)
        symlink = NsTarget(work, "symlink", shared_ruby, f"""
mount -t tmpfs none "{decoy_dir}"
echo junk > "{decoy_dir}/libruby.so"
mount -t tmpfs none "{lib_dir}"
ln -s "{decoy_dir}/libruby.so" "{libruby}"
""")
        targets.append(symlink)
        hostile.append((symlink, "symlink"))
        check_attach(res, "symlink", rvbpfd, symlink.pid, work, "3.3.8", build_id_of(libruby))

        # --- sparse 1 GiB executables ---
        sparse_sleep = os.path.join(work, "sleep-sparse")
        shutil.copy(shutil.which("sleep"), sparse_sleep)
        os.truncate(sparse_sleep, GIB)
        os.chmod(sparse_sleep, 0o755)
        sleeper = PlainTarget([sparse_sleep, "600"])
        targets.append(sleeper)
        time.sleep(0.3)
        rc, _, err, secs, rss = run_measured([rvbpfd, "--pid", str(sleeper.pid), "-o",
                                              os.path.join(work, "sleep.rvtrace")], ERROR_BOUND)
        p = one_error_line(err, 4, rc, r"not-ruby")
        if rss > 256 << 20:
            p.append(f"peak RSS {rss >> 20} MiB for a 1 GiB sparse file")
        res.check(f"sparse-exe: exit 4 in one line (rc {rc}, {secs:.1f} s, peak RSS {rss >> 20} MiB)", p)

        if static_ruby:
            sparse_ruby = os.path.join(work, "ruby-sparse")
            shutil.copy(static_ruby, sparse_ruby)
            os.truncate(sparse_ruby, GIB)
            os.chmod(sparse_ruby, 0o755)
            sr = PlainTarget([sparse_ruby, "-e", '$stdout.puts "ready"; $stdout.flush; sleep'])
            targets.append(sr)
            if sr.out.wait_for(lambda l: l == "ready", 30) is None:
                res.check("sparse-ruby: the padded ruby runs", ["it did not print ready"])
            else:
                check_attach(res, "sparse-ruby", rvbpfd, sr.pid, work, "3.4.5", build_id_of(static_ruby),
                             max_rss=512 << 20)

        # --- the agent's scan with all of them alive ---
        plain = PlainTarget([shared_ruby, "-e", '$stdout.puts "ready"; $stdout.flush; sleep'])
        targets.append(plain)
        plain.out.wait_for(lambda l: l == "ready", 30)
        out_dir = os.path.join(work, "agent-out")
        agent = subprocess.Popen([rvbpfd, "agent", "--output-dir", out_dir, "--interval", "2", "--log-format",
                                  "json", "--metrics-listen", "127.0.0.1:0", "--cache-dir",
                                  os.path.join(work, "agent-cache")],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        log = rvlib.LineReader(agent.stderr)

        def logged(pred):
            for line in list(log.lines):
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if pred(r):
                    return r
            return None

        start = time.monotonic()
        p = []
        attached = None
        while time.monotonic() - start < ATTACH_BOUND and agent.poll() is None:
            attached = logged(lambda r: r.get("msg") == "process attached" and r.get("pid") == plain.pid)
            if attached:
                break
            time.sleep(0.2)
        if not attached:
            p.append(f"the ordinary Ruby {plain.pid} was not attached within {ATTACH_BOUND} s: "
                     + "\n".join(log.lines[-15:]))
        # The scan goes in pid order, and pids wrap: a hostile target may come after the ordinary one, so each
        # gets until the same bound to be logged.
        unlogged = list(hostile)
        while unlogged and time.monotonic() - start < ATTACH_BOUND and agent.poll() is None:
            unlogged = [(t, name) for t, name in unlogged if not logged(lambda r, pid=t.pid: r.get("pid") == pid)]
            if unlogged:
                time.sleep(0.2)
        for t, name in unlogged:
            if not logged(lambda r, pid=t.pid: r.get("pid") == pid):
                p.append(f"nothing logged about the {name} target {t.pid} (neither attached nor skipped)")
        stop_start = time.monotonic()
        agent.send_signal(signal.SIGTERM)
        try:
            rc = agent.wait(STOP_BOUND)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
            rc = None
            p.append(f"SIGTERM did not stop the agent within {STOP_BOUND} s")
        if rc not in (0, None):
            p.append(f"the agent exited {rc} after SIGTERM")
        res.check(f"agent: the scan goes on past hostile targets and SIGTERM stops it "
                  f"({time.monotonic() - stop_start:.1f} s)", p)

        # --- inspect of what is not a trace ---
        dev_cases = (("FIFO", fifo, r"is a FIFO"), ("/dev/zero", "/dev/zero", r"character device"),
                     ("directory", work, r"is a directory"))
        for what, path, mention in dev_cases:
            rc, out, err, secs, rss = run_measured([rvbpfd, "inspect", path], ERROR_BOUND)
            p = one_error_line(err, 11, rc, mention) if rc is not None else [f"did not return in {ERROR_BOUND} s"]
            if out.strip():
                p.append(f"unexpected stdout {out[:200]!r}")
            res.check(f"inspect {what}: exit 11 in one line (rc {rc}, {secs:.1f} s)", p)
    except rvlib.Fatal as e:
        res.check("setup of the hostile targets", [str(e)])
    finally:
        for t in targets:
            t.stop()
    res.finish(work, keep=args.keep)


if __name__ == "__main__":
    main()
