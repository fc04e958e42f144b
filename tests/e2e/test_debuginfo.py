#!/usr/bin/env python3
"""Debug info by build-id (src/elf/debug_lookup.h): a stripped VM binary whose split debug file is found by its
build-id is traced exactly like the unstripped one.

Per test Ruby (3.4.5-static: the ruby executable; 3.3.8-shared: libruby, loaded through LD_LIBRARY_PATH), the VM
binary is split with `objcopy --only-keep-debug` and a stripped copy made (3.3.8's copy also gets a .gnu_debuglink,
which must not matter). Then:
  - no debug file reachable: `rvbpfd sites --binary COPY` either refuses with exit 6 and a message saying where it
    looked, or (once stripped binaries are analysed without debug info) does not claim a debug file;
  - a planted debug file (issue 45: a tenant's own root may hold one for a binary other tenants run too) whose
    symbols move rb_f_sleep one byte into its first instruction: `rvbpfd sites` refuses the binary (exit 6, naming
    rb_f_sleep), caches nothing, and the same binary with its genuine debug file, with the same --cache-dir, gets the
    unstripped binary's sites; one that names another function's entry for rb_f_sleep (the code allows it) is cached
    under its own key, and the genuine debug file's analysis with the same --cache-dir is not served that entry;
  - the debug file under a temporary build-id tree (--debug-dir D: D/.build-id/xx/rest.debug) and, separately, served
    by Debian's debuginfod on loopback (DEBUGINFOD_URLS, DEBUGINFOD_CACHE_PATH in a temporary directory; --debug-dir
    pointing at an empty tree): for each
      * `rvbpfd sites --binary COPY` lists exactly the sites of the unstripped binary and says where the symbols came
        from ("# symbols: build-id directory PATH" / "# symbols: debuginfod URL ...");
      * rvbpfd attached to the workloads below (with a fresh --cache-dir, so the sites are computed from the debug
        file) says the same on its "attached" line, and records exactly the events of the in-process reference
        (rvlib.compare_traces, as test_fidelity.py);
      * stacks_golden: the stacks at release equal rb_profile_frames (test_stacks.py's golden check), so DWARF struct
        offsets and symbols from the debug file resolve frames.
"""
import os
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rvlib  # noqa: E402
import test_stacks  # noqa: E402

WORKLOADS = ("mutex_contention", "gc_threads", "pipe_io")


class StrippedRuby:
    """A test Ruby whose VM binary is a stripped copy: .bin runs it, .env_extra makes it load the copy."""

    def __init__(self, ruby, work):
        self.name, self.version, self.rvref_dir, self.prefix = ruby.name, ruby.version, ruby.rvref_dir, ruby.prefix
        self.env, self.yjit = ruby.env, ruby.yjit  # the Ruby's own settings (rvlib.RUBY_ENV: YJIT)
        self.env_extra = {}
        d = os.path.join(work, ruby.name)
        os.makedirs(d)
        if not ruby.shared:
            self.original = ruby.bin
            self.vm = os.path.join(d, "ruby")
            self.bin = self.vm
            debuglink = False
        else:
            self.original = os.path.realpath(os.path.join(ruby.prefix, "lib", "libruby.so"))
            libdir = os.path.join(d, "lib")
            os.makedirs(libdir)
            self.vm = os.path.join(libdir, os.path.basename(self.original))
            soname = subprocess.run(["readelf", "-d", self.original], capture_output=True, text=True).stdout
            for line in soname.splitlines():
                if "(SONAME)" in line:
                    os.symlink(os.path.basename(self.vm), os.path.join(libdir, line.split("[")[1].rstrip("]")))
            self.bin = ruby.bin
            # LD_LIBRARY_PATH wins over the executable's RUNPATH: the process maps the stripped copy.
            self.env_extra = {"LD_LIBRARY_PATH": libdir}
            debuglink = True
        self.debug = os.path.join(d, "vm.debug")
        rvlib.split_debug(self.original, self.debug, self.vm, debuglink=debuglink)
        self.build_id = rvlib.elf_build_id(self.vm)
        if not self.build_id or self.build_id != rvlib.elf_build_id(self.original):
            raise rvlib.Fatal(f"{self.vm}: build-id {self.build_id} differs from {self.original}'s")


