#include "common/capabilities.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>

namespace rvbpfd {

std::string CapabilityName(int cap) {
  switch (cap) {
    case kCapChown: return "CAP_CHOWN";
    case kCapDacReadSearch: return "CAP_DAC_READ_SEARCH";
    case kCapSetgid: return "CAP_SETGID";
    case kCapSetuid: return "CAP_SETUID";
    case kCapSysPtrace: return "CAP_SYS_PTRACE";
    case kCapSysAdmin: return "CAP_SYS_ADMIN";
    case kCapSysResource: return "CAP_SYS_RESOURCE";
    case kCapPerfmon: return "CAP_PERFMON";
    case kCapBpf: return "CAP_BPF";
  }
  return "capability " + std::to_string(cap);
}

std::optional<uint64_t> ParseEffectiveCapabilities(std::string_view status_text) {
  constexpr std::string_view kKey = "\nCapEff:";
  const std::string text = "\n" + std::string(status_text);
  const size_t at = text.find(kKey);
  if (at == std::string::npos) return std::nullopt;
  size_t pos = at + kKey.size();
  while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\t')) ++pos;
  size_t end = pos;
  while (end < text.size() && text[end] != '\n') ++end;
  uint64_t mask = 0;
  const auto [ptr, ec] = std::from_chars(text.data() + pos, text.data() + end, mask, 16);
  if (ec != std::errc() || ptr != text.data() + end || end == pos) return std::nullopt;
  return mask;
}

std::optional<uint64_t> EffectiveCapabilities() {
  const int fd = ::open("/proc/self/status", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string text;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || text.size() > (1 << 16)) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return ParseEffectiveCapabilities(text);
}

std::string MissingCapabilities(uint64_t effective, std::initializer_list<int> needed) {
  std::string out;
  for (int cap : needed) {
    if (cap >= 0 && cap < 64 && (effective >> cap & 1) != 0) continue;
    if (!out.empty()) out += ", ";
    out += CapabilityName(cap);
  }
  return out;
}

std::string PrivilegeHint(std::initializer_list<int> needed, std::optional<uint64_t> effective) {
  if (effective) {
    const std::string missing = MissingCapabilities(*effective, needed);
    if (!missing.empty()) {
      return "missing " + missing + ": grant it (setcap, systemd AmbientCapabilities) or run as root";
    }
  }
  return "needs " + MissingCapabilities(0, needed) + " (or root)";
}

std::string TargetFileAccessHint() {
  const std::optional<uint64_t> caps = EffectiveCapabilities();
  if (caps && !MissingCapabilities(*caps, {kCapSysPtrace}).empty()) return PrivilegeHint({kCapSysPtrace}, caps);
  return PrivilegeHint({kCapDacReadSearch}, caps);
}

}  // namespace rvbpfd
