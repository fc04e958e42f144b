#!/usr/bin/env bash
# Sets everything up on a fresh Debian 12 machine, records the bundled example (examples/cpu_threads.rb: two
# CPU-bound threads and a sleep) with rvbpfd in launch mode, and shows the result: the one-screen summary (time by
# thread and state, who held the GVL while the others waited) and writes the HTML report. Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh
bash tools/build-test-rubies.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target rvbpfd
ruby_bin="$(bash tools/build-test-rubies.sh --print-prefix 3.4.5-static)/bin/ruby"
out=${1:-cpu_threads.rvtrace}
./build/rvbpfd -o "$out" -- "$ruby_bin" examples/cpu_threads.rb
./build/rvbpfd inspect "$out"
./build/rvbpfd report "$out" -o "${out%.rvtrace}.html"
echo "open ${out%.rvtrace}.html in a browser for the timeline (it needs no network);"
echo "rvbpfd inspect --events $out prints every event, rvbpfd stats $out the counts"
