// PlanLaunch: finding the VM a command will run before it runs, through PATH, #! lines and DT_NEEDED/RUNPATH.
// Uses the test Rubies when present (tools/build-test-rubies.sh) and skips, saying so, when they are not.
#include "record/launch.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <vector>
#include <string>

namespace rvbpfd {
namespace {

const char* kRubies = "/var/cache/rvbpfd/rubies";

std::string RubyPrefix(const std::string& name) {
  const char* env = getenv("RVBPFD_RUBY_CACHE");
  return std::string(env ? env : kRubies) + "/" + name;
}

bool Exists(const std::string& p) { return access(p.c_str(), F_OK) == 0; }

class LaunchPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/rvbpfd-launch-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  std::string WriteScript(const std::string& name, const std::string& text) {
    std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    chmod(path.c_str(), 0755);
    return path;
  }
  std::string dir_;
};

TEST_F(LaunchPlanTest, StaticRubyIsItsOwnVm) {
  const std::string prefix = RubyPrefix("3.4.5-static");
  if (!Exists(prefix + "/.complete")) GTEST_SKIP() << prefix << " not built (tools/build-test-rubies.sh)";
  Result<LaunchPlan> plan = PlanLaunch({"ruby", "-e", "1"}, "/nonexistent:" + prefix + "/bin", "");
  ASSERT_TRUE(plan.ok()) << plan.error().ToString();
  EXPECT_EQ(plan->executable, prefix + "/bin/ruby");
  EXPECT_EQ(plan->vm_path, prefix + "/bin/ruby");
  EXPECT_FALSE(plan->vm_is_shared_library);
}

TEST_F(LaunchPlanTest, SharedRubyResolvesLibrubyThroughItsRunpath) {
  const std::string prefix = RubyPrefix("3.3.8-shared");
  if (!Exists(prefix + "/.complete")) GTEST_SKIP() << prefix << " not built (tools/build-test-rubies.sh)";
  Result<LaunchPlan> plan = PlanLaunch({prefix + "/bin/ruby"}, "", "");
  ASSERT_TRUE(plan.ok()) << plan.error().ToString();
  EXPECT_EQ(plan->vm_path, prefix + "/lib/libruby.so.3.3.8");
  EXPECT_TRUE(plan->vm_is_shared_library);
}

TEST_F(LaunchPlanTest, LdLibraryPathWinsOverTheRunpathAsInTheDynamicLinker) {
  const std::string prefix = RubyPrefix("3.3.8-shared");
  if (!Exists(prefix + "/.complete")) GTEST_SKIP() << prefix << " not built (tools/build-test-rubies.sh)";
  // A copy of libruby elsewhere, named by LD_LIBRARY_PATH: ld.so loads it (the test Ruby has DT_RUNPATH), so the
  // probes must go on it, not on the RUNPATH's.
  const std::string lib = dir_ + "/lib";
  ASSERT_EQ(mkdir(lib.c_str(), 0755), 0);
  ASSERT_EQ(std::system(("cp " + prefix + "/lib/libruby.so.3.3.8 " + lib + "/ && ln -s libruby.so.3.3.8 " + lib +
                         "/libruby.so.3.3").c_str()),
            0);
  Result<LaunchPlan> plan = PlanLaunch({prefix + "/bin/ruby"}, "", "/nonexistent:" + lib);
  ASSERT_TRUE(plan.ok()) << plan.error().ToString();
  EXPECT_EQ(plan->vm_path, lib + "/libruby.so.3.3.8");
  // What ld.so itself maps for the same environment.
  const std::string maps = dir_ + "/ldd.txt";
  ASSERT_EQ(std::system(("LD_LIBRARY_PATH=" + lib + " ldd " + prefix + "/bin/ruby > " + maps).c_str()), 0);
  std::ifstream in(maps);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find(lib + "/libruby.so.3.3"), std::string::npos) << text;
}

TEST_F(LaunchPlanTest, ShebangThroughEnvFindsTheInterpreter) {
  const std::string prefix = RubyPrefix("3.4.5-static");
  if (!Exists(prefix + "/.complete")) GTEST_SKIP() << prefix << " not built (tools/build-test-rubies.sh)";
  std::string script = WriteScript("app", "#!/usr/bin/env ruby\nputs 1\n");
  Result<LaunchPlan> plan = PlanLaunch({"app"}, dir_ + ":" + prefix + "/bin", "");
  ASSERT_TRUE(plan.ok()) << plan.error().ToString();
  EXPECT_EQ(plan->executable, script);
  EXPECT_EQ(plan->vm_path, prefix + "/bin/ruby");
}

