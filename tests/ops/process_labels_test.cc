#include "ops/process_labels.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "elf/elf_fixtures.h"

namespace rvbpfd {
namespace {

using ::testing::HasSubstr;

const std::string kId = "3f2a9c1b7d8e4f5061728394a5b6c7d8e9f00112233445566778899aabbccdde";
const std::string kId2 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

// A fake /proc with one process directory per pid.
class FakeProc {
 public:
  std::string root() const { return dir_.path(); }
  void Write(int pid, const std::string& name, const std::string& bytes) {
    testing::WriteFile(dir_.Join(std::to_string(pid) + "/" + name), bytes);
  }

 private:
  testing::TempDir dir_;
};

TEST(ParseCgroupPathTest, PrefersTheUnifiedLineElseTheFirstV1Path) {
  EXPECT_EQ(ParseCgroupPath("0::/system.slice/puma.service\n"), "/system.slice/puma.service");
  // Hybrid hierarchy: v1 lines first, the unified line last.
  EXPECT_EQ(ParseCgroupPath("12:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n0::/docker/unified\n"),
            "/docker/unified");
  EXPECT_EQ(ParseCgroupPath("12:cpu,cpuacct:/kubepods/pod1/c1\n11:memory:/other\n"), "/kubepods/pod1/c1");
  EXPECT_EQ(ParseCgroupPath("0::/a:b/c\n"), "/a:b/c");  // ':' inside the path
  EXPECT_EQ(ParseCgroupPath("0::/gone (deleted)\n"), "/gone");
  EXPECT_EQ(ParseCgroupPath(""), "");
  EXPECT_EQ(ParseCgroupPath("garbage\n3:x:\n"), "");
  EXPECT_EQ(ParseCgroupPath("0::/no-newline"), "/no-newline");
}

TEST(ContainerIdFromCgroupTest, FindsRuntimeIds) {
  EXPECT_EQ(ContainerIdFromCgroup("/system.slice/docker-" + kId + ".scope"), kId);
  EXPECT_EQ(ContainerIdFromCgroup("/docker/" + kId), kId);
  EXPECT_EQ(ContainerIdFromCgroup("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234_5678.slice/"
                                  "cri-containerd-" + kId + ".scope"),
            kId);
  EXPECT_EQ(ContainerIdFromCgroup("/kubepods/burstable/pod0a1b2c3d-1111-2222-3333-444455556666/" + kId), kId);
  EXPECT_EQ(ContainerIdFromCgroup("/kubepods.slice/kubepods-besteffort.slice/crio-" + kId + ".scope"), kId);
  EXPECT_EQ(ContainerIdFromCgroup("/machine.slice/libpod-" + kId + ".scope/container"), kId);
  EXPECT_EQ(ContainerIdFromCgroup("/system.slice/docker-" + kId + ".scope/init.scope"), kId);
  EXPECT_EQ(ContainerIdFromCgroup("/kubepods/besteffort/podx/crio-" + kId), kId);  // cgroupfs driver, no .scope
  // A private cgroup namespace shows host paths relative to the agent's cgroup.
  EXPECT_EQ(ContainerIdFromCgroup("/../../system.slice/docker-" + kId + ".scope"), kId);
  // Nested runtimes: the innermost id is the process's own container.
  EXPECT_EQ(ContainerIdFromCgroup("/docker/" + kId + "/docker/" + kId2), kId2);
}

TEST(ContainerIdFromCgroupTest, IgnoresEverythingElse) {
  EXPECT_EQ(ContainerIdFromCgroup("/system.slice/puma.service"), "");
  EXPECT_EQ(ContainerIdFromCgroup("/user.slice/user-1000.slice/session-3.scope"), "");
  EXPECT_EQ(ContainerIdFromCgroup("/"), "");
  EXPECT_EQ(ContainerIdFromCgroup(""), "");
  EXPECT_EQ(ContainerIdFromCgroup("/docker/" + kId.substr(0, 63)), "");  // too short
  EXPECT_EQ(ContainerIdFromCgroup("/docker/" + kId + "0"), "");            // too long
  std::string upper = kId;
  upper[0] = 'F';
  EXPECT_EQ(ContainerIdFromCgroup("/docker/" + upper), "");
  EXPECT_EQ(ContainerIdFromCgroup("/system.slice/crio-conmon-" + kId + ".scope"), "");  // the monitor, not the app
  EXPECT_EQ(ContainerIdFromCgroup("/system.slice/other-" + kId + ".scope"), "");
}

TEST(ServiceNameFromEnvironTest, RvbpfServiceWinsOverOtel) {
  using namespace std::string_literals;
  EXPECT_EQ(ServiceNameFromEnviron("PATH=/bin\0OTEL_SERVICE_NAME=otel\0RVBPF_SERVICE=shop\0"s), "shop");
  EXPECT_EQ(ServiceNameFromEnviron("PATH=/bin\0OTEL_SERVICE_NAME=checkout\0"s), "checkout");
  EXPECT_EQ(ServiceNameFromEnviron("OTEL_SERVICE_NAME=last-without-nul"s), "last-without-nul");
  EXPECT_EQ(ServiceNameFromEnviron("PATH=/bin\0HOME=/root\0"s), "");
  EXPECT_EQ(ServiceNameFromEnviron(""), "");
  // First occurrence counts, as getenv would find it.
  EXPECT_EQ(ServiceNameFromEnviron("RVBPF_SERVICE=first\0RVBPF_SERVICE=second\0"s), "first");
  // Names must match exactly at the start of an entry.
  EXPECT_EQ(ServiceNameFromEnviron("XRVBPF_SERVICE=no\0MY_OTEL_SERVICE_NAME=no\0"s), "");
  // Unusable values fall through: empty, control characters, invalid UTF-8, too long.
  EXPECT_EQ(ServiceNameFromEnviron("RVBPF_SERVICE=\0OTEL_SERVICE_NAME=otel\0"s), "otel");
  EXPECT_EQ(ServiceNameFromEnviron("RVBPF_SERVICE=a\tb\0OTEL_SERVICE_NAME=otel\0"s), "otel");
  EXPECT_EQ(ServiceNameFromEnviron("RVBPF_SERVICE=\xff\xfe\0"s), "");
  EXPECT_EQ(ServiceNameFromEnviron("RVBPF_SERVICE=" + std::string(kMaxServiceNameBytes, 'a') + '\0'),
            std::string(kMaxServiceNameBytes, 'a'));
  EXPECT_EQ(ServiceNameFromEnviron("RVBPF_SERVICE=" + std::string(kMaxServiceNameBytes + 1, 'a') + '\0'), "");
  EXPECT_EQ(ServiceNameFromEnviron("RVBPF_SERVICE=caf\xc3\xa9\0"s), "caf\xc3\xa9");
}

TEST(ReadProcessLabelsTest, ReadsAllLabelsOfAContainerProcess) {
  using namespace std::string_literals;
  FakeProc proc;
  proc.Write(4242, "comm", "puma 6.4.2 (tc\n");
  proc.Write(4242, "cgroup", "0::/system.slice/docker-" + kId + ".scope\n");
  proc.Write(4242, "environ", "PATH=/usr/bin\0RVBPF_SERVICE=storefront\0"s);
  Result<ProcessLabels> l = ReadProcessLabels(proc.root(), 4242);
  ASSERT_TRUE(l.ok()) << l.error().message();
  EXPECT_EQ(l->pid, 4242);
  EXPECT_EQ(l->comm, "puma 6.4.2 (tc");
  EXPECT_EQ(l->cgroup, "/system.slice/docker-" + kId + ".scope");
  EXPECT_EQ(l->container_id, kId);
  EXPECT_EQ(l->service_name, "storefront");
  EXPECT_EQ(l->service_name_source, kServiceFromEnvironment);  // the process's own claim, said so
}

// A stat line as the kernel writes it: pid, (comm), state, ppid, 16 fields, starttime, then the rest.
std::string StatLine(const std::string& comm, const std::string& ppid, const std::string& start) {
  return "77 (" + comm + ") S " + ppid + " 77 1 0 -1 4194560 2200 0 0 0 5 3 0 0 20 0 2 0 " + start +
         " 12345 678 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 17 1 0 0\n";
}

TEST(ParseProcStatTest, ReadsTheFieldsAfterTheLastParenthesis) {
  ProcStat st = ParseProcStat(StatLine("ruby3.3", "4242", "987654"));
  EXPECT_EQ(st.parent_pid, 4242);
  EXPECT_EQ(st.start_ticks, 987654u);
  // comm is the process's choice: spaces and parentheses in it do not shift the fields.
  st = ParseProcStat(StatLine("puma: cluster (w) 0", "7", "11"));
  EXPECT_EQ(st.parent_pid, 7);
  EXPECT_EQ(st.start_ticks, 11u);
  st = ParseProcStat(StatLine("a) S 9 (b", "1", "12"));  // the comm "a) S 9 (b" cannot fake a parent
  EXPECT_EQ(st.parent_pid, 1);
  EXPECT_EQ(st.start_ticks, 12u);
  EXPECT_EQ(ParseProcStat(StatLine("init", "0", "1")).parent_pid, 0);  // pid 1's parent is 0: unknown
  st = ParseProcStat("12 (x) S 5");  // cut short: the parent, no start time
  EXPECT_EQ(st.parent_pid, 5);
  EXPECT_EQ(st.start_ticks, 0u);
}

TEST(ParseProcStatTest, MalformedFieldsAreUnknown) {
  EXPECT_EQ(ParseProcStat("").parent_pid, 0);
  EXPECT_EQ(ParseProcStat("12 x S 5 5\n").parent_pid, 0);   // no parenthesis
  EXPECT_EQ(ParseProcStat("12 (x)S 5 5\n").parent_pid, 0);  // no space after it
  EXPECT_EQ(ParseProcStat(StatLine("x", "-5", "1")).parent_pid, 0);
  EXPECT_EQ(ParseProcStat(StatLine("x", "5x", "1")).parent_pid, 0);
  EXPECT_EQ(ParseProcStat(StatLine("x", "2147483648", "1")).parent_pid, 0);  // past int
  EXPECT_EQ(ParseProcStat(StatLine("x", "2147483647", "1")).parent_pid, 2147483647);
  EXPECT_EQ(ParseProcStat(StatLine("x", "5", "99999999999999999999")).start_ticks, 0u);  // past uint64
  EXPECT_EQ(ParseProcStat(StatLine("x", "5", "")).start_ticks, 0u);
  ProcStat st = ParseProcStat(StatLine("x", "5", "+7"));
  EXPECT_EQ(st.parent_pid, 5);
  EXPECT_EQ(st.start_ticks, 0u);
}

TEST(ReadProcessLabelsTest, ReadsTheParentFromStatAndToleratesItsAbsence) {
  FakeProc proc;
  proc.Write(4243, "comm", "puma\n");
  proc.Write(4243, "cgroup", "0::/\n");
  proc.Write(4243, "stat", StatLine("puma: cluster w", "4242", "5150"));
  Result<ProcessLabels> l = ReadProcessLabels(proc.root(), 4243);
  ASSERT_TRUE(l.ok()) << l.error().message();
  EXPECT_EQ(l->parent_pid, 4242);
  EXPECT_EQ(l->start_ticks, 5150u);
  proc.Write(4244, "comm", "puma\n");
  proc.Write(4244, "cgroup", "0::/\n");
  l = ReadProcessLabels(proc.root(), 4244);  // no stat file: unknown, not an error
  ASSERT_TRUE(l.ok()) << l.error().message();
  EXPECT_EQ(l->parent_pid, 0);
  EXPECT_EQ(l->start_ticks, 0u);
}

ProcessLabels Labels(std::string cgroup, std::string service, std::string_view source) {
  ProcessLabels l;
  l.comm = "ruby";
  l.cgroup = std::move(cgroup);
  l.service_name = std::move(service);
  l.service_name_source = std::string(source);
  return l;
}

TEST(ServiceNamePolicyTest, APinnedCgroupNamesTheServiceWhateverTheEnvironmentClaims) {
  Result<ServiceNamePolicy> policy = ServiceNamePolicy::Create(
      {"/system.slice/shop.service=shop", "/kubepods/burstable=k8s", "/kubepods/burstable/pod7=billing"}, false);
  ASSERT_TRUE(policy.ok()) << policy.error().message();
  // A process in the shop's cgroup claiming to be billing is the shop.
  ProcessLabels l = Labels("/system.slice/shop.service", "billing", kServiceFromEnvironment);
  ApplyServiceNamePolicy(*policy, &l);
  EXPECT_EQ(l.service_name, "shop");
  EXPECT_EQ(l.service_name_source, kServiceFromCgroup);
  // The longest matching prefix wins, whatever the order of the rules.
  l = Labels("/kubepods/burstable/pod7/c1", "ruby", kServiceFromComm);
  ApplyServiceNamePolicy(*policy, &l);
  EXPECT_EQ(l.service_name, "billing");
  l = Labels("/kubepods/burstable/pod8/c1", "x", kServiceFromEnvironment);
  ApplyServiceNamePolicy(*policy, &l);
  EXPECT_EQ(l.service_name, "k8s");
  // Outside every pin, the environment's claim stands (marked as such) when it is not ignored.
  l = Labels("/user.slice/session-1.scope", "billing", kServiceFromEnvironment);
  ApplyServiceNamePolicy(*policy, &l);
  EXPECT_EQ(l.service_name, "billing");
  EXPECT_EQ(l.service_name_source, kServiceFromEnvironment);
}

TEST(ServiceNamePolicyTest, IgnoringTheEnvironmentFallsBackToComm) {
  Result<ServiceNamePolicy> policy = ServiceNamePolicy::Create({"/system.slice/shop.service=shop"}, true);
  ASSERT_TRUE(policy.ok());
  ProcessLabels l = Labels("/user.slice/session-1.scope", "billing", kServiceFromEnvironment);
  ApplyServiceNamePolicy(*policy, &l);
  EXPECT_EQ(l.service_name, "ruby");
  EXPECT_EQ(l.service_name_source, kServiceFromComm);
  // A pin still names its cgroup's processes.
  l = Labels("/system.slice/shop.service", "billing", kServiceFromEnvironment);
  ApplyServiceNamePolicy(*policy, &l);
  EXPECT_EQ(l.service_name, "shop");
}

TEST(ServiceNamePolicyTest, BadPinsAreUsageErrorsNamingTheRule) {
  for (const char* bad : {"shop", "system.slice=shop", "/a=", "=shop", "/a=b\x01"}) {
    Result<ServiceNamePolicy> policy = ServiceNamePolicy::Create({bad}, false);
    ASSERT_FALSE(policy.ok()) << bad;
    EXPECT_EQ(policy.error().code(), ErrorCode::kUsage);
    EXPECT_THAT(policy.error().message(), HasSubstr(std::string("--service-pin rule \"") + bad));
  }
}

TEST(ReadProcessLabelsTest, FallsBackToCommWithoutServiceVariables) {
  using namespace std::string_literals;
  FakeProc proc;
  proc.Write(7, "comm", "ruby\n");
  proc.Write(7, "cgroup", "0::/system.slice/app.service\n");
  proc.Write(7, "environ", "PATH=/usr/bin\0"s);
  Result<ProcessLabels> l = ReadProcessLabels(proc.root(), 7);
  ASSERT_TRUE(l.ok()) << l.error().message();
  EXPECT_EQ(l->service_name, "ruby");
  EXPECT_EQ(l->service_name_source, kServiceFromComm);
  EXPECT_EQ(l->container_id, "");
  EXPECT_EQ(l->cgroup, "/system.slice/app.service");
}

TEST(ReadProcessLabelsTest, MissingOrUnreadableEnvironIsNotAnError) {
  FakeProc proc;
  proc.Write(8, "comm", "ruby\n");
  proc.Write(8, "cgroup", "0::/\n");
  Result<ProcessLabels> missing = ReadProcessLabels(proc.root(), 8);
  ASSERT_TRUE(missing.ok()) << missing.error().message();
  EXPECT_EQ(missing->service_name, "ruby");

  // A directory where the file should be makes read() fail with EISDIR: any read failure falls back to comm.
  std::filesystem::create_directories(proc.root() + "/8/environ");
  Result<ProcessLabels> unreadable = ReadProcessLabels(proc.root(), 8);
  ASSERT_TRUE(unreadable.ok()) << unreadable.error().message();
  EXPECT_EQ(unreadable->service_name, "ruby");
}

TEST(ReadProcessLabelsTest, OversizedEnvironIsSearchedInItsFirstMebibyteOnly) {
  FakeProc proc;
  proc.Write(9, "comm", "ruby\n");
  proc.Write(9, "cgroup", "0::/\n");
  std::string env = "OTEL_SERVICE_NAME=early";
  env.push_back('\0');
  env += "BIG=" + std::string(kMaxEnvironBytes, 'x');
  env.push_back('\0');
  env += "RVBPF_SERVICE=late";  // past the cap: never seen
  env.push_back('\0');
  proc.Write(9, "environ", env);
  Result<ProcessLabels> l = ReadProcessLabels(proc.root(), 9);
  ASSERT_TRUE(l.ok()) << l.error().message();
  EXPECT_EQ(l->service_name, "early");

  // An entry cut by the cap is not used even if its start looks right.
  std::string cut = "A=" + std::string(kMaxEnvironBytes - 2 - 1 - 20, 'y');
  cut.push_back('\0');
  cut += "RVBPF_SERVICE=truncated-name-goes-on-and-on";
  proc.Write(9, "environ", cut);
  Result<ProcessLabels> c = ReadProcessLabels(proc.root(), 9);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->service_name, "ruby");
}

TEST(ReadProcessLabelsTest, GoneProcessIsNoSuchProcess) {
  FakeProc proc;
  Result<ProcessLabels> l = ReadProcessLabels(proc.root(), 31337);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.error().code(), ErrorCode::kNoSuchProcess);
  EXPECT_THAT(l.error().message(), HasSubstr("31337"));

