#!/usr/bin/env bash
# Makes a Debian 13 (trixie) root filesystem holding Debian's own ruby3.3 (its libruby is stripped, as every
# distribution's is), ruby3.3-dev, gcc and make, for the end-to-end tests that run a distribution Ruby in new mount
# and pid namespaces chrooted into it, like a container (tests/e2e/test_container.py). Cached under
# /var/cache/rvbpfd/trixie-root (override with RVBPFD_TRIXIE_ROOT) with a .complete stamp: debootstrap runs only when
# the root is missing or was made with another package list.
#
# Inside the root it compiles, with the root's own ruby (chroot), the in-process reference recorder (tests/refrecorder)
# into /opt/rvbpfd/rvref and the golden-frames extension (tests/golden) into /opt/rvbpfd/rvgolden; they are rebuilt
# whenever their sources change (stamp: the sources' sha256).
#
# Debian's debug symbols for ruby3.3 (libruby3.3-dbgsym) are installed into the root's /usr/lib/debug/.build-id when
# this machine's apt configuration lists Debian's debug archive (a "-debug" suite); otherwise the root records why in
# /opt/rvbpfd/dbgsym-unavailable and the tests that need them say so and skip.
#
# The mirror is the one this machine's own apt configuration uses (tools/lib/apt-sources.sh).
#
# Usage: tools/make-trixie-root.sh [--print-root]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tools/lib/apt-sources.sh
source "$here/lib/apt-sources.sh"
src_dir=$(cd "$here/.." && pwd)

root=${RVBPFD_TRIXIE_ROOT:-/var/cache/rvbpfd/trixie-root}
if [[ ${1:-} == --print-root ]]; then
  echo "$root"
  exit 0
fi
log() { printf '[make-trixie-root] %s\n' "$*" >&2; }
[[ $(id -u) == 0 ]] || { echo "make-trixie-root: run as root (debootstrap, chroot)" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "make-trixie-root: debootstrap missing: run tools/install-deps.sh" >&2; exit 1; }

suite=trixie
packages=ruby3.3,ruby3.3-dev,gcc,make,libc6-dev
stamp="$suite $packages"
in_root() { env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 chroot "$root" "$@"; }

if [[ -f $root/.complete && $(cat "$root/.complete") == "$stamp" ]]; then
  log "cached at $root"
else
  mirror=$(apt_source_uri release) || { echo "make-trixie-root: no apt source for this Debian release in /etc/apt" >&2; exit 1; }
  tmp="$root.new"
  rm -rf "$tmp" "$root"
  mkdir -p "$(dirname "$root")"
  log "debootstrap $suite ($packages) into $tmp (a few minutes)"
  debootstrap --variant=minbase --include="$packages" "$suite" "$tmp" "$mirror" >"$(dirname "$root")/trixie-debootstrap.log" 2>&1 ||
    { tail -n 30 "$(dirname "$root")/trixie-debootstrap.log" >&2; echo "make-trixie-root: debootstrap failed (log above)" >&2; exit 1; }
  mkdir -p "$tmp/opt/rvbpfd"
  # Debian's debug symbols, when this machine can reach Debian's debug archive through its apt configuration.
  if dbg=$(apt_source_uri debug); then
    echo "deb $dbg $suite-debug main" > "$tmp/etc/apt/sources.list.d/debug.list"
    if env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root chroot "$tmp" sh -c \
         'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libruby3.3-dbgsym ruby3.3-dbgsym' \
         >"$(dirname "$root")/trixie-dbgsym.log" 2>&1; then
      log "installed libruby3.3-dbgsym from $dbg"
    else
      echo "apt-get install libruby3.3-dbgsym from $dbg failed (see $(dirname "$root")/trixie-dbgsym.log)" \
        > "$tmp/opt/rvbpfd/dbgsym-unavailable"
    fi
  else
    echo "this machine's apt configuration lists no Debian debug archive (no \"-debug\" suite in /etc/apt)" \
      > "$tmp/opt/rvbpfd/dbgsym-unavailable"
  fi
  [[ -f $tmp/opt/rvbpfd/dbgsym-unavailable ]] && log "no Debian debug symbols: $(cat "$tmp/opt/rvbpfd/dbgsym-unavailable")"
  echo "$stamp" > "$tmp/.complete"
  mv "$tmp" "$root"
  log "root ready at $root"
fi

# The test extensions, compiled by the root's own ruby against its own headers.
ext_stamp=$(cat "$src_dir"/tests/refrecorder/{rvref.c,extconf.rb} "$src_dir"/tests/golden/{rvgolden.c,extconf.rb} | sha256sum | cut -d' ' -f1)
if [[ -f $root/opt/rvbpfd/.ext-complete && $(cat "$root/opt/rvbpfd/.ext-complete") == "$ext_stamp" ]]; then
  log "test extensions up to date"
  exit 0
fi
rm -rf "$root/opt/rvbpfd/src" "$root/opt/rvbpfd/rvref" "$root/opt/rvbpfd/rvgolden" "$root/opt/rvbpfd/.ext-complete"
mkdir -p "$root/opt/rvbpfd/src" "$root/opt/rvbpfd/rvref" "$root/opt/rvbpfd/rvgolden"
cp -r "$src_dir/tests/refrecorder" "$src_dir/tests/golden" "$root/opt/rvbpfd/src/"
for ext in rvref:refrecorder rvgolden:golden; do
  out=${ext%%:*} dir=${ext#*:}
  log "compiling tests/$dir inside the root"
  in_root sh -c "cd /opt/rvbpfd/$out && ruby /opt/rvbpfd/src/$dir/extconf.rb && make V=1" \
    >"$root/opt/rvbpfd/$out/build.log" 2>&1 ||
    { tail -n 30 "$root/opt/rvbpfd/$out/build.log" >&2; echo "make-trixie-root: building tests/$dir failed" >&2; exit 1; }
  [[ -f $root/opt/rvbpfd/$out/$out.so ]] || { echo "make-trixie-root: $out.so missing after make" >&2; exit 1; }
done
echo "$ext_stamp" > "$root/opt/rvbpfd/.ext-complete"
log "test extensions compiled"