def sites_lines(rvbpfd, binary, cache_dir, extra_args=(), env=None):
    p = subprocess.run([rvbpfd, "--cache-dir", cache_dir, "sites", "--binary", binary, *extra_args],
                       capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})
    return p.returncode, p.stdout.splitlines(), p.stderr.strip()


def check_sites(rvbpfd, sr, work, tag, extra_args, env, want_symbols):
    p = []
    rc0, want, err0 = sites_lines(rvbpfd, sr.original, tempfile.mkdtemp(dir=work, prefix="cache-"))
    if rc0 != 0:
        return [f"sites of the unstripped {sr.original} failed ({rc0}): {err0}"]
    rc, got, err = sites_lines(rvbpfd, sr.vm, tempfile.mkdtemp(dir=work, prefix="cache-"), extra_args, env)
    if rc != 0:
        return [f"sites of the stripped copy with the debug file {tag} exited {rc}: {err}"]
    sym = [l for l in got if l.startswith("# symbols: ")]
    if not sym or not sym[0][len("# symbols: "):].startswith(want_symbols):
        p.append(f"sites says {sym[:1]}, expected '# symbols: {want_symbols}...'")
    else:
        print(f"  {sym[0]}")
    body = [l for l in got if not l.startswith("#")]
    want_body = [l for l in want if not l.startswith("#")]
    if body != want_body or not body:
        p.append(f"sites of the stripped copy ({len(body)} lines) differ from the unstripped binary's "
                 f"({len(want_body)} lines):\n" + "\n".join(l for l in (set(body) ^ set(want_body)))[:3000])
    return p


def patch_symbol_value(path, name, value):
    """Sets st_value of the .symtab symbol `name` in the ELF64 file at `path`; returns its old value (None: none)."""
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        shoff, = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", data, 0x3a)
        for i in range(shnum):
            sh = shoff + i * shentsize
            sh_type, = struct.unpack_from("<I", data, sh + 4)
            if sh_type != 2:  # SHT_SYMTAB
                continue
            offset, size, link = struct.unpack_from("<QQI", data, sh + 0x18)
            str_off, = struct.unpack_from("<Q", data, shoff + link * shentsize + 0x18)
            for sym in range(offset, offset + size, 24):
                st_name, = struct.unpack_from("<I", data, sym)
                end = data.index(0, str_off + st_name)
                if data[str_off + st_name:end].decode(errors="replace") != name:
                    continue
                old, = struct.unpack_from("<Q", data, sym + 8)
                struct.pack_into("<Q", data, sym + 8, value)
                f.seek(0)
                f.write(data)
                return old
    return None


def symbol_value(path, name):
    out = subprocess.run(["nm", path], capture_output=True, text=True, timeout=120).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == name:
            return int(parts[0], 16)
    return None


