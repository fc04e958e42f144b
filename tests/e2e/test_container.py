#!/usr/bin/env python3
"""A distribution Ruby in a container: Debian trixie's own ruby3.3 (stripped libruby, as every distribution ships
it) in the root tools/make-trixie-root.sh makes, run in new mount and pid namespaces chrooted into that root
(rvlib.Container: unshare --mount --pid --fork --mount-proc --root, under a reaping init), with rvbpfd attaching
from the host (attach mode: rvbpfd's launch mode cannot start a command through unshare).

Cases (each: the in-process reference recorder and the golden-frames extension compiled inside the root; checks:
scheduler/GC/probe events identical to the reference with native tids one to one with the namespace's, stacks at
release equal rb_profile_frames, pprof top is the hot method). The event comparison runs twice, and the events must
be identical both times: in the container (pid + mount namespaces: the VM names threads by the namespace's tids,
which rvbpfd translates to host tids), and in the same root with a mount namespace only:
  - debian-ruby3.3, no debug info at all: needs the analysis of stripped binaries (.dynsym + disassembly + offsets
    tables). Until rvbpfd has it, rvbpfd refuses with exit 6 and that is the expected outcome, printed with its reason
    (XFAIL); once it attaches, the full checks run and must pass;
  - debian-ruby3.3 with Debian's debug symbols (libruby3.3-dbgsym) in the root's /usr/lib/debug/.build-id, and the
    same file served by a loopback debuginfod: only when make-trixie-root.sh could install them (it needs Debian's
    debug archive in this machine's apt configuration); otherwise skipped with the reason;
  - test-ruby 3.3.8-shared copied into the root with its libruby stripped (objcopy --only-keep-debug + strip), the
    debug file in the root's /usr/lib/debug/.build-id (found through /proc/PID/root), and then served by Debian's
    debuginfod on loopback instead (the root's debug file removed): full checks.
In each case `rvbpfd agent` (the fleet mode) on the host also finds the container's Ruby (RVBPF_SERVICE in its
environment) and writes cpu profiles holding its hot method under its service name and host pid, with the labels of
its "process attached" record (service_name, container_id as its cgroup names one); where rvbpfd refuses the binary,
the agent logs a warning and skips it.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pprof_decode  # noqa: E402
import rvlib  # noqa: E402
import test_stacks  # noqa: E402

WORKLOADS = ("mutex_contention", "gc_threads", "pipe_io", "many_threads")
HOT_LEAF = "Foo.hot"


class ContainerRuby:
    """A Ruby as the container sees it (paths inside the root)."""

    def __init__(self, name, version, bin_path, rvref_dir, golden_dir, env_extra=None):
        self.name, self.version, self.bin = name, version, bin_path
        self.rvref_dir, self.golden_dir = rvref_dir, golden_dir
        self.env_extra = env_extra or {}


def pprof_top(rvbpfd, trace_path, out_dir):
    out = os.path.join(out_dir, os.path.basename(trace_path) + ".pb.gz")
    p = subprocess.run([rvbpfd, "export", "--pprof", trace_path, "-o", out], capture_output=True, text=True,
                       timeout=300)
    if p.returncode != 0:
        return None, f"rvbpfd export --pprof exited {p.returncode}: {p.stderr.strip()}"
    with open(out, "rb") as f:
        prof = pprof_decode.decode(f.read())
    cpu = [i for i, (t, _) in enumerate(prof["sample_types"]) if t in ("cpu", "samples")]
    idx = cpu[0] if cpu else 0
    by_leaf = {}
    for s in prof["samples"]:
        if s["stack"]:
            by_leaf[s["stack"][0]] = by_leaf.get(s["stack"][0], 0) + s["values"][idx]
    if not by_leaf:
        return None, f"the pprof export has no samples with a stack ({prof['sample_types']})"
    return max(by_leaf.items(), key=lambda kv: kv[1]), None


def full_checks(res, rvbpfd, ruby, containers, args, tag, rv_args, rv_env, want_symbols):
    """Events vs the reference (in the pid-namespaced container and in the mount-only one), golden stacks, pprof
    top."""
    container, mount_only = containers
    for wl, c in [(w, c) for w in WORKLOADS if not args.workload or w in args.workload for c in containers]:
        ns = "pid+mount namespaces" if c.pid_namespace else "mount namespace only"
        name = f"container {ruby.name} {tag}: {wl} events equal the reference ({ns})"
        cache = tempfile.mkdtemp(dir=c.workdir, prefix="cache-")
        try:
            run = rvlib.run_workload(ruby, wl, "attach", c.workdir, ref=True, probes=True, rvbpfd=rvbpfd,
                                     rv_args=("--cache-dir", cache, *rv_args), rv_env=rv_env, container=c,
                                     env_extra={**rvlib.FIDELITY_WORKLOADS[wl]["env"], **ruby.env_extra})
        except rvlib.RunError as e:
            res.check(name, [str(e)])
            continue
        problems = list(run.problems)
        if want_symbols:
            problems += rvlib.attached_symbols_problems(run, [want_symbols])
        if run.rv is not None:
            compared = rvlib.compare_traces(run.ref, run.rv, probes=True, pid_namespace=c.pid_namespace)
            for check, probs in compared.items():
                problems += [f"[{check}] {x}" for x in probs]
            problems += rvlib.check_invariants(run.rv, rvlib.FIDELITY_WORKLOADS[wl], exact_window=True)
        res.check(name, problems)

    if not args.workload or "stacks_golden" in args.workload:
        name = f"container {ruby.name} {tag}: stacks at release equal rb_profile_frames"
        gout = os.path.join(container.workdir, f"{ruby.name}-{tag.split()[0]}-golden.json")
        try:
            run = rvlib.run_workload(ruby, "stacks_golden", "attach", container.workdir, ref=False, rvbpfd=rvbpfd,
                                     rv_args=("--cache-dir", tempfile.mkdtemp(dir=container.workdir, prefix="cache-"),
                                              *rv_args), rv_env=rv_env, container=container,
                                     env_extra={"RVGOLDEN_DIR": ruby.golden_dir, "RVGOLDEN_OUT": container.inside(gout),
                                                **ruby.env_extra})
            problems = list(run.problems)
            if run.rv is not None:
                problems += test_stacks.check_golden(run.rv, gout)
        except rvlib.RunError as e:
            problems = [str(e)]
        res.check(name, problems)

    if args.workload and "stacks_hot" not in args.workload:
        return
    name = f"container {ruby.name} {tag}: pprof top is {HOT_LEAF}"
    try:
        run = rvlib.run_workload(ruby, "stacks_hot", "attach", container.workdir, ref=False, rvbpfd=rvbpfd,
                                 rv_args=("--cache-dir", tempfile.mkdtemp(dir=container.workdir, prefix="cache-"),
                                          *rv_args), rv_env=rv_env, container=container,
                                 env_extra={"STACKS_HOT_SECONDS": "2", **ruby.env_extra})
        problems = list(run.problems)
        if run.rv is not None:
            top, err = pprof_top(rvbpfd, run.rv.path, container.workdir)
            if err:
                problems.append(err)
            elif top[0] != HOT_LEAF:
                problems.append(f"pprof's top function is {top[0]} ({top[1]}), expected {HOT_LEAF}")
            else:
                print(f"  pprof top: {top[0]} ({top[1]} samples)")
    except rvlib.RunError as e:
        problems = [str(e)]
    res.check(name, problems)


def agent_check(res, rvbpfd, ruby, container, tag, agent_env, args, expect_refusal=False):
    """`rvbpfd agent` on the host finds the container's Ruby (RVBPF_SERVICE in its environment), attaches to it and
    writes profiles labelled with its service name and host pid, whose cpu profile holds the hot method; the
    "process attached" log record carries its labels (container_id as its cgroup names one, as test_agent.py).
    expect_refusal: the agent must instead log that it skips the process (a VM it cannot analyse)."""
    if args.workload and "agent_work" not in args.workload:
        return
    import test_agent  # noqa: E402 (the agent harness)
    name = f"container {ruby.name} {tag}: the agent " + ("skips it with a warning" if expect_refusal else
                                                        "profiles it with its container labels")
    service = f"e2e-container-{os.getpid()}"
    # A command name of its own (the kernel's comm is the exec'd file's name), so the agent's --include matches this
    # process and none of the host's other Rubies.
    comm = f"rvct{os.getpid() % 100000}"
    link = os.path.join(container.workdir, comm)
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(ruby.bin, link)
    out_dir = tempfile.mkdtemp(dir=container.workdir, prefix="agent-out-")
    cache = tempfile.mkdtemp(dir=container.workdir, prefix="cache-")
    saved = {k: os.environ.get(k) for k in agent_env}
    os.environ.update(agent_env)
    agent = proc = None
    problems = []
    try:
        agent = test_agent.Agent(rvbpfd, ["--interval", "2", "--hz", "49", "--output-dir", out_dir, "--cache-dir",
                                          cache, "--metrics-listen", "off", "--include", f"comm:{comm}"])
        env = {**container.environment(), "RVBPF_SERVICE": service, **ruby.env_extra}
        proc = subprocess.Popen(container.wrap([link[len(container.root):], container.workload("agent_work"), "hot_d",
                                                "10000",
                                                "0.005"]),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        if not proc.stdout.readline().decode().startswith("ready"):
            raise rvlib.Fatal(f"agent_work in the container did not start: {proc.stderr.read()[:500]!r}")
        pid = container.host_pid(proc)
        if expect_refusal:
            r = agent.wait_log(lambda r: r.get("pid") == pid and r.get("msg") != "process attached"
                               and r.get("level") in ("warn", "warning", "error"), 30)
            attached = agent.wait_log(lambda r: r.get("msg") == "process attached" and r.get("pid") == pid, 1)
            if r is None or attached is not None:
                problems.append(f"no warning about pid {pid} (or it was attached): {agent.records()[-5:]}")
            else:
                print(f"  agent: {json.dumps(r)[:400]}")
            return
        r = agent.wait_log(lambda r: r.get("msg") == "process attached" and r.get("pid") == pid, 60)
        if r is None:
            others = [r for r in agent.records() if r.get("msg") != "agent started"]
            problems.append(f"no 'process attached' for host pid {pid}; records: {others[-5:]}")
            return
        want_cid = test_agent.Proc.container_id(type("P", (), {"pid": pid})())
        if r.get("service_name") != service or (r.get("container_id") or None) != want_cid:
            problems.append(f"labels of the attached record: {r} (want service_name {service}, container_id "
                            f"{want_cid})")
        deadline = time.time() + 40
        hot = None
        while time.time() < deadline and hot is None:
            for root_dir, _, names in os.walk(os.path.join(out_dir, service)):
                for n in names:
                    if n.startswith(f"cpu-{pid}-"):
                        with open(os.path.join(root_dir, n), "rb") as f:
                            if "AgentWork#hot_d" in pprof_decode.function_names(pprof_decode.decode(f.read())):
                                hot = n
            time.sleep(1)
        if hot is None:
            found = [n for _, _, ns in os.walk(out_dir) for n in ns]
            problems.append(f"no cpu profile of service {service}, pid {pid} holding AgentWork#hot_d within "
                            f"40 s (files: {found[:10]})")
        else:
            labels = {k: r.get(k) for k in ("pid", "service_name", "container_id", "vm_path")}
            print(f"  agent: {service}/{hot} holds AgentWork#hot_d; labels {labels}")
    except (rvlib.Fatal, OSError, ValueError) as e:
        problems.append(str(e))
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if agent is not None:
            agent.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        res.check(name, problems)


def debuginfod_case(res, rvbpfd, ruby, containers, args, debug_file, build_id, tag, empty_debug_dir):
    """The full checks and the agent's with `debug_file` served only by Debian's debuginfod on loopback."""
    serve = tempfile.mkdtemp(dir=containers[0].workdir, prefix="serve-")
    shutil.copyfile(debug_file, os.path.join(serve, "vm.debug"))
    server = rvlib.Debuginfod(serve, tempfile.mkdtemp(dir=containers[0].workdir, prefix="debuginfod-"))
    try:
        server.wait_serving(build_id)
        full_checks(res, rvbpfd, ruby, containers, args, tag,
                    ("--debug-dir", empty_debug_dir, "--debuginfod-timeout", "60"), server.env(),
                    f"debuginfod {server.url}")
        agent_check(res, rvbpfd, ruby, containers[0], tag, {**server.env(), "RVBPFD_DEBUG_DIR": empty_debug_dir},
                    args)
    finally:
        server.stop()


def refusal(rvbpfd, container, host_pid_ruby, rv_args):
    """rvbpfd --pid on a container workload that waits for a line: (exit code, stderr)."""
    p = subprocess.Popen(container.wrap([host_pid_ruby.bin, container.workload("cpu_sleep")]), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=container.environment())
    try:
        line = p.stdout.readline().decode().strip()
        if line != "ready":
            return None, f"the workload printed {line!r} instead of 'ready'"
        pid = container.host_pid(p)
        r = subprocess.run([rvbpfd, "--pid", str(pid), "-o", os.path.join(container.workdir, "refused.rvtrace"),
                            "--cache-dir", tempfile.mkdtemp(dir=container.workdir, prefix="cache-"),
                            # A binary it can analyse is attached: the run must end while the workload waits.
                            "--duration", "3", *rv_args],
                           capture_output=True, text=True, timeout=120)
        return r.returncode, r.stderr.strip()
    finally:
        p.kill()
        p.wait(10)


def main():
    args, res, rvbpfd, rubies = rvlib.begin(__doc__)
    try:
        root = rvlib.trixie_root(args.source_dir)
    except rvlib.Fatal as e:
        res.check("setup (Debian trixie root)", [str(e)])
        res.finish()
    container = rvlib.Container(root)
    containers = (container, rvlib.Container(root, pid_namespace=False))
    copied = None
    try:
        # --- Debian's own ruby3.3 -----------------------------------------------------------------------------
        debian = ContainerRuby("debian-ruby3.3", "3.3.8", "/usr/bin/ruby3.3", "/opt/rvbpfd/rvref",
                               "/opt/rvbpfd/rvgolden")
        v = subprocess.run(["chroot", root, debian.bin, "-e", "print RUBY_VERSION"], capture_output=True, text=True)
        if v.returncode != 0 or not v.stdout.startswith("3.3."):
            res.check("Debian's ruby3.3 runs in the root", [f"exit {v.returncode}: {v.stdout} {v.stderr}"])
        debian.version = v.stdout.strip()
        empty = os.path.join(container.workdir, "empty-debug")
        os.makedirs(empty)
        no_debug = ("--debug-dir", empty, "--debuginfod-timeout", "0")
        rc, err = refusal(rvbpfd, container, debian, no_debug)
        if rc == 6:
            print(f"XFAIL container debian-ruby3.3 without debug info: refused with exit 6 as expected until rvbpfd "
                  f"analyses stripped binaries (.dynsym + disassembly + offsets tables): {err}")
            res.check("container debian-ruby3.3 without debug info: refused with exit 6 (expected for now)",
                      [] if "no symbol table" in err or "no-symbols" in err else [f"exit 6 without the reason: {err}"])
            agent_check(res, rvbpfd, debian, container, "no debug info", {"RVBPFD_DEBUG_DIR": empty}, args,
                        expect_refusal=True)
        elif rc == 0:
            full_checks(res, rvbpfd, debian, containers, args, "no debug info", no_debug, None, None)
            agent_check(res, rvbpfd, debian, container, "no debug info", {"RVBPFD_DEBUG_DIR": empty}, args)
        else:
            res.check("container debian-ruby3.3 without debug info", [f"rvbpfd exited {rc}: {err}"])

        unavailable = os.path.join(root, "opt", "rvbpfd", "dbgsym-unavailable")
        if os.path.exists(unavailable):
            with open(unavailable) as f:
                why = f.read().strip()
            print(f"SKIP container debian-ruby3.3 with Debian's dbgsym (/usr/lib/debug and debuginfod): {why}")
        else:
            lib = os.path.join(root, "usr", "lib", "x86_64-linux-gnu", "libruby-3.3.so.3.3")
            bid = rvlib.elf_build_id(lib)
            dbg = os.path.join(root, "usr", "lib", "debug", ".build-id", bid[:2], bid[2:] + ".debug")
            full_checks(res, rvbpfd, debian, containers, args, "dbgsym in /usr/lib/debug",
                        ("--debuginfod-timeout", "0"), None, "build-id directory /proc/")
            agent_check(res, rvbpfd, debian, container, "dbgsym in /usr/lib/debug", {}, args)
            debuginfod_case(res, rvbpfd, debian, containers, args, dbg, bid, "dbgsym by debuginfod", empty)

        # --- A test Ruby, stripped inside the root, with its split debug file --------------------------------
        ruby = next((r for r in rubies if r.name == "3.3.8-shared"), None)
        if ruby is None:
            print("SKIP the stripped test Ruby case: run with --ruby 3.3.8-shared")
        else:
            copied = root + ruby.prefix  # the same absolute path inside the root: the executable's RUNPATH holds
            if os.path.exists(copied):
                shutil.rmtree(copied)
            shutil.copytree(ruby.prefix, copied, symlinks=True)
            lib = os.path.realpath(os.path.join(ruby.prefix, "lib", "libruby.so"))
            lib_in_root = copied + lib[len(ruby.prefix):]
            debug = os.path.join(container.workdir, "libruby.debug")
            rvlib.split_debug(lib, debug, lib_in_root)
            bid = rvlib.elf_build_id(lib_in_root)
            ext = os.path.join(container.workdir, "ext")
            os.makedirs(ext)
            shutil.copy(os.path.join(ruby.rvref_dir, "rvref.so"), ext)
            gdir = rvlib.build_golden(args.build_dir, args.source_dir, ruby)
            shutil.copy(os.path.join(gdir, "rvgolden.so"), ext)
            copy = ContainerRuby(f"test-{ruby.name}-stripped", ruby.version, ruby.prefix + "/bin/ruby",
                                 container.inside(ext), container.inside(ext))
            installed = rvlib.install_build_id_debug(debug, os.path.join(root, "usr", "lib", "debug"), bid)
            try:
                full_checks(res, rvbpfd, copy, containers, args, "root /usr/lib/debug",
                            ("--debuginfod-timeout", "0"), None,
                            "build-id directory /proc/")
                agent_check(res, rvbpfd, copy, container, "root /usr/lib/debug", {}, args)
            finally:
                os.unlink(installed)
            debuginfod_case(res, rvbpfd, copy, containers, args, debug, bid, "debuginfod", empty)
    except rvlib.Fatal as e:
        res.check("container setup", [str(e)])
    finally:
        if copied and os.path.exists(copied):
            shutil.rmtree(copied, ignore_errors=True)
        for c in containers:
            c.cleanup(args.keep)
    res.finish()


if __name__ == "__main__":
    main()
