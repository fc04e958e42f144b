#!/usr/bin/env python3
"""Least privilege: each mode works with exactly the capabilities docs/deploy.md lists for it, and with any one of
them removed fails with exit 7 and one line naming that capability ("missing CAP_X").

rvbpfd runs as uid 0 with its capability bounding set cut down by setpriv (util-linux), like systemd's
CapabilityBoundingSet; the target runs as `nobody`, so reading it needs more than uid 0's file ownership.

  --pid PID           CAP_BPF CAP_PERFMON CAP_SYS_PTRACE                  (the trace holds the target's events)
  agent               CAP_BPF CAP_PERFMON CAP_SYS_PTRACE                  (the target is attached)
  sites --pid PID     CAP_SYS_PTRACE                                      (the sites are listed)
  launch under sudo   CAP_BPF CAP_PERFMON CAP_CHOWN CAP_SETUID CAP_SETGID (the command runs as the invoker)

Launch under sudo of a VM binary without debug symbols (a stripped copy of the test Ruby: its layout comes from the
offsets table, which only the live layout check can confirm) with those capabilities: the command's memory is not
readable without CAP_SYS_PTRACE, so rvbpfd refuses with exit 7 and one line naming CAP_SYS_PTRACE and the debug
symbols, writes no trace, and leaves the command running (untraced) to its end.
"""
import os
import re
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rvlib  # noqa: E402
import test_stripped  # noqa: E402

NOBODY = 65534
MODES = {
    "--pid": ["bpf", "perfmon", "sys_ptrace"],
    "agent": ["bpf", "perfmon", "sys_ptrace"],
    "sites --pid": ["sys_ptrace"],
    "launch under sudo": ["bpf", "perfmon", "chown", "setuid", "setgid"],
}
WAIT = ("STDOUT.puts 'ready'; STDOUT.flush; t = Time.now; "
        "(Thread.new { sleep 0.01 }.join; x = 0; 20000.times { |i| x += i }) while Time.now - t < 600")


def limited(caps):
    bounding = "-all" + "".join(f",+{c}" for c in caps)
    return ["setpriv", "--inh-caps=-all", "--ambient-caps=-all", f"--bounding-set={bounding}", "--"]


def judge_missing(rc, err, cap):
    name = "CAP_" + cap.upper()
    lines = [l for l in err.splitlines() if l.strip()]
    p = []
    if rc != 7:
        p.append(f"exit {rc}, expected 7")
    if len(lines) != 1:
        p.append(f"expected one stderr line, got {len(lines)}: {lines[:4]}")
    elif not re.search(rf"missing {name}\b(?!,)", lines[0]):
        p.append(f"the message does not name exactly {name} as missing: {lines[0]}")
    return p


