"""Shared code for rvbpfd's end-to-end tests (Python 3 standard library only).

Each tests/e2e/test_*.py is run by ctest as

    python3 test_x.py --rvbpfd <binary> --source-dir <repo> --build-dir <cmake build dir>

and exits 0 (pass), 77 (skip: only when the kernel or privileges forbid BPF) or 1 (fail), after printing a final
line "N passed, M failed".

What lives here:
  - environment checks (root, BTF, uprobes) and the test Rubies (tools/build-test-rubies.sh --print-prefix);
  - building the in-process reference recorder tests/refrecorder (rvref) per Ruby into <build-dir>/rvref-<name>/;
  - running a workload (tests/e2e/workloads/*.rb) under the reference, rvbpfd (attach or launch mode), or both;
  - reading .rvtrace files, windowing them on absolute CLOCK_MONOTONIC time, comparing them and checking invariants.

Workload protocol: the script prints "ready", blocks reading one line of stdin, runs, joins its threads, prints
"done" and exits. In attach mode the harness starts rvbpfd after "ready" and sends the line only once rvbpfd has
printed "rvbpfd: attached", so the attach happens while only the main thread exists and is blocked in a read.
"""

import argparse
import copy
import difflib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

RUBIES = ("3.3.8-shared", "3.4.5-static", "3.4.5-shared-yjit")
# The environment every process of a test Ruby runs with. The YJIT build runs with YJIT enabled (RUBY_YJIT_ENABLE=1 is
# --yjit) and compiling every method and block at its first call (YJIT's default waits for 30 calls), so the workloads'
# own code runs as JIT code and each test that covers this Ruby compares the events and frames of JIT code with
# CRuby's own; setup_rubies refuses it when YJIT is not actually on.
RUBY_ENV = {"3.4.5-shared-yjit": {"RUBY_YJIT_ENABLE": "1", "RUBYOPT": "--yjit-call-threshold=1"}}

SCHED_EVENTS = ("thread_started", "wants_gvl", "gvl_acquired", "gvl_released", "thread_exited")
GC_EVENTS = ("gc_enter", "gc_exit")
PROBE_EVENTS = ("sleep_enter", "mutex_lock_enter")
RECORDED_EVENTS = SCHED_EVENTS + GC_EVENTS + PROBE_EVENTS
# Events that a CRuby TracePoint delivers to the in-process recorder (the thread hook delivers the rest).
TRACEPOINT_EVENTS = GC_EVENTS + PROBE_EVENTS
# Events that run on the thread they are about (3.3+): STARTED runs on the creator, READY on the waker.
OWN_THREAD_EVENTS = ("gvl_acquired", "gvl_released", "thread_exited") + GC_EVENTS + PROBE_EVENTS

# Workloads compared against the reference. Value: extra environment, and what the workload must show.
#   threads: non-main Ruby threads it creates; probes: exact probe events it makes (attach-mode window).
FIDELITY_WORKLOADS = {
    "cpu_sleep": {"env": {}, "threads": 2, "probes": {"sleep_enter": 2, "mutex_lock_enter": 0}},
    "pipe_io": {"env": {}, "threads": 3, "probes": {"sleep_enter": 10, "mutex_lock_enter": 0}},
    "mutex_contention": {"env": {}, "threads": 4, "probes": {"sleep_enter": 60, "mutex_lock_enter": 120}},
    "queue": {"env": {}, "threads": 2, "probes": {"sleep_enter": 20, "mutex_lock_enter": 0}},
    "many_threads": {"env": {}, "threads": 40, "probes": {"sleep_enter": 0, "mutex_lock_enter": 0}},
    "gc_threads": {"env": {}, "threads": 2, "probes": {"sleep_enter": 0, "mutex_lock_enter": 0}, "min_gc": 6},
    "mn_threads": {"env": {"RUBY_MN_THREADS": "1"}, "threads": 5,
                   "probes": {"sleep_enter": 15 + 8, "mutex_lock_enter": 0}},
}
OTHER_WORKLOADS = ("bench_cpu4", "bench_io", "flood")

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOAD_DIR = os.path.join(HERE, "workloads")


class Fatal(Exception):
    """The harness cannot go on (missing Ruby, build failure): a test failure, not a skip."""


# ----------------------------------------------------------------------------------------------------------------
# Results and reporting
# ----------------------------------------------------------------------------------------------------------------

class Results:
    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.failures = []

    def check(self, name, problems):
        """problems: list of strings (empty = pass)."""
        if isinstance(problems, str):
            problems = [problems]
        if problems:
            self.failed += 1
            self.failures.append(name)
            print(f"FAIL {name}")
            for p in problems:
                for line in str(p).splitlines():
                    print(f"    {line}")
        else:
            self.passed += 1
            print(f"PASS {name}")
        sys.stdout.flush()
        return not problems

    def finish(self, work_dir=None, keep=False):
        """Prints the tally and exits 0 when every check passed, else 1. work_dir (a test's temporary directory) is
        removed when everything passed and keep is false, and otherwise kept and printed for a look."""
        if work_dir:
            if keep or self.failed:
                print(f"kept {work_dir}")
            else:
                shutil.rmtree(work_dir, ignore_errors=True)
        if self.failures:
            print("failed checks:")
            for f in self.failures:
                print(f"  {f}")
        print(f"{self.passed} passed, {self.failed} failed")
        sys.stdout.flush()
        sys.exit(0 if self.failed == 0 else 1)


def parse_args(description, extra=None):
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--rvbpfd", required=True, help="path of the rvbpfd binary under test")
    ap.add_argument("--source-dir", required=True, help="repository root")
    ap.add_argument("--build-dir", required=True, help="cmake build directory (rvref is built under it)")
    ap.add_argument("--ruby", action="append", choices=RUBIES, help="only these test Rubies (default: all)")
    ap.add_argument("--workload", action="append", help="only these workloads (default: all)")
    ap.add_argument("--keep", action="store_true", help="keep the traces in a temporary directory and print it")
    if extra:
        extra(ap)
    return ap.parse_args()


def skip(reason):
    print(f"SKIP: {reason}")
    print("0 passed, 0 failed")
    sys.stdout.flush()
    sys.exit(77)


def require_bpf_environment():
    """Exit 77 only when the kernel or privileges truly forbid BPF uprobes."""
    if os.geteuid() != 0:
        skip("not root: attaching BPF uprobes needs root (or CAP_BPF+CAP_PERFMON+CAP_SYS_ADMIN)")
    if not os.path.exists("/sys/kernel/btf/vmlinux"):
        skip("the kernel has no BTF (/sys/kernel/btf/vmlinux missing)")
    if not os.path.exists("/sys/bus/event_source/devices/uprobe"):
        skip("the kernel has no uprobe PMU (/sys/bus/event_source/devices/uprobe missing)")


def require_rvbpfd(path):
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise Fatal(f"rvbpfd binary not found or not executable: {path}")
    return os.path.abspath(path)


# ----------------------------------------------------------------------------------------------------------------
# Test Rubies and the reference extension
# ----------------------------------------------------------------------------------------------------------------

class Ruby:
    def __init__(self, name, prefix, rvref_dir):
        self.name = name
        self.prefix = prefix
        self.bin = os.path.join(prefix, "bin", "ruby")
        self.rvref_dir = rvref_dir
        self.version = name.split("-")[0]
        self.shared = "-shared" in name  # the VM is lib/libruby.so (else the ruby executable itself)
        self.env = dict(RUBY_ENV.get(name, {}))
        self.yjit = self.env.get("RUBY_YJIT_ENABLE") == "1"


