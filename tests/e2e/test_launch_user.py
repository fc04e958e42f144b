#!/usr/bin/env python3
"""Launch mode never runs a sudo user's program as root: `sudo rvbpfd -- ruby app.rb` runs app.rb as the user who
ran sudo (SUDO_UID/SUDO_GID, supplementary groups re-initialised, HOME/USER of that user), `--user NAME` as NAME,
and root only without sudo or with `--user root`. The probes are attached before the program's first instruction
either way: every run must still record the program's thread_started, gvl_released/acquired and thread_exited.

Cases (sudo is simulated by setting SUDO_UID/SUDO_GID/SUDO_USER for the root-run rvbpfd, as sudo would):
  SUDO_UID=nobody           the script reports uid/euid/gid 65534, no root groups, HOME of nobody; events recorded
  --user nobody             the same without SUDO_*
  --user root under sudo    uid 0 (asked for explicitly)
  no sudo, no --user        uid 0 (rvbpfd's own identity), and the status line says so
  --user no-such-user       exit 2 naming the user, nothing run, no trace left
"""
import os
import pwd
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rvlib  # noqa: E402

SCRIPT = """
t = Thread.new { sleep 0.01; 1000.times { |i| i * i } }
t.join
ids = "uid=#{Process.uid} euid=#{Process.euid} gid=#{Process.gid} egid=#{Process.egid}"
puts "#{ids} groups=#{Process.groups.sort.join(',')} home=#{ENV['HOME']} user=#{ENV['USER']}"
"""


def run(rvbpfd, base, name, extra_args, env_extra, ruby):
    out = os.path.join(base, name + ".rvtrace")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUDO_")}
    env.update(env_extra)
    argv = [rvbpfd, "--no-status", "-o", out] + extra_args + ["--", ruby, "--disable-gems", "-e", SCRIPT]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd=base)
    return p, out


def parse_ids(stdout):
    for line in stdout.splitlines():
        if line.startswith("uid="):
            return dict(kv.split("=", 1) for kv in line.split())
    return None


def recorded(out):
    if not os.path.isfile(out):
        return [f"no trace at {out}"]
    tr = rvlib.Trace(out)
    names = [e.get("event") for e in tr.events]
    p = [f"trace: {x}" for x in tr.problems[:5]]
    for ev in ("thread_started", "gvl_released", "gvl_acquired", "thread_exited"):
        if ev not in names:
            p.append(f"no {ev} event recorded (probes not attached before exec?); events: {sorted(set(names))}")
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
    nobody = pwd.getpwnam("nobody")
    base = tempfile.mkdtemp(prefix="rvbpfd-e2e-launch-user-")
    os.chmod(base, 0o755)  # the dropped user must be able to enter the working directory

    sudo_env = {"SUDO_UID": str(nobody.pw_uid), "SUDO_GID": str(nobody.pw_gid), "SUDO_USER": "nobody"}
    for label, extra, env in (("under sudo (SUDO_UID=nobody)", [], sudo_env),
                              ("--user nobody", ["--user", "nobody"], {})):
        p, out = run(rvbpfd, base, label.split()[0].strip("-"), extra, env, ruby)
        prob = [] if p.returncode == 0 else [f"exit {p.returncode}: {p.stderr[-800:]}"]
        ids = parse_ids(p.stdout)
        if ids is None:
            prob.append(f"the script printed no ids: {p.stdout!r} {p.stderr[-500:]!r}")
        else:
            want = str(nobody.pw_uid)
            for k in ("uid", "euid"):
                if ids[k] != want:
                    prob.append(f"{k}={ids[k]}, expected {want} (nobody)")
            for k in ("gid", "egid"):
                if ids[k] != str(nobody.pw_gid):
                    prob.append(f"{k}={ids[k]}, expected {nobody.pw_gid}")
            if "0" in ids["groups"].split(","):
                prob.append(f"root's group 0 kept in the supplementary groups: {ids['groups']}")
            if ids["home"] != nobody.pw_dir or ids["user"] != "nobody":
                prob.append(f"HOME={ids['home']} USER={ids['user']}, expected {nobody.pw_dir} and nobody")
        if "running the command as nobody" not in p.stderr:
            prob.append(f"stderr does not say who the command runs as: {p.stderr[-500:]}")
        prob += recorded(out)
        if os.path.isfile(out):
            st = os.stat(out)
            if label.startswith("under sudo") and (st.st_uid, st.st_gid) != (nobody.pw_uid, nobody.pw_gid):
                prob.append(f"the trace is owned by {st.st_uid}:{st.st_gid}, not the sudo invoker")
        res.check(f"launch {label}: the program runs unprivileged and its events are recorded", prob)

    for label, extra, env in (("--user root under sudo", ["--user", "root"], sudo_env),
                              ("as root without sudo or --user", [], {})):
        p, out = run(rvbpfd, base, "root" + str(len(extra)), extra, env, ruby)
        prob = [] if p.returncode == 0 else [f"exit {p.returncode}: {p.stderr[-800:]}"]
        ids = parse_ids(p.stdout)
        if ids is None or ids["uid"] != "0" or ids["euid"] != "0":
            prob.append(f"expected uid 0, got {ids}")
        if not extra and "running the command as root" not in p.stderr:
            prob.append(f"stderr does not say the command runs as root: {p.stderr[-500:]}")
        prob += recorded(out)
        res.check(f"launch {label}: runs as root only when asked or not under sudo", prob)

    p, out = run(rvbpfd, base, "nosuch", ["--user", "no-such-user-rvbpfd"], {}, ruby)
    prob = []
    if p.returncode != 2:
        prob.append(f"exit {p.returncode}, expected 2: {p.stderr[-500:]}")
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    if len(lines) != 1 or "no-such-user-rvbpfd" not in lines[0]:
        prob.append(f"expected one line naming the user: {lines}")
    if p.stdout.strip():
        prob.append(f"the program ran: {p.stdout!r}")
    if os.path.exists(out):
        prob.append("a trace was left behind")
    res.check("launch --user no-such-user: exit 2, nothing run", prob)

    res.finish(base, keep=args.keep)


if __name__ == "__main__":
    main()