def main():
    args = rvlib.parse_args(__doc__)
    rvlib.require_bpf_environment()
    res = rvlib.Results()
    try:
        rvbpfd = rvlib.require_rvbpfd(args.rvbpfd)
        ruby = None
        for name in rvlib.RUBIES:
            try:
                ruby_prefix = rvlib.find_ruby(args.source_dir, name)
                ruby_name = name
                ruby = ruby_prefix + "/bin/ruby"
                break
            except rvlib.Fatal:
                continue
        if ruby is None:
            raise rvlib.Fatal("no test Ruby is built (tools/build-test-rubies.sh)")
        if subprocess.run(["setpriv", "--version"], capture_output=True).returncode != 0:
            raise rvlib.Fatal("setpriv (util-linux) is missing: tools/install-deps.sh")
    except rvlib.Fatal as e:
        res.check("setup (rvbpfd, a test Ruby, setpriv)", [str(e)])
        res.finish()
    base = tempfile.mkdtemp(prefix="rvbpfd-e2e-leastpriv-")
    os.chmod(base, 0o755)
    cache = os.path.join(base, "sites")
    target = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", ruby,
                               "--disable-gems", "-e", WAIT], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL)
    n = [0]

    def out_path():
        n[0] += 1
        return os.path.join(base, f"t{n[0]}.rvtrace")

    def record(caps):
        out = out_path()
        p = subprocess.run(limited(caps) + [rvbpfd, "-q", "--no-status", "--cache-dir", cache, "--pid",
                                            str(target.pid), "-d", "1", "-o", out],
                           capture_output=True, text=True, timeout=120)
        return p.returncode, p.stderr, out

    def sites(caps):
        p = subprocess.run(limited(caps) + [rvbpfd, "--cache-dir", cache, "sites", "--pid", str(target.pid)],
                           capture_output=True, text=True, timeout=120)
        return p.returncode, p.stderr, p.stdout

    def launch(caps, ruby=ruby, extra_env=None, script="Thread.new { sleep 0.01 }.join; p Process.uid"):
        out = out_path()
        env = dict(os.environ, SUDO_UID=str(NOBODY), SUDO_GID=str(NOBODY), SUDO_USER="nobody", **(extra_env or {}))
        p = subprocess.run(limited(caps) + [rvbpfd, "-q", "--no-status", "--cache-dir", cache, "-o", out, "--", ruby,
                                            "--disable-gems", "-e", script],
                           capture_output=True, text=True, timeout=120, env=env, cwd=base)
        return p.returncode, p.stderr, p.stdout, out

    def agent(caps, full):
        out_dir = os.path.join(base, f"agent{n[0]}")
        n[0] += 1
        a = subprocess.Popen(limited(caps) + [rvbpfd, "agent", "--output-dir", out_dir, "--interval", "1",
                                              "--metrics-listen", "off", "--log-format", "text", "--cache-dir", cache,
                                              "--include", "comm:ruby"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        log = rvlib.LineReader(a.stderr)
        if full:
            hit = log.wait_for(lambda l: "process attached" in l and f"pid={target.pid} " in l, 60)
            a.send_signal(signal.SIGTERM)
        try:
            rc = a.wait(60)
        except subprocess.TimeoutExpired:
            a.kill()
            rc = a.wait()
        log.t.join(5)
        return rc, log.text(), (hit if full else None)

    try:
        if target.stdout.readline().decode().strip() != "ready":
            raise rvlib.Fatal("the target did not start")
        for mode, needed in MODES.items():
            for removed in [None] + needed:
                caps = [c for c in needed if c != removed]
                label = f"{mode} with {' '.join('CAP_' + c.upper() for c in caps) or 'no capabilities'}"
                if mode == "--pid":
                    rc, err, out = record(caps)
                    if removed is None:
                        p = [] if rc == 0 else [f"exit {rc}: {err[-600:]}"]
                        if rc == 0:
                            tr = rvlib.Trace(out)
                            if not any(e.get("event") == "gvl_released" for e in tr.events):
                                p.append("the trace holds no gvl_released of the target")
                    else:
                        p = judge_missing(rc, err, removed)
                elif mode == "sites --pid":
                    rc, err, so = sites(caps)
                    if removed is None:
                        p = [] if rc == 0 and "build-id" in so else [f"exit {rc}: {err[-600:]}"]
                    else:
                        p = judge_missing(rc, err, removed)
                elif mode == "launch under sudo":
                    rc, err, so, out = launch(caps)
                    if removed is None:
                        p = [] if rc == 0 else [f"exit {rc}: {err[-600:]}"]
                        if so.strip() != str(NOBODY):
                            p.append(f"the command ran as uid {so.strip()!r}, expected {NOBODY}")
                    else:
                        p = judge_missing(rc, err, removed)
                        if so.strip():
                            p.append(f"the command ran anyway: {so!r}")
                else:
                    rc, text, hit = agent(caps, removed is None)
                    if removed is None:
                        p = [] if hit else [f"the target was not attached within 60 s:\n{text[-1500:]}"]
                        if rc != 0:
                            p.append(f"the agent ended with {rc} after SIGTERM")
                    else:
                        p = judge_missing(rc, text, removed)
                res.check(label + (f" (CAP_{removed.upper()} removed)" if removed else ": works"), p)
        # A stripped VM under sudo: the offsets table's layout cannot stand unchecked.
        stripped, env, vm = test_stripped.stripped_copy(rvlib.Ruby(ruby_name, ruby_prefix, None),
                                                        os.path.join(base, "stripped"))
        # The command lives a second: the check is made at its first scheduler events (a command that ends before is
        # refused as one whose memory could not be checked, exit 9).
        rc, err, so, out = launch(MODES["launch under sudo"], ruby=stripped.bin, extra_env=env,
                                  script="Thread.new { sleep 0.01 }.join; sleep 1; p Process.uid")
        lines = [l for l in err.splitlines() if l.strip()]
        p = []
        if rc != 7:
            p.append(f"exit {rc}, expected 7: {err[-600:]}")
        if len(lines) != 1 or "CAP_SYS_PTRACE" not in lines[0] or "debug symbols" not in lines[0]:
            p.append(f"expected one stderr line naming CAP_SYS_PTRACE and the debug symbols, got {lines[:4]}")
        if os.path.exists(out):
            p.append(f"a trace was written: {out}")
        if so.strip() != str(NOBODY):
            p.append(f"the command did not run on as uid {NOBODY}: stdout {so!r}")
        res.check(f"launch under sudo of a stripped VM ({os.path.basename(vm)}) without CAP_SYS_PTRACE: exit 7, "
                  f"no trace, the command runs on", p)
    except rvlib.Fatal as e:
        res.check("target", [str(e)])
    finally:
        target.kill()
        target.wait()
    res.finish(base, keep=args.keep)


if __name__ == "__main__":
    main()