TEST_F(LaunchPlanTest, NonRubyAndMissingCommandsAreRefused) {
  Result<LaunchPlan> sleep_plan = PlanLaunch({"sleep", "1"}, "/usr/bin:/bin", "");
  ASSERT_FALSE(sleep_plan.ok());
  EXPECT_EQ(sleep_plan.error().code(), ErrorCode::kNotRuby);
  Result<LaunchPlan> missing = PlanLaunch({"no-such-command-rvbpfd"}, "/usr/bin:/bin", "");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code(), ErrorCode::kUsage);
  WriteScript("broken", "#!/nonexistent/interp\n");
  Result<LaunchPlan> broken = PlanLaunch({dir_ + "/broken"}, "", "");
  ASSERT_FALSE(broken.ok());
  EXPECT_EQ(broken.error().code(), ErrorCode::kNotRuby);
}

TEST(HeldChild, RunsOnlyAfterReleaseAndNeverWhenAbandoned) {
  char tmpl[] = "/tmp/rvbpfd-held-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string marker = std::string(tmpl) + "/ran";
  {
    Result<HeldChild> child = HeldChild::Spawn({"/bin/sh", "-c", "touch " + marker});
    ASSERT_TRUE(child.ok());
    usleep(100 * 1000);
    EXPECT_FALSE(Exists(marker)) << "the child ran before Release()";
    ASSERT_TRUE(child->Release().ok());
    int status = 0;
    for (int i = 0; i < 200 && !child->Reap(&status); ++i) usleep(10 * 1000);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    EXPECT_TRUE(Exists(marker));
  }
  unlink(marker.c_str());
  {
    Result<HeldChild> child = HeldChild::Spawn({"/bin/sh", "-c", "touch " + marker});
    ASSERT_TRUE(child.ok());
    // Destroyed without Release(): the attach failed, the program must never run.
  }
  usleep(100 * 1000);
  EXPECT_FALSE(Exists(marker));
  Result<HeldChild> bad = HeldChild::Spawn({"/nonexistent/binary"});
  ASSERT_TRUE(bad.ok());
  EXPECT_FALSE(bad->Release().ok()) << "exec failure must be reported";
  rmdir(tmpl);
}

// A fake passwd/group database: alice (1000:1000, also in group 27), root, and nothing else.
UserDatabase FakeUsers() {
  UserDatabase db;
  const std::vector<UserAccount> users = {{"alice", 1000, 1000, "/home/alice", "/bin/zsh"},
                                          {"root", 0, 0, "/root", "/bin/bash"}};
  db.by_name = [users](const std::string& name) -> std::optional<UserAccount> {
    for (const UserAccount& u : users) {
      if (u.name == name) return u;
    }
    return std::nullopt;
  };
  db.by_uid = [users](uid_t uid) -> std::optional<UserAccount> {
    for (const UserAccount& u : users) {
      if (u.uid == uid) return u;
    }
    return std::nullopt;
  };
  db.groups = [](const std::string& name, gid_t gid) {
    return name == "alice" ? std::vector<gid_t>{gid, 27} : std::vector<gid_t>{gid};
  };
  return db;
}

EnvLookup Env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

const std::map<std::string, std::string> kSudoAlice = {{"SUDO_UID", "1000"}, {"SUDO_GID", "1000"},
                                                       {"SUDO_USER", "alice"}};

TEST(DecideLaunchIdentity, UnderSudoTheCommandRunsAsTheInvoker) {
  Result<std::optional<LaunchIdentity>> id = DecideLaunchIdentity("", Env(kSudoAlice), 0, FakeUsers());
  ASSERT_TRUE(id.ok()) << id.error().ToString();
  ASSERT_TRUE(id->has_value());
  EXPECT_EQ((*id)->uid, 1000u);
  EXPECT_EQ((*id)->gid, 1000u);
  EXPECT_EQ((*id)->groups, (std::vector<gid_t>{1000, 27}));  // re-initialised, not root's
  EXPECT_EQ((*id)->user, "alice");
  EXPECT_EQ((*id)->home, "/home/alice");
}

