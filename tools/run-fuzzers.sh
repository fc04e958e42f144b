#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz) into build-fuzz with clang, ASan and UBSan, and runs each one. Fails
# when any harness reports a crash, a leak, a UBSan finding, a timeout or running out of memory; the input that did
# it is left in build-fuzz/fuzz-artifacts/<harness>/ and the log in build-fuzz/fuzz-logs/.
# Two modes:
#   default (what CI runs): a fixed number of executions per harness (about a minute each here) with a fixed random
#     seed, from the committed and generated seeds only, without address randomisation (setarch -R: the harnesses'
#     coverage otherwise varies with where the allocator puts things, so two runs of one binary explored different
#     inputs) and without corpus reloading, so one tree gives the same run: a bug is found by whoever runs the
#     exploration below, fixed, and its input committed, instead of failing a later, unrelated landing at random.
#   RVBPFD_FUZZ_SECONDS=N: exploration, N seconds per harness with a fresh random seed, reusing and growing the work
#     corpus in build-fuzz/fuzz-corpus/<harness>/.
#   RVBPFD_FUZZ_RUNS     executions per harness in the default mode (default: the table below)
#   RVBPFD_FUZZ_JOBS     parallel fuzzing processes per harness, exploration only (default 1)
#   arguments            harness names to run (default: all but elf_real): trace_reader trace_export elf
#                        site_cache stacks kernel_layout sites (crafted VM look-alikes of up to 30,000 symbols,
#                        each input bounded by -timeout) core (ELF core files: notes, reads, build-ids), and elf_real: fuzz_elf on mutations of real VM binaries (the test
#                        Rubies' libruby / static ruby when built, Debian's libruby-3.1 when installed; slow, since
#                        each execution analyses a whole binary)
# Inputs that found new coverage accumulate in build-fuzz/fuzz-corpus/<harness>/ and are reused by the next run;
# the committed seeds (tests/fuzz/corpus/<harness>/) and the generated ones (build-fuzz/fuzz-seeds/) are read only.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${RVBPFD_FUZZ_SECONDS:-}
jobs=${RVBPFD_FUZZ_JOBS:-1}
# Executions per harness in the default mode: about 60 s each under ASan+UBSan on a 2-core VM.
declare -A runs=([trace_reader]=150000 [trace_export]=80000 [elf]=40000 [site_cache]=150000 [stacks]=100000
                 [kernel_layout]=150000 [sites]=3000 [core]=800000 [elf_real]=200)
build=build-fuzz
all=(trace_reader trace_export elf site_cache stacks kernel_layout sites core)
harnesses=("$@")
((${#harnesses[@]})) || harnesses=("${all[@]}")
# Generated seed directory and dictionary of each harness.
declare -A seeds=([trace_reader]=trace [trace_export]=trace [elf]=elf [site_cache]=site_cache [stacks]=stacks
                  [kernel_layout]=kernel_layout [sites]=sites [core]=core [elf_real]=elf_real)
declare -A dicts=([trace_reader]=tests/fuzz/rvtrace.dict [trace_export]=tests/fuzz/rvtrace.dict)

for h in "${harnesses[@]}"; do
  [[ -n ${seeds[$h]+x} ]] || { echo "run-fuzzers: unknown harness '$h' (known: ${all[*]} elf_real)" >&2; exit 2; }
done
for tool in clang clang++; do
  command -v "$tool" >/dev/null || { echo "run-fuzzers: $tool not found; install it with tools/install-deps.sh" >&2; exit 1; }
done

echo "== build (libFuzzer + ASan + UBSan, $build) =="
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRVBPFD_FUZZ=ON -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ >/dev/null
cmake --build "$build" -j"$(nproc)" --target fuzzers

# elf_real's seeds: links to the real VM binaries present on this machine (never copied into the repository).
real_seeds="$build/fuzz-seeds/elf_real"
rm -rf "$real_seeds"
mkdir -p "$real_seeds" "$build/fuzz-logs"
for ruby in /var/cache/rvbpfd/rubies/*/; do
  [[ -e $ruby/.complete ]] || continue  # still being built
  for vm in "$ruby"lib/libruby.so.*.*.* "$ruby"bin/ruby; do
    # A static ruby holds the VM; a shared one's bin/ruby is a small launcher, left out.
    if [[ -f $vm && ( $vm == *libruby* || $(stat -c %s "$vm") -gt 4000000 ) ]]; then
      ln -sf "$(readlink -f "$vm")" "$real_seeds/$(basename "$ruby")-$(basename "$vm")"
    fi
  done
done
if [[ -f /usr/lib/x86_64-linux-gnu/libruby-3.1.so.3.1 ]]; then
  ln -sf "$(readlink -f /usr/lib/x86_64-linux-gnu/libruby-3.1.so.3.1)" "$real_seeds/debian-libruby-3.1.so"
fi

failed=()
for h in "${harnesses[@]}"; do
  exe="$build/tests/fuzz/fuzz_$h"
  limits=(-timeout=10 -rss_limit_mb=2048 -max_len=65536)
  if [[ $h == elf_real ]]; then
    exe="$build/tests/fuzz/fuzz_elf"
    limits=(-timeout=120 -rss_limit_mb=4096 -max_len=100000000)
    if [[ -z $(ls -A "$real_seeds") ]]; then
      echo "run-fuzzers: elf_real: no real VM binary on this machine (tools/build-test-rubies.sh, or apt-get install libruby3.1)" >&2
      failed+=("$h")
      continue
    fi
  fi
  corpus="$build/fuzz-corpus/$h"
  # elf_real's new inputs are whole binaries (tens of MB each), and the default mode must not depend on earlier
  # runs: their work corpus starts empty.
  if [[ $h == elf_real || -z $seconds ]]; then
    corpus="$build/fuzz-corpus-fixed/$h"
    rm -rf "$corpus"
  fi
  artifacts="$build/fuzz-artifacts/$h"
  log="$build/fuzz-logs/$h.log"
  mkdir -p "$corpus" "$artifacts"
  dirs=("$corpus")
  [[ -d tests/fuzz/corpus/$h ]] && dirs+=("tests/fuzz/corpus/$h")
  [[ -d $build/fuzz-seeds/${seeds[$h]} ]] && dirs+=("$build/fuzz-seeds/${seeds[$h]}")
  args=("${limits[@]}" -print_final_stats=1 -artifact_prefix="$artifacts/")
  if [[ -n $seconds ]]; then
    args+=(-max_total_time="$seconds")
    ((jobs > 1)) && args+=(-fork="$jobs" -ignore_crashes=0)
    what="${seconds}s, random seed"
  else
    n=${RVBPFD_FUZZ_RUNS:-${runs[$h]}}
    args+=(-runs="$n" -seed=1 -reload=0)
    what="$n executions, seed 1"
  fi
  # Exploration wants the variety; the fixed run the same addresses every time (util-linux setarch).
  norandom=()
  [[ -z $seconds ]] && command -v setarch >/dev/null && norandom=(setarch "$(uname -m)" -R)
  [[ -n ${dicts[$h]+x} ]] && args+=(-dict="${dicts[$h]}")
  echo "== fuzz $h ($what) =="
  if ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
     LSAN_OPTIONS=suppressions=tests/fuzz/lsan.supp:print_suppressions=0 "${norandom[@]}" "$exe" "${args[@]}" \
     "${dirs[@]}" >"$log" 2>&1
  then
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
