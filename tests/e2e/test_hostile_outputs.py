#!/usr/bin/env python3
"""Hostile outputs and names: what another local user can plant or choose never makes root's rvbpfd write through
a symlink, print a terminal escape, or abort. Every case checks the exit code, the message, and that a root-owned
victim file outside the output (content and mtime) was not touched.

  trace -o       a symlink planted by `nobody` in a sticky world-writable directory (like /tmp with
                 fs.protected_symlinks=0) at the -o path: exit 8 naming the symbolic link; the victim unchanged
  export -o      symlinks at OUT.tmp and .OUT.tmp (the names a predictable temporary file would take): the export
                 succeeds into a new file of mode 0600, the links and the victim untouched; a symlink at OUT
                 itself: exit 8
  report -o      a symlink at the report path: exit 8
  dir sink       <dir>/<service> planted as a symlink to a root-owned directory: the agent keeps running, logs
                 "is a symbolic link", and writes nothing there
  comm           a non-Ruby process whose comm holds ESC sequences: exit 4 with the bytes escaped (\\x1b), no raw ESC
  --host         `rvbpfd agent --host $'bad\\xffhost'` and the same in a --config file: exit 2 naming --host, never
                 an abort (134) from the JSON writer
  --push-url     user:password@ and token= never appear in the validation error or the agent's startup log
"""
import os
import re
import signal
import stat
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rvlib  # noqa: E402

NOBODY = 65534
MSG = re.compile(r"^rvbpfd: [a-z-]+: \S.*$")


def run(argv, timeout=120, env=None):
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, b"", f"timed out after {timeout} s".encode()
    return p.returncode, p.stdout, p.stderr


class Victim:
    """A root-owned file outside every output; check() says whether anything touched it."""

    def __init__(self, path):
        self.path = path
        with open(path, "w") as f:
            f.write("precious root data\n")
        os.chmod(path, 0o644)
        past = time.time() - 3600
        os.utime(path, (past, past))
        self.st = os.stat(path)

    def check(self):
        st = os.stat(self.path)
        with open(self.path) as f:
            text = f.read()
        p = []
        if text != "precious root data\n":
            p.append(f"victim {self.path} was overwritten: {text[:80]!r}")
        if (st.st_mtime_ns, st.st_size, st.st_uid, st.st_mode) != (self.st.st_mtime_ns, self.st.st_size,
                                                                    self.st.st_uid, self.st.st_mode):
            p.append(f"victim {self.path} metadata changed (mtime/size/owner/mode)")
        return p


def plant_symlink(target, link):
    os.symlink(target, link)
    os.lchown(link, NOBODY, NOBODY)  # planted by another user


def one_error_line(rc, err, want_rc, must):
    p = []
    text = err.decode("utf-8", "replace")
    lines = [l for l in text.splitlines() if l.strip()]
    if rc is None:
        return [text]
    if rc != want_rc:
        p.append(f"exit {rc}, expected {want_rc}: {text[-500:]}")
    if len(lines) != 1 or not MSG.match(lines[0]):
        p.append(f"expected one 'rvbpfd: <name>: <message>' line, got: {lines[:5]}")
    elif not re.search(must, lines[0]):
        p.append(f"message does not mention {must!r}: {lines[0]}")
    return p


