#!/usr/bin/env python3
"""Stripped VM binaries: rvbpfd records a Ruby whose libruby / static ruby has no .symtab and no DWARF.

For each test Ruby, the whole prefix is copied to a temporary directory and the VM binary of the copy is stripped
(`strip`: no .symtab, no .debug_*; .dynsym and .eh_frame stay, as in a distribution package). A shared build's
bin/ruby has an absolute RUNPATH to the original prefix, so the copy runs with LD_LIBRARY_PATH=<copy>/lib, which the
dynamic linker searches first: the process maps the stripped libruby (checked in /proc/PID/maps). Then:
  - `rvbpfd sites --binary <stripped VM>` succeeds, prints where each fact came from, and claims no symtab/DWARF;
  - every fidelity workload (rvlib.FIDELITY_WORKLOADS) in attach mode: the events are identical to the in-process
    reference recorder's (the same comparison as test_fidelity.py);
  - stacks_golden in attach mode: the stack at each release equals rb_profile_frames (as test_stacks.py).
GC enter/exit is compared too: every test Ruby's GC sites are found without symbols (hook checks of
ruby_vm_event_flags, objspace->hook_events, or 3.4.5-shared-yjit's calls of rb_gc_event_hook through the PLT).
"""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rvlib  # noqa: E402
import test_stacks  # noqa: E402


def vm_binary(prefix):
    """The ELF holding the VM: lib/libruby.so.X.Y.Z of a shared build, else bin/ruby."""
    lib = os.path.join(prefix, "lib")
    for f in sorted(os.listdir(lib)):
        p = os.path.join(lib, f)
        if f.startswith("libruby.so.") and f.count(".") == 4 and os.path.isfile(p) and not os.path.islink(p):
            return p
    return os.path.join(prefix, "bin", "ruby")


def stripped_copy(ruby, root):
    """Copies ruby's prefix under root, strips its VM binary; returns (Ruby, env, stripped VM path)."""
    prefix = os.path.join(root, ruby.name)
    shutil.copytree(ruby.prefix, prefix, symlinks=True)
    vm = vm_binary(prefix)
    subprocess.run(["strip", vm], check=True)
    sections = subprocess.run(["readelf", "-S", "-W", vm], check=True, capture_output=True, text=True).stdout
    for s in (".symtab", ".debug_info"):
        if s in sections:
            raise rvlib.Fatal(f"strip left {s} in {vm}")
    env = {"LD_LIBRARY_PATH": os.path.join(prefix, "lib")} if vm.endswith(tuple("0123456789")) else {}
    return rvlib.Ruby(ruby.name, prefix, ruby.rvref_dir), env, vm


def check_sites(rvbpfd, vm, cache_dir):
    p = subprocess.run([rvbpfd, "--cache-dir", cache_dir, "sites", "--binary", vm], capture_output=True, text=True,
                       timeout=120)
    if p.returncode != 0:
        return [f"rvbpfd sites --binary {vm} exited {p.returncode}: {p.stderr.strip()}"], ""
    problems = []
    prov = [l for l in p.stdout.splitlines() if l.startswith("# ") and ": " in l]
    facts = {l[2:].split(": ", 1)[0]: l.split(": ", 1)[1] for l in prov}
    for fact in ("hook list", "function extents", "hook sites", "events", "GC enter/exit", "Kernel#sleep",
                 "Mutex#lock", "thread struct offsets", "stack offsets", "sample EC route", "ruby_global_symbols"):
        if fact not in facts:
            problems.append(f"rvbpfd sites names no source for {fact!r}:\n{p.stdout[:2000]}")
        elif "symtab" in facts[fact] or "dwarf" in facts[fact]:
            problems.append(f"{fact}: claims {facts[fact]!r} for a binary without .symtab/DWARF")
        elif facts[fact].startswith("none"):
            problems.append(f"{fact}: not found in the stripped binary: {facts[fact]}")
    sites = [l for l in p.stdout.splitlines() if l.startswith("0x")]
    if not any("hook-site, disasm" in l for l in sites):
        problems.append("no hook site located th by disassembly")
    if any("dwarf" in l for l in sites):
        problems.append("a site claims DWARF in a stripped binary")
    return problems, p.stdout


