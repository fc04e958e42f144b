#!/usr/bin/env python3
"""`rvbpfd inspect [--events] FILE` and `rvbpfd stats FILE` on recorded traces agree with the file.

Traces: mutex_contention on 3.4.5-static and many_threads (41 threads) on 3.3.8-shared, recorded in attach mode with
the reference running too, so each run gives an rvbpfd trace and an in-process trace (the same format, which
rvbpfd's tools must read as well). For each trace:
  inspect: exit 0; at most 40 lines; the wall clock table has a row for each Ruby thread (at most 12 rows, then a
           line counting the others) whose lifetime is the thread's first event to its thread_exited, within 1%;
  inspect --events: exit 0; the event table has one row per event (for each event name, the number of rows - lines that
           start with a time - naming it equals the count in the file) and each row starts with the event's time in
           ms; the per-thread
           summary lists every Ruby thread with its native tid, and its running time in ms (sum of
           gvl_acquired -> gvl_released intervals) for every non-main thread;
  stats:   exit 0; for each event name a line with its count; a line about dropped events with the file's total;
           a line about the ring buffer high-water mark (with the summary's value when the summary has one).
  inspect --events --thread N --from A --to B --limit K: only rows of thread N (or about no thread) within [A, B]
           ms, at most K of them.
Also: inspect --events on a trace cut in the middle (as after a crash: no summary line), plain or zstd-compressed (cut
inside a zstd frame), still exits 0 and shows the events of its complete lines (for zstd: what the zstd CLI decodes
from the cut file).
"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rvlib  # noqa: E402

TABLE_EVENTS = rvlib.RECORDED_EVENTS + ("tracing_started", "tracing_stopped", "events_dropped")
ROW_START = re.compile(r"^\s*-?\d+(?:\.\d+)?\s*(?:ms)?\s")
NUM = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.])")


def run_tool(rvbpfd, sub, path, *extra):
    try:
        p = subprocess.run([rvbpfd, sub, *extra, path], capture_output=True, timeout=120)
    except subprocess.TimeoutExpired:
        return None, "", "timed out"
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def normalize(line):
    return re.sub(r"(?<=\d)[,_](?=\d{3})", "", line)


def word(w):
    return re.compile(rf"(?<![\w#]){re.escape(str(w))}(?!\w)")


def running_ms(trace):
    """Per thread: sum of gvl_acquired -> next gvl_released, in ms; None for a thread with an open interval."""
    out, since = {}, {}
    for e in trace.named(rvlib.SCHED_EVENTS):
        tid = e.get("ruby_thread")
        if e["event"] == "gvl_acquired":
            since[tid] = e["t_ns"]
        elif e["event"] in ("gvl_released", "thread_exited") and tid in since:
            out[tid] = out.get(tid, 0) + (e["t_ns"] - since.pop(tid))
    return {t: v / 1e6 for t, v in out.items()}


def check_inspect(trace, out):
    p = []
    lines = [normalize(l) for l in out.splitlines()]
    pats = {name: word(name) for name in TABLE_EVENTS}
    # Event table rows start with the time; other lines (headers, legends, per-thread tables) may name events too.
    table = [l for l in lines if ROW_START.match(l)]
    rows = {name: [l for l in table if pats[name].search(l)] for name in TABLE_EVENTS}
    for name in TABLE_EVENTS:
        evs = [e for e in trace.events if e.get("event") == name]
        if len(rows[name]) != len(evs):
            p.append(f"{name}: {len(rows[name])} event table rows (lines starting with a time) name it, the file "
                     f"has {len(evs)} events")
            continue
        for e, row in zip(evs, rows[name]):
            nums = NUM.findall(row)
            t_ms = e["t_ns"] / 1e6
            if not nums or abs(float(nums[0]) - t_ms) > max(0.0015, 1e-6 * abs(t_ms)):
                p.append(f"{name} row {row.strip()!r}: first number is not the event time {t_ms:.3f} ms")
                break
    summary_lines = [l for l in lines if not ROW_START.match(l)]
    native = {}
    for e in trace.events:
        if e.get("event") in rvlib.OWN_THREAD_EVENTS and isinstance(e.get("native_tid"), int):
            native.setdefault(e.get("ruby_thread"), e["native_tid"])
    run_ms = running_ms(trace)
    ids = sorted({e.get("ruby_thread") for e in trace.named(rvlib.RECORDED_EVENTS)}, key=lambda x: (x is None, x))
    for tid in ids:
        cand = [l for l in summary_lines if word(tid).search(l)]
        if tid in native:
            cand = [l for l in cand if word(native[tid]).search(l)]
        if not cand:
            p.append(f"per-thread summary: no line with ruby_thread {tid} and native tid {native.get(tid)}")
            continue
        main = trace.threads.get(tid, {}).get("main")
        if not main and tid in run_ms:
            want = run_ms[tid]
            ok = any(abs(float(x) - want) <= max(0.0015, 0.01 * want) for l in cand for x in NUM.findall(l))
            if not ok:
                p.append(f"per-thread summary of {tid}: no running time of {want:.3f} ms in {cand[0].strip()!r}")
    return p


def lifetimes_ms(trace):
    """ruby_thread -> ms from its first event to its thread_exited (or the trace's last event)."""
    first, exited, last = {}, {}, 0
    for e in trace.events:
        if isinstance(e.get("t_ns"), int):
            last = max(last, e["t_ns"])
    for e in trace.events:
        tid = e.get("ruby_thread")
        if tid is None or not isinstance(e.get("t_ns"), int):
            continue
        first[tid] = min(first.get(tid, e["t_ns"]), e["t_ns"])
        if e.get("event") == "thread_exited":
            exited[tid] = e["t_ns"]
    return {t: (exited.get(t, last) - f) / 1e6 for t, f in first.items()}


def check_summary(trace, out):
    p = []
    lines = [normalize(l) for l in out.splitlines()]
    if len(lines) > 40:
        p.append(f"{len(lines)} lines, want at most 40")
    try:
        start = next(i for i, l in enumerate(lines) if l.startswith("wall clock by thread")) + 2
    except StopIteration:
        return p + ["no 'wall clock by thread' table"]
    rows = []
    for l in lines[start:]:
        if not l.startswith("  ") or l.startswith("  ..."):
            break
        rows.append(l)
    life = lifetimes_ms(trace)
    more = [l for l in lines[start:] if l.startswith("  ...")]
    if len(life) > 12:
        if len(rows) != 12 or not more or not word(len(life) - 12).search(more[0]):
            p.append(f"{len(life)} threads: want 12 rows and a line counting {len(life) - 12} more, got {len(rows)} "
                     f"rows and {more[:1]}")
    elif len(rows) != len(life):
        p.append(f"{len(rows)} thread rows, the trace has {len(life)} threads")
    for tid, ms in life.items():
        label = trace.thread_label(tid)
        row = [r for r in rows if r.strip().startswith(label + " ")]
        if not row:
            if len(life) <= 12:
                p.append(f"no row for {label}")
            continue
        cells = row[0].split()
        nums = [float(x) for x in NUM.findall(row[0][len("  " + label):])]
        # Columns after the native tids: lifetime first.
        ok = any(abs(x - ms) <= max(0.15, 0.01 * ms) for x in nums[:3])
        if not ok:
            p.append(f"{label}: no lifetime of {ms:.1f} ms in {row[0].strip()!r} ({cells[:4]})")
    return p


def check_filtered(trace, out, tid, lo_ms, hi_ms, limit):
    p = []
    want = [e for e in trace.events
            if (e.get("ruby_thread") == tid or (e.get("ruby_thread") is None and e.get("source") == "daemon"))
            and lo_ms <= e["t_ns"] / 1e6 <= hi_ms][:limit]
    table = [l for l in out.splitlines() if ROW_START.match(normalize(l))]
    if len(table) != len(want):
        p.append(f"{len(table)} rows, want {len(want)} (thread {tid}, {lo_ms:.3f}..{hi_ms:.3f} ms, limit {limit})")
    for e, row in zip(want, table):
        t = float(NUM.findall(normalize(row))[0])
        if abs(t - e["t_ns"] / 1e6) > 0.0015 or e["event"] not in row:
            p.append(f"row {row.strip()!r} is not {e['event']} at {e['t_ns'] / 1e6:.3f} ms")
            break
    if not re.search(rf"\({len(table)} of {len(trace.events)} events shown\)", out):
        p.append(f"no '({len(table)} of {len(trace.events)} events shown)' line")
    return p


def check_stats(trace, out):
    p = []
    lines = [normalize(l) for l in out.splitlines()]
    counts = {}
    for e in trace.events:
        counts[e.get("event")] = counts.get(e.get("event"), 0) + 1
    for name in rvlib.RECORDED_EVENTS:
        c = counts.get(name, 0)
        if c == 0:
            continue
        if not any(word(name).search(l) and word(c).search(l) for l in lines):
            p.append(f"no line with {name} and its count {c}")
    dropped = sum(int(e.get("count", 0)) for e in trace.dropped_records())
    if trace.recorder == "in-process":
        dropped = int(trace.summary.get("events_dropped", 0))
    if not any(re.search(r"drop", l, re.I) and word(dropped).search(l) for l in lines):
        p.append(f"no line about dropped events with the total {dropped}")
    hw = [v for k, v in trace.summary.items() if "high" in k.lower() and isinstance(v, int)]
    hl = [l for l in lines if re.search(r"high", l, re.I)]
    if not hl:
        p.append("no line about the ring buffer high-water mark")
    elif hw and not any(word(hw[0]).search(l) for l in hl):
        p.append(f"high-water line(s) {hl[:2]} do not show the summary's value {hw[0]}")
    return p


def main():
    args, res, rvbpfd, ruby_list = rvlib.begin(__doc__)
    rubies = {r.name: r for r in ruby_list}
    outdir = rvlib.make_outdir(args, "inspect")
    for rname, wl in (("3.4.5-static", "mutex_contention"), ("3.3.8-shared", "many_threads")):
        if rname not in rubies:
            continue
        try:
            run = rvlib.run_workload(rubies[rname], wl, "attach", outdir, ref=True, probes=True, rvbpfd=rvbpfd)
        except rvlib.RunError as e:
            res.check(f"record {rname} {wl}", [str(e)])
            continue
        if run.problems or run.rv is None:
            res.check(f"record {rname} {wl}", run.problems or ["no rvbpfd trace"])
            continue
        for label, trace in (("rvbpfd trace", run.rv), ("in-process trace", run.ref)):
            for sub, extra, fn in (("inspect", ("--events",), check_inspect), ("inspect", (), check_summary),
                                   ("stats", (), check_stats)):
                rc, out, err = run_tool(rvbpfd, sub, trace.path, *extra)
                name = " ".join([sub, *extra, rname, wl]) + f" ({label})"
                if rc != 0:
                    res.check(name, [f"exit {rc}; stderr: {err[-1000:]}"])
                    continue
                res.check(name, fn(trace, out))
        # The filters, on the thread with the most events, over the middle half of the trace.
        counts = {}
        for e in run.rv.events:
            if e.get("ruby_thread") is not None:
                counts[e["ruby_thread"]] = counts.get(e["ruby_thread"], 0) + 1
        tid = max(counts, key=counts.get)
        end_ms = max(e["t_ns"] for e in run.rv.events) / 1e6
        lo_ms, hi_ms, limit = round(end_ms / 4, 3), round(3 * end_ms / 4, 3), 25
        rc, out, err = run_tool(rvbpfd, "inspect", run.rv.path, "--events", "--thread", str(tid), "--from",
                                f"{lo_ms:.3f}", "--to", f"{hi_ms:.3f}", "--limit", str(limit))
        name = f"inspect --events --thread --from --to --limit {rname} {wl}"
        res.check(name, [f"exit {rc}; stderr: {err[-1000:]}"] if rc != 0 else
                  check_filtered(run.rv, out, tid, lo_ms, hi_ms, limit))
        # A trace cut in the middle, as a crash leaves it: its plain lines cut after half of them, and (the recorder
        # writes zstd by default) the compressed file cut after half of its bytes, inside a zstd frame or between two.
        raw, _ = rvlib.trace_bytes(run.rv.path)
        lines = raw.splitlines(True)
        cuts = {"plain": b"".join(lines[: max(2, len(lines) // 2)])}
        with open(run.rv.path, "rb") as f:
            packed = f.read()
        if rvlib.is_zstd(packed):
            cuts["zstd"] = packed[: len(packed) // 2]
        else:
            res.check(f"{rname} {wl}: the recorder's default format is zstd", ["the trace is not zstd-compressed"])
        for kind, content in cuts.items():
            cut = os.path.join(outdir, f"{rname}-{wl}-cut-{kind}.rvtrace")
            with open(cut, "wb") as f:
                f.write(content)
            t = rvlib.Trace(cut)
            rc, out, err = run_tool(rvbpfd, "inspect", cut, "--events")
            name = f"inspect --events {rname} {wl} ({kind} trace cut in half, no summary)"
            if rc != 0:
                res.check(name, [f"exit {rc}; stderr: {err[-1000:]}"])
                continue
            p = []
            for ev in ("gvl_acquired", "gvl_released"):
                n = sum(1 for e in t.events if e.get("event") == ev)
                got = sum(1 for l in out.splitlines() if ROW_START.match(l) and word(ev).search(l))
                if got != n:
                    p.append(f"{ev}: {got} lines, the cut file has {n}")
            if kind == "zstd" and not t.events:
                p.append("the compressed half decodes to no event (the writer ends a frame at every flush)")
            res.check(name, p)
    rvlib.cleanup_outdir(args, outdir)
    res.finish()


if __name__ == "__main__":
    main()
