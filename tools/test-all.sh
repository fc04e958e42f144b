#!/usr/bin/env bash
# Sets everything up on a fresh Debian 12 machine and runs every test: builds rvbpfd (and, in build-demo/, in the
# demo's Release unity configuration, so that a change breaking it fails here), runs the unit tests and the
# end-to-end BPF tests against the test Rubies and the trixie root, the unit tests again under AddressSanitizer +
# UndefinedBehaviorSanitizer, then every libFuzzer harness at a fixed number of executions (tools/run-fuzzers.sh).
# Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

bash tools/install-deps.sh
bash tools/install-browser-deps.sh
bash tools/build-test-rubies.sh
bash tools/make-trixie-root.sh --apps  # Debian trixie's own ruby3.3, Rails, Puma, Sidekiq in a root (tests/e2e)

echo "== build (RelWithDebInfo) =="
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_UNITY_BUILD=OFF >/dev/null  # after a demo: its unity build
cmake --build build -j"$jobs"

echo "== build (the demo's configuration: Release, unity; tools/demo.sh) =="
cmake -S . -B build-demo -DCMAKE_BUILD_TYPE=Release -DCMAKE_UNITY_BUILD=ON >/dev/null
cmake --build build-demo -j"$jobs" --target rvbpfd
build-demo/rvbpfd --version

echo "== tests: unit + end-to-end =="
(cd build && ctest --output-on-failure --timeout 1500)

echo "== build (ASan + UBSan) =="
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DRVBPFD_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$jobs"

echo "== tests under ASan + UBSan: unit =="
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
   ctest -L unit --output-on-failure --timeout 600)

echo "== fuzzing (libFuzzer + ASan + UBSan, fixed executions and seed per harness) =="
bash tools/run-fuzzers.sh
