// HandOffFileRelease (src/common/release_in_child.h): the caller's files stay open in the child until the caller's
// process has exited, and are closed then; the caller's standard streams are not held.
#include "common/release_in_child.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

namespace rvbpfd {
namespace {

// True when `fd` (a pipe's read end) reports EOF within timeout_ms.
bool SeesEof(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) != 1) return false;
  char c;
  return read(fd, &c, 1) == 0;
}

TEST(ReleaseInChildTest, FilesAreClosedOnlyAfterTheCallerHasExited) {
  int held[2], dropped[2], out[2];  // pipes: [0] read end, [1] write end
  ASSERT_EQ(pipe(held), 0);     // a file the caller holds (a link, in rvbpfd)
  ASSERT_EQ(pipe(dropped), 0);  // the caller says "I closed mine"
  ASSERT_EQ(pipe(out), 0);      // the caller's stdout
  const pid_t caller = fork();
  ASSERT_GE(caller, 0);
  if (caller == 0) {
    dup2(out[1], 1);
    close(out[0]);
    close(out[1]);
    close(held[0]);
    close(dropped[0]);
    const bool ok = HandOffFileRelease();
    close(held[1]);  // the caller's own close: the child still holds the file
    const bool said = write(dropped[1], "x", 1) == 1;  // a byte, not EOF: the child holds this pipe too
    usleep(300'000);  // the caller lives on for a while after dropping its references
    _exit(ok && said ? 0 : 1);
  }
  close(held[1]);
  close(dropped[1]);
  close(out[1]);
  pollfd p{dropped[0], POLLIN, 0};
  char c = 0;
  ASSERT_TRUE(poll(&p, 1, 5000) == 1 && read(dropped[0], &c, 1) == 1) << "the caller never closed its copy";
  // The caller dropped its references and still runs: the child holds the file, so no EOF yet; the caller's stdout
  // is not held by the child either way.
  EXPECT_FALSE(SeesEof(held[0], 150)) << "the file was released while the caller still ran";
  int status = 0;
  ASSERT_EQ(waitpid(caller, &status, 0), caller);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "HandOffFileRelease failed";
  EXPECT_TRUE(SeesEof(out[0], 0)) << "the child holds the caller's stdout";
  EXPECT_TRUE(SeesEof(held[0], 5000)) << "the child did not close the file after the caller exited";
  close(held[0]);
  close(dropped[0]);
  close(out[0]);
}

}  // namespace
}  // namespace rvbpfd
