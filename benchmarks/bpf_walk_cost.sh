#!/usr/bin/env bash
# Cost of rvbpfd's Ruby stack walk inside BPF, in ns per frame, from the kernel's own BPF run-time statistics.
#
# With kernel.bpf_stats_enabled=1 the kernel accumulates run_time_ns and run_cnt for every BPF program. rvbpfd records
# benchmarks/workloads/deep_release.rb (one thread releasing the GVL from a deep stack) with --stacks=release --hz 0,
# so the uprobe program (rv_site_*) walks a stack at each gvl_released. While rvbpfd runs, its programs' counters are
# read through `bpftool prog show id` (the ids come from rvbpfd's own BPF fds in /proc/PID/fdinfo, so another rvbpfd
# on the machine is never counted). Ruby runs with --disable-gems so RubyGems' start-up IO (hundreds of shallow
# stacks) does not dilute the depth under test. The average frames per stack come from the trace: every event's "stack" id,
# resolved through the stack lines (docs/rvtrace.md, "Frames and stacks").
#
# Three numbers per depth, from cheap-and-crude to the one that isolates the walk:
#   naive     run_time_ns / run_cnt / frames_per_stack: the whole program's average (including hits that take no stack
#             and the per-hit fixed cost) spread over the frames; what the brief's formula gives.
#   walk      (run_time_ns - run_cnt x avg ns of a --stacks=off hit) / stacks walked / frames_per_stack: the extra
#             cost of taking a stack (walk + copying it into the ring), per frame.
#   marginal  the slope between the two depths: d(ns per stack) / d(frames per stack), i.e. what one more frame
#             costs, with every fixed per-stack cost cancelled out.
# The sysctl is restored to its previous value on every exit path (trap).
#
# Usage (root): benchmarks/bpf_walk_cost.sh RVBPFD [RUBY] [SECONDS]
#   RUBY     default /var/cache/rvbpfd/rubies/3.4.5-static/bin/ruby (tools/build-test-rubies.sh)
#   SECONDS  time each run keeps releasing the GVL (default 3)
#   DEPTHS   env, two stack depths in Ruby frames (default "100 1000")
set -euo pipefail