def main():
    args = rvlib.parse_args(__doc__)
    rvlib.require_bpf_environment()
    res = rvlib.Results()
    try:
        rvbpfd = rvlib.require_rvbpfd(args.rvbpfd)
        ruby = rvlib.any_test_ruby(args.source_dir)
    except rvlib.Fatal as e:
        res.check("setup (rvbpfd binary, a test Ruby)", [str(e)])
        res.finish()
    base = tempfile.mkdtemp(prefix="rvbpfd-e2e-hostile-")
    os.chmod(base, 0o755)
    victim = Victim(os.path.join(base, "victim"))
    sticky = os.path.join(base, "tmp")
    os.mkdir(sticky)
    os.chmod(sticky, 0o1777)

    # trace -o through a planted symlink.
    link = os.path.join(sticky, "trace.rvtrace")
    plant_symlink(victim.path, link)
    rc, out, err = run([rvbpfd, "-q", "-o", link, "--", ruby, "--disable-gems", "-e", "sleep 0.1"])
    p = one_error_line(rc, err, 8, r"symbolic link")
    p += victim.check()
    if not os.path.islink(link):
        p.append("the planted symlink was replaced or removed")
    res.check("trace -o at a symlink planted in a sticky directory: exit 8, victim untouched", p)

    # A real trace to export and report from.
    trace = os.path.join(base, "good.rvtrace")
    rc, out, err = run([rvbpfd, "-q", "-o", trace, "--", ruby, "--disable-gems", "-e",
                        "t = Thread.new { 20000.times { |i| i * i } }; sleep 0.05; t.join"])
    p = [] if rc == 0 and os.path.isfile(trace) else [f"recording failed: exit {rc}: {err[-500:]!r}"]
    if not p:
        mode = stat.S_IMODE(os.stat(trace).st_mode)
        if mode != 0o600:
            p.append(f"trace mode {oct(mode)}, expected 0o600 (traces hold command lines and paths)")
    res.check("a trace recorded as root is created with mode 0600", p)

    # export -o with symlinks planted at the names a predictable temporary file would take.
    out_path = os.path.join(sticky, "out.pb.gz")
    guesses = [out_path + ".tmp", os.path.join(sticky, ".out.pb.gz.tmp")]
    for g in guesses:
        plant_symlink(victim.path, g)
    rc, out, err = run([rvbpfd, "export", "--pprof", trace, "-o", out_path])
    p = [] if rc == 0 else [f"export failed: exit {rc}: {err[-500:]!r}"]
    p += victim.check()
    if os.path.islink(out_path) or not os.path.isfile(out_path):
        p.append(f"{out_path} is not a regular file")
    elif stat.S_IMODE(os.stat(out_path).st_mode) != 0o600:
        p.append(f"export mode {oct(stat.S_IMODE(os.stat(out_path).st_mode))}, expected 0o600")
    for g in guesses:
        if not os.path.islink(g):
            p.append(f"the planted {g} was replaced or removed")
    left = [f for f in os.listdir(sticky) if f.endswith(".tmp") and not os.path.islink(os.path.join(sticky, f))]
    if left:
        p.append(f"temporary files left behind: {left}")
    res.check("export -o with symlinks planted at OUT.tmp and .OUT.tmp: written safely, links untouched", p)

    link = os.path.join(sticky, "planted.json")
    plant_symlink(victim.path, link)
    rc, out, err = run([rvbpfd, "export", "--perfetto", trace, "-o", link])
    res.check("export -o at a planted symlink: exit 8, victim untouched",
              one_error_line(rc, err, 8, r"symbolic link") + victim.check())

    link = os.path.join(sticky, "planted.html")
    plant_symlink(victim.path, link)
    rc, out, err = run([rvbpfd, "report", trace, "-o", link])
    res.check("report -o at a planted symlink: exit 8, victim untouched",
              one_error_line(rc, err, 8, r"symbolic link") + victim.check())

    # The agent's dir sink with <dir>/<service> planted as a symlink to a root-owned directory.
    out_dir = os.path.join(base, "profiles")
    os.mkdir(out_dir)
    os.chmod(out_dir, 0o1777)  # a shared output directory other users can write
    root_dir = os.path.join(base, "root-only")
    os.mkdir(root_dir)
    os.chmod(root_dir, 0o700)
    service = "hostile-svc"
    plant_symlink(root_dir, os.path.join(out_dir, service))
    env = dict(os.environ, RVBPF_SERVICE=service)
    target = subprocess.Popen([ruby, "--disable-gems", "-e",
                               "STDOUT.puts 'ready'; STDOUT.flush; t = Time.now; "
                               "(x = 0; 200000.times { |i| x += i }; sleep 0.01) while Time.now - t < 40"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=env)
    agent = None
    p = []
    try:
        target.stdout.readline()
        agent = subprocess.Popen([rvbpfd, "agent", "--output-dir", out_dir, "--interval", "1", "--metrics-listen",
                                  "off", "--include", f"label:service={service}", "--log-format", "json",
                                  "--cache-dir", os.path.join(base, "sites")],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        log = rvlib.LineReader(agent.stderr)
        hit = log.wait_for(lambda l: "symbolic link" in l, 40)
        if hit is None:
            p.append("no log line saying <dir>/<service> is a symbolic link within 40 s:\n" + log.text()[-2000:])
        elif f"{service} is a symbolic link" not in hit:
            p.append(f"the log line does not name the service directory: {hit}")
        if agent.poll() is not None:
            p.append(f"the agent exited ({agent.returncode}) instead of carrying on")
        agent.send_signal(signal.SIGTERM)
        try:
            rc = agent.wait(30)
            if rc != 0:
                p.append(f"the agent ended with {rc} after SIGTERM")
        except subprocess.TimeoutExpired:
            p.append("the agent did not stop within 30 s of SIGTERM")
    finally:
        for proc in (agent, target):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    if os.listdir(root_dir):
        p.append(f"files written through the planted symlink: {os.listdir(root_dir)}")
    if not os.path.islink(os.path.join(out_dir, service)):
        p.append("the planted <dir>/<service> symlink was replaced or removed")
    res.check("agent --output-dir with <dir>/<service> planted as a symlink: nothing written through it",
              p + victim.check())

    # A non-Ruby process with terminal escapes in its comm.
    evil = "\x1b[2J\x1b]0;own\x07"
    sl = subprocess.Popen([sys.executable, "-c",
                           f"open('/proc/self/comm', 'w').write({evil!r}); print('ready', flush=True); "
                           "import time; time.sleep(60)"], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        sl.stdout.readline()
        comm = open(f"/proc/{sl.pid}/comm", "rb").read()
        rc, out, err = run([rvbpfd, "--pid", str(sl.pid), "-o", os.path.join(base, "comm.rvtrace")])
        p = one_error_line(rc, err, 4, r"\\x1b\[2J")
        if b"\x1b" not in comm:
            p.append(f"the test could not set an ESC comm: {comm!r}")
        if b"\x1b" in err or b"\x07" in err or b"\x1b" in out:
            p.append(f"raw control bytes reached the terminal: {err!r}")
    finally:
        sl.kill()
        sl.wait()
    res.check("a comm with ESC sequences is printed escaped (exit 4)", p)

    # --host with invalid UTF-8: flag and config file.
    bad = b"bad\xffhost"
    agent_out = os.path.join(base, "agent-out")
    rc, out, err = run([os.fsencode(rvbpfd), b"agent", b"--output-dir", os.fsencode(agent_out), b"--host", bad,
                        b"--metrics-listen", b"off"], timeout=60)
    p = one_error_line(rc, err, 2, r"--host")
    res.check("agent --host $'bad\\xffhost': exit 2 naming --host, no abort", p)
    cfg = os.path.join(base, "agent.json")
    with open(cfg, "wb") as f:
        f.write(b'{"host": "' + bad + b'", "output-dir": "' + os.fsencode(agent_out) + b'"}')
    rc, out, err = run([rvbpfd, "agent", "--config", cfg, "--metrics-listen", "off"], timeout=60)
    res.check("agent --config with an invalid UTF-8 host: exit 2, no abort",
              one_error_line(rc, err, 2, r"host|UTF-8|JSON"))

    # --push-url credentials never reach a log line or an error.
    secret = "s3cr3t-pw"
    rc, out, err = run([rvbpfd, "agent", "--push-url", f"http://alice:{secret}@127.0.0.1:9/x?token=tok-{secret}",
                        "--metrics-listen", "off"], timeout=60)
    p = one_error_line(rc, err, 2, r"\*\*\*@127\.0\.0\.1")
    if secret.encode() in err:
        p.append(f"the validation error shows the credentials: {err!r}")
    res.check("a --push-url validation error redacts user:password and token", p)
    a = subprocess.Popen([rvbpfd, "agent", "--push-url", f"http://alice:{secret}@127.0.0.1:9", "--output-dir",
                          os.path.join(base, "agent-push"), "--interval", "1", "--metrics-listen", "off",
                          "--include", "comm:no-such-rvbp", "--cache-dir", os.path.join(base, "sites")],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    log = rvlib.LineReader(a.stderr)
    started = log.wait_for(lambda l: "agent started" in l, 60)
    a.send_signal(signal.SIGTERM)
    try:
        a.wait(30)
    except subprocess.TimeoutExpired:
        a.kill()
        a.wait()
    log.t.join(5)
    p = [] if started else ["no 'agent started' line within 60 s:\n" + log.text()[-1500:]]
    if started and "***@127.0.0.1:9" not in started:
        p.append(f"the startup line does not show the redacted URL: {started[:400]}")
    if secret in log.text():
        p.append("the agent's log shows the push credentials")
    res.check("the agent's startup log shows --push-url without its credentials", p)

    res.finish(base, keep=args.keep)


if __name__ == "__main__":
    main()
