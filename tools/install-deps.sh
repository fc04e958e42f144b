#!/usr/bin/env bash
# Installs everything rvbpfd builds and tests with, from Debian 12's packages. Idempotent.
set -euo pipefail
if [[ $(id -u) != 0 ]]; then
  echo "install-deps: run as root (apt-get install)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
pkgs=(
  build-essential cmake pkg-config clang llvm bpftool libbpf-dev libelf-dev libdw-dev elfutils libcapstone-dev
  libdebuginfod-dev debuginfod  # debug files by build-id; the server serves them to the e2e tests on loopback
  debootstrap  # the Debian trixie root of the container tests (tools/make-trixie-root.sh)
  libcli11-dev libgtest-dev libgmock-dev protobuf-compiler libprotobuf-dev libzstd-dev zlib1g-dev nlohmann-json3-dev libcurl4-openssl-dev ccache
  util-linux  # setpriv: tests/e2e/test_least_privilege.py, test_errors.py
  zstd  # the zstd CLI: tests/e2e/rvlib.py and benchmarks/overhead.py read compressed traces with it
  libclang-rt-14-dev  # libFuzzer and the sanitizer runtimes for clang 14 (tools/run-fuzzers.sh)
  golang-go python3 ruby ruby-dev  # Debian's ruby3.1: live test and coredump case (rvgolden needs its headers)
  # to build the test Rubies from Debian's source packages
  autoconf bison rustc libyaml-dev libffi-dev libssl-dev libgdbm-dev libreadline-dev xz-utils
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}" >&2
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