def check_maps_stripped(ruby, env, vm):
    """The copy's ruby, run as the workloads are, maps the stripped VM binary (not the original one)."""
    p = subprocess.run([ruby.bin, "-e", "print File.read('/proc/self/maps')"], capture_output=True, text=True,
                       env={**os.environ, **env}, timeout=60)
    if p.returncode != 0:
        return [f"{ruby.bin} -e exited {p.returncode}: {p.stderr.strip()[:500]}"]
    if not any(line.rstrip().endswith(vm) for line in p.stdout.splitlines()):
        return [f"{ruby.bin} does not map the stripped {vm}"]
    return []


def main():
    args, res, rvbpfd, rubies = rvlib.begin(__doc__)
    outdir = rvlib.make_outdir(args, "stripped")
    root = tempfile.mkdtemp(prefix="rvbpfd-e2e-stripped-rubies-")
    cache = os.path.join(root, "sites-cache")
    try:
        for orig in rubies:
            try:
                ruby, env, vm = stripped_copy(orig, root)
            except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired, rvlib.Fatal) as e:
                res.check(f"stripped {orig.name}: make the stripped copy", [str(e)])
                continue
            res.check(f"stripped {ruby.name}: the copy runs on the stripped VM binary", check_maps_stripped(ruby, env, vm))
            problems, out = check_sites(rvbpfd, vm, cache)
            print(out, end="")
            res.check(f"stripped {ruby.name}: rvbpfd sites says where each fact came from", problems)
            for wl, spec in rvlib.FIDELITY_WORKLOADS.items():
                if args.workload and wl not in args.workload:
                    continue
                name = f"stripped {ruby.name} {wl} attach: events identical to the in-process reference"
                try:
                    run = rvlib.run_workload(ruby, wl, "attach", outdir, ref=True, probes=True, rvbpfd=rvbpfd,
                                             env_extra={**spec["env"], **env}, rv_args=("--cache-dir", cache))
                except rvlib.RunError as e:
                    res.check(name, [str(e)])
                    continue
                problems = list(run.problems)
                if run.rv is not None:
                    for check, probs in rvlib.compare_traces(run.ref, run.rv, probes=True).items():
                        problems += [f"[{check}] {p}" for p in probs]
                    lo, hi = rvlib.comparison_window(run.ref, run.rv)
                    win = rvlib.in_window(run.ref.named(rvlib.RECORDED_EVENTS), lo, hi, run.ref.tracepoint_window())
                    started = sum(1 for e in win if e["event"] == "thread_started")
                    if started != spec["threads"]:
                        problems.append(f"the common window holds {started} thread_started events of the "
                                        f"reference, the workload creates {spec['threads']}")
                    # Not vacuous: the trace holds what the workload makes (its GC runs, its probes), as in test_fidelity.
                    problems += rvlib.check_invariants(run.rv, spec, exact_window=True)
                    print(f"  compared {len(win)} events over {(hi - lo) / 1e6:.1f} ms")
                res.check(name, problems)
            if args.workload and "stacks_golden" not in args.workload:
                continue
            name = f"stripped {ruby.name} stacks_golden attach: stacks at release equal rb_profile_frames"
            try:
                gdir = rvlib.build_golden(args.build_dir, args.source_dir, orig)
                gout = os.path.join(outdir, f"{ruby.name}-golden.json")
                run = rvlib.run_workload(ruby, "stacks_golden", "attach", outdir, ref=False, rvbpfd=rvbpfd,
                                         env_extra={"RVGOLDEN_DIR": gdir, "RVGOLDEN_OUT": gout, **env},
                                         rv_args=("--cache-dir", cache))
            except rvlib.RunError as e:
                res.check(name, [str(e)])
                continue
            problems = list(run.problems)
            if run.rv is not None:
                problems += test_stacks.check_golden(run.rv, gout, jit=ruby.yjit)
            res.check(name, problems)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rvlib.cleanup_outdir(args, outdir)
    res.finish()


if __name__ == "__main__":
    main()
