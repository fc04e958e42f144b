#!/usr/bin/env bash
# Makes a Debian 13 (trixie) root filesystem holding Debian's own ruby3.3 (its libruby is stripped, as every
# distribution's is), ruby3.3-dev, gcc and make, for the end-to-end tests that run a distribution Ruby in new mount
# and pid namespaces chrooted into it, like a container (tests/e2e/test_container.py), and for the README's demo
# (tools/demo.sh records examples/cpu_threads.rb on that ruby3.3 the same way). Cached under
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
# With --apps it also installs the real applications of the end-to-end tests (Puma, Rails, Sidekiq, redis-server; a
# second stage with its own stamp, reused like the first).
#
# Usage: tools/make-trixie-root.sh [--print-root | --apps]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tools/lib/apt-sources.sh
source "$here/lib/apt-sources.sh"
src_dir=$(cd "$here/.." && pwd)

root=${RVBPFD_TRIXIE_ROOT:-/var/cache/rvbpfd/trixie-root}
with_apps=0
case ${1:-} in
  --print-root) echo "$root"; exit 0 ;;
  --apps) with_apps=1 ;;
  "") ;;
  *) echo "make-trixie-root: usage: $0 [--print-root | --apps]" >&2; exit 2 ;;
esac
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

# The real applications of the end-to-end tests (a Rails app on Puma, Sidekiq with redis-server), from Debian's own
# packages, installed by the root's apt so their dependencies resolve as on a Debian host. A second stage with its own
# stamp: a new package list reinstalls only these. No service is started inside the root (policy-rc.d).
app_packages="puma ruby-railties ruby-actionpack ruby-activerecord ruby-sqlite3 ruby-sidekiq redis-server"
if ((!with_apps)); then
  :
elif [[ -f $root/.apps-complete && $(cat "$root/.apps-complete") == "$app_packages" ]]; then
  log "application packages cached"
else
  mirror=$(apt_source_uri release) || { echo "make-trixie-root: no apt source for this Debian release in /etc/apt" >&2; exit 1; }
  echo "deb $mirror $suite main" > "$root/etc/apt/sources.list"
  printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"
  chmod 755 "$root/usr/sbin/policy-rc.d"
  log "installing $app_packages into the root (a few minutes)"
  # shellcheck disable=SC2086
  in_root sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $app_packages" \
    >"$(dirname "$root")/trixie-apps.log" 2>&1 ||
    { tail -n 30 "$(dirname "$root")/trixie-apps.log" >&2; echo "make-trixie-root: installing $app_packages failed (log above)" >&2; exit 1; }
  in_root apt-get clean
  echo "$app_packages" > "$root/.apps-complete"
  log "application packages installed"
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