def check_planted(rvbpfd, sr, work, genuine_dir):
    """Issue 45: a planted debug file decides nothing for others: refused when it moves a probe into an instruction,
    keyed by its own content when the code allows what it names."""
    p = []
    rc0, want, err0 = sites_lines(rvbpfd, sr.original, tempfile.mkdtemp(dir=work, prefix="cache-"))
    sleep_want = [l for l in want if " SLEEP " in l]
    if rc0 != 0 or not sleep_want:
        return [f"sites of the unstripped {sr.original} failed ({rc0}) or has no SLEEP site: {err0}"]
    sleep = symbol_value(sr.debug, "rb_f_sleep")
    neighbour = symbol_value(sr.debug, "rb_f_exit") or symbol_value(sr.debug, "rb_f_abort")
    if sleep is None or neighbour is None:
        return [f"{sr.debug} has no rb_f_sleep or rb_f_exit/rb_f_abort symbol"]
    genuine = ("--debug-dir", genuine_dir, "--debuginfod-timeout", "0")
    for tag, value in (("one byte into rb_f_sleep", sleep + 1), ("another function's entry", neighbour)):
        planted_dir = tempfile.mkdtemp(dir=work, prefix="planted-")
        planted = rvlib.install_build_id_debug(sr.debug, planted_dir, sr.build_id)
        if patch_symbol_value(planted, "rb_f_sleep", value) is None:
            return [f"no rb_f_sleep in {planted}'s .symtab"]
        cache = tempfile.mkdtemp(dir=work, prefix="cache-")
        rc, out, err = sites_lines(rvbpfd, sr.vm, cache, ("--debug-dir", planted_dir, "--debuginfod-timeout", "0"))
        if value == sleep + 1:
            if rc != 6 or "rb_f_sleep" not in err or "refused" not in err:
                p.append(f"planted debug file moving rb_f_sleep {tag}: exit {rc} (want 6 naming rb_f_sleep): "
                         f"{err[-500:]} {[l for l in out if ' SLEEP ' in l]}")
            if any(n.endswith(".json") and not n.startswith("file-") for n in os.listdir(cache)):
                p.append(f"planted debug file moving rb_f_sleep {tag}: a site cache entry was written: "
                         f"{os.listdir(cache)}")
        elif rc != 0:
            p.append(f"planted debug file naming {tag} for rb_f_sleep: exit {rc}: {err[-500:]}")
        else:
            print(f"  planted ({tag}): {[l for l in out if ' SLEEP ' in l]}")
        # The same binary with its genuine debug file, the same cache: the unstripped binary's sites.
        rc, got, err = sites_lines(rvbpfd, sr.vm, cache, genuine)
        body = [l for l in got if not l.startswith("#")]
        want_body = [l for l in want if not l.startswith("#")]
        if rc != 0 or body != want_body:
            p.append(f"after the planted debug file ({tag}), the genuine one with the same --cache-dir: exit {rc}, "
                     f"SLEEP {[l for l in got if ' SLEEP ' in l]} (want {sleep_want}): {err[-300:]}")
    return p


def record_checks(res, rvbpfd, sr, args, outdir, work, tag, rv_args, rv_env, want):
    for wl in [w for w in WORKLOADS if not args.workload or w in args.workload]:
        name = f"debuginfo {sr.name} {tag}: {wl} attach, events equal the reference"
        cache = tempfile.mkdtemp(dir=work, prefix="cache-")
        try:
            run = rvlib.run_workload(sr, wl, "attach", outdir, ref=True, probes=True, rvbpfd=rvbpfd,
                                     rv_args=("--cache-dir", cache, *rv_args), rv_env=rv_env,
                                     env_extra={**rvlib.FIDELITY_WORKLOADS[wl]["env"], **sr.env_extra})
        except rvlib.RunError as e:
            res.check(name, [str(e)])
            continue
        problems = list(run.problems)
        # A build-id directory is searched in the target's own root first (/proc/PID/root: here the host's).
        want_symbols = [want]
        if want.startswith("build-id directory "):
            want_symbols.append(f"build-id directory /proc/{run.target_pid}/root{want[len('build-id directory '):]}")
        problems += rvlib.attached_symbols_problems(run, want_symbols)
        if f"{sr.vm} (symbols: " not in run.rv_stderr:
            problems.append(f"rvbpfd did not trace the stripped copy {sr.vm}: {run.rv_stderr[-500:]}")
        if run.rv is not None:
            for check, probs in rvlib.compare_traces(run.ref, run.rv, probes=True).items():
                problems += [f"[{check}] {x}" for x in probs]
        res.check(name, problems)
    if args.workload and "stacks_golden" not in args.workload:
        return
    name = f"debuginfo {sr.name} {tag}: stacks at release equal rb_profile_frames"
    try:
        gdir = rvlib.build_golden(args.build_dir, args.source_dir, sr)
        gout = os.path.join(outdir, f"{sr.name}-{tag.split()[0]}-golden.json")
        cache = tempfile.mkdtemp(dir=work, prefix="cache-")
        run = rvlib.run_workload(sr, "stacks_golden", "attach", outdir, ref=False, rvbpfd=rvbpfd,
                                 rv_args=("--cache-dir", cache, *rv_args), rv_env=rv_env,
                                 env_extra={"RVGOLDEN_DIR": gdir, "RVGOLDEN_OUT": gout, **sr.env_extra})
    except rvlib.RunError as e:
        res.check(name, [str(e)])
        return
    problems = list(run.problems)
    if run.rv is not None:
        problems += test_stacks.check_golden(run.rv, gout, jit=sr.yjit)
        if any("stacks" in l and "warning" in l for l in run.rv_stderr.splitlines()):
            problems.append(f"rvbpfd warned about stacks: {run.rv_stderr[-1000:]}")
    res.check(name, problems)


