// PlanLaunch: finding the VM a command will run before it runs, through PATH, #! lines and DT_NEEDED/RUNPATH.
// Uses the test Rubies when present (tools/build-test-rubies.sh) and skips, saying so, when they are not.
#include "record/launch.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
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

}  // namespace
}  // namespace rvbpfd