def find_ruby(source_dir, name):
    script = os.path.join(source_dir, "tools", "build-test-rubies.sh")
    try:
        prefix = subprocess.run(["bash", script, "--print-prefix", name], check=True, capture_output=True,
                                text=True, timeout=30).stdout.strip()
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
        raise Fatal(f"{script} --print-prefix {name} failed: {e}")
    if not os.path.isfile(os.path.join(prefix, ".complete")) or not os.access(os.path.join(prefix, "bin", "ruby"),
                                                                            os.X_OK):
        raise Fatal(f"test Ruby {name} missing at {prefix} (no .complete stamp): run tools/build-test-rubies.sh")
    return prefix


def any_test_ruby(source_dir):
    """bin/ruby of the first test Ruby that is built, for tests where any CRuby will do."""
    errors = []
    for name in RUBIES:
        try:
            return find_ruby(source_dir, name) + "/bin/ruby"
        except Fatal as e:
            errors.append(str(e))
    raise Fatal("; ".join(errors))


def build_rvref(source_dir, build_dir, name, ruby_bin):
    """Builds tests/refrecorder with this Ruby's mkmf into <build-dir>/rvref-<name>/ (outside the source tree)."""
    src = os.path.join(source_dir, "tests", "refrecorder")
    out = os.path.join(os.path.abspath(build_dir), f"rvref-{name}")
    os.makedirs(out, exist_ok=True)
    so = os.path.join(out, "rvref.so")
    # Several test files may build the same directory at once under `ctest -j`.
    with open(os.path.join(out, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        sources = [os.path.join(src, f) for f in ("rvref.c", "extconf.rb")]
        if os.path.exists(so) and all(os.path.getmtime(so) >= os.path.getmtime(s) for s in sources):
            return out
        for f in ("Makefile", "rvref.o", "rvref.so", "mkmf.log"):
            if os.path.exists(os.path.join(out, f)):
                os.unlink(os.path.join(out, f))
        for cmd in ([ruby_bin, os.path.join(src, "extconf.rb")], ["make", "V=1"]):
            p = subprocess.run(cmd, cwd=out, capture_output=True, text=True, timeout=300)
            if p.returncode != 0:
                raise Fatal(f"building rvref for {name} failed: {' '.join(cmd)}\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
        if not os.path.exists(so):
            raise Fatal(f"building rvref for {name}: {so} missing after make")
    return out


def check_jit(ruby):
    """A Ruby meant to run with YJIT must have it on in its environment (a build without YJIT would only warn)."""
    if not ruby.yjit:
        return
    env = dict(os.environ)
    env.pop("RUBYOPT", None)
    env.update(ruby.env)
    p = subprocess.run([ruby.bin, "-e", "exit(defined?(RubyVM::YJIT) && RubyVM::YJIT.enabled? ? 0 : 1)"], env=env,
                       capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise Fatal(f"test Ruby {ruby.name} does not run with YJIT enabled ({ruby.env}): {p.stderr.strip()[:300]} "
                    f"(tools/build-test-rubies.sh builds it with Debian's rustc)")


def setup_rubies(args, rvref=True):
    """The test Rubies --ruby names (default all), checked for YJIT; with their in-process reference recorders
    built unless rvref=False."""
    rubies = []
    for name in (args.ruby or RUBIES):
        prefix = find_ruby(args.source_dir, name)
        ruby = Ruby(name, prefix, build_rvref(args.source_dir, args.build_dir, name, os.path.join(prefix, "bin", "ruby"))
                    if rvref else None)
        check_jit(ruby)
        rubies.append(ruby)
    return rubies


def begin(description, extra=None):
    """The common start of a test on the test Rubies: arguments, the BPF check (exit 77 where BPF is forbidden),
    the rvbpfd binary, the Rubies with their in-process reference recorders. A setup failure is one failed check and
    ends the test. Returns (args, Results, rvbpfd path, [Ruby])."""
    args = parse_args(description, extra)
    require_bpf_environment()
    res = Results()
    try:
        rvbpfd = require_rvbpfd(args.rvbpfd)
        rubies = setup_rubies(args)
    except Fatal as e:
        res.check("setup (rvbpfd binary, test Rubies, rvref)", [str(e)])
        res.finish()
    return args, res, rvbpfd, rubies


def build_golden(build_dir, source_dir, ruby):
    """Builds tests/golden (RvGolden.capture: CRuby's own rb_profile_frames of every thread) with this Ruby's mkmf
    into BUILD/golden-e2e-<ruby>; returns the directory."""
    d = os.path.join(build_dir, f"golden-e2e-{ruby.name}")
    os.makedirs(d, exist_ok=True)
    log = os.path.join(d, "build.log")
    # Several test files may build the same directory at once under `ctest -j`.
    with open(os.path.join(d, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with open(log, "w") as f:
            r = subprocess.run([ruby.bin, os.path.join(source_dir, "tests", "golden", "extconf.rb")], cwd=d, stdout=f,
                               stderr=subprocess.STDOUT)
            if r.returncode == 0:
                r = subprocess.run(["make"], cwd=d, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        raise RunError(f"building tests/golden for {ruby.name} failed, see {log}")
    return d


def workload_path(name):
    p = os.path.join(WORKLOAD_DIR, f"{name}.rb")
    if not os.path.isfile(p):
        raise Fatal(f"workload missing: {p}")
    return p


# ----------------------------------------------------------------------------------------------------------------
# Traces
# ----------------------------------------------------------------------------------------------------------------

ZSTD_MAGIC = 0xFD2FB528
ZSTD_SKIPPABLE_MAGIC = 0x184D2A50  # ..0x184D2A5F


def is_zstd(raw):
    """Whether bytes start like a zstd stream (docs/rvtrace.md "Compression"): by magic number, never by file name."""
    if len(raw) < 4:
        return False
    magic = int.from_bytes(raw[:4], "little")
    return magic == ZSTD_MAGIC or (magic & 0xFFFFFFF0) == ZSTD_SKIPPABLE_MAGIC


def trace_bytes(path):
    """The JSON Lines of an .rvtrace file, plain or zstd-compressed, as bytes, and a problem (None when there is none).
    A compressed file is decoded by the zstd CLI (tools/install-deps.sh installs it); one cut inside a zstd frame, as
    a killed recorder leaves it, gives what its complete blocks decode to and a problem saying it was cut."""
    with open(path, "rb") as f:
        raw = f.read()
    if not is_zstd(raw):
        return raw, None
    if shutil.which("zstd") is None:
        raise SystemExit(f"{path} is zstd-compressed and the zstd command is missing: apt-get install zstd "
                         "(tools/install-deps.sh)")
    p = subprocess.run(["zstd", "-d", "-c", "-q"], input=raw, capture_output=True, timeout=600)
    if p.returncode != 0:
        return p.stdout, f"zstd stream cut or corrupt: {p.stderr.decode('utf-8', 'replace').strip()[-300:]}"
    return p.stdout, None


class Trace:
    """One .rvtrace file: header, thread lines, events (dicts, file order, each with 'abs' added), summary."""

    def __init__(self, path):
        self.path = path
        self.header = None
        self.threads = {}       # ruby_thread -> thread object
        self.thread_line_index = {}  # ruby_thread -> index in file of its thread line
        self.thread_infos = []  # thread_info lines, in file order (their values are merged into self.threads)
        self.events = []
        self.frames = {}        # frame id -> frame object (dictionary lines, docs/rvtrace.md "Frames and stacks")
        self.stacks = {}        # stack id -> [frame id, ...], leaf first
        self.summary = None
        self.processes = {}     # process id -> process object (a trace that follows a process tree)
        self.process_line_index = {}  # process id -> index in file of its process line
        self.process_ends = {}  # process id -> process_end object
        self.problems = []      # format problems found while reading
        self.lines = 0
        raw, problem = trace_bytes(path)
        if problem:
            self.problems.append(problem)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            self.problems.append(f"not UTF-8: {e}")
            text = raw.decode("utf-8", "replace")
        if text and not text.endswith("\n"):
            self.problems.append("last line is not terminated by a newline")
        for i, line in enumerate(text.splitlines()):
            self.lines += 1
            if not line.strip():
                self.problems.append(f"line {i + 1}: empty line")
                continue
            try:
                obj = json.loads(line)
            except ValueError as e:
                self.problems.append(f"line {i + 1}: invalid JSON ({e}): {line[:200]}")
                continue
            if not isinstance(obj, dict):
                self.problems.append(f"line {i + 1}: not an object")
                continue
            if i == 0:
                self.header = obj
                continue
            if "summary" in obj:
                if self.summary is not None:
                    self.problems.append(f"line {i + 1}: second summary line")
                self.summary = obj["summary"]
                continue
            if self.summary is not None:
                self.problems.append(f"line {i + 1}: line after the summary")
            if "thread" in obj:
                t = obj["thread"]
                self.threads[t.get("ruby_thread")] = t
                self.thread_line_index.setdefault(t.get("ruby_thread"), i)
                continue
            if "process" in obj and isinstance(obj["process"], dict):
                pr = obj["process"]
                self.processes[pr.get("id")] = pr
                self.process_line_index.setdefault(pr.get("id"), i)
                continue
            if "process_end" in obj and isinstance(obj["process_end"], dict):
                self.process_ends[obj["process_end"].get("id")] = obj["process_end"]
                continue
            if "thread_info" in obj and isinstance(obj["thread_info"], dict):
                # A name or namespace tid learnt or changed after the thread line (docs/rvtrace.md).
                ti = obj["thread_info"]
                t = self.threads.get(ti.get("ruby_thread"))
                if t is None:
                    self.problems.append(f"line {i + 1}: thread_info before its thread's line")
                    continue
                self.thread_infos.append(ti)
                t.update({k: ti[k] for k in ("name", "native_name", "ns_tid") if k in ti})
                continue
            if "event" in obj:
                obj["_line"] = i
                if "stack" in obj and obj["stack"] not in self.stacks:
                    self.problems.append(f"line {i + 1}: stack {obj['stack']} used before its definition")
                self.events.append(obj)
                continue
            if "frame" in obj and isinstance(obj["frame"], dict):
                self.frames[obj["frame"].get("id")] = obj["frame"]
                continue
            if "stack" in obj and isinstance(obj["stack"], dict):
                st = obj["stack"]
                missing = [f for f in st.get("frames", []) if f not in self.frames]
                if missing:
                    self.problems.append(f"line {i + 1}: stack {st.get('id')} uses undefined frames {missing[:5]}")
                self.stacks[st.get("id")] = st.get("frames", [])
                continue
            self.problems.append(f"line {i + 1}: unknown line kind: {line[:200]}")
        if self.header is None or self.header.get("rvtrace") != 1:
            self.problems.append(f"first line is not an rvtrace v1 header: {self.header!r}"[:300])
            self.header = self.header or {}
        self.origin = self.header.get("origin_ns")
        if not isinstance(self.origin, int):
            self.problems.append(f"header origin_ns is not an integer: {self.origin!r}")
            self.origin = 0
        if self.summary is None:
            self.problems.append("no summary line at the end")
            self.summary = {}
        for e in self.events:
            t = e.get("t_ns")
            e["abs"] = self.origin + t if isinstance(t, int) else None

    def thread_label(self, tid):
        """How rvbpfd's tools label a Ruby thread (trace/reader.h ThreadLabelWithName): "main" or "Thread #N", then
        " (NAME)" with NAME its Thread#name, else its native name unless that is the main thread's."""
        t = self.threads.get(tid, {})
        main = bool(t.get("main")) or self.header.get("main_thread") == tid
        label = "main" if main else f"Thread #{tid}"
        mains = [x for x in self.threads.values() if x.get("main") or x.get("ruby_thread") == self.header.get("main_thread")]
        process_comm = mains[-1].get("native_name") if mains else None
        name = t.get("name") or ""
        if not name and t.get("native_name") and t.get("native_name") != process_comm:
            name = t["native_name"]
        if name and not (main and name == "main"):
            label += f" ({name})"
        return label

    def stack_frames(self, e):
        """The frame objects of event e's stack, leaf first ([] when it has none)."""
        if "stack" not in e:
            return []
        return [self.frames[f] for f in self.stacks.get(e["stack"], [])]

    def stack_labels(self, e):
        return [f.get("label") for f in self.stack_frames(e)]

    @property
    def recorder(self):
        return self.header.get("recorder")

    def first(self, name):
        for e in self.events:
            if e.get("event") == name:
                return e
        return None

    def last(self, name):
        for e in reversed(self.events):
            if e.get("event") == name:
                return e
        return None

    def named(self, names):
        return [e for e in self.events if e.get("event") in names]

    def dropped_records(self):
        return [e for e in self.events if e.get("event") == "events_dropped"]

    def window(self):
        """(start_abs, end_abs) of the time this recorder was complete."""
        if self.recorder == "in-process":
            return self.origin, self.origin + int(self.summary.get("stopped_t_ns", 0))
        start = self.first("tracing_started")
        stop = self.last("tracing_stopped")
        lo = start["abs"] if start and start.get("abs") is not None else self.origin
        if stop and stop.get("abs") is not None:
            hi = stop["abs"]
        else:
            hi = max((e["abs"] for e in self.events if e.get("abs") is not None), default=self.origin)
        return lo, hi

    def tracepoint_end(self):
        """In-process only: when CRuby cleared the TracePoints (rule TEARDOWN_TRACEPOINTS), absolute."""
        v = self.summary.get("tracepoints_stopped_t_ns")
        return None if v is None else self.origin + int(v)

    def tracepoint_start(self):
        """In-process only: when its TracePoints were live (enabling one allocates, which can run a GC first)."""
        v = self.summary.get("tracepoints_started_t_ns")
        return None if v is None else self.origin + int(v)

    def tracepoint_window(self):
        return (self.tracepoint_start(), self.tracepoint_end())


def process_view(trace, process_id):
    """A Trace with only process `process_id`'s threads and events of a multi-process trace (and the daemon's events
    without a thread; for process 1 every event without a thread), its ruby_threads renumbered as that process's own
    recorder numbers them: its main thread 1, the others 2, 3, ... in the order of their global numbers."""
    view = copy.copy(trace)
    mine = {t: o for t, o in trace.threads.items() if o.get("process", 1) == process_id}
    main = [t for t, o in mine.items() if o.get("main")]
    order = main + sorted(t for t in mine if t not in main)
    ids = {t: i + 1 for i, t in enumerate(order)}
    view.threads = {}
    for t, o in mine.items():
        o = dict(o)
        o["ruby_thread"] = ids[t]
        view.threads[ids[t]] = o
    view.events = []
    for e in trace.events:
        t = e.get("ruby_thread")
        if t is None:
            if e.get("source") == "daemon" or process_id == 1:
                view.events.append(e)
            continue
        if t in ids:
            e = dict(e)
            e["ruby_thread"] = ids[t]
            view.events.append(e)
    view.header = dict(trace.header)
    view.header["main_thread"] = 1
    view.processes = {}  # the view is a trace of one process
    view.process_ends = {}
    return view


def paused_ns(trace):
    """ns of the trace between tracing_paused and tracing_resumed (a pause still open runs to the last event)."""
    total, since = 0, None
    last = max((e["t_ns"] for e in trace.events if isinstance(e.get("t_ns"), int)), default=0)
    for e in trace.events:
        if e.get("event") == "tracing_paused" and since is None:
            since = e["t_ns"]
        elif e.get("event") == "tracing_resumed" and since is not None:
            total += e["t_ns"] - since
            since = None
    return total + (last - since if since is not None else 0)


def export_pprof(rvbpfd, trace_path, out_path):
    """`rvbpfd export --pprof` of the trace into out_path, decoded (pprof_decode). Returns (profile, problem)."""
    import pprof_decode  # beside this file
    p = subprocess.run([rvbpfd, "export", "--pprof", trace_path, "-o", out_path], capture_output=True, timeout=300)
    if p.returncode != 0:
        return None, f"export --pprof exit {p.returncode}: {p.stderr.decode('utf-8', 'replace')[-1000:]}"
    with open(out_path, "rb") as f:
        return pprof_decode.decode(f.read()), None


def fmt_ms(trace, e):
    t = e.get("t_ns")
    return f"{t / 1e6:10.3f} ms" if isinstance(t, int) else "      ? ms"


# Rule TEARDOWN_TRACEPOINTS: at exit CRuby's rb_ec_teardown() runs the end procs and then clears every TracePoint
# (rb_ec_clear_all_trace_func); the shutdown finalizer GC (gc_enter/gc_exit in rb_objspace_call_finalizer) comes after
# that. The thread event hook is not cleared. So an in-process recorder sees no GC or probe event after that point,
# while rvbpfd's GC hook-site probes do. The reference records when its own end proc ran (registered first, so run
# last, right before the clearing) as summary.tracepoints_stopped_t_ns; GC and probe events are compared only up to
# that moment. Likewise they are compared only from summary.tracepoints_started_t_ns on: enabling a TracePoint
# allocates, and the GC that allocation may start runs before the TracePoint is live.
TEARDOWN_TRACEPOINTS_RULE = ("TEARDOWN_TRACEPOINTS: CRuby clears all TracePoints in rb_ec_teardown before the "
                             "shutdown finalizer GC; GC/probe events are compared only until then")


def comparison_window(ref, rv):
    rlo, rhi = ref.window()
    vlo, vhi = rv.window()
    lo, hi = max(rlo, vlo), min(rhi, vhi)
    return lo, hi


def in_window(events, lo, hi, tp=None):
    """Events with lo <= absolute time <= hi; GC/probe events also inside tp = (start, end) of the reference's
    TracePoints (either may be None) when given."""
    tp_start, tp_end = tp if isinstance(tp, tuple) else (None, tp)
    out = []
    for e in events:
        a = e.get("abs")
        if a is None or a < lo or a > hi:
            continue
        if e.get("event") in TRACEPOINT_EVENTS and ((tp_end is not None and a > tp_end) or
                                                   (tp_start is not None and a < tp_start)):
            continue
        out.append(e)
    return out


def canonical_ids(events):
    """ruby_thread id -> 0, 1, 2... in order of first appearance (ties by file order)."""
    order = {}
    for e in sorted(events, key=lambda e: (e["abs"], e["_line"])):
        tid = e.get("ruby_thread")
        if tid not in order:
            order[tid] = len(order)
    return order


def per_thread(events, names, ids):
    seqs = {}
    for e in sorted(events, key=lambda e: (e["abs"], e["_line"])):
        if e.get("event") in names:
            seqs.setdefault(ids[e.get("ruby_thread")], []).append(e)
    return seqs


def fmt_rel(e, lo):
    a = e.get("abs")
    return f"{(a - lo) / 1e6:10.3f} ms" if isinstance(a, int) else "      ? ms"


def diff_sequences(label, ref_seq, rv_seq, lo, context=4, max_lines=60):
    """Readable diff of two event sequences (compared on event names); times relative to lo (absolute ns)."""
    a = [e.get("event") for e in ref_seq]
    b = [e.get("event") for e in rv_seq]
    if a == b:
        return []
    out = [f"{label}: reference has {len(a)} events, rvbpfd has {len(b)}",
           "    (- only in the in-process reference, + only in rvbpfd; ms since the start of the common window)"]
    sm = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    for group in sm.get_grouped_opcodes(context):
        i1, j1 = group[0][1], group[0][3]
        out.append(f"  @@ reference #{i1} / rvbpfd #{j1} @@")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                for k in range(i1, i2):
                    out.append(f"    {fmt_rel(ref_seq[k], lo)}  {a[k]:<18} {ref_seq[k].get('ruby_thread')!s:>4}")
                continue
            for k in range(i1, i2):
                out.append(f"  - {fmt_rel(ref_seq[k], lo)}  {a[k]:<18} {ref_seq[k].get('ruby_thread')!s:>4}"
                           f"  tid {ref_seq[k].get('native_tid')}")
            for k in range(j1, j2):
                out.append(f"  + {fmt_rel(rv_seq[k], lo)}  {b[k]:<18} {rv_seq[k].get('ruby_thread')!s:>4}"
                           f"  tid {rv_seq[k].get('native_tid')} src {rv_seq[k].get('source')}")
        if len(out) > max_lines:
            out.append(f"  ... diff truncated ({len(out)} lines so far)")
            break
    return out


def compare_traces(ref, rv, probes=True, pid_namespace=False):
    """Fidelity comparison over the intersection of the two windows. Returns a dict check-name -> problems.
    pid_namespace: the target ran in its own pid namespace, so the reference records the tids it sees there and
    rvbpfd the host's: native tids must then correspond one to one (the same host tid for every event of one
    namespace tid, and back) instead of being equal."""
    results = {}
    if rv.processes:
        # Launch mode follows the process tree: the workload is the launched process (rvref forks to write its file
        # at exit, and that child is followed too).
        rv = process_view(rv, 1)
    fmt = list(ref.problems) + [f"rvbpfd trace: {p}" for p in rv.problems]
    if ref.summary.get("events_dropped", 0) or ref.summary.get("unpublished", 0):
        fmt.append(f"the reference itself dropped events ({ref.summary}); ground truth incomplete")
    results["trace files readable"] = fmt
    lo, hi = comparison_window(ref, rv)
    tp = ref.tracepoint_window()
    if hi <= lo:
        results["windows overlap"] = [f"no overlap: reference {ref.window()} rvbpfd {rv.window()}"]
        return results
    results["windows overlap"] = []
    losses = [e for e in in_window(rv.events, lo, hi) if e.get("event") in ("events_dropped", "tracing_paused")]
    results["rvbpfd complete in window (no events_dropped/tracing_paused)"] = [
        f"{e.get('event')} at {fmt_rel(e, lo)}: {json.dumps({k: v for k, v in e.items() if k != 'abs'})}"
        for e in losses]
    ref_ev = in_window(ref.named(RECORDED_EVENTS), lo, hi, tp)
    rv_ev = in_window(rv.named(RECORDED_EVENTS), lo, hi, tp)
    ref_ids = canonical_ids(ref_ev)
    rv_ids = canonical_ids(rv_ev)

    # Thread identity: same number of threads, and the same ids as the in-process recorder (main = 1).
    idp = []
    if len(ref_ids) != len(rv_ids):
        idp.append(f"reference sees {len(ref_ids)} Ruby threads in the window, rvbpfd {len(rv_ids)} "
                   f"(rvbpfd ids: {sorted(rv_ids, key=str)[:50]})")
    ref_by_c = {c: t for t, c in ref_ids.items()}
    rv_by_c = {c: t for t, c in rv_ids.items()}
    mism = [(ref_by_c[c], rv_by_c.get(c)) for c in sorted(ref_by_c) if rv_by_c.get(c) != ref_by_c[c]]
    if mism:
        idp.append("ruby_thread ids differ from the in-process recorder's (reference id -> rvbpfd id, by order of "
                   "first appearance): " + ", ".join(f"{a}->{b}" for a, b in mism[:20]))
    rv_main = [t for t, o in rv.threads.items() if o.get("main")]
    if rv_main != [1]:
        idp.append(f"rvbpfd marks {rv_main} as main thread(s); the in-process recorder marks [1]")
    results["thread identity (ids and main flag agree)"] = idp

    ref_seq = per_thread(ref_ev, SCHED_EVENTS, ref_ids)
    rv_seq = per_thread(rv_ev, SCHED_EVENTS, rv_ids)
    sp = []
    for c in sorted(set(ref_seq) | set(rv_seq)):
        label = (f"Ruby thread #{c + 1} in order of appearance (reference id {ref_by_c.get(c)}, rvbpfd id "
                 f"{rv_by_c.get(c)})")
        sp += diff_sequences(label, ref_seq.get(c, []), rv_seq.get(c, []), lo)
    results["scheduler events per thread equal"] = sp

    ref_gc = [e for e in sorted(ref_ev, key=lambda e: (e["abs"], e["_line"])) if e.get("event") in GC_EVENTS]
    rv_gc = [e for e in sorted(rv_ev, key=lambda e: (e["abs"], e["_line"])) if e.get("event") in GC_EVENTS]
    gp = diff_sequences("GC enter/exit sequence", ref_gc, rv_gc, lo)
    if not gp:
        who = [(ref_ids[a.get("ruby_thread")], rv_ids[b.get("ruby_thread")]) for a, b in zip(ref_gc, rv_gc)]
        bad = [i for i, (x, y) in enumerate(who) if x != y]
        if bad:
            i = bad[0]
            gp.append(f"GC event #{i} ({ref_gc[i].get('event')}) is attributed to thread #{who[i][0] + 1} by the "
                      f"reference and #{who[i][1] + 1} by rvbpfd ({len(bad)} such events)")
    results[f"GC enter/exit sequence equal [{TEARDOWN_TRACEPOINTS_RULE.split(':')[0]}]"] = gp

    # The native thread of events that run on the thread itself (under M:N it changes; it is never the identity).
    tp = []
    ns_to_host, host_to_ns = {}, {}
    if not sp:
        for c in sorted(ref_seq):
            for a, b in zip(ref_seq[c], rv_seq.get(c, [])):
                if a.get("event") not in OWN_THREAD_EVENTS:
                    continue
                x, y = a.get("native_tid"), b.get("native_tid")
                if pid_namespace and isinstance(x, int) and isinstance(y, int):
                    if ns_to_host.setdefault(x, y) == y and host_to_ns.setdefault(y, x) == x:
                        continue
                    tp.append(f"Ruby thread #{c + 1} {a.get('event')} at {fmt_rel(a, lo)}: namespace tid {x} is "
                              f"host tid {y} here, but {ns_to_host[x]} (host tid {y} was namespace tid "
                              f"{host_to_ns[y]}) earlier")
                    break
                if x != y:
                    tp.append(f"Ruby thread #{c + 1} {a.get('event')} at {fmt_rel(a, lo)}: native_tid "
                              f"{x} in the reference, {y} in rvbpfd")
                    break
    results["native_tid of RESUMED/SUSPENDED/EXITED " +
            ("one to one with the namespace's" if pid_namespace else "equal")] = tp

    if probes:
        ref_p = per_thread(ref_ev, PROBE_EVENTS, ref_ids)
        rv_p = per_thread(rv_ev, PROBE_EVENTS, rv_ids)
        pp = []
        for c in sorted(set(ref_p) | set(rv_p)):
            pp += diff_sequences(f"probes of Ruby thread #{c + 1}", ref_p.get(c, []), rv_p.get(c, []), lo)
        results["Kernel#sleep / Mutex#lock probes per thread equal"] = pp
    return results


def check_invariants(trace, expect=None, exact_window=True):
    """Invariants of a complete rvbpfd trace of one workload. expect: FIDELITY_WORKLOADS entry or None.
    exact_window: the trace covers only the workload (attach mode), so probe counts are exact."""
    if trace.processes:
        trace = process_view(trace, 1)  # the launched process (see compare_traces)
    p = list(trace.problems)
    h = trace.header
    for k, v in (("rvtrace", 1), ("clock", "monotonic")):
        if h.get(k) != v:
            p.append(f"header {k} is {h.get(k)!r}, expected {v!r}")
    for k in ("recorder", "pid", "ruby_version", "origin_ns"):
        if k not in h:
            p.append(f"header lacks {k}")
    # Timestamp order.
    prev = None
    for e in trace.events:
        t = e.get("t_ns")
        if not isinstance(t, int):
            p.append(f"line {e['_line'] + 1}: t_ns is not an integer: {t!r}")
            continue
        if prev is not None and t < prev:
            p.append(f"line {e['_line'] + 1}: events out of timestamp order ({t} after {prev})")
            break
        prev = t
    for k in ("t_ns", "ruby_thread", "native_tid", "event", "cruby_event", "source", "provenance"):
        missing = [e for e in trace.events if k not in e]
        if missing:
            p.append(f"{len(missing)} event lines lack {k!r} (first: line {missing[0]['_line'] + 1})")
    drops = trace.dropped_records()
    if drops:
        p.append(f"{len(drops)} events_dropped records, total {sum(int(e.get('count', 0)) for e in drops)}")
    if trace.summary.get("events_dropped"):
        p.append(f"summary events_dropped = {trace.summary.get('events_dropped')}")
    paused = trace.named(("tracing_paused",))
    if paused:
        p.append(f"{len(paused)} tracing_paused records in a recording (recordings must be complete by default)")

    evs = trace.named(RECORDED_EVENTS)
    mains = [t for t, o in trace.threads.items() if o.get("main")]
    if len(mains) != 1:
        p.append(f"exactly one thread must be marked main, got {mains}")
    main = mains[0] if mains else None
    # Thread lines before each thread's first event.
    firsts = {}
    for e in evs:
        if e.get("ruby_thread") is not None:
            firsts.setdefault(e.get("ruby_thread"), e)
    for tid, e in firsts.items():
        li = trace.thread_line_index.get(tid)
        if li is None or li > e["_line"]:
            p.append(f"ruby_thread {tid}: no thread line before its first event (line {e['_line'] + 1})")
    anon = [e for e in evs if e.get("ruby_thread") is None]
    if anon:
        p.append(f"{len(anon)} events with ruby_thread null (every scheduler/GC/probe event is about a Ruby thread), "
                 f"first: line {anon[0]['_line'] + 1} {anon[0].get('event')} at {anon[0].get('t_ns')} ns")
    by_thread = {}
    for e in evs:
        if e.get("ruby_thread") is not None:
            by_thread.setdefault(e.get("ruby_thread"), []).append(e)
    started = [e for e in evs if e.get("event") == "thread_started"]
    if expect:
        n = expect["threads"]
        if (len(started) != n) if exact_window else (len(started) < n):
            p.append(f"{len(started)} thread_started events, the workload creates {n} threads")
    for tid, seq in by_thread.items():
        names = [e.get("event") for e in seq]
        if tid == main:
            if "thread_started" in names or "thread_exited" in names:
                p.append(f"main thread {tid}: CRuby never emits STARTED/EXITED for the main thread, got {names[:5]}")
            continue
        if names[0] != "thread_started":
            p.append(f"thread {tid}: first event is {names[0]} (line {seq[0]['_line'] + 1}), not thread_started")
        if names[-1] != "thread_exited":
            p.append(f"thread {tid}: last event is {names[-1]} (line {seq[-1]['_line'] + 1}), not thread_exited")
        if names.count("thread_started") != 1 or names.count("thread_exited") != 1:
            p.append(f"thread {tid}: {names.count('thread_started')} thread_started and "
                     f"{names.count('thread_exited')} thread_exited events")
        sched = [n for n in names if n in SCHED_EVENTS]
        if len(sched) >= 2 and sched[-1] == "thread_exited" and sched[-2] != "gvl_released":
            p.append(f"thread {tid}: thread_exited not preceded by gvl_released (3.3+ emits SUSPENDED then EXITED)")
    p += gvl_alternation(evs, main)
    # GC enter/exit alternate (GC does not nest), globally.
    gcs = [e for e in evs if e.get("event") in GC_EVENTS]
    for a, b in zip(gcs, gcs[1:]):
        if a.get("event") == b.get("event"):
            p.append(f"two {a.get('event')} in a row (lines {a['_line'] + 1}, {b['_line'] + 1})")
            break
    if expect and expect.get("min_gc"):
        n = sum(1 for e in gcs if e.get("event") == "gc_enter")
        if n < expect["min_gc"]:
            p.append(f"{n} gc_enter events, the workload calls GC.start {expect['min_gc']} times")
    if expect and exact_window:
        for name, n in expect["probes"].items():
            got = sum(1 for e in evs if e.get("event") == name)
            if got != n:
                p.append(f"{got} {name} events, the workload makes exactly {n}")
    # native_tid: known for events on the thread itself.
    for e in evs:
        if e.get("event") in OWN_THREAD_EVENTS and not isinstance(e.get("native_tid"), int):
            p.append(f"line {e['_line'] + 1}: {e.get('event')} has native_tid {e.get('native_tid')!r}")
            break
    return p


# Rule IMPLICIT_RESUME (reference doc section 7.4): 3.3/3.4 thread_sched_to_waiting_until_wakeup and
# thread_sched_wait_events fire SUSPENDED and may then find the thread interrupted / already awake and keep running
# with no READY and no RESUMED. A later event that runs on the thread itself (another gvl_released, gc, a probe) is
# an implicit resume. It does not apply once the thread reported wants_gvl (then it must get gvl_acquired before it
# runs), and thread_exited is not activity: 3.3+ fires it after the SUSPENDED that hands the GVL over.
IMPLICIT_RESUME_RULE = "IMPLICIT_RESUME: a SUSPENDED followed by activity of the same thread without RESUMED"


def gvl_alternation(evs, main):
    """gvl_acquired / gvl_released alternate per thread (modulo IMPLICIT_RESUME); at most one holder at a time."""
    p = []
    held = {}    # tid -> True/False; absent = unknown (thread existed before the window)
    waiting = {}  # tid -> True after wants_gvl: the thread asked for the GVL and must get gvl_acquired to run
    holder = None
    for e in evs:
        tid, name = e.get("ruby_thread"), e.get("event")
        if name == "thread_started":
            held[tid] = False
            continue
        if name == "wants_gvl":
            if held.get(tid) is True:
                p.append(f"line {e['_line'] + 1}: thread {tid} wants_gvl while holding it")
            waiting[tid] = True
            continue
        if name in OWN_THREAD_EVENTS and name not in ("gvl_acquired", "thread_exited") and waiting.get(tid):
            p.append(f"line {e['_line'] + 1}: thread {tid} {name} after wants_gvl without gvl_acquired "
                     f"(IMPLICIT_RESUME does not apply once the thread asked for the GVL)")
        waiting[tid] = False
        if name == "gvl_acquired":
            if held.get(tid) is True:
                p.append(f"line {e['_line'] + 1}: thread {tid} gvl_acquired twice without gvl_released")
            if holder is not None and holder != tid and held.get(holder) is True:
                p.append(f"line {e['_line'] + 1}: thread {tid} gvl_acquired while thread {holder} holds the GVL")
            held[tid] = True
            holder = tid
            continue
        if name in OWN_THREAD_EVENTS and name not in ("gvl_acquired", "thread_exited") and held.get(tid) is False:
            # IMPLICIT_RESUME: the thread is running although its last scheduler event was a release.
            if holder is not None and holder != tid and held.get(holder) is True:
                p.append(f"line {e['_line'] + 1}: thread {tid} runs ({name}) while thread {holder} holds the GVL")
            held[tid] = True
            holder = tid
        if name == "gvl_released":
            held[tid] = False
            if holder == tid:
                holder = None
        elif name == "thread_exited":
            held[tid] = False
            if holder == tid:
                holder = None
        if len(p) > 10:
            p.append("... (more alternation problems)")
            break
    return p


# ----------------------------------------------------------------------------------------------------------------
# Running workloads
# ----------------------------------------------------------------------------------------------------------------

class LineReader:
    """Collects the lines of a pipe in a background thread; wait_for() blocks until one matches."""

    def __init__(self, stream, echo=None):
        self.lines = []
        self.cond = threading.Condition()
        self.closed = False
        self.echo = echo
        self.t = threading.Thread(target=self._run, args=(stream,), daemon=True)
        self.t.start()

    def _run(self, stream):
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def wait_for(self, pred, timeout):
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for line in self.lines:
                    if pred(line):
                        return line
                if self.closed:
                    return None
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(left)

    def text(self):
        with self.cond:
            return "\n".join(self.lines)


class RunError(Exception):
    pass


def start_fake_pyroscope(recv_dir, port_file):
    """tests/e2e/fake_pyroscope.py on a free loopback port (written to port_file), storing what it receives in
    recv_dir; the caller ends it."""
    return subprocess.Popen([sys.executable, os.path.join(HERE, "fake_pyroscope.py"), "--port", "0",
                             "--out-dir", recv_dir, "--port-file", port_file],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def agent_metrics(port):
    """The agent's Prometheus metrics on 127.0.0.1:port: {"name{labels}": value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        key, _, value = line.rpartition(" ")
        values[key] = float(value)
    return values


def thread_cpu_ticks(pid, tid):
    """utime + stime of one thread of a process, in clock ticks."""
    with open(f"/proc/{pid}/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def process_state(pid):
    """The state letter of /proc/PID/stat (T or t: stopped)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


class Run:
    """Result of one workload run."""

    def __init__(self):
        self.ref = None
        self.rv = None
        self.rv_rc = None
        self.rv_stderr = ""
        self.target_stderr = ""
        self.target_pid = None
        self.problems = []


def _kill(p):
    if p and p.poll() is None:
        try:
            p.kill()
        except ProcessLookupError:
            pass
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            pass


def run_workload(ruby, workload, mode, outdir, ref=True, probes=True, rvbpfd=None, rv_args=(), env_extra=None,
                 attach_timeout=60.0, run_timeout=120.0, container=None, rv_env=None):
    """mode: 'attach' (rvbpfd --pid after "ready"), 'launch' (rvbpfd -o F -- ruby ...), 'none' (no rvbpfd).
    ref: load rvref with RVREF_OUT. Returns Run; raises RunError with details when the run itself failed.
    container: a Container the workload runs in (attach mode only; outdir must lie inside its root; ruby's paths are
    the container's); rvbpfd runs on the host and attaches to the workload's host pid. rv_env: extra environment of
    rvbpfd only."""
    tag = f"{ruby.name}-{workload}-{mode}{'-ref' if ref else ''}"
    ref_out = os.path.join(outdir, f"{tag}.ref.rvtrace")
    rv_out = os.path.join(outdir, f"{tag}.rvbpfd.rvtrace")
    if container is None:
        script = workload_path(workload)
        env = dict(os.environ)
        for k in ("RVREF_OUT", "RVREF_PROBES", "RUBY_MN_THREADS", "RUBYOPT", "RUBY_YJIT_ENABLE"):
            env.pop(k, None)
        ref_out_seen = ref_out
    else:
        if mode != "attach":
            raise RunError(f"{tag}: a container workload runs in attach mode only")
        script = container.workload(workload)
        env = container.environment()
        ref_out_seen = container.inside(ref_out)
    env.update(getattr(ruby, "env", {}))
    env.update(env_extra or {})
    cmd = [ruby.bin]
    if ref:
        env["RVREF_OUT"] = ref_out_seen
        if probes:
            env["RVREF_PROBES"] = "1"
        cmd += ["-I", ruby.rvref_dir, "-rrvref"]
    cmd.append(script)
    if container is not None:
        cmd = container.wrap(cmd)
    rv_environ = dict(os.environ)
    rv_environ.update(rv_env or {})
    run = Run()
    target = rv = None
    for stale in (ref_out, rv_out):  # a file left by an earlier run must never pass for this run's
        if os.path.exists(stale):
            os.unlink(stale)
    target_err = open(os.path.join(outdir, f"{tag}.target.stderr"), "w+b")
    try:
        if mode == "launch":
            rv = subprocess.Popen([rvbpfd, "-o", rv_out, *rv_args, "--", *cmd], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**env, **(rv_env or {})})
            out_proc = rv
        else:
            target = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=target_err, env=env)
            out_proc = target
            run.target_pid = target.pid
        out = LineReader(out_proc.stdout)
        rv_err = LineReader(rv.stderr) if rv else None
        if out.wait_for(lambda l: l == "ready", attach_timeout) is None:
            raise RunError(f"{tag}: the workload never printed 'ready'")
        if container is not None:
            run.target_pid = container.host_pid(target)
            if run.target_pid is None:
                raise RunError(f"{tag}: cannot find the host pid of the workload under {cmd[0]} (pid {target.pid})")
        if mode == "attach":
            rv = subprocess.Popen([rvbpfd, "--pid", str(run.target_pid), "-o", rv_out, *rv_args],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  env=rv_environ)
            rv_err = LineReader(rv.stderr)
            if rv_err.wait_for(lambda l: l.startswith("rvbpfd: attached"), attach_timeout) is None:
                raise RunError(f"{tag}: rvbpfd did not print 'rvbpfd: attached' within {attach_timeout:.0f} s "
                               f"(exit {rv.poll()}); stderr:\n{rv_err.text()[-3000:]}")
        out_proc.stdin.write(b"go\n")
        out_proc.stdin.flush()
        if out.wait_for(lambda l: l == "done", run_timeout) is None:
            raise RunError(f"{tag}: the workload did not print 'done' within {run_timeout:.0f} s")
        out_proc.stdin.close()
        if target:
            try:
                target.wait(30)
            except subprocess.TimeoutExpired:
                raise RunError(f"{tag}: the workload did not exit after 'done'")
            if target.returncode != 0:
                raise RunError(f"{tag}: the workload exited {target.returncode}")
        if rv:
            try:
                run.rv_rc = rv.wait(60)
            except subprocess.TimeoutExpired:
                raise RunError(f"{tag}: rvbpfd did not exit within 60 s after the target exited")
            rv_err.t.join(5)
            run.rv_stderr = rv_err.text()
    except OSError as e:
        _kill(rv)
        _kill(target)
        raise RunError(f"{tag}: cannot start a process: {e}")
    except BaseException:
        if rv is not None and rv.poll() is None:
            try:
                rv.send_signal(signal.SIGINT)
                rv.wait(10)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                _kill(rv)
        _kill(target)
        raise
    finally:
        target_err.seek(0)
        run.target_stderr = target_err.read().decode("utf-8", "replace")
        target_err.close()
    if rv is not None:
        if run.rv_rc != 0:
            run.problems.append(f"rvbpfd exited {run.rv_rc}; stderr:\n{run.rv_stderr[-3000:]}")
        if not os.path.exists(rv_out):
            run.problems.append(f"rvbpfd wrote no trace at {rv_out}")
        else:
            run.rv = Trace(rv_out)
            if run.rv.recorder != "rvbpfd":
                run.problems.append(f"rvbpfd trace header recorder is {run.rv.recorder!r}")
            if mode == "attach" and run.rv.header.get("pid") != run.target_pid:
                run.problems.append(f"rvbpfd trace header pid {run.rv.header.get('pid')} != target {run.target_pid}")
            if run.rv.header.get("ruby_version") != ruby.version:
                run.problems.append(f"rvbpfd trace header ruby_version {run.rv.header.get('ruby_version')!r} != "
                                    f"{ruby.version!r}")
    if ref:
        # rvref writes its file from a child forked at exit (tests/refrecorder/rvref.c says why): it appears by rename
        # shortly after the target has exited.
        deadline = time.monotonic() + 30
        while not os.path.exists(ref_out) and time.monotonic() < deadline:
            time.sleep(0.01)
        if not os.path.exists(ref_out):
            raise RunError(f"{tag}: the reference wrote no trace; target stderr:\n{run.target_stderr[-2000:]}")
        run.ref = Trace(ref_out)
    return run


class Container:
    """A Debian root (tools/make-trixie-root.sh) a workload runs in like a container: new mount and pid namespaces
    chrooted into the root (unshare --mount --pid --fork --mount-proc --root ROOT), so it sees its own files and
    pids, and rvbpfd on the host reaches its files through /proc/PID/root. Workloads and traces live in a directory
    under the root's /tmp (self.workdir: pass it as run_workload's outdir)."""

    def __init__(self, root, pid_namespace=True):
        self.root = os.path.realpath(root)
        self.pid_namespace = pid_namespace
        os.makedirs(os.path.join(self.root, "tmp"), exist_ok=True)
        self.workdir = tempfile.mkdtemp(prefix="rvbpfd-e2e-", dir=os.path.join(self.root, "tmp"))
        os.chmod(self.workdir, 0o755)
        shutil.copytree(WORKLOAD_DIR, os.path.join(self.workdir, "workloads"))

    def inside(self, host_path):
        """The container's path of a host path under the root."""
        real = os.path.realpath(host_path)
        if not real.startswith(self.root + "/"):
            raise Fatal(f"{host_path} is not inside the container root {self.root}")
        return real[len(self.root):]

    def workload(self, name):
        return self.inside(os.path.join(self.workdir, "workloads", f"{name}.rb"))

    def environment(self):
        """The environment of a process in the container: none of the host's."""
        return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}

    # pid 1 of the namespace: runs the command and reaps every process until none is left, as a container's init
    # does. When pid 1 exits the kernel kills the whole namespace, so the command itself must not be pid 1: rvref
    # writes its trace from a child forked at exit.
    INIT = ("/usr/bin/perl", "-e", "my $c = fork // die 'fork'; if (!$c) { exec @ARGV or die 'exec' } my $rc = 0; "
            "while ((my $p = wait()) != -1) { $rc = $? >> 8 if $p == $c } exit $rc", "--")

    def wrap(self, cmd):
        if not self.pid_namespace:
            return ["unshare", "--mount", "--fork", "--kill-child", f"--root={self.root}", "--", *cmd]
        return ["unshare", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc", f"--root={self.root}", "--",
                *self.INIT, *cmd]

    def host_pid(self, unshare_proc, timeout=10.0):
        """The host pid of the command wrap() started: unshare's child (mount namespace only), or the child of the
        new pid namespace's init (pid 2 there)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{unshare_proc.pid}/task/{unshare_proc.pid}/children") as f:
                    kids = [int(x) for x in f.read().split()]
                if kids and self.pid_namespace:
                    with open(f"/proc/{kids[0]}/task/{kids[0]}/children") as f:
                        kids = [int(x) for x in f.read().split()]
                if kids:
                    with open(f"/proc/{kids[0]}/status") as f:
                        nspid = [l.split()[1:] for l in f if l.startswith("NSpid:")]
                    if nspid and (len(nspid[0]) == 2 or not self.pid_namespace):
                        return kids[0]
            except (OSError, ValueError):
                pass
            if unshare_proc.poll() is not None:
                return None
            time.sleep(0.05)
        return None

    def cleanup(self, keep=False):
        if keep:
            print(f"container traces kept in {self.workdir}")
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)


def trixie_root(source_dir):
    """The Debian trixie root of tools/make-trixie-root.sh, if it is complete with its compiled test extensions."""
    script = os.path.join(source_dir, "tools", "make-trixie-root.sh")
    try:
        root = subprocess.run(["bash", script, "--print-root"], check=True, capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
        raise Fatal(f"{script} --print-root failed: {e}")
    for f in (".complete", "opt/rvbpfd/.ext-complete", "opt/rvbpfd/rvref/rvref.so", "opt/rvbpfd/rvgolden/rvgolden.so"):
        if not os.path.exists(os.path.join(root, f)):
            raise Fatal(f"the Debian trixie root at {root} is incomplete ({f} missing): run tools/make-trixie-root.sh")
    return root


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Debuginfod:
    """Debian's debuginfod server on loopback serving the debug files in one directory (debuginfod -F DIR), and the
    client environment that points at it with a private cache (DEBUGINFOD_URLS, DEBUGINFOD_CACHE_PATH)."""

    def __init__(self, serve_dir, work_dir):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = os.path.join(work_dir, "debuginfod.log")
        self.cache = os.path.join(work_dir, "debuginfod-client-cache")
        os.makedirs(self.cache, exist_ok=True)
        self.log = open(self.log_path, "wb")
        try:
            self.proc = subprocess.Popen(["debuginfod", "-F", serve_dir, "-p", str(self.port), "-d",
                                          os.path.join(work_dir, "debuginfod.sqlite")],
                                         stdout=self.log, stderr=subprocess.STDOUT)
        except OSError as e:
            raise Fatal(f"cannot start debuginfod (package debuginfod, tools/install-deps.sh): {e}")

    def env(self):
        return {"DEBUGINFOD_URLS": self.url, "DEBUGINFOD_CACHE_PATH": self.cache}

    def wait_serving(self, build_id, timeout=90.0):
        """Waits until the server has indexed `build_id` (its scan of -F runs in the background)."""
        import urllib.error
        import urllib.request
        deadline = time.monotonic() + timeout
        url = f"{self.url}/buildid/{build_id}/debuginfo"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        self.log.flush()
        with open(self.log_path, "rb") as f:
            tail = f.read()[-2000:].decode("utf-8", "replace")
        raise Fatal(f"debuginfod on {self.url} did not serve {build_id} within {timeout:.0f} s "
                    f"(exit {self.proc.poll()}); log:\n{tail}")

    def stop(self):
        _kill(self.proc)
        self.log.close()


def elf_build_id(path):
    """NT_GNU_BUILD_ID of an ELF file, lower-case hex (readelf -n), or None."""
    out = subprocess.run(["readelf", "-n", path], capture_output=True, text=True, timeout=60).stdout
    m = re.search(r"Build ID:\s*([0-9a-f]+)", out)
    return m.group(1) if m else None


def split_debug(binary, debug_out, stripped_out, debuglink=False):
    """objcopy --only-keep-debug BINARY DEBUG_OUT, then a stripped copy (optionally with .gnu_debuglink)."""
    for cmd in (["objcopy", "--only-keep-debug", binary, debug_out],
                ["strip", "-o", stripped_out, binary]):
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            raise Fatal(f"{' '.join(cmd)} failed: {p.stderr[-2000:]}")
    if debuglink:
        p = subprocess.run(["objcopy", f"--add-gnu-debuglink={debug_out}", stripped_out], capture_output=True,
                           text=True, timeout=300)
        if p.returncode != 0:
            raise Fatal(f"objcopy --add-gnu-debuglink failed: {p.stderr[-2000:]}")
    shutil.copymode(binary, stripped_out)


def install_build_id_debug(debug_file, debug_dir, build_id):
    """Puts debug_file where a distribution's debug package would: DEBUG_DIR/.build-id/xx/rest.debug."""
    dest = os.path.join(debug_dir, ".build-id", build_id[:2], build_id[2:] + ".debug")
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    shutil.copyfile(debug_file, dest)
    return dest


def attached_symbols_problems(run, wants):
    """Problems unless rvbpfd's "rvbpfd: attached" line says its symbols came from one of `wants` (prefixes of
    what follows "(symbols: ")."""
    attached = [l for l in run.rv_stderr.splitlines() if l.startswith("rvbpfd: attached")]
    if attached and any(f"(symbols: {w}" in attached[0] for w in wants):
        return []
    return [f"the attached line does not say the symbols came from {' or '.join(wants)}: {attached[:1]}"]


def make_outdir(args, prefix):
    d = tempfile.mkdtemp(prefix=f"rvbpfd-e2e-{prefix}-")
    if args.keep:
        print(f"traces kept in {d}")
    return d


def cleanup_outdir(args, d):
    if not args.keep:
        shutil.rmtree(d, ignore_errors=True)
