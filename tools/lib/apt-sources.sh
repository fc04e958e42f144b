# Sourced by tools/*.sh: reads this machine's own apt configuration, so the repository never names a package
# registry's host.
#
#   apt_source_uri release   the URI of the first apt source (one-line or deb822 format) serving this machine's
#                            Debian release (VERSION_CODENAME of /etc/os-release)
#   apt_source_uri debug     the URI of the first apt source serving a "<codename>-debug" suite (Debian's debug
#                            symbol archive), if the machine is configured with one
# Prints the URI and returns 0, or returns 1 when no source matches.
apt_source_uri() {
  local kind=${1:?release or debug} codename
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  [[ -n $codename ]] || return 1
  python3 - "$kind" "$codename" /etc/apt/sources.list /etc/apt/sources.list.d/* <<'PY'
import sys, re, os
kind, codename, files = sys.argv[1], sys.argv[2], sys.argv[3:]
def wanted(suite):
    return suite == codename if kind == "release" else suite.endswith("-debug")
for path in files:
    if not os.path.isfile(path):
        continue
    text = open(path, errors="replace").read()
    if path.endswith(".sources"):
        for stanza in re.split(r"\n\s*\n", text):
            fields = {}
            for line in stanza.splitlines():
                m = re.match(r"^([A-Za-z-]+):\s*(.*)$", line)
                if m:
                    fields[m.group(1).lower()] = m.group(2).split()
            if ("deb" in fields.get("types", []) and any(wanted(s) for s in fields.get("suites", []))
                    and fields.get("uris")):
                print(fields["uris"][0]); sys.exit(0)
    else:
        for line in text.splitlines():
            parts = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
            if len(parts) >= 3 and parts[0] == "deb" and wanted(parts[2]):
                print(parts[1]); sys.exit(0)
sys.exit(1)
PY
}
