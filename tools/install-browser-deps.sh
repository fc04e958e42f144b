#!/usr/bin/env bash
# Installs what the report's browser test (tests/browser) and benchmarks/report_load.mjs need: Debian's chromium
# (the test drives /usr/bin/chromium; nothing downloads a browser), playwright-core and the speedscope app from npm,
# pinned by tests/browser/package-lock.json. Idempotent: each step runs only when its result is missing. Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() {
  echo "install-browser-deps: $*" >&2
  exit 1
}
export DEBIAN_FRONTEND=noninteractive
apt_updated=0
apt_install() {
  [[ $(id -u) == 0 ]] || fail "installing $* needs root (apt-get install); run this script as root"
  if [[ $apt_updated == 0 ]]; then
    apt-get update -qq || fail "apt-get update failed"
    apt_updated=1
  fi
  echo "install-browser-deps: apt-get install $*" >&2
  apt-get install -y -qq --no-install-recommends "$@" >/dev/null || fail "apt-get install $* failed"
}

if [[ ! -x /usr/bin/chromium ]]; then
  apt_install chromium
fi
[[ -x /usr/bin/chromium ]] || fail "/usr/bin/chromium is still missing after installing the chromium package"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  apt_install nodejs npm
fi
node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
# playwright-core (tests/browser/package.json) declares node >= 20.
((node_major >= 20)) || fail "node $(node --version 2>/dev/null || echo '(none)') is too old: playwright-core needs Node.js 20 or newer"

if [[ ! -d tests/browser/node_modules/playwright-core || ! -f tests/browser/node_modules/speedscope/dist/release/index.html ]]; then
  echo "install-browser-deps: npm ci in tests/browser" >&2
  (cd tests/browser && npm ci --no-audit --no-fund --loglevel=error) || fail "npm ci in tests/browser failed"
fi
node -e 'require("./tests/browser/node_modules/playwright-core")' || fail "playwright-core does not load from tests/browser/node_modules"
echo "install-browser-deps: ok ($(/usr/bin/chromium --version 2>/dev/null | head -1), node $(node --version), playwright-core $(node -p 'require("./tests/browser/node_modules/playwright-core/package.json").version'))"
