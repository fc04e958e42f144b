// Who ran rvbpfd: under sudo the process is root but its outputs and launched programs belong to the user who typed
// the command. Computed here once; output files (common/safe_file) and launch mode (record/launch) read it.
#ifndef RVBPFD_SRC_COMMON_INVOKING_USER_H_
#define RVBPFD_SRC_COMMON_INVOKING_USER_H_

#include <sys/types.h>

#include <functional>
#include <optional>

namespace rvbpfd {

struct UserIds {
  uid_t uid = 0;
  gid_t gid = 0;
  bool operator==(const UserIds&) const = default;
};

// Reads an environment variable (nullptr when unset); getenv in production, a map in tests.
using EnvLookup = std::function<const char*(const char*)>;

// The sudo invoker: SUDO_UID and SUDO_GID when the effective uid is 0 and both are plain decimal ids below 2^32-1
// ((uid_t)-1 means "no change" to chown). nullopt when not root, not under sudo, or the variables are malformed.
std::optional<UserIds> SudoInvoker(const EnvLookup& getenv_fn, uid_t euid);
// The same for this process (getenv, geteuid).
std::optional<UserIds> SudoInvokerOfProcess();

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_COMMON_INVOKING_USER_H_
