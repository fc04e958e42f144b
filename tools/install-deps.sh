#!/usr/bin/env bash
# Installs everything rvbpfd builds and tests with, from Debian 12's packages. Idempotent.
# With --build only what building the rvbpfd binary and the Debian trixie root needs (tools/demo.sh): no test
# Rubies' build dependencies, fuzzing runtimes, Go or debuginfod.
set -euo pipefail
if [[ $(id -u) != 0 ]]; then
  echo "install-deps: run as root (apt-get install)" >&2
  exit 1
fi
case ${1:-} in
  --build) build_only=1 ;;
  "") build_only=0 ;;
  *) echo "install-deps: usage: $0 [--build]" >&2; exit 2 ;;
esac
export DEBIAN_FRONTEND=noninteractive
pkgs=(
  build-essential cmake pkg-config clang bpftool libbpf-dev libelf-dev libdw-dev libcapstone-dev libdebuginfod-dev
  libcli11-dev libgtest-dev libgmock-dev zlib1g-dev libzstd-dev nlohmann-json3-dev libcurl4-openssl-dev python3
  debootstrap  # the Debian trixie root of the demo and the container tests (tools/make-trixie-root.sh)
)
if ((!build_only)); then
  pkgs+=(
    llvm elfutils protobuf-compiler libprotobuf-dev ccache
    zstd  # the zstd CLI: tests/e2e/rvlib.py and benchmarks/overhead.py read compressed traces with it
    debuginfod  # the server serves debug files to the e2e tests on loopback
    util-linux  # setpriv: tests/e2e/test_least_privilege.py, test_errors.py
    gdb  # gcore: tests/e2e/test_dump.py dumps a core of a live process
    tmux  # tests/e2e/test_top.py drives `rvbpfd top` on a terminal (send-keys, capture-pane)
    libclang-rt-14-dev  # libFuzzer and the sanitizer runtimes for clang 14 (tools/run-fuzzers.sh)
    golang-go ruby ruby-dev  # Debian's ruby3.1: live test and coredump case (rvgolden needs its headers)
    # to build the test Rubies from Debian's source packages
    autoconf bison rustc libyaml-dev libffi-dev libssl-dev libgdbm-dev libreadline-dev xz-utils
  )
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}" >&2
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
