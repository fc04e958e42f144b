#include "common/invoking_user.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace rvbpfd {
namespace {

EnvLookup Env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(SudoInvokerTest, RootUnderSudoIsTheInvoker) {
  EXPECT_EQ(SudoInvoker(Env({{"SUDO_UID", "1000"}, {"SUDO_GID", "1001"}}), 0), (UserIds{1000, 1001}));
}

TEST(SudoInvokerTest, NoInvokerWithoutSudoOrRoot) {
  EXPECT_EQ(SudoInvoker(Env({}), 0), std::nullopt);
  // Only root acts for someone else: an unprivileged rvbpfd with a stray SUDO_UID keeps its own ids.
  EXPECT_EQ(SudoInvoker(Env({{"SUDO_UID", "1000"}, {"SUDO_GID", "1000"}}), 1000), std::nullopt);
  EXPECT_EQ(SudoInvoker(Env({{"SUDO_UID", "1000"}}), 0), std::nullopt);
}

TEST(SudoInvokerTest, MalformedIdsAreIgnored) {
  for (const char* bad : {"", "-1", "10x", " 10", "4294967295", "99999999999", "0x10"}) {
    EXPECT_EQ(SudoInvoker(Env({{"SUDO_UID", bad}, {"SUDO_GID", "5"}}), 0), std::nullopt) << bad;
    EXPECT_EQ(SudoInvoker(Env({{"SUDO_UID", "5"}, {"SUDO_GID", bad}}), 0), std::nullopt) << bad;
  }
  EXPECT_EQ(SudoInvoker(Env({{"SUDO_UID", "0"}, {"SUDO_GID", "0"}}), 0), (UserIds{0, 0}));
}

}  // namespace
}  // namespace rvbpfd