TEST(DecideLaunchIdentity, RootWithoutSudoOrUserKeepsItsIdentity) {
  Result<std::optional<LaunchIdentity>> id = DecideLaunchIdentity("", Env({}), 0, FakeUsers());
  ASSERT_TRUE(id.ok());
  EXPECT_FALSE(id->has_value());
  // Not root: SUDO_* mean nothing (nothing to drop).
  id = DecideLaunchIdentity("", Env(kSudoAlice), 1000, FakeUsers());
  ASSERT_TRUE(id.ok());
  EXPECT_FALSE(id->has_value());
}

TEST(DecideLaunchIdentity, UserFlagWinsAndRootOnlyWhenNamed) {
  Result<std::optional<LaunchIdentity>> id = DecideLaunchIdentity("root", Env(kSudoAlice), 0, FakeUsers());
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(id->has_value());
  EXPECT_EQ((*id)->uid, 0u);
  EXPECT_EQ((*id)->home, "/root");
  id = DecideLaunchIdentity("1000", Env({}), 0, FakeUsers());  // a numeric uid with a passwd entry
  ASSERT_TRUE(id.ok());
  EXPECT_EQ((*id)->user, "alice");
  id = DecideLaunchIdentity("alice", Env({}), 0, FakeUsers());
  ASSERT_TRUE(id.ok());
  EXPECT_EQ((*id)->uid, 1000u);
}

TEST(DecideLaunchIdentity, UnknownUsersAndUnprivilegedSwitchesAreErrors) {
  Result<std::optional<LaunchIdentity>> id = DecideLaunchIdentity("mallory", Env({}), 0, FakeUsers());
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.error().code(), ErrorCode::kUsage);
  EXPECT_NE(id.error().message().find("no such user"), std::string::npos);
  id = DecideLaunchIdentity("4242", Env({}), 0, FakeUsers());
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.error().code(), ErrorCode::kUsage);
  id = DecideLaunchIdentity("root", Env({}), 1000, FakeUsers());
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.error().code(), ErrorCode::kNoPrivilege);
  id = DecideLaunchIdentity("alice", Env({}), 1000, FakeUsers());  // oneself: fine without root
  ASSERT_TRUE(id.ok());
}

TEST(DecideLaunchIdentity, SudoInvokerWithoutPasswdEntryKeepsItsIds) {
  Result<std::optional<LaunchIdentity>> id =
      DecideLaunchIdentity("", Env({{"SUDO_UID", "5555"}, {"SUDO_GID", "5556"}}), 0, FakeUsers());
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(id->has_value());
  EXPECT_EQ((*id)->uid, 5555u);
  EXPECT_EQ((*id)->gid, 5556u);
  EXPECT_EQ((*id)->groups, std::vector<gid_t>{5556});
}

TEST(LaunchEnvironment, HomeUserLognameShellAreTheCommandUsers) {
  LaunchIdentity id;
  id.uid = 1000;
  id.user = "alice";
  id.home = "/home/alice";
  id.shell = "/bin/zsh";
  const std::vector<std::string> env =
      LaunchEnvironment({"HOME=/root", "PATH=/usr/bin", "USER=root", "LOGNAME=root", "SUDO_UID=1000"}, id);
  EXPECT_EQ(env, (std::vector<std::string>{"PATH=/usr/bin", "SUDO_UID=1000", "HOME=/home/alice", "USER=alice",
                                           "LOGNAME=alice", "SHELL=/bin/zsh"}));
}

TEST(HeldChild, DropsToTheIdentityBeforeExec) {
  if (geteuid() != 0) GTEST_SKIP() << "switching users needs root";
  char tmpl[] = "/tmp/rvbpfd-held-id-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  ASSERT_EQ(chmod(tmpl, 0777), 0);
  const std::string out = std::string(tmpl) + "/id";
  LaunchIdentity id;
  id.uid = 65534;
  id.gid = 65534;
  id.groups = {65534};
  id.user = "nobody";
  id.home = "/nonexistent";
  Result<HeldChild> child = HeldChild::Spawn(
      {"/bin/sh", "-c", "echo $(id -u) $(id -g) $(id -G) $HOME $USER > " + out}, id);
  ASSERT_TRUE(child.ok());
  ASSERT_TRUE(child->Release().ok());
  int status = 0;
  for (int i = 0; i < 500 && !child->Reap(&status); ++i) usleep(10 * 1000);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  std::ifstream in(out);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "65534 65534 65534 /nonexistent nobody");
  unlink(out.c_str());
  rmdir(tmpl);
}

}  // namespace
}  // namespace rvbpfd
