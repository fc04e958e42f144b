#include "common/invoking_user.h"

#include <unistd.h>

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace rvbpfd {
namespace {

std::optional<uint32_t> ParseId(const char* s) {
  if (s == nullptr || *s == '\0') return std::nullopt;
  const char* end = s + std::strlen(s);
  uint32_t v = 0;
  const auto [ptr, ec] = std::from_chars(s, end, v);
  if (ec != std::errc() || ptr != end || v == UINT32_MAX) return std::nullopt;
  return v;
}

}  // namespace

std::optional<UserIds> SudoInvoker(const EnvLookup& getenv_fn, uid_t euid) {
  if (euid != 0) return std::nullopt;
  const std::optional<uint32_t> uid = ParseId(getenv_fn("SUDO_UID"));
  const std::optional<uint32_t> gid = ParseId(getenv_fn("SUDO_GID"));
  if (!uid || !gid) return std::nullopt;
  return UserIds{static_cast<uid_t>(*uid), static_cast<gid_t>(*gid)};
}

std::optional<UserIds> SudoInvokerOfProcess() {
  return SudoInvoker([](const char* name) { return static_cast<const char*>(std::getenv(name)); }, ::geteuid());
}

}  // namespace rvbpfd
