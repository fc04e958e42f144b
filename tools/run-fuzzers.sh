#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz) into build-fuzz with clang, ASan and UBSan, and runs each for a bounded
# time. Fails when any harness reports a crash, a leak, a UBSan finding, a timeout or running out of memory; the
# input that did it is left in build-fuzz/fuzz-artifacts/<harness>/ and the log in build-fuzz/fuzz-logs/.
#   RVBPFD_FUZZ_SECONDS  seconds per harness (default 60)
#   RVBPFD_FUZZ_JOBS     parallel fuzzing processes per harness (default 1)
#   arguments            harness names to run (default: all): trace_reader trace_export elf site_cache stacks
# Inputs that found new coverage accumulate in build-fuzz/fuzz-corpus/<harness>/ and are reused by the next run;
# the committed seeds (tests/fuzz/corpus/<harness>/) and the generated ones (build-fuzz/fuzz-seeds/) are read only.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${RVBPFD_FUZZ_SECONDS:-60}
jobs=${RVBPFD_FUZZ_JOBS:-1}
build=build-fuzz
all=(trace_reader trace_export elf site_cache stacks)
harnesses=("$@")
((${#harnesses[@]})) || harnesses=("${all[@]}")
# Generated seed directory and dictionary of each harness.
declare -A seeds=([trace_reader]=trace [trace_export]=trace [elf]=elf [site_cache]=site_cache [stacks]=stacks)
declare -A dicts=([trace_reader]=tests/fuzz/rvtrace.dict [trace_export]=tests/fuzz/rvtrace.dict)

for h in "${harnesses[@]}"; do
  [[ -n ${seeds[$h]+x} ]] || { echo "run-fuzzers: unknown harness '$h' (known: ${all[*]})" >&2; exit 2; }
done
for tool in clang clang++; do
  command -v "$tool" >/dev/null || { echo "run-fuzzers: $tool not found; install it with tools/install-deps.sh" >&2; exit 1; }
done

echo "== build (libFuzzer + ASan + UBSan, $build) =="
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRVBPFD_FUZZ=ON -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ >/dev/null
cmake --build "$build" -j"$(nproc)" --target fuzzers

mkdir -p "$build/fuzz-logs"
failed=()
for h in "${harnesses[@]}"; do
  corpus="$build/fuzz-corpus/$h"
  artifacts="$build/fuzz-artifacts/$h"
  log="$build/fuzz-logs/$h.log"
  mkdir -p "$corpus" "$artifacts"
  dirs=("$corpus")
  [[ -d tests/fuzz/corpus/$h ]] && dirs+=("tests/fuzz/corpus/$h")
  [[ -d $build/fuzz-seeds/${seeds[$h]} ]] && dirs+=("$build/fuzz-seeds/${seeds[$h]}")
  args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1
        -artifact_prefix="$artifacts/")
  [[ -n ${dicts[$h]+x} ]] && args+=(-dict="${dicts[$h]}")
  ((jobs > 1)) && args+=(-fork="$jobs" -ignore_crashes=0)
  echo "== fuzz $h (${seconds}s) =="
  if ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
     LSAN_OPTIONS=suppressions=tests/fuzz/lsan.supp:print_suppressions=0 "$build/tests/fuzz/fuzz_$h" "${args[@]}" "${dirs[@]}" >"$log" 2>&1; then
    grep -E '^stat::number_of_executed_units|^#[0-9]+.*DONE' "$log" | tail -2 || true
  else
    echo "run-fuzzers: $h failed; log: $log; input: $(ls -t "$artifacts" | head -1)" >&2
    grep -E 'ERROR: |runtime error|fuzz check failed|SUMMARY' "$log" | head -5 >&2 || true
    failed+=("$h")
  fi
done
if ((${#failed[@]})); then
  echo "run-fuzzers: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "run-fuzzers: all passed (${harnesses[*]})"