def main():
    args, res, rvbpfd, rubies = rvlib.begin(__doc__)
    for tool in ("objcopy", "strip", "readelf", "debuginfod"):
        if shutil.which(tool) is None:
            res.check("setup", [f"{tool} not found (binutils, debuginfod: tools/install-deps.sh)"])
            res.finish()
    outdir = rvlib.make_outdir(args, "debuginfo")
    work = tempfile.mkdtemp(prefix="rvbpfd-e2e-debuginfo-work-")
    try:
        for ruby in rubies:
            try:
                sr = StrippedRuby(ruby, work)
            except rvlib.Fatal as e:
                res.check(f"debuginfo {ruby.name}: split and strip", [str(e)])
                continue
            empty = os.path.join(work, f"{ruby.name}-empty-debug")
            os.makedirs(empty)

            # No debug file anywhere: refused with where it looked, or at least no debug file claimed.
            rc, out, err = sites_lines(rvbpfd, sr.vm, tempfile.mkdtemp(dir=work, prefix="cache-"),
                                       ("--debug-dir", empty, "--debuginfod-timeout", "0"))
            p = []
            if rc == 6:
                if "debug info by build-id" not in err or empty not in err:
                    p.append(f"exit 6 without saying where it looked for the debug file: {err}")
            elif rc == 0:
                if any(l.startswith("# symbols: build-id") or l.startswith("# symbols: debuginfod") for l in out):
                    p.append(f"claims a debug file although none is reachable: {out[:2]}")
            else:
                p.append(f"exit {rc}: {err}")
            res.check(f"debuginfo {ruby.name}: stripped copy without any debug file (exit {rc})", p)

            # (1) A build-id directory.
            debug_dir = os.path.join(work, f"{ruby.name}-debug")
            installed = rvlib.install_build_id_debug(sr.debug, debug_dir, sr.build_id)
            dir_args = ("--debug-dir", debug_dir, "--debuginfod-timeout", "0")
            want = f"build-id directory {installed}"
            res.check(f"debuginfo {ruby.name} --debug-dir: sites equal the unstripped binary's",
                      check_sites(rvbpfd, sr, work, "in --debug-dir", dir_args, None, want))
            res.check(f"debuginfo {ruby.name}: a planted debug file places no probe and poisons no cache",
                      check_planted(rvbpfd, sr, work, debug_dir))
            record_checks(res, rvbpfd, sr, args, outdir, work, "--debug-dir", dir_args, None, want)

            # (2) Debian's debuginfod on loopback.
            serve = os.path.join(work, f"{ruby.name}-serve")
            os.makedirs(serve)
            shutil.copyfile(sr.debug, os.path.join(serve, "vm.debug"))
            server = None
            try:
                server = rvlib.Debuginfod(serve, tempfile.mkdtemp(dir=work, prefix="debuginfod-"))
                server.wait_serving(sr.build_id)
                di_args = ("--debug-dir", empty, "--debuginfod-timeout", "60")
                want = f"debuginfod {server.url}"
                res.check(f"debuginfo {ruby.name} debuginfod: sites equal the unstripped binary's",
                          check_sites(rvbpfd, sr, work, "from debuginfod", di_args, server.env(), want))
                record_checks(res, rvbpfd, sr, args, outdir, work, "debuginfod", di_args, server.env(), want)
            except rvlib.Fatal as e:
                res.check(f"debuginfo {ruby.name} debuginfod: server", [str(e)])
            finally:
                if server:
                    server.stop()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"work files kept in {work}")
        rvlib.cleanup_outdir(args, outdir)
    res.finish()


if __name__ == "__main__":
    main()
