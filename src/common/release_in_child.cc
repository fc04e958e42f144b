#include "common/release_in_child.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

namespace rvbpfd {

bool HandOffFileRelease() {
  // The child learns that the caller's process has exited from EOF on this pipe: only the caller holds its write
  // end (O_CLOEXEC keeps it from commands the caller runs later).
  int exited[2];
  if (pipe2(exited, O_CLOEXEC) != 0) return false;
  const pid_t pid = fork();
  if (pid < 0) {
    close(exited[0]);
    close(exited[1]);
    return false;
  }
  if (pid == 0) {
    close(exited[1]);
    for (int fd = 0; fd <= 2; ++fd) {
      if (fd != exited[0]) close(fd);
    }
    char byte;
    while (read(exited[0], &byte, 1) < 0 && errno == EINTR) {
    }
    syscall(SYS_close_range, 3u, ~0u, 0u);
    _exit(0);
  }
  close(exited[0]);
  return true;  // exited[1] stays open until this process exits
}

}  // namespace rvbpfd