if [[ $# -lt 1 ]]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 2
fi
RVBPFD=$(realpath "$1")
RUBY=${2:-/var/cache/rvbpfd/rubies/3.4.5-static/bin/ruby}
SECONDS_PER_RUN=${3:-3}
read -r -a DEPTH_LIST <<<"${DEPTHS:-100 1000}"
HERE=$(cd "$(dirname "$0")" && pwd)
WORKLOAD="$HERE/workloads/deep_release.rb"
STATS_SYSCTL=kernel.bpf_stats_enabled

[[ $EUID -eq 0 ]] || { echo "needs root (BPF, sysctl)" >&2; exit 1; }
[[ -x $RVBPFD ]] || { echo "not executable: $RVBPFD" >&2; exit 1; }
[[ -x $RUBY ]] || { echo "no Ruby at $RUBY" >&2; exit 1; }
[[ ${#DEPTH_LIST[@]} -eq 2 ]] || { echo "DEPTHS must name two depths" >&2; exit 1; }

WORK=$(mktemp -d /tmp/bpf_walk_cost.XXXXXX)
PREV_STATS=$(sysctl -n "$STATS_SYSCTL")
RVBPFD_PID=
cleanup() {
  # Restore first: an interrupted run must not leave every BPF program on the machine paying for stats.
  sysctl -q -w "$STATS_SYSCTL=$PREV_STATS" || echo "could not restore $STATS_SYSCTL=$PREV_STATS" >&2
  # rvbpfd stops recording on SIGTERM; its launched Ruby finishes on its own within SECONDS + 1.5 s.
  if [[ -n $RVBPFD_PID ]] && kill -0 "$RVBPFD_PID" 2>/dev/null; then
    kill "$RVBPFD_PID" 2>/dev/null || true
    wait "$RVBPFD_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP
sysctl -q -w "$STATS_SYSCTL=1"

# Prints "run_time_ns run_cnt" summed over rvbpfd's uprobe programs (rv_site_single / rv_site_multi: only the one
# that is attached runs), or nothing when they cannot be read (rvbpfd not started yet or already gone).
read_stats() {
  local pid=$1 ids=() id fd
  for fd in /proc/"$pid"/fdinfo/*; do
    id=$(awk '$1 == "prog_id:" {print $2}' "$fd" 2>/dev/null) || continue
    [[ -n $id ]] && ids+=("$id")
  done
  [[ ${#ids[@]} -gt 0 ]] || return 0
  local rt=0 cnt=0 found=0 line
  # A program's id appears on its own fd and on every link fd attached to it: count each program once.
  for id in $(printf '%s\n' "${ids[@]}" | sort -un); do
    line=$(bpftool prog show id "$id" 2>/dev/null | head -1) || continue
    [[ $line == *" name rv_site_"* ]] || continue
    found=1
    if [[ $line =~ run_time_ns\ ([0-9]+)\ run_cnt\ ([0-9]+) ]]; then
      rt=$((rt + BASH_REMATCH[1]))
      cnt=$((cnt + BASH_REMATCH[2]))
    fi
  done
  [[ $found -eq 1 ]] && echo "$rt $cnt"
  return 0
}

# run_one NAME STACKS DEPTH: records the workload; writes NAME.trace and NAME.stats ("run_time_ns run_cnt", the last
# reading taken while rvbpfd was still running).
run_one() {
  local name=$1 stacks=$2 depth=$3 last="" s
  # Plain JSON Lines (--trace-format=jsonl): the analysis below reads them directly.
  DEEP_DEPTH=$depth DEEP_SECONDS=$SECONDS_PER_RUN "$RVBPFD" -o "$WORK/$name.trace" --trace-format=jsonl \
    --stacks="$stacks" --hz 0 \
    -- "$RUBY" --disable-gems "$WORKLOAD" >"$WORK/$name.log" 2>&1 &
  RVBPFD_PID=$!
  # Every 200 ms; the workload idles 1.5 s after its last release, so the last reading holds every walk.
  while kill -0 "$RVBPFD_PID" 2>/dev/null; do
    s=$(read_stats "$RVBPFD_PID")
    [[ -n $s ]] && last=$s
    sleep 0.2
  done
  if ! wait "$RVBPFD_PID"; then
    echo "rvbpfd failed ($name):" >&2
    cat "$WORK/$name.log" >&2
    exit 1
  fi
  RVBPFD_PID=
  [[ -n $last ]] || { echo "no BPF stats read for $name" >&2; exit 1; }
  echo "$last" >"$WORK/$name.stats"
}

run_one off off "${DEPTH_LIST[1]}"
for d in "${DEPTH_LIST[@]}"; do run_one "d$d" release "$d"; done

python3 - "$WORK" "${DEPTH_LIST[@]}" <<'EOF'
import json, sys

work, depths = sys.argv[1], sys.argv[2:]


def trace_stats(path):
    """Events, events carrying a stack, the mean frames per carried stack (each event counts once), the frames of
    those stacks that are unresolved (a walk that read garbage would show here), and the summary."""
    stacks, unresolved_ids, events, with_stack, frames, unresolved, summary = {}, set(), 0, 0, 0, 0, {}
    with open(path) as f:
        for line in f:
            o = json.loads(line)
            if "frame" in o and isinstance(o["frame"], dict):
                if o["frame"].get("kind") == "unresolved":
                    unresolved_ids.add(o["frame"]["id"])
            elif "stack" in o and isinstance(o["stack"], dict):
                fr = o["stack"]["frames"]
                stacks[o["stack"]["id"]] = (len(fr), sum(1 for i in fr if i in unresolved_ids))
            elif "t_ns" in o:
                events += 1
                if "stack" in o:
                    with_stack += 1
                    frames += stacks[o["stack"]][0]
                    unresolved += stacks[o["stack"]][1]
            elif "summary" in o:
                summary = o["summary"]
    return events, with_stack, (frames / with_stack if with_stack else 0.0), unresolved, summary


def bpf_stats(name):
    rt, cnt = open(f"{work}/{name}.stats").read().split()
    return int(rt), int(cnt)


off_rt, off_cnt = bpf_stats("off")
off_avg = off_rt / off_cnt if off_cnt else 0.0
print(f"--stacks=off: {off_cnt} hits, {off_avg:.0f} ns per hit (no walk)")
per_stack = {}
for d in depths:
    rt, cnt = bpf_stats(f"d{d}")
    events, with_stack, fps, unresolved, summary = trace_stats(f"{work}/d{d}.trace")
    # Walks the BPF program made: the events carrying a stack, plus stack records the ring dropped (walked all the
    # same). Hits that wrote no event (another process running the same VM binary, filtered call sites) are in
    # run_cnt and are priced at the --stacks=off average below.
    walks = with_stack + (summary.get("events_dropped", 0) if isinstance(summary, dict) else 0)
    avg = rt / cnt if cnt else 0.0
    naive = avg / fps if fps else 0.0
    extra_per_stack = (rt - cnt * off_avg) / walks if walks else 0.0
    per_stack[d] = (fps, extra_per_stack)
    dropped = {k: v for k, v in summary.items() if "drop" in k} if isinstance(summary, dict) else {}
    print(json.dumps({"depth": int(d), "run_cnt": cnt, "run_time_ns": rt, "ns_per_run": round(avg, 1),
                      "events": events, "stack_events": with_stack, "frames_per_stack": round(fps, 1),
                      "naive_ns_per_frame": round(naive, 2), "walk_ns_per_stack": round(extra_per_stack, 1),
                      "walk_ns_per_frame": round(extra_per_stack / fps, 2) if fps else None,
                      "unresolved_frames": unresolved, "dropped": dropped}))
(f1, s1), (f2, s2) = per_stack[depths[0]], per_stack[depths[1]]
if f2 != f1:
    print(f"marginal: {(s2 - s1) / (f2 - f1):.2f} ns per frame "
          f"(between {f1:.0f} and {f2:.0f} frames per stack)")
EOF
