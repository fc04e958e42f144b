#!/usr/bin/env bash
# Builds the CRuby versions the tests run against, from Debian's source packages, into a cache outside the
# repository (default /var/cache/rvbpfd/rubies, override with RVBPFD_RUBY_CACHE). A version already built (its
# .complete stamp exists) is reused, so CI pays the ~10 minutes per Ruby only once per machine.
#
#   3.3.8-shared   ruby3.3 from sid,          --enable-shared (libruby.so holds the VM)
#   3.4.5-static   ruby3.4 from experimental, static (the ruby executable holds the VM)
#   3.4.5-shared-yjit  the same ruby3.4, --enable-shared, with YJIT (Debian's rustc; tests run it with --yjit)
#
# The deb-src mirror is the one this machine's own apt configuration uses for its Debian release (so the repository
# names no package registry). A cached build is reused only if its .complete stamp records the same configure line.
#
# Usage: tools/build-test-rubies.sh [--print-prefix NAME]
set -euo pipefail
# shellcheck source=tools/lib/apt-sources.sh
source "$(dirname "$0")/lib/apt-sources.sh"

cache=${RVBPFD_RUBY_CACHE:-/var/cache/rvbpfd/rubies}
jobs=$(nproc)

# name  source-package  debian-version  upstream-version  configure-extra
rubies=(
  "3.3.8-shared ruby3.3 3.3.8-2.2 3.3.8 --enable-shared"
  "3.4.5-static ruby3.4 3.4.5-1~exp1 3.4.5 --disable-shared"
  "3.4.5-shared-yjit ruby3.4 3.4.5-1~exp1 3.4.5 --enable-shared --enable-yjit"
)

if [[ ${1:-} == --print-prefix ]]; then
  echo "$cache/${2:?name}"
  exit 0
fi

log() { printf '[build-test-rubies] %s\n' "$*" >&2; }

# A private apt configuration: deb-src lines for sid and experimental without touching the system's sources.
apt_dir="$cache/.apt"
apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
          -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache")
apt_ready=0
prepare_apt() {
  [[ $apt_ready == 1 ]] && return
  local mirror
  mirror=$(apt_source_uri release) || { echo "build-test-rubies: no apt source for this Debian release in /etc/apt" >&2; exit 1; }
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
  cat > "$apt_dir/sources.list" <<SRC
deb-src $mirror sid main
deb-src $mirror experimental main
SRC
  log "apt-get update (private deb-src list for sid + experimental)"
  apt-get "${apt_opts[@]}" update -qq
  apt_ready=1
}

for spec in "${rubies[@]}"; do
  read -r name pkg debver upver extra <<<"$spec"
  prefix="$cache/$name"
  stamp="$pkg=$debver $extra"
  if [[ -f $prefix/.complete && $(cat "$prefix/.complete") == "$stamp" ]]; then
    log "$name: cached at $prefix"
    continue
  fi
  command -v gcc >/dev/null || { echo "build-test-rubies: gcc missing: run tools/install-deps.sh" >&2; exit 1; }
  prepare_apt
  work="$cache/.build/$name"
  rm -rf "$work" "$prefix"
  mkdir -p "$work"
  log "$name: fetching $pkg=$debver sources"
  # --download-only may complain about the .dsc; the upstream .orig.tar.xz is all that is needed.
  (cd "$work" && apt-get "${apt_opts[@]}" source --download-only "$pkg=$debver" >/dev/null 2>&1 || true)
  orig=$(ls "$work"/*"${upver}".orig.tar.* 2>/dev/null | head -n1 || true)
  [[ -n $orig ]] || { echo "build-test-rubies: no orig tarball for $pkg=$debver (network or mirror?)" >&2; exit 1; }
  tar -xf "$orig" -C "$work"
  src=$(find "$work" -maxdepth 1 -mindepth 1 -type d -name 'ruby*' | head -n1)
  log "$name: configure ($extra)"
  conf_env=()
  if [[ $extra == *--enable-yjit* ]]; then
    [[ -x /usr/bin/rustc ]] || { echo "build-test-rubies: YJIT needs Debian's rustc: run tools/install-deps.sh" >&2; exit 1; }
    conf_env=(RUSTC=/usr/bin/rustc)
  fi
  (cd "$src" && env "${conf_env[@]}" ./configure --prefix="$prefix" --without-baseruby --disable-install-doc $extra \
     >"$work/configure.log" 2>&1) ||
    { tail -n 30 "$work/configure.log" >&2; exit 1; }
  log "$name: make -j$jobs (a few minutes on 2 cores)"
  (cd "$src" && make -j"$jobs" >"$work/make.log" 2>&1) || { tail -n 40 "$work/make.log" >&2; exit 1; }
  log "$name: make install"
  (cd "$src" && make install HAVE_BASERUBY=no >"$work/install.log" 2>&1) || { tail -n 40 "$work/install.log" >&2; exit 1; }
  "$prefix/bin/ruby" -e 'exit(RUBY_VERSION.start_with?(ARGV[0]) ? 0 : 1)' "${upver}" ||
    { echo "build-test-rubies: $prefix/bin/ruby is not $upver" >&2; exit 1; }
  rm -rf "$work"
  if [[ $extra == *--enable-yjit* ]]; then
    "$prefix/bin/ruby" --yjit -e 'exit(RubyVM::YJIT.enabled? ? 0 : 1)' ||
      { echo "build-test-rubies: $prefix/bin/ruby was built without YJIT" >&2; exit 1; }
  fi
  echo "$stamp" > "$prefix/.complete"
  log "$name: done"
done
