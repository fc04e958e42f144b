#!/usr/bin/env python3
"""Thread names and namespace tids (docs/rvtrace.md, "Thread line" and "Thread info line").

Workload thread_names.rb: two threads named "worker-1"/"worker-2" as they start (Thread#name=, which CRuby also gives
the native thread), renamed "renamed-1"/"renamed-2" after 1.5 s, each printing its name and
Thread#native_thread_id.
  - on each test Ruby (launch mode): the thread whose native tid is the one printed has, in the trace, Thread#name
    and the native name "worker-N" (thread line or thread_info line) and then "renamed-N" in a thread_info line
    (timed after the first); `inspect` lists it as "Thread #K (renamed-N)", `inspect --events` gives its name and
    native_name, and the Perfetto thread track and the speedscope profile are named the same;
  - in a container (Debian trixie's ruby3.3 of tools/make-trixie-root.sh in its own pid + mount namespace, attach
    mode; skipped with the reason when the root is missing): each renamed thread's ns_tid is the
    Thread#native_thread_id the Ruby printed (its namespace's tid) and differs from its host tid; `inspect --events`
    shows ns_tid=, and the native name is there although the stripped libruby has no DWARF for Thread#name.
"""
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rvlib  # noqa: E402

WORKLOAD = "thread_names"


def printed_tids(stderr):
    """{name: native_thread_id} from the workload's stderr."""
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^thread (\S+) (\d+)$", stderr, re.M)}


def host_tids(trace):
    """ruby_thread -> the native tids of the events it ran itself."""
    out = {}
    for e in trace.events:
        if e.get("ruby_thread") is not None and e.get("native_tid") and e.get("native_tid") == e.get("probe_tid"):
            out.setdefault(e["ruby_thread"], set()).add(e["native_tid"])
    return out


def thread_named(trace, name):
    for tid, t in trace.threads.items():
        if t.get("native_name") == name or t.get("name") == name:
            return tid
    return None


def tool(rvbpfd, *argv):
    p = subprocess.run([rvbpfd, *argv], capture_output=True, timeout=300)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def check_names(trace, tids, want_ruby_name):
    """Each worker's names in the trace: first 'worker-N', then 'renamed-N' in a later thread_info line."""
    p = list(trace.problems)
    hosts = host_tids(trace)
    for i in (1, 2):
        first, last = f"worker-{i}", f"renamed-{i}"
        if last not in tids:
            p.append(f"the workload printed no tid for {last}: {tids}")
            continue
        tid = thread_named(trace, last)
        if tid is None:
            p.append(f"no thread named {last!r}: {trace.threads}")
            continue
        t = trace.threads[tid]
        keys = ("name", "native_name") if want_ruby_name else ("native_name",)
        for k in keys:
            if t.get(k) != last:
                p.append(f"thread {tid}: {k} {t.get(k)!r}, want {last!r}")
        # Its earlier name, on the thread line itself or in an earlier thread_info line.
        infos = [x for x in trace.thread_infos if x.get("ruby_thread") == tid]
        earlier = [x for x in infos if x.get("native_name") == first]
        renamed = [x for x in infos if x.get("native_name") == last]
        if not earlier:
            p.append(f"thread {tid}: no thread_info line with native_name {first!r}: {infos}")
        if not renamed or (earlier and renamed[0]["t_ns"] <= earlier[0]["t_ns"]):
            p.append(f"thread {tid}: no thread_info line renaming it {last!r} after {first!r}: {infos}")
        if want_ruby_name and not [x for x in infos if x.get("name") == first]:
            p.append(f"thread {tid}: Thread#name {first!r} never in a thread_info line: {infos}")
        if want_ruby_name and tids[last] not in hosts.get(tid, set()):
            p.append(f"thread {tid}: printed native_thread_id {tids[last]} is not among its native tids "
                     f"{sorted(hosts.get(tid, set()))}")
    return p


