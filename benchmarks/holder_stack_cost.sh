#!/usr/bin/env bash
# What a contended READY costs with the holder's stack walk (--holder-stacks=on) against without it (off), in ns of
# BPF program time, from the kernel's own BPF run-time statistics (kernel.bpf_stats_enabled=1, as
# benchmarks/bpf_walk_cost.sh).
#
# rvbpfd launches benchmarks/workloads/contended_ready.rb (a cruncher holds the GVL in CPU work HOLDER_DEPTH frames
# deep while three threads do pipe round trips: most of their READYs are contended) twice in one run of this script,
# --stacks=release --hz 0 both times, with --holder-stacks=off and then =on. Both runs walk the release stacks; the
# second also reads the holder at every READY and walks the holder's stack at the contended ones (the summary's
# holder_stacks). The figures:
#   ns_per_hit             run_time_ns / run_cnt of rvbpfd's uprobe program, off and on;
#   ns_per_contended_ready (on's run_time_ns - on's run_cnt x off's per-hit average) / holder_stacks: what one
#                          contended READY costs more with the walk (the holder read of every READY included), and
#                          that per frame of the holder stacks (their mean depth, from the trace).
# The two runs are not the same hits (the scheduler decides how many round trips and READYs each gets), so the
# difference is an estimate: compare it with bpf_walk_cost.sh's ns per frame. The sysctl is restored on every exit.
#
# Usage (root): benchmarks/holder_stack_cost.sh RVBPFD [RUBY] [SECONDS]
#   RUBY          default /var/cache/rvbpfd/rubies/3.4.5-static/bin/ruby (tools/build-test-rubies.sh)
#   SECONDS       time each run contends (default 3)
#   HOLDER_DEPTH  env, the cruncher's stack depth in Ruby frames (default 50)
set -euo pipefail

if [[ $# -lt 1 ]]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 2
fi
RVBPFD=$(realpath "$1")
RUBY=${2:-/var/cache/rvbpfd/rubies/3.4.5-static/bin/ruby}
SECONDS_PER_RUN=${3:-3}
DEPTH=${HOLDER_DEPTH:-50}
HERE=$(cd "$(dirname "$0")" && pwd)
WORKLOAD="$HERE/workloads/contended_ready.rb"
STATS_SYSCTL=kernel.bpf_stats_enabled

[[ $EUID -eq 0 ]] || { echo "needs root (BPF, sysctl)" >&2; exit 1; }
[[ -x $RVBPFD ]] || { echo "not executable: $RVBPFD" >&2; exit 1; }
[[ -x $RUBY ]] || { echo "no Ruby at $RUBY" >&2; exit 1; }

WORK=$(mktemp -d /tmp/holder_stack_cost.XXXXXX)
PREV_STATS=$(sysctl -n "$STATS_SYSCTL")
RVBPFD_PID=
cleanup() {
  sysctl -q -w "$STATS_SYSCTL=$PREV_STATS" || echo "could not restore $STATS_SYSCTL=$PREV_STATS" >&2
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

# run_one NAME HOLDER_STACKS: records the workload; writes NAME.trace and NAME.stats ("run_time_ns run_cnt", the
# last reading taken while rvbpfd was still running).
run_one() {
  local name=$1 holder=$2 last="" s
  HOLDER_DEPTH=$DEPTH HOLDER_SECONDS=$SECONDS_PER_RUN "$RVBPFD" -o "$WORK/$name.trace" --trace-format=jsonl \
    --stacks=release --holder-stacks="$holder" --hz 0 \
    -- "$RUBY" --disable-gems "$WORKLOAD" >"$WORK/$name.log" 2>&1 &
  RVBPFD_PID=$!
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

run_one off off
run_one on on

python3 - "$WORK" <<'EOF'
import json, sys

work = sys.argv[1]


def trace_stats(path):
    """READYs, contended READYs (holder_stack), the mean frames per holder stack, and the summary."""
    stacks, readies, contended, frames, summary = {}, 0, 0, 0, {}
    with open(path) as f:
        for line in f:
            o = json.loads(line)
            if "stack" in o and isinstance(o["stack"], dict):
                stacks[o["stack"]["id"]] = len(o["stack"]["frames"])
            elif o.get("event") == "wants_gvl":
                readies += 1
                if "holder_stack" in o:
                    contended += 1
                    frames += stacks[o["holder_stack"]]
            elif "summary" in o:
                summary = o["summary"]
    return readies, contended, (frames / contended if contended else 0.0), summary


def bpf_stats(name):
    rt, cnt = open(f"{work}/{name}.stats").read().split()
    return int(rt), int(cnt)


off_rt, off_cnt = bpf_stats("off")
on_rt, on_cnt = bpf_stats("on")
off_avg, on_avg = off_rt / off_cnt, on_rt / on_cnt
readies_off = trace_stats(f"{work}/off.trace")[0]
readies, contended, fps, summary = trace_stats(f"{work}/on.trace")
walks = summary.get("holder_stacks", contended)
extra = (on_rt - on_cnt * off_avg) / walks if walks else 0.0
print(json.dumps({"off": {"run_cnt": off_cnt, "ns_per_hit": round(off_avg, 1), "wants_gvl": readies_off},
                  "on": {"run_cnt": on_cnt, "ns_per_hit": round(on_avg, 1), "wants_gvl": readies,
                         "holder_stacks": walks, "frames_per_holder_stack": round(fps, 1)},
                  "ns_per_contended_ready": round(extra, 1),
                  "ns_per_holder_frame": round(extra / fps, 2) if fps else None}))
EOF
