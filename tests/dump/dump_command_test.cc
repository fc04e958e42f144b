// The /proc facts a dump adds: the descriptor a blocked thread's system call waits on, and the task state letter.
#include "dump/dump_command.h"

#include <gtest/gtest.h>

#include "stacks/fake_memory.h"

namespace rvbpfd {
namespace {

TEST(BlockedFdTest, ReadLikeCallsWaitOnTheirFirstArgument) {
  testing::FakeMemory mem;
  EXPECT_EQ(BlockedFd("0 0x5 0x7ffc1000 0x2000 0x0 0x0 0x0 0x7ffc0ff8 0x7f0012345678\n", mem), 5);  // read
  EXPECT_EQ(BlockedFd("45 0xc 0x7f 0x10 0x0 0x0 0x0 0x7ffc 0x7f00\n", mem), 12);                   // recvfrom
  EXPECT_EQ(BlockedFd("232 0x3 0x7f 0x10 0xffffffff 0x0 0x0 0x7ffc 0x7f00\n", mem), 3);             // epoll_wait
}

TEST(BlockedFdTest, PollWaitsOnTheFirstPollfdReadFromTheTarget) {
  testing::FakeMemory mem;
  mem.Map(0x7000, 8);
  mem.Put32(0x7000, 9);  // struct pollfd {fd = 9, events, revents}
  EXPECT_EQ(BlockedFd("7 0x7000 0x1 0xffffffff 0x0 0x0 0x0 0x7ffc 0x7f00\n", mem), 9);    // poll
  EXPECT_EQ(BlockedFd("271 0x7000 0x1 0x0 0x0 0x8 0x0 0x7ffc 0x7f00\n", mem), 9);         // ppoll
  EXPECT_EQ(BlockedFd("271 0x8000 0x1 0x0 0x0 0x8 0x0 0x7ffc 0x7f00\n", mem), std::nullopt);  // unreadable
  EXPECT_EQ(BlockedFd("7 0x7000 0x0 0x0 0x0 0x0 0x0 0x7ffc 0x7f00\n", mem), std::nullopt);    // no fds
}

TEST(BlockedFdTest, OtherCallsRunningAndGarbageGiveNone) {
  testing::FakeMemory mem;
  EXPECT_EQ(BlockedFd("202 0x7f 0x80 0x0 0x0 0x0 0x0 0x7ffc 0x7f00\n", mem), std::nullopt);  // futex
  EXPECT_EQ(BlockedFd("running\n", mem), std::nullopt);
  EXPECT_EQ(BlockedFd("-1 0x7ffc 0x7f00\n", mem), std::nullopt);
  EXPECT_EQ(BlockedFd("", mem), std::nullopt);
  EXPECT_EQ(BlockedFd("0 zz 0x1\n", mem), std::nullopt);
  EXPECT_EQ(BlockedFd("0 0xffffffffff 0x1\n", mem), std::nullopt);  // not an int
}

TEST(TaskStateLetterTest, TheLetterAfterTheLastParenthesis) {
  EXPECT_EQ(TaskStateLetter("1234 (ruby) S 1 1234 1234 0 -1 4194560"), 'S');
  EXPECT_EQ(TaskStateLetter("1234 (a) R) (b) R 1 2"), 'R');
  EXPECT_EQ(TaskStateLetter("1234 (ruby)"), 0);
  EXPECT_EQ(TaskStateLetter(""), 0);
  EXPECT_EQ(TaskStateLetter("1234 (ruby) 5 1"), 0);  // no state letter there
}

}  // namespace
}  // namespace rvbpfd