def check_tools(rvbpfd, trace, outdir, tag):
    p = []
    labels = {}
    for i in (1, 2):
        tid = thread_named(trace, f"renamed-{i}")
        if tid is not None:
            labels[tid] = f"Thread #{tid} (renamed-{i})"
    if not labels:
        return ["no renamed threads to look for"]
    rc, out, err = tool(rvbpfd, "inspect", trace.path)
    for tid, label in labels.items():
        if rc != 0 or label not in out:
            p.append(f"inspect (exit {rc}) does not list {label!r}: {out[:1500]} {err[-500:]}")
    rc, out, err = tool(rvbpfd, "inspect", "--events", trace.path)
    for tid, label in labels.items():
        line = [l for l in out.splitlines() if l.startswith(f"  {label} id={tid} ")]
        want = f'native_name="{label[label.index("(") + 1:-1]}"'
        if rc != 0 or not line or want not in line[0]:
            p.append(f"inspect --events (exit {rc}): no thread line for {label!r} with {want}: {line or out[-800:]}")
    perfetto = os.path.join(outdir, f"{tag}.perfetto.json")
    rc, _, err = tool(rvbpfd, "export", "--perfetto", trace.path, "-o", perfetto)
    if rc != 0:
        p.append(f"export --perfetto exited {rc}: {err[-500:]}")
    else:
        with open(perfetto) as f:
            doc = json.load(f)
        events = doc["traceEvents"] if isinstance(doc, dict) else doc
        names = {e.get("args", {}).get("name") for e in events if e.get("name") == "thread_name"}
        for label in labels.values():
            if label not in names:
                p.append(f"Perfetto: no thread track named {label!r}: {sorted(n for n in names if n)}")
    speedscope = os.path.join(outdir, f"{tag}.speedscope.json")
    rc, _, err = tool(rvbpfd, "export", "--speedscope", trace.path, "-o", speedscope)
    if rc != 0:
        p.append(f"export --speedscope exited {rc}: {err[-500:]}")
    else:
        with open(speedscope) as f:
            names = [x.get("name") for x in json.load(f).get("profiles", [])]
        for label in labels.values():
            if label not in names:
                p.append(f"speedscope: no profile named {label!r}: {names}")
    return p


class DebianRuby:
    """Debian's ruby3.3 as the container sees it."""
    name, version, bin, env = "debian-ruby3.3", "3.3", "/usr/bin/ruby3.3", {}


def container_case(res, rvbpfd, args):
    try:
        root = rvlib.trixie_root(args.source_dir)
    except rvlib.Fatal as e:
        print(f"SKIP container thread names and ns_tid: {e}")
        return
    container = rvlib.Container(root)
    try:
        ruby = DebianRuby()
        try:
            run = rvlib.run_workload(ruby, WORKLOAD, "attach", container.workdir, ref=False, rvbpfd=rvbpfd,
                                     container=container)
        except rvlib.RunError as e:
            res.check("container debian-ruby3.3: record", [str(e)])
            return
        if run.rv is None:
            res.check("container debian-ruby3.3: record", run.problems or [f"no trace: {run.rv_stderr[-1000:]}"])
            return
        tids = printed_tids(run.target_stderr)
        p = check_names(run.rv, tids, want_ruby_name=False)
        hosts = host_tids(run.rv)
        for i in (1, 2):
            tid = thread_named(run.rv, f"renamed-{i}")
            if tid is None or f"renamed-{i}" not in tids:
                continue
            t = run.rv.threads[tid]
            if t.get("ns_tid") != tids[f"renamed-{i}"]:
                p.append(f"thread {tid}: ns_tid {t.get('ns_tid')!r}, the Ruby printed native_thread_id "
                         f"{tids[f'renamed-{i}']}")
            if t.get("ns_tid") in hosts.get(tid, set()):
                p.append(f"thread {tid}: ns_tid {t.get('ns_tid')} equals a host tid {sorted(hosts[tid])}: not a "
                         f"namespace's")
            rc, out, _ = tool(rvbpfd, "inspect", "--events", run.rv.path)
            if f" ns_tid={tids[f'renamed-{i}']} " not in out:
                p.append(f"inspect --events shows no ns_tid={tids[f'renamed-{i}']}: {out[-800:]}")
        res.check("container debian-ruby3.3: ns_tid is Thread#native_thread_id, native names", p)
    finally:
        container.cleanup(keep=args.keep)


def main():
    args, res, rvbpfd, rubies = rvlib.begin(__doc__)
    outdir = rvlib.make_outdir(args, "thread-names")
    for ruby in rubies:
        try:
            run = rvlib.run_workload(ruby, WORKLOAD, "launch", outdir, ref=False, rvbpfd=rvbpfd)
        except rvlib.RunError as e:
            res.check(f"{ruby.name}: record", [str(e)])
            continue
        if run.rv is None:
            res.check(f"{ruby.name}: record", run.problems or ["no trace"])
            continue
        tids = printed_tids(run.target_stderr + "\n" + run.rv_stderr)  # launch mode: the command's stderr is rvbpfd's
        res.check(f"{ruby.name}: Thread#name and native names, renamed, in the trace",
                  check_names(run.rv, tids, want_ruby_name=True))
        res.check(f"{ruby.name}: names in inspect, Perfetto and speedscope",
                  check_tools(rvbpfd, run.rv, outdir, ruby.name))
    container_case(res, rvbpfd, args)
    res.finish(outdir, keep=args.keep)


if __name__ == "__main__":
    main()