  // The directory exists but comm vanished (the process exited between the two reads).
  std::filesystem::create_directories(proc.root() + "/55");
  Result<ProcessLabels> raced = ReadProcessLabels(proc.root(), 55);
  ASSERT_FALSE(raced.ok());
  EXPECT_EQ(raced.error().code(), ErrorCode::kNoSuchProcess);
  EXPECT_THAT(raced.error().message(), HasSubstr("comm"));

  EXPECT_EQ(ReadProcessLabels(proc.root(), 0).error().code(), ErrorCode::kNoSuchProcess);
  EXPECT_EQ(ReadProcessLabels(proc.root(), -5).error().code(), ErrorCode::kNoSuchProcess);
}

TEST(ReadProcessLabelsTest, MissingCgroupFileGivesEmptyCgroup) {
  FakeProc proc;
  proc.Write(10, "comm", "ruby\n");
  Result<ProcessLabels> l = ReadProcessLabels(proc.root(), 10);
  ASSERT_TRUE(l.ok()) << l.error().message();
  EXPECT_EQ(l->cgroup, "");
  EXPECT_EQ(l->container_id, "");
}

TEST(ReadProcessLabelsTest, UnreadableCommIsAnIoError) {
  FakeProc proc;
  std::filesystem::create_directories(proc.root() + "/11/comm");  // EISDIR
  Result<ProcessLabels> l = ReadProcessLabels(proc.root(), 11);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.error().code(), ErrorCode::kIo);
  EXPECT_THAT(l.error().message(), HasSubstr("/11/comm"));
}

TEST(ReadProcessLabelsTest, ReadsTheRealProcOfThisProcess) {
  // The live /proc/self layout (the fake tree above mirrors it).
  Result<ProcessLabels> l = ReadProcessLabels("/proc", static_cast<int>(getpid()));
  ASSERT_TRUE(l.ok()) << l.error().message();
  EXPECT_EQ(l->pid, static_cast<int>(getpid()));
  EXPECT_FALSE(l->comm.empty());
  EXPECT_EQ(l->comm.find('\n'), std::string::npos);
  EXPECT_FALSE(l->service_name.empty());
  EXPECT_EQ(l->cgroup.empty(), false);
  EXPECT_EQ(l->parent_pid, static_cast<int>(getppid()));
  EXPECT_GT(l->start_ticks, 0u);
}

}  // namespace
}  // namespace rvbpfd
