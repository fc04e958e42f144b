#!/usr/bin/env python3
"""Nothing lost silently: with a tiny ring buffer and a flood of events, every event rvbpfd could not write is
accounted for by an events_dropped record.

For each test Ruby: the flood workload (one thread, 50,000 pipe round trips, ~300,000 events) runs with the
in-process reference (RVREF_PROBES=1, so it records every kind rvbpfd records) and rvbpfd in attach mode with
--ring-buffer-kb 4. rvbpfd's window W = [tracing_started, tracing_stopped] lies inside the reference's. Then:
  - at least one events_dropped record, each with a positive integer "count";
  - rvbpfd's written events in W + the sum of the events_dropped counts == the reference's events in W;
  - the summary's events_dropped (if present) equals the sum of the records' counts.
Rule TEARDOWN_TRACEPOINTS (rvlib.py): the reference cannot see GC/probe events after CRuby cleared the TracePoints
at exit; rvbpfd's written GC/probe events after that moment are left out of its side. The balance is exact when every
events_dropped record precedes that moment; a drop record after it may count events of both sides, so then the lost
events must lie between the drops inside the window and all drops.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rvlib  # noqa: E402


def main():
    args, res, rvbpfd, rubies = rvlib.begin(__doc__)
    outdir = rvlib.make_outdir(args, "drops")
    for ruby in rubies:
        name = f"drops {ruby.name} flood attach --ring-buffer-kb 4"
        try:
            run = rvlib.run_workload(ruby, "flood", "attach", outdir, ref=True, probes=True, rvbpfd=rvbpfd,
                                     rv_args=("--ring-buffer-kb", "4"), run_timeout=300.0)
        except rvlib.RunError as e:
            res.check(name, [str(e)])
            continue
        p = list(run.problems)
        ref, rv = run.ref, run.rv
        if rv is None:
            res.check(name, p)
            continue
        p += ref.problems + [f"rvbpfd trace: {x}" for x in rv.problems]
        if ref.summary.get("events_dropped"):
            p.append(f"the reference dropped {ref.summary['events_dropped']} events (ground truth incomplete)")
        lo, hi = rv.window()
        rlo, rhi = ref.window()
        if lo < rlo:
            p.append(f"rvbpfd's window starts before the reference's ({lo} < {rlo}): not an attach-mode run?")
        tp_end = ref.tracepoint_end()
        if tp_end is None:
            p.append("reference summary lacks tracepoints_stopped_t_ns")
            tp_end = hi
        drops = rv.dropped_records()
        bad = [d for d in drops if not isinstance(d.get("count"), int) or d["count"] <= 0]
        if bad:
            p.append(f"{len(bad)} events_dropped records without a positive integer count, first: {bad[0]}")
        dropped = sum(d["count"] for d in drops if isinstance(d.get("count"), int))
        if not drops:
            p.append("no events_dropped record although the ring buffer is 4 KiB and the flood makes ~300,000 "
                     "events")
        late = [d for d in drops if d.get("abs") is not None and d["abs"] > tp_end]
        late_count = sum(d["count"] for d in late if isinstance(d.get("count"), int))
        if late:
            print(f"  {len(late)} events_dropped records ({late_count} events) after the reference's TracePoint end, "
                  f"first at {rvlib.fmt_ms(rv, late[0])}: they may hold events of its window and GC/probe events "
                  f"after it (rule TEARDOWN_TRACEPOINTS), so the balance is checked as a range")
        if "events_dropped" in rv.summary and rv.summary["events_dropped"] != dropped:
            p.append(f"summary events_dropped {rv.summary['events_dropped']} != sum of the records' counts {dropped}")
        written = rvlib.in_window(rv.named(rvlib.RECORDED_EVENTS), lo, hi)
        written_lines = {e["_line"] for e in written}
        outside = [e for e in rv.named(rvlib.RECORDED_EVENTS) if e["_line"] not in written_lines]
        written_cmp = rvlib.in_window(written, lo, hi, (ref.tracepoint_start(), tp_end))
        after_tp = len(written) - len(written_cmp)
        expected = rvlib.in_window(ref.named(rvlib.RECORDED_EVENTS), lo, hi,
                                   (ref.tracepoint_start(), tp_end))
        by_kind = {}
        for e in expected:
            by_kind[e["event"]] = by_kind.get(e["event"], [0, 0])
            by_kind[e["event"]][0] += 1
        for e in written_cmp:
            by_kind[e["event"]] = by_kind.get(e["event"], [0, 0])
            by_kind[e["event"]][1] += 1
        print(f"  {ruby.name}: reference events in rvbpfd's window {len(expected)}; rvbpfd written {len(written_cmp)}"
              f" + dropped {dropped} = {len(written_cmp) + dropped} ({len(drops)} events_dropped records; "
              f"{after_tp} GC/probe events outside the reference's TracePoint window left out; "
              f"{len(outside)} events outside "
              f"rvbpfd's own window)")
        print("    per kind (reference, rvbpfd written): "
              + ", ".join(f"{k} {v[0]}/{v[1]}" for k, v in sorted(by_kind.items())))
        if outside:
            p.append(f"{len(outside)} rvbpfd events outside its own [tracing_started, tracing_stopped] window")
        lost = len(expected) - len(written_cmp)  # the reference's events in the window that rvbpfd did not write
        if not late and lost != dropped:
            p.append(f"written {len(written_cmp)} + dropped {dropped} = {len(written_cmp) + dropped} != reference "
                     f"{len(expected)} (difference {len(written_cmp) + dropped - len(expected):+d})")
        elif late and not dropped - late_count <= lost <= dropped:
            # A drop after the TracePoint end counts events lost since the previous written one: some of the window,
            # some GC/probe events after it. Every other drop lies inside the window.
            p.append(f"the reference's {len(expected)} events minus rvbpfd's {len(written_cmp)} written = {lost} lost, "
                     f"not within the drops inside the window ({dropped - late_count}) and all drops ({dropped})")
        over = [k for k, v in by_kind.items() if v[1] > v[0]]
        if over:
            p.append("rvbpfd wrote more events than the reference saw for: "
                     + ", ".join(f"{k} ({by_kind[k][1]} > {by_kind[k][0]})" for k in over))
        res.check(name, p)
    rvlib.cleanup_outdir(args, outdir)
    res.finish()


if __name__ == "__main__":
    main()
