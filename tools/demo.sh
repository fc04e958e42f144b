#!/usr/bin/env bash
# The first command of the README: on a fresh Debian 12 machine (run as root), installs the Debian packages the build
# needs (tools/install-deps.sh --build), builds the rvbpfd binary (build/, its log in build/demo-build.log) while it
# makes a Debian trixie root holding Debian's own ruby3.3 with debootstrap (tools/make-trixie-root.sh), and
# records the bundled example (examples/cpu_threads.rb: two CPU-bound threads and a sleep) running in that root like
# a container: new mount and pid namespaces, chrooted into the root. rvbpfd attaches from the host (attach mode: its
# launch mode cannot start a command through unshare) while the example waits at a gate before its first line, then
# prints the one-screen summary (`rvbpfd inspect`) and writes the HTML report.
#
# Everything is reused by a second run: the packages, the build (incremental), the root (its stamp), rvbpfd's site
# cache. RVBPFD_TRIXIE_ROOT places the root elsewhere (as for make-trixie-root.sh).
#
# Usage: tools/demo.sh [TRACE]   (default: cpu_threads.rvtrace in the current directory; the report is TRACE's
#                                 name with .html)
set -euo pipefail
out=$(realpath -m -- "${1:-cpu_threads.rvtrace}")
report=${out%.rvtrace}.html
mkdir -p "$(dirname "$out")"
cd "$(dirname "$0")/.."

step=0
progress() { step=$((step + 1)); printf '[demo %d/5] %s\n' "$step" "$*"; }
fail() { echo "demo: $*" >&2; exit 1; }
[[ $(id -u) == 0 ]] || fail "run as root (it installs packages, loads BPF programs and makes a root with debootstrap)"
started=$SECONDS

progress "Debian packages for the build (tools/install-deps.sh --build)"
bash tools/install-deps.sh --build

# The root is made while rvbpfd builds: debootstrap mostly waits for the network and dpkg, the compiler for the CPUs.
mkdir -p build
build_log=build/demo-build.log root_log=build/demo-root.log
root=$(bash tools/make-trixie-root.sh --print-root)
progress "Debian trixie root with its ruby3.3, in the background (tools/make-trixie-root.sh; log in $root_log)"
bash tools/make-trixie-root.sh >"$root_log" 2>&1 &
root_job=$!

# A build/ made here is a Release unity build: without -g, and with each module's sources compiled as one unit, the
# rvbpfd target takes less than half the CPU time of the test command's RelWithDebInfo build (docs/benchmarks.md,
# "The demo"). A build/ that exists keeps its configuration (the test command's RelWithDebInfo, or this one).
build_type=()
[[ -f build/CMakeCache.txt ]] || build_type=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_UNITY_BUILD=ON)
progress "building rvbpfd (build/; log in $build_log)"
if ! { cmake -S . -B build "${build_type[@]}" && cmake --build build -j"$(nproc)" --target rvbpfd; } \
     >"$build_log" 2>&1; then
  tail -n 40 "$build_log" >&2
  echo "demo: building rvbpfd failed (the last lines above; the whole log is $build_log)" >&2
  wait "$root_job" || true
  exit 1
fi
echo "  built build/rvbpfd after $((SECONDS - started)) s; waiting for the root"
if ! wait "$root_job"; then
  cat "$root_log" >&2
  fail "making the Debian trixie root failed (its log above)"
fi
sed 's/^/  /' "$root_log"
# The example, and a gate that holds it before its first line until rvbpfd has attached (rubygems and the gate are
# loaded by then, so only the example runs traced).
mkdir -p "$root/opt/rvbpfd/demo"
cp examples/cpu_threads.rb "$root/opt/rvbpfd/demo/cpu_threads.rb"
# shellcheck disable=SC2016  # Ruby code, not shell
printf '$stdout.puts "ready"\n$stdout.flush\nexit 1 unless $stdin.gets\n' > "$root/opt/rvbpfd/demo/gate.rb"

progress "recording examples/cpu_threads.rb on the root's ruby3.3 in new pid and mount namespaces"
work=$(mktemp -d /tmp/rvbpfd-demo.XXXXXX)
container="" pid="" rv=""
cleanup() {
  set +e
  exec 3>&-
  [[ -n $rv ]] && kill "$rv" 2>/dev/null
  # The example's ruby is its namespace's init: only a SIGKILL from this namespace ends it.
  [[ -n $container ]] && { [[ -n $pid ]] && kill -KILL "$pid"; kill "$container"; } 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
mkfifo "$work/gate"
# The container: pid 1 of its own pid namespace is the example's ruby, which sees the root's files and its own pids
# (what `docker run` does without --init); no variable of this shell's environment reaches it.
env -i PATH=/usr/bin:/bin HOME=/root LANG=C.UTF-8 \
  unshare --mount --pid --fork --kill-child --mount-proc --root="$root" -- \
  /usr/bin/ruby3.3 -r/opt/rvbpfd/demo/gate.rb /opt/rvbpfd/demo/cpu_threads.rb <"$work/gate" >"$work/ruby.out" 2>&1 &
container=$!
exec 3>"$work/gate"  # opening the gate's write end lets the container start; writing a line releases the example
for _ in $(seq 300); do
  grep -qx ready "$work/ruby.out" 2>/dev/null && break
  kill -0 "$container" 2>/dev/null || { cat "$work/ruby.out" >&2; fail "the example's ruby3.3 exited before its gate"; }
  sleep 0.1
done
grep -qx ready "$work/ruby.out" || fail "the example's ruby3.3 did not reach its gate within 30 s"
read -r pid _ <"/proc/$container/task/$container/children" || true
[[ $pid =~ ^[0-9]+$ ]] || fail "cannot find the container's process (no child of unshare, pid $container)"
echo "  ruby3.3 runs as pid 1 of its namespace, host pid $pid; attaching rvbpfd"
./build/rvbpfd --pid "$pid" -o "$out" 2>"$work/rvbpfd.err" &
rv=$!
for _ in $(seq 600); do
  grep -q '^rvbpfd: attached' "$work/rvbpfd.err" && break
  kill -0 "$rv" 2>/dev/null || { cat "$work/rvbpfd.err" >&2; fail "rvbpfd exited before attaching (its output above)"; }
  sleep 0.1
done
grep -q '^rvbpfd: attached' "$work/rvbpfd.err" ||
  { cat "$work/rvbpfd.err" >&2; fail "rvbpfd did not attach within 60 s"; }
echo go >&3
exec 3>&-
wait "$container" || { cat "$work/ruby.out" >&2; fail "the example failed (its output above)"; }
container=""
rc=0
wait "$rv" || rc=$?
rv=""
sed -e '/^ready$/d' -e 's/^/  example: /' "$work/ruby.out"
sed 's/^/  /' "$work/rvbpfd.err"
((rc == 0)) || fail "rvbpfd exited with status $rc (its output above)"

progress "the trace: rvbpfd inspect, then the HTML report"
./build/rvbpfd inspect "$out"
./build/rvbpfd report "$out" -o "$report"
echo
echo "demo done in $((SECONDS - started)) s. The trace is $out;"
echo "open $report in a browser for the timeline (it needs no network);"
echo "build/rvbpfd inspect --events $out prints every event,"
echo "build/rvbpfd stats $out the counts."
