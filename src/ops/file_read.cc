#include "ops/file_read.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace rvbpfd {

SmallFile ReadSmallFile(const std::string& path, size_t max_bytes) {
  SmallFile out;
  // O_NONBLOCK: a FIFO in place of a config file must not hang the agent's (re)load; it reads as empty.
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    out.err = errno;
    return out;
  }
  // Reads in 64 KiB steps into a buffer that grows only as far as the file really is (a 1 MiB cap on environ must
  // not cost 1 MiB for every 2 KiB environment), plus one byte to tell "exactly max_bytes" from "more".
  constexpr size_t kStep = 64 * 1024;
  size_t used = 0;
  for (;;) {
    size_t want = std::min(kStep, max_bytes + 1 - used);
    out.data.resize(used + want);
    ssize_t n = read(fd, out.data.data() + used, want);
    if (n < 0) {
      if (errno == EINTR) continue;
      out.err = errno;
      out.data.clear();
      close(fd);
      return out;
    }
    if (n == 0) break;
    used += static_cast<size_t>(n);
    if (used > max_bytes) {
      out.truncated = true;
      used = max_bytes;
      break;
    }
  }
  out.data.resize(used);
  close(fd);
  return out;
}

}  // namespace rvbpfd
