// Helper threads block the daemon's signals, so a SIGTERM always reaches the main loop.
#include "common/threads.h"

#include <signal.h>

#include <gtest/gtest.h>

namespace rvbpfd {
namespace {

TEST(StartHelperThreadTest, HelperBlocksStopSignalsAndCreatorKeepsItsMask) {
  sigset_t before;
  ASSERT_EQ(pthread_sigmask(SIG_SETMASK, nullptr, &before), 0);
  ASSERT_EQ(sigismember(&before, SIGTERM), 0);  // gtest's main thread takes SIGTERM
  bool term_blocked = false, int_blocked = false, hup_blocked = false;
  std::thread t = StartHelperThread([&] {
    sigset_t mine;
    pthread_sigmask(SIG_SETMASK, nullptr, &mine);
    term_blocked = sigismember(&mine, SIGTERM) == 1;
    int_blocked = sigismember(&mine, SIGINT) == 1;
    hup_blocked = sigismember(&mine, SIGHUP) == 1;
  });
  t.join();
  EXPECT_TRUE(term_blocked);
  EXPECT_TRUE(int_blocked);
  EXPECT_TRUE(hup_blocked);
  sigset_t after;
  ASSERT_EQ(pthread_sigmask(SIG_SETMASK, nullptr, &after), 0);
  EXPECT_EQ(sigismember(&after, SIGTERM), 0);
  EXPECT_EQ(sigismember(&after, SIGINT), 0);
}

}  // namespace
}  // namespace rvbpfd
