// Which Linux capabilities this process holds, for errors that name the missing one ("needs CAP_BPF") instead of
// a generic "run as root". docs/deploy.md lists what each mode needs.
#ifndef RVBPFD_SRC_COMMON_CAPABILITIES_H_
#define RVBPFD_SRC_COMMON_CAPABILITIES_H_

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

namespace rvbpfd {

// Capability numbers (linux/capability.h) rvbpfd's modes need.
inline constexpr int kCapChown = 0;
inline constexpr int kCapDacReadSearch = 2;
inline constexpr int kCapSetgid = 6;
inline constexpr int kCapSetuid = 7;
inline constexpr int kCapSysPtrace = 19;
inline constexpr int kCapSysAdmin = 21;
inline constexpr int kCapSysResource = 24;
inline constexpr int kCapPerfmon = 38;
inline constexpr int kCapBpf = 39;

// "CAP_BPF" for kCapBpf; "capability N" for numbers it does not name.
std::string CapabilityName(int cap);
// The CapEff mask of a /proc/<pid>/status text; nullopt when the line is missing or malformed.
std::optional<uint64_t> ParseEffectiveCapabilities(std::string_view status_text);
// This process's effective set (from /proc/self/status); nullopt when it cannot be read.
std::optional<uint64_t> EffectiveCapabilities();

// The names of `needed` absent from `effective`, comma-separated ("CAP_BPF, CAP_PERFMON"); "" when none is.
std::string MissingCapabilities(uint64_t effective, std::initializer_list<int> needed);

// The end of a kNoPrivilege message: "missing CAP_X[, CAP_Y]: grant them (e.g. setcap, systemd
// AmbientCapabilities) or run as root" naming those of `needed` this process lacks; when it holds all of them (or
// its set is unreadable), "needs <all of needed> (or root)".
std::string PrivilegeHint(std::initializer_list<int> needed, std::optional<uint64_t> effective);
inline std::string PrivilegeHint(std::initializer_list<int> needed) {
  return PrivilegeHint(needed, EffectiveCapabilities());
}
// A target's files are opened through /proc/PID/root (ptrace access: CAP_SYS_PTRACE) and may sit in a directory only
// their owner can search (CAP_DAC_READ_SEARCH): the hint names the first of the two this process lacks.
std::string TargetFileAccessHint();

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_COMMON_CAPABILITIES_H_
