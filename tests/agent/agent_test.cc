#include "agent/agent.h"

#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <map>
#include <optional>
#include <sstream>

#include "agent_fakes.h"
#include "common/label_bound.h"
#include "session/fake_vm_memory.h"
#include "stacks/synthetic_objects.h"

namespace rvbpfd {
namespace {

using agent_testing::FakeBackend;
using agent_testing::FakeClock;
using agent_testing::FakeFrameSource;
using agent_testing::FakePrepared;
using agent_testing::FakeProc;
using agent_testing::RecordingSink;

constexpr uint64_t kMs = 1'000'000;
constexpr uint64_t kS = 1'000'000'000;
const std::string kContainerId = "3f2a" + std::string(60, 'b');

std::string Gunzip(const std::string& gz) {
  z_stream zs{};
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) return "";
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(gz.data()));
  zs.avail_in = static_cast<uInt>(gz.size());
  std::string out;
  char buf[65536];
  int rc = Z_OK;
  while (rc == Z_OK) {
    zs.next_out = reinterpret_cast<Bytef*>(buf);
    zs.avail_out = sizeof(buf);
    rc = inflate(&zs, Z_NO_FLUSH);
    out.append(buf, sizeof(buf) - zs.avail_out);
  }
  inflateEnd(&zs);
  return rc == Z_STREAM_END ? out : "";
}

class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    AddRuby(10, "host", "ruby");
    AddRuby(11, "host", "puma");
    proc_.AddProcess(12, "ls", "host", proc_.AddExe("host", "ls"), {"/usr/lib/libc.so.6"});
    AddRuby(20, "container1", "ruby", std::string("RVBPF_SERVICE=billing\0PATH=/bin\0", 32),
            "0::/system.slice/docker-" + kContainerId + ".scope\n");
    config_.interval_s = 2;
    config_.output_dir = "unused-by-the-fake-sink";
    config_.host = "testhost";
    config_.proc_root = proc_.root();
  }

  void AddRuby(int pid, const std::string& rootfs, const std::string& comm, const std::string& environ = "",
               const std::string& cgroup = "0::/user.slice/session-1.scope\n") {
    const std::string exe = proc_.AddExe(rootfs, "ruby");
    proc_.AddProcess(pid, comm, rootfs, exe, {proc_.AddLibruby(rootfs, "3.3.8")}, environ, cgroup);
  }

  void StartAgent() {
    AgentEnv env;
    env.backend = &backend_;
    env.clock = &clock_;
    env.drain_period_ns = drain_period_ns_;
    env.preparer = [this](const std::string&, const std::string& v, std::shared_ptr<ElfFile>,
                          std::shared_ptr<const FileFd>) -> Result<PreparedBinary> {
      PreparedBinary p = FakePrepared(v, /*entry_probes=*/true);
      if (layout_) p.live_layout = *layout_;
      return p;
    };
    if (layout_) {
      env.memory = [this](int pid) -> std::unique_ptr<MemoryReader> {
        ++memory_opened_;
        return std::make_unique<testing::FakeMemory>(memory_[pid]);
      };
    }
    env.frame_source = [this](int pid, const RubyTarget&, const ProbeSet&) -> std::unique_ptr<FrameSource> {
      if (frame_source_override_) return frame_source_override_(pid);
      return std::make_unique<FakeFrameSource>(&resolve_epochs_);
    };
    env.make_sinks = [this](const AgentConfig&) -> Result<AgentSinks> {
      ++sinks_made_;
      auto s = std::make_unique<RecordingSink>();
      sink_ = s.get();
      AgentSinks out;
      out.dir = std::move(s);
      return out;
    };
    env.metrics = &metrics_;
    env.log = &log_;
    env.self_usage = [this]() -> Result<SelfUsage> {
      ++self_usage_reads_;
      return SelfUsage{1.5, 10 << 20, 12 << 20};
    };
    env.max_exit_fds = max_exit_fds_;
    if (use_exit_fds_) {
      // An eventfd stands for each process's pidfd: the agent owns the descriptor, the test writes to a duplicate
      // to make it readable ("the process exited").
      env.open_exit_fd = [this](int pid) {
        const int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (fd >= 0) exit_fds_[pid] = FileFd(dup(fd));
        return fd;
      };
    }
    Result<std::unique_ptr<Agent>> a = Agent::Create(config_, env);
    ASSERT_TRUE(a.ok()) << a.error().message();
    agent_ = std::move(a.value());
    Status st = agent_->Start();
    ASSERT_TRUE(st.ok()) << st.error().message();
  }

  // Advances the clock in poll-sized steps, running the loop at each.
  void Run(uint64_t ns) {
    const uint64_t end = clock_.mono + ns;
    do {
      clock_.mono = std::min(end, clock_.mono + 50 * kMs);
      Status st = agent_->RunOnce(0);
      ASSERT_TRUE(st.ok()) << st.error().message();
    } while (clock_.mono < end);
  }

  std::vector<ProfileUpload> UploadsFor(int pid, const std::string& type = "cpu") {
    std::vector<ProfileUpload> out;
    for (const ProfileUpload& u : sink_->uploads) {
      if (u.labels.at("pid") == std::to_string(pid) && u.profile_type == type) out.push_back(u);
    }
    return out;
  }

  FakeProc proc_;
  FakeBackend backend_;
  FakeClock clock_;
  MetricsRegistry metrics_;
  std::ostringstream log_text_;
  Logger log_{LogFormat::kText, &log_text_};
  AgentConfig config_;
  std::unique_ptr<Agent> agent_;
  RecordingSink* sink_ = nullptr;
  int sinks_made_ = 0;
  std::vector<uint64_t> resolve_epochs_;  // GC epoch of every stack the agent had named, in order
  // With a live layout: what the prepared binary says of every process, and each process's memory.
  std::optional<LiveLayout> layout_;
  std::map<int, testing::FakeMemory> memory_;
  int memory_opened_ = 0;
  int self_usage_reads_ = 0;  // calls of AgentEnv::self_usage
  // With exit descriptors (AgentEnv::open_exit_fd): the test's duplicate of every process's descriptor.
  bool use_exit_fds_ = false;
  size_t max_exit_fds_ = AgentEnv{}.max_exit_fds;
  // 0: the ring is read at every RunOnce, as the tests' scripts (records due by the next step) assume; the tests of
  // the read period set it.
  std::optional<uint64_t> drain_period_ns_ = 0;
  std::map<int, FileFd> exit_fds_;
  std::function<std::unique_ptr<FrameSource>(int pid)> frame_source_override_;  // null: FakeFrameSource
};

// The layout a prepared binary reports for the live check: testing::FakeVm's, in the libruby of FakeProc (mapped at
// 0x7f0000000000 by every process).
constexpr uint64_t kFakeLibrubyBias = 0x7f0000000000;
LiveLayout FakeLayout() {
  using testing::FakeVm;
  LiveLayout l;
  l.vm_path = "/usr/lib/libruby.so.3.3.8";
  l.ruby_version = "3.3.8";
  l.description = "CRuby 3.3.8, build-id none, no symbols: offsets table";
  l.hooks_vaddr = FakeVm::kHooks;
  l.main_ractor_vaddr = FakeVm::kMainRactor;
  l.ractor_main_thread = FakeVm::kRactorMainThread;
  l.th_nt = FakeVm::kThNt;
  l.nt_tid = FakeVm::kNtTid;
  l.lowest_load_vaddr = 0;
  return l;
}
// A process whose memory holds that layout with main thread tid `tid` (its pid when it matches); `main_thread` 0:
// the VM has not set its main thread up yet.
testing::FakeMemory FakeVmMemory(int tid, uint64_t main_thread = testing::FakeVm::kThread) {
  return testing::FakeVmMemory(kFakeLibrubyBias, tid, main_thread);
}

// An EC route the backend refuses (BPF's proc_ec map full): the process is still watched, the refusal is logged once
// per reason however many processes share it, and a refused route is not retried.
TEST_F(AgentTest, ARefusedEcRouteIsLoggedOnceAndNotRetried) {
  backend_.ec_refusal = "writing proc_ec: No space left on device (errno 28)";
  StartAgent();
  EXPECT_EQ(agent_->watched_pids(), (std::vector<int>{10, 11, 20}));
  EXPECT_EQ(backend_.ec_polls, 3) << "one attempt per process";
  Run(5'000'000'000);  // past the eager polls and several housekeeping rounds
  EXPECT_EQ(backend_.ec_polls, 3) << "a refused route is not retried";
  const std::string log = log_text_.str();
  const std::string warning = "samples of this process find their thread only through scheduler events";
  const size_t at = log.find(warning);
  ASSERT_NE(at, std::string::npos) << log;
  EXPECT_EQ(log.find(warning, at + 1), std::string::npos) << "logged once for the reason: " << log;
  EXPECT_NE(log.find("No space left on device (errno 28)"), std::string::npos) << log;
}

// A pending EC route is retried at every loop while its process attached less than kEcEagerNs ago, then only at the
// housekeeping (once a second); loops in between poll nothing.
TEST_F(AgentTest, APendingEcRouteIsRetriedAtEveryLoopWhileNewThenAtTheHousekeeping) {
  backend_.ec_pending_polls = 1'000'000;
  StartAgent();
  ASSERT_EQ(agent_->watched_pids(), (std::vector<int>{10, 11, 20}));
  EXPECT_EQ(backend_.ec_polls, 3);
  Run(500 * kMs);  // ten 50 ms loops before the first housekeeping
  EXPECT_EQ(backend_.ec_polls, 3 + 10 * 3);
  Run(Agent::kEcEagerNs);
  const int after_eager = backend_.ec_polls;
  Run(3'000'000'000);
  EXPECT_EQ(backend_.ec_polls - after_eager, 3 * 3) << "one poll per process at each of three housekeepings";
}

// A route that is pending for its first polls is installed by the retries, before any housekeeping.
TEST_F(AgentTest, APendingEcRouteIsInstalledByTheEagerRetries) {
  backend_.ec_pending_polls = 4 * 3;  // the start's poll and three loops' find the VM not relocated yet
  StartAgent();
  Run(400 * kMs);
  EXPECT_EQ(backend_.ec_polls, 4 * 3 + 3) << "installed at the fourth loop, then never polled again";
}

TEST_F(AgentTest, StartWatchesEveryRubyProcessWithOneProbeSetPerBinary) {
  StartAgent();
  EXPECT_EQ(agent_->watched_pids(), (std::vector<int>{10, 11, 20}));
  EXPECT_EQ(backend_.pids, (std::set<uint32_t>{10, 11, 20}));
  EXPECT_TRUE(backend_.watching);
  EXPECT_GE(backend_.ec_polls, 3);  // every process gets its EC route installed (samples of CPU-bound threads)
  EXPECT_EQ(backend_.sampling_hz, 19);
  const rv_config probe_config = Agent::ProbeConfig(config_);
  EXPECT_EQ(probe_config.watch_exec, 1u);
  EXPECT_EQ(probe_config.sampling, 1u);
  EXPECT_EQ(probe_config.stack_events, 1u << RV_EV_THREAD_SUSPENDED);
  // host's libruby (10, 11) and the container's own copy (20): two sets, two groups each.
  EXPECT_EQ(backend_.groups.size(), 4u);
  EXPECT_EQ(agent_->probe_sets().active_sets(), 2u);
  EXPECT_NE(log_text_.str().find("process attached"), std::string::npos);
  EXPECT_NE(log_text_.str().find("binary probed"), std::string::npos);
  const std::string m = metrics_.RenderPrometheus();
  EXPECT_NE(m.find("rvbpfd_processes_watched 3"), std::string::npos) << m;
  EXPECT_NE(m.find("rvbpfd_binaries_probed 2"), std::string::npos) << m;
}

TEST_F(AgentTest, AProcessInItsOwnPidNamespaceIsAddedWithItAndItsThreadsNamespaceTids) {
  proc_.OwnPidNamespace(20, {{20, 1}, {23, 7}});
  StartAgent();
  ASSERT_EQ(backend_.pids.count(20), 1u);
  EXPECT_NE(backend_.pidns[20].ino, 0u);
  auto threads = backend_.ns_threads[20];
  std::sort(threads.begin(), threads.end());
  EXPECT_EQ(threads, (std::vector<std::pair<uint32_t, uint32_t>>{{1, 20}, {7, 23}}));
  // The host's processes: no namespace, nothing to translate.
  EXPECT_EQ(backend_.pidns[10].ino, 0u);
  EXPECT_EQ(backend_.pidns[10].dev, 0u);
  EXPECT_TRUE(backend_.ns_threads[10].empty());
}

TEST_F(AgentTest, PinnedCgroupsAndIgnoredEnvironmentsNameTheServices) {
  // pid 20 claims "billing" from its container; the operator pins that container's cgroup to "storefront" and
  // ignores environment names elsewhere.
  config_.service_pins = {"/system.slice/docker-=storefront"};
  config_.ignore_env_service = true;
  AddRuby(30, "host", "ruby", std::string("RVBPF_SERVICE=billing\0", 22));
  StartAgent();
  const uint64_t t0 = clock_.mono;
  for (int pid : {20, 30}) backend_.Stack(t0 + 10 * kMs, pid, RV_EV_SAMPLE, 0x1000, {111});
  Run(2 * kS);
  std::vector<ProfileUpload> pinned = UploadsFor(20);
  ASSERT_EQ(pinned.size(), 1u);
  EXPECT_EQ(pinned[0].app_name, "storefront");
  EXPECT_EQ(pinned[0].labels.at("service_name"), "storefront");
  EXPECT_EQ(pinned[0].labels.at("service_name_source"), "cgroup");
  std::vector<ProfileUpload> ignored = UploadsFor(30);
  ASSERT_EQ(ignored.size(), 1u);
  EXPECT_EQ(ignored[0].app_name, "ruby");
  EXPECT_EQ(ignored[0].labels.at("service_name_source"), "comm");
}

TEST_F(AgentTest, EachIntervalCutsLabelledProfilesOfEveryProcess) {
  StartAgent();
  const uint64_t t0 = clock_.mono;
  for (int i = 0; i < 10; ++i) {
    backend_.Stack(t0 + (10 + i) * kMs, 10, RV_EV_SAMPLE, 0x1000, {111, 222});
    backend_.Stack(t0 + (10 + i) * kMs, 20, RV_EV_SAMPLE, 0x2000, {333});
  }
  Run(1900 * kMs);
  EXPECT_TRUE(sink_->uploads.empty());  // the interval has not ended
  Run(100 * kMs);
  std::vector<ProfileUpload> a = UploadsFor(10);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].labels, (std::map<std::string, std::string>{{"host", "testhost"},
                                                             {"pid", "10"},
                                                             {"parent_pid", "1"},  // the fake stat's
                                                             {"command", "ruby"},
                                                             {"ruby_version", "3.3.8"},
                                                             {"service_name", "ruby"},
                                                             {"service_name_source", "comm"}}));
  EXPECT_EQ(a[0].app_name, "ruby");
  const int64_t start_unix_s = clock_.RealtimeNs() / static_cast<int64_t>(kS) - 2;
  EXPECT_EQ(a[0].from_unix_s, start_unix_s);
  EXPECT_EQ(a[0].until_unix_s, start_unix_s + 2);
  const std::string pb = Gunzip(a[0].pprof_gz);
  EXPECT_EQ(a[0].pprof_bytes, pb.size());  // the push sink sizes its requests by it
  EXPECT_NE(pb.find("m111"), std::string::npos);
  EXPECT_NE(pb.find("m222"), std::string::npos);
  EXPECT_EQ(pb.find("m333"), std::string::npos);
  std::vector<ProfileUpload> c = UploadsFor(20);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].labels.at("container_id"), kContainerId);
  EXPECT_EQ(c[0].labels.at("service_name"), "billing");
  EXPECT_EQ(c[0].labels.at("service_name_source"), "environment");  // RVBPF_SERVICE: the process's own claim
  EXPECT_EQ(c[0].app_name, "billing");
  EXPECT_TRUE(UploadsFor(11).empty());  // no samples, no events: nothing to upload
  EXPECT_EQ(agent_->samples(), 20u);
  EXPECT_EQ(sink_->submit_alls, 1);  // both processes' profiles in one hand-over, for the push sink to batch
  // The next interval starts where this one ended.
  backend_.Stack(clock_.mono + 5 * kMs, 10, RV_EV_SAMPLE, 0x1000, {111});
  Run(2 * kS);
  a = UploadsFor(10);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[1].from_unix_s, a[0].until_unix_s);
}

TEST_F(AgentTest, AnExecdDynamicRubyIsInspectedWithBackoffUntilLibrubyIsMapped) {
  StartAgent();
  const std::string exe = proc_.AddExe("host", "ruby");
  proc_.AddProcess(30, "ruby", "host", exe, {});  // libruby not mapped yet
  const uint64_t exec = clock_.mono + 1 * kMs;
  backend_.Record(exec, 30, RV_EV_PROC_EXEC);
  Run(50 * kMs);  // the 20 ms inspection: not Ruby yet
  EXPECT_TRUE(agent_->retries().contains(30));
  EXPECT_EQ(agent_->process(30), nullptr);
  proc_.SetMaps(30, exe, {proc_.AddLibruby("host", "3.3.8")});
  Run(60 * kMs);  // the 100 ms inspection
  ASSERT_NE(agent_->process(30), nullptr);
  EXPECT_TRUE(backend_.pids.count(30));
  EXPECT_FALSE(agent_->retries().contains(30));
  EXPECT_EQ(backend_.groups.size(), 4u);  // joined the host libruby's set
}

TEST_F(AgentTest, AWorkerForkedByAWatchedProcessIsWatchedWithoutAnExec) {
  StartAgent();
  AddRuby(50, "host", "puma");  // a forked child: same binary, already mapped
  backend_.Record(clock_.mono + 1 * kMs, 50, RV_EV_PROC_FORK);
  Run(50 * kMs);
  ASSERT_NE(agent_->process(50), nullptr);
  EXPECT_TRUE(backend_.pids.count(50));
  EXPECT_EQ(agent_->process(50)->set, agent_->process(11)->set);
  EXPECT_EQ(backend_.groups.size(), 4u);
}

TEST_F(AgentTest, WorkersForkedBeforeTheirParentWasWatchedAreFoundThroughItsChildren) {
  StartAgent();
  const std::string exe = proc_.AddExe("host", "ruby");
  proc_.AddProcess(60, "ruby", "host", exe, {proc_.AddLibruby("host", "3.3.8")});
  AddRuby(61, "host", "ruby");  // forked by 60 before the agent watched 60: no fork record
  agent_testing::WriteFile(proc_.PidDir(60) + "/task/60/children", "61 ");
  backend_.Record(clock_.mono + 1 * kMs, 60, RV_EV_PROC_EXEC);
  Run(50 * kMs);
  ASSERT_NE(agent_->process(60), nullptr);
  ASSERT_NE(agent_->process(61), nullptr);
  EXPECT_NE(log_text_.str().find("pid=61 comm=ruby ruby_version=3.3.8"), std::string::npos);
  EXPECT_NE(log_text_.str().find("found_by=fork"), std::string::npos);
}

TEST_F(AgentTest, AnExecThatNeverMapsRubyIsGivenUpAfterTwoSeconds) {
  StartAgent();
  proc_.AddProcess(31, "sh", "host", proc_.AddExe("host", "sh"), {"/usr/lib/libc.so.6"});
  backend_.Record(clock_.mono + 1 * kMs, 31, RV_EV_PROC_EXEC);
  Run(1900 * kMs);
  EXPECT_TRUE(agent_->retries().contains(31));
  Run(200 * kMs);
  EXPECT_FALSE(agent_->retries().contains(31));
  EXPECT_EQ(agent_->retries().given_up(), 1u);
  EXPECT_EQ(agent_->process(31), nullptr);
}

TEST_F(AgentTest, AnExitSubmitsTheLastPartialProfileAndTheLastProcessOfABinaryDetachesIt) {
  StartAgent();
  const uint64_t t0 = clock_.mono;
  backend_.Stack(t0 + 5 * kMs, 10, RV_EV_SAMPLE, 0x1000, {111});
  backend_.Record(t0 + 300 * kMs, 10, RV_EV_PROC_EXIT);
  Run(400 * kMs);
  EXPECT_EQ(agent_->process(10), nullptr);
  EXPECT_FALSE(backend_.pids.count(10));
  ASSERT_EQ(UploadsFor(10).size(), 1u);
  EXPECT_EQ(backend_.attached_groups(), 4u);  // 11 still uses the host libruby
  backend_.Record(clock_.mono + 1 * kMs, 11, RV_EV_PROC_EXIT);
  Run(100 * kMs);
  EXPECT_EQ(backend_.attached_groups(), 2u);  // only the container's set
  EXPECT_EQ(agent_->probe_sets().active_sets(), 1u);
  // Later samples of the exited pid are not attributed to anything.
  backend_.Stack(clock_.mono + 1 * kMs, 10, RV_EV_SAMPLE, 0x1000, {111});
  Run(3 * kS);
  EXPECT_EQ(UploadsFor(10).size(), 1u);
}

TEST_F(AgentTest, AProcessThatVanishedWithoutAnExitRecordIsFinishedWithinASecond) {
  StartAgent();
  backend_.Stack(clock_.mono + 5 * kMs, 11, RV_EV_SAMPLE, 0x1000, {111});
  Run(100 * kMs);
  proc_.Zombie(11, "puma");
  Run(1100 * kMs);
  EXPECT_EQ(agent_->process(11), nullptr);
  EXPECT_FALSE(backend_.pids.count(11));
  EXPECT_EQ(UploadsFor(11).size(), 1u);
}

TEST_F(AgentTest, SitesOfEventsNoProfileReadsAreNeverAttached) {
  StartAgent();
  ASSERT_FALSE(backend_.groups.empty());
  size_t sites = 0;
  for (const auto& g : backend_.groups) {
    for (const auto& s : g.sites) {
      EXPECT_TRUE(ProcessProfile::ReadsEvent(s.site.event)) << "event " << int{s.site.event};
      EXPECT_NE(s.site.event, RV_EV_SLEEP_ENTER);
      EXPECT_NE(s.site.event, RV_EV_MUTEX_LOCK_ENTER);
      ++sites;
    }
  }
  // Two binaries (the host's libruby and the container's), three sites each of the five the preparer found.
  EXPECT_EQ(sites, 6u);
}

TEST_F(AgentTest, AProcessWhoseExitDescriptorIsReadableIsFinishedWithoutReadingProc) {
  use_exit_fds_ = true;
  StartAgent();
  ASSERT_TRUE(exit_fds_.count(10) && exit_fds_.count(11));
  backend_.Stack(clock_.mono + 5 * kMs, 11, RV_EV_SAMPLE, 0x1000, {111});
  Run(100 * kMs);
  // /proc says both are gone, but a process with an exit descriptor is judged by it alone: 10's stays quiet.
  proc_.Remove(10);
  proc_.Zombie(11, "puma");
  Run(1100 * kMs);
  EXPECT_NE(agent_->process(10), nullptr);
  EXPECT_NE(agent_->process(11), nullptr);
  const uint64_t one = 1;
  ASSERT_EQ(write(exit_fds_[11].get(), &one, sizeof(one)), static_cast<ssize_t>(sizeof(one)));
  Run(1100 * kMs);
  EXPECT_EQ(agent_->process(11), nullptr);
  EXPECT_FALSE(backend_.pids.count(11));
  EXPECT_EQ(UploadsFor(11).size(), 1u);
  EXPECT_NE(agent_->process(10), nullptr);
  EXPECT_NE(log_text_.str().find("reason=vanished"), std::string::npos) << log_text_.str();
}

TEST_F(AgentTest, ProcessesPastTheExitDescriptorCapAreJudgedByProcUntilADescriptorIsFree) {
  use_exit_fds_ = true;
  max_exit_fds_ = 2;
  StartAgent();
  for (int pid : {10, 11, 20}) ASSERT_NE(agent_->process(pid), nullptr) << pid;
  ASSERT_EQ(exit_fds_.size(), 2u) << "two descriptors at most";
  int without_fd = 0;
  for (int pid : {10, 11, 20}) {
    if (!exit_fds_.count(pid)) without_fd = pid;
  }
  ASSERT_NE(without_fd, 0);
  const int with_fd = exit_fds_.begin()->first;
  // A worker forked while both are held is watched through /proc.
  AddRuby(50, "host", "puma");
  backend_.Record(clock_.mono + 1 * kMs, 50, RV_EV_PROC_FORK);
  Run(50 * kMs);
  ASSERT_NE(agent_->process(50), nullptr);
  EXPECT_FALSE(exit_fds_.count(50));
  // The process over the cap is finished once /proc says it is gone; a process with a descriptor by it alone.
  proc_.Remove(without_fd);
  proc_.Remove(with_fd);
  Run(1100 * kMs);
  EXPECT_EQ(agent_->process(without_fd), nullptr);
  EXPECT_NE(agent_->process(with_fd), nullptr);
  const uint64_t one = 1;
  ASSERT_EQ(write(exit_fds_[with_fd].get(), &one, sizeof(one)), static_cast<ssize_t>(sizeof(one)));
  Run(1100 * kMs);
  EXPECT_EQ(agent_->process(with_fd), nullptr);
  // Its descriptor was closed with it: the next process gets one.
  AddRuby(51, "host", "puma");
  backend_.Record(clock_.mono + 1 * kMs, 51, RV_EV_PROC_FORK);
  Run(50 * kMs);
  ASSERT_NE(agent_->process(51), nullptr);
  EXPECT_TRUE(exit_fds_.count(51));
}

TEST_F(AgentTest, SamplesOfExitedThreadsAreDroppedAndUnnameableStacksCounted) {
  StartAgent();
  const uint64_t t0 = clock_.mono;
  backend_.Record(t0 + 1 * kMs, 10, RV_EV_THREAD_EXITED, 0x5000);
  backend_.Stack(t0 + 2 * kMs, 10, RV_EV_SAMPLE, 0x5000, {111});  // stale current_th of a dead thread
  backend_.Stack(t0 + 3 * kMs, 10, RV_EV_SAMPLE, 0x6000, {0});    // nothing resolvable
  backend_.Stack(t0 + 4 * kMs, 10, RV_EV_SAMPLE, 0x6000, {444});
  Run(100 * kMs);
  EXPECT_EQ(agent_->samples(), 1u);
  EXPECT_EQ(agent_->unsymbolized(), 1u);
  agent_->UpdateMetrics();
  EXPECT_NE(metrics_.RenderPrometheus().find("rvbpfd_dropped_total{reason=\"unsymbolized\"} 1"), std::string::npos);
}

TEST_F(AgentTest, GvlBlameNamesTheMainThreadByItsTidAndTellsSinksItsSampleLabels) {
  StartAgent();
  const uint64_t t0 = clock_.mono;
  // Process 10: the thread on tid 10 (main) holds the GVL running m111 while thread 0x2000 (tid 11) waits 30 ms.
  backend_.Record(t0 + 1 * kMs, 10, RV_EV_THREAD_RESUMED, 0x1000, 10);
  backend_.Record(t0 + 2 * kMs, 10, RV_EV_THREAD_READY, 0x2000, 11);
  backend_.Stack(t0 + 10 * kMs, 10, RV_EV_SAMPLE, 0x1000, {111}, 0, 10);
  backend_.Stack(t0 + 32 * kMs, 10, RV_EV_THREAD_SUSPENDED, 0x1000, {111}, 0, 10);
  backend_.Record(t0 + 32 * kMs, 10, RV_EV_THREAD_RESUMED, 0x2000, 11);
  Run(2 * kS);
  std::vector<ProfileUpload> blame = UploadsFor(10, "gvl_blame");
  ASSERT_EQ(blame.size(), 1u);
  EXPECT_EQ(blame[0].sample_label_names,
            (std::vector<std::string>{"holder", "waiter", "blame_source", "provenance", "endpoint"}));
  EXPECT_EQ(UploadsFor(10, "cpu").at(0).sample_label_names, std::vector<std::string>{"endpoint"});
  const std::string pb = Gunzip(blame[0].pprof_gz);
  EXPECT_NE(pb.find("m111"), std::string::npos);
  EXPECT_NE(pb.find("main"), std::string::npos);       // the holder
  EXPECT_NE(pb.find("Thread #2"), std::string::npos);  // the waiter
  EXPECT_NE(pb.find("sampled"), std::string::npos);
}

// A contended READY carries the holder and its stack (RV_REC_HAS_HOLDER): without any sample, the pushed gvl_blame
// names what the holder ran when the wait began (m222), not the stack it released the GVL with (m111).
TEST_F(AgentTest, GvlBlameNamesTheHolderStackAContendedReadyCarried) {
  AgentConfig no_stacks = config_;
  no_stacks.stacks = "off";
  EXPECT_EQ(Agent::ProbeConfig(no_stacks).holder_stacks, 0u);
  EXPECT_EQ(Agent::ProbeConfig(config_).holder_stacks, 1u) << "contended READYs carry the holder's stack";
  StartAgent();
  const uint64_t t0 = clock_.mono;
  rv_gvl_reading holder{};
  holder.holder = 0x1000;
  backend_.Record(t0 + 1 * kMs, 10, RV_EV_THREAD_RESUMED, 0x1000, 10);
  backend_.Stack(t0 + 2 * kMs, 10, RV_EV_THREAD_READY, 0x2000, {222}, 0, 11, holder);
  backend_.Stack(t0 + 32 * kMs, 10, RV_EV_THREAD_SUSPENDED, 0x1000, {111}, 0, 10);
  backend_.Record(t0 + 32 * kMs, 10, RV_EV_THREAD_RESUMED, 0x2000, 11);
  Run(2 * kS);
  std::vector<ProfileUpload> blame = UploadsFor(10, "gvl_blame");
  ASSERT_EQ(blame.size(), 1u);
  const std::string pb = Gunzip(blame[0].pprof_gz);
  EXPECT_NE(pb.find("m222"), std::string::npos);
  EXPECT_NE(pb.find("contention"), std::string::npos);
  EXPECT_EQ(pb.find("release_stack"), std::string::npos) << "the release stack covers nothing after the observation";
  // The READY's stack was the holder's: the waiter's own wait is not placed there.
  std::vector<ProfileUpload> wait = UploadsFor(10, "gvl_wait");
  ASSERT_EQ(wait.size(), 1u);
  EXPECT_EQ(Gunzip(wait[0].pprof_gz).find("m222"), std::string::npos);
}

TEST_F(AgentTest, ReloadDropsProcessesTheNewRulesExcludeAndPicksUpNewMatches) {
  config_.exclude = {"label:service=billing"};
  StartAgent();
  EXPECT_EQ(agent_->watched_pids(), (std::vector<int>{10, 11}));
  AgentConfig next = config_;
  next.exclude = {"comm:puma"};
  backend_.Stack(clock_.mono + 5 * kMs, 11, RV_EV_SAMPLE, 0x1000, {111});
  Run(100 * kMs);
  ASSERT_TRUE(agent_->Reload(next).ok());
  EXPECT_EQ(agent_->watched_pids(), (std::vector<int>{10, 20}));
  EXPECT_FALSE(backend_.pids.count(11));
  EXPECT_TRUE(backend_.pids.count(20));
  EXPECT_EQ(UploadsFor(11).size(), 1u);  // its partial interval was submitted
  EXPECT_EQ(sinks_made_, 1);             // sinks untouched
  next.output_dir = "elsewhere";
  ASSERT_TRUE(agent_->Reload(next).ok());
  EXPECT_EQ(sinks_made_, 2);
  EXPECT_EQ(agent_->config().output_dir, "elsewhere");
}

TEST_F(AgentTest, ReloadKeepsRestartOnlyKeysAndChangesTheInterval) {
  StartAgent();
  AgentConfig next = config_;
  next.hz = 99;
  next.interval_s = 5;
  const uint64_t before = agent_->next_cut_ns();
  ASSERT_TRUE(agent_->Reload(next).ok());
  EXPECT_EQ(agent_->config().hz, 19);
  EXPECT_EQ(agent_->config().interval_s, 5);
  EXPECT_EQ(agent_->next_cut_ns(), before + 3 * kS);
  EXPECT_NE(log_text_.str().find("need a restart"), std::string::npos);
}

TEST_F(AgentTest, TheBudgetPausesTheHighRateSitesOfABusyBinaryAndResumesThem) {
  StartAgent();
  Run(50 * kMs);
  // 40,000 hand-offs by one process: 60 ms of estimated traps (1.5 us each), more than a 1 s window's 5% (50 ms).
  for (int i = 0; i < 40000; ++i) backend_.Record(clock_.mono + 1 * kMs, 10, RV_EV_THREAD_RESUMED, 0x1000);
  Run(Agent::kBudgetCheckNs + 50 * kMs);  // the next budget check
  const ProbeSet* host = agent_->process(10)->set;
  EXPECT_TRUE(host->paused);
  EXPECT_FALSE(backend_.GroupAttached(host->high_group));
  EXPECT_TRUE(backend_.GroupAttached(host->low_group));
  EXPECT_TRUE(backend_.GroupAttached(agent_->process(20)->set->high_group));  // other binaries are not paused
  Run(20 * kS);
  EXPECT_FALSE(host->paused);
  EXPECT_TRUE(backend_.GroupAttached(host->high_group));
}

TEST_F(AgentTest, TheBudgetCountsEachProcesssTrapsIncludingThoseThatBecameNoRecord) {
  // IO#write in a shared libruby enters rb_mutex_lock, whose site BPF discards by caller: traps with no record.
  AddRuby(11, "host", "ruby");  // a second process of pid 10's binary
  StartAgent();
  Run(50 * kMs);
  const ProbeSet* host = agent_->process(10)->set;
  ASSERT_EQ(agent_->process(11)->set, host);
  backend_.DiscardedTraps(10, 40000);  // 60 ms of estimated traps, and not one record
  Run(Agent::kBudgetCheckNs + 50 * kMs);  // the next budget check
  EXPECT_TRUE(host->paused);
  EXPECT_FALSE(backend_.GroupAttached(host->high_group));
  Run(20 * kS);
  ASSERT_FALSE(host->paused);
  // The budget is each process's: two processes at 2.9% each (390 x 1.5 us per 20 ms) stay under 5% for three 1 s
  // budget windows (summed, 5.9% would have paused within the first).
  for (int i = 0; i < 150; ++i) {
    backend_.DiscardedTraps(10, 390);
    backend_.DiscardedTraps(11, 390);
    Run(20 * kMs);
  }
  EXPECT_FALSE(host->paused);
  // ... and one of them at 7.8% alone does not.
  for (int i = 0; i < 150 && !host->paused; ++i) {
    backend_.DiscardedTraps(10, 1040);
    Run(20 * kMs);
  }
  EXPECT_TRUE(host->paused);
}

TEST_F(AgentTest, ColdAndSingleSteppedTrapsWeighInTheProcesssBudget) {
  StartAgent();
  Run(50 * kMs);
  const ProbeSet* host = agent_->process(10)->set;
  // 3.75% of each 20 ms at 1.5 us a hit (500 hits): under the 5% budget for two 1 s windows...
  for (int i = 0; i < 100; ++i) {
    backend_.DiscardedTraps(10, 500);
    Run(20 * kMs);
  }
  EXPECT_FALSE(host->paused);
  // ... but the same hits isolated (every one cold, +3 us) cost 11%: paused within a window...
  for (int i = 0; i < 75 && !host->paused; ++i) {
    backend_.DiscardedTraps(10, 500);
    backend_.ColdTraps(10, 500);
    Run(20 * kMs);
  }
  EXPECT_TRUE(host->paused);
  EXPECT_EQ(Agent::ProbeConfig(config_).cold_gap_ns, OverheadBudget::kColdGapNs);
  // ... and so do a few hits of a single-stepped site (10.5 us): 100 of them add 4.5% to 3.75%.
  Run(5 * kS);
  ASSERT_FALSE(host->paused);
  for (int i = 0; i < 75 && !host->paused; ++i) {
    backend_.DiscardedTraps(10, 500);
    backend_.SteppedTraps(10, 100);
    Run(20 * kMs);
  }
  EXPECT_TRUE(host->paused);
}

TEST_F(AgentTest, WhileTheGcSitesArePausedEveryStackIsNamedInANewGcEpoch) {
  // Cached frames are trusted within one GC epoch (GC_ENTER records): with GC paused by the budget, GCs go unseen.
  StartAgent();
  Run(50 * kMs);
  const ProbeSet* host = agent_->process(10)->set;
  backend_.Stack(clock_.mono + 1 * kMs, 10, RV_EV_SAMPLE, 0x1000, {111});
  backend_.Stack(clock_.mono + 2 * kMs, 10, RV_EV_SAMPLE, 0x1000, {111});
  Run(20 * kMs);
  ASSERT_EQ(resolve_epochs_.size(), 2u);
  EXPECT_EQ(resolve_epochs_[0], resolve_epochs_[1]) << "no GC seen, attached: the same epoch";
  backend_.DiscardedTraps(10, 40000);  // 60 ms of estimated traps: paused
  Run(Agent::kBudgetCheckNs + 50 * kMs);
  ASSERT_TRUE(host->paused);
  backend_.Stack(clock_.mono + 1 * kMs, 10, RV_EV_SAMPLE, 0x1000, {111});
  backend_.Stack(clock_.mono + 2 * kMs, 10, RV_EV_SAMPLE, 0x1000, {111});
  Run(20 * kMs);
  ASSERT_EQ(resolve_epochs_.size(), 4u);
  EXPECT_GT(resolve_epochs_[2], resolve_epochs_[1]);
  EXPECT_GT(resolve_epochs_[3], resolve_epochs_[2]) << "paused: every stack in a new epoch";
  Run(20 * kS);
  ASSERT_FALSE(host->paused);
  backend_.Stack(clock_.mono + 1 * kMs, 10, RV_EV_SAMPLE, 0x1000, {111});
  backend_.Stack(clock_.mono + 2 * kMs, 10, RV_EV_SAMPLE, 0x1000, {111});
  Run(20 * kMs);
  ASSERT_EQ(resolve_epochs_.size(), 6u);
  EXPECT_GT(resolve_epochs_[4], resolve_epochs_[3]) << "the resume starts a new epoch";
  EXPECT_EQ(resolve_epochs_[5], resolve_epochs_[4]) << "attached again: GCs are seen";
}

TEST_F(AgentTest, WaitsHiddenByABudgetPauseAreEstimatedFromTheSamplesGvlReadings) {
  EXPECT_EQ(Agent::ProbeConfig(config_).gvl_readings, 1u) << "sampling agents have samples read the GVL";
  AgentConfig no_samples = config_;
  no_samples.hz = 0;
  EXPECT_EQ(Agent::ProbeConfig(no_samples).gvl_readings, 0u);
  StartAgent();
  Run(50 * kMs);
  const ProbeSet* host = agent_->process(10)->set;
  const uint64_t t0 = clock_.mono;
  // Main (tid 10) holds the GVL; thread 0x2000 (tid 11) releases it and wants it back at t0 + 3 ms.
  backend_.Record(t0 + 1 * kMs, 10, RV_EV_THREAD_RESUMED, 0x1000, 10);
  backend_.Record(t0 + 2 * kMs, 10, RV_EV_THREAD_SUSPENDED, 0x2000, 11);
  backend_.Record(t0 + 3 * kMs, 10, RV_EV_THREAD_READY, 0x2000, 11);
  backend_.DiscardedTraps(10, 40000);  // 60 ms of estimated traps: paused at the next check
  Run(Agent::kBudgetCheckNs + 50 * kMs);
  ASSERT_TRUE(host->paused);
  // Paused: no scheduler event, but main's samples read the GVL, 0x2000 queued for it.
  rv_gvl_reading g{};
  g.holder = 0x1000;
  g.waiting = 1;
  g.nqueued = 1;
  g.queued[0] = 0x2000;
  const uint64_t t1 = clock_.mono;
  for (uint64_t i = 1; i <= 10; ++i) backend_.Stack(t1 + i * 10 * kMs, 10, RV_EV_SAMPLE, 0x1000, {111}, 0, 10, g);
  backend_.counters.gvl_readings = 10;
  Run(20 * kS);
  ASSERT_FALSE(host->paused);
  backend_.Record(clock_.mono + 1 * kMs, 10, RV_EV_THREAD_RESUMED, 0x2000, 11);  // its wait ends
  Run(3 * kS);
  bool inferred = false;
  for (const ProfileUpload& u : UploadsFor(10, "gvl_blame")) {
    const std::string pb = Gunzip(u.pprof_gz);
    if (pb.find("inferred") == std::string::npos) continue;
    inferred = true;
    EXPECT_NE(pb.find("m111"), std::string::npos) << "the estimate is blamed on what main ran";
    EXPECT_NE(pb.find("main"), std::string::npos);
    EXPECT_NE(pb.find("estimated from the samples' GVL readings"), std::string::npos);
  }
  EXPECT_TRUE(inferred) << "no gvl_blame upload holds an estimate";
  bool wait_inferred = false;
  for (const ProfileUpload& u : UploadsFor(10, "gvl_wait")) {
    wait_inferred = wait_inferred || Gunzip(u.pprof_gz).find("inferred") != std::string::npos;
  }
  EXPECT_TRUE(wait_inferred) << "no gvl_wait upload holds the estimated wait";
  agent_->UpdateMetrics();
  EXPECT_NE(metrics_.RenderPrometheus().find("rvbpfd_gvl_readings_total 10"), std::string::npos);
}

TEST_F(AgentTest, AWatchedProcessKeepsNoCopyOfItsVmBinary) {
  StartAgent();
  ASSERT_NE(agent_->process(10), nullptr);
  // Discovery's parse (the whole file, in memory) served the set's preparation and is freed once attached.
  EXPECT_EQ(agent_->process(10)->target.vm_elf, nullptr);
  EXPECT_EQ(agent_->process(20)->target.vm_elf, nullptr);
}

TEST_F(AgentTest, ABudgetPauseComesAfterTheEventsStillInTheReorderWindow) {
  StartAgent();
  Run(50 * kMs);
  const ProbeSet* host = agent_->process(10)->set;
  // To 50 ms before the last budget check ahead of the next interval cut: the pause it makes spans that cut.
  while (agent_->next_budget_check_ns() + Agent::kBudgetCheckNs < agent_->next_cut_ns() ||
         clock_.mono + 50 * kMs < agent_->next_budget_check_ns()) {
    Run(50 * kMs);
  }
  const uint64_t check = agent_->next_budget_check_ns();
  const uint64_t cut = agent_->next_cut_ns();
  backend_.Record(clock_.mono + 1 * kMs, 10, RV_EV_THREAD_RESUMED, 0x1000, 10);
  backend_.Record(clock_.mono + 2 * kMs, 10, RV_EV_THREAD_SUSPENDED, 0x2000, 11);
  // Wants the GVL 5 ms before the check that pauses: still in the reorder window when the sites are detached.
  backend_.Record(check - 5 * kMs, 10, RV_EV_THREAD_READY, 0x2000, 11);
  backend_.DiscardedTraps(10, 40000);
  clock_.mono = check;
  ASSERT_TRUE(agent_->RunOnce(0).ok());
  ASSERT_TRUE(host->paused);
  Run(cut + 10 * kMs - clock_.mono);
  ASSERT_TRUE(host->paused) << "the pause does not span the interval cut";
  Run(20 * kS);
  ASSERT_FALSE(host->paused);
  backend_.Record(clock_.mono + 1 * kMs, 10, RV_EV_THREAD_RESUMED, 0x2000, 11);
  Run(3 * kS);
  // The wait began before the pause, which ended it uncounted: no part of it before the interval cut is observed.
  EXPECT_TRUE(UploadsFor(10, "gvl_wait").empty()) << "the pause reached the profile before the earlier READY";
}

// Between ring reads (Agent::kDrainPeriodNs) the agent does not touch the ring unless BPF wakes it (the ring a
// quarter full): a record waits in the ring until the next read, and reaches its profile once it is older than the
// reorder window at that read. Reads fall on budget checks: the last one within a period of the previous read.
TEST_F(AgentTest, TheRingIsReadEveryDrainPeriodUnlessBpfWakesTheAgent) {
  drain_period_ns_ = std::nullopt;  // the agent's own period
  backend_.wake_at_queued = SIZE_MAX;
  const uint64_t start = clock_.mono;
  StartAgent();
  Run(50 * kMs);  // the first RunOnce reads the ring
  const uint64_t due = agent_->next_drain_ns();
  EXPECT_EQ((due - start) % Agent::kBudgetCheckNs, 0u) << "the read is not on a budget check";
  EXPECT_LE(due, clock_.mono + Agent::kDrainPeriodNs);
  EXPECT_GT(due + Agent::kBudgetCheckNs, clock_.mono + Agent::kDrainPeriodNs) << "not the last check in the period";
  ASSERT_LT(due + 100 * kMs, agent_->next_housekeeping_ns());  // no housekeeping drain in between
  const int consumes = backend_.consumes;
  backend_.Record(clock_.mono + 1 * kMs, 10, RV_EV_THREAD_RESUMED, 0x1000, 10);
  Run(due - 50 * kMs - clock_.mono);
  EXPECT_EQ(backend_.consumes, consumes) << "the ring was read before its period";
  EXPECT_EQ(agent_->events(), 0u);
  Run(100 * kMs);
  EXPECT_EQ(backend_.consumes, consumes + 1);
  EXPECT_EQ(agent_->events(), 1u);
  EXPECT_EQ(agent_->next_drain_ns(), due + Agent::kDrainPeriodNs);  // read at the step that reached `due`
  // BPF wakes the agent: the ring is read at once, whatever the period.
  backend_.wake_at_queued = 3;
  for (int i = 0; i < 3; ++i) backend_.Record(clock_.mono + 1 * kMs, 10, RV_EV_THREAD_SUSPENDED, 0x1000, 10);
  clock_.mono += 10 * kMs;
  ASSERT_TRUE(agent_->RunOnce(0).ok());
  EXPECT_EQ(backend_.consumes, consumes + 2);
}

// A budget pause between ring reads: the records stamped before it that are still in the ring reach the profile
// before the pause does (only what is older than the last read is released), so the wait a READY opened before the
// pause is ended by the pause, uncounted, as ABudgetPauseComesAfterTheEventsStillInTheReorderWindow has it.
TEST_F(AgentTest, ABudgetPauseBetweenRingReadsComesAfterTheRecordsStillInTheRing) {
  drain_period_ns_ = std::nullopt;
  backend_.wake_at_queued = SIZE_MAX;
  StartAgent();
  Run(50 * kMs);
  const ProbeSet* host = agent_->process(10)->set;
  // To a budget check that falls between two reads, with the pause it makes before the next interval cut.
  while (agent_->next_budget_check_ns() + Agent::kBudgetCheckNs >= agent_->next_cut_ns() ||
         agent_->next_budget_check_ns() + 20 * kMs >= agent_->next_drain_ns() ||
         clock_.mono + 50 * kMs < agent_->next_budget_check_ns()) {
    Run(50 * kMs);
  }
  const uint64_t check = agent_->next_budget_check_ns();
  const uint64_t read = agent_->next_drain_ns();
  ASSERT_GT(read, check);
  backend_.Record(check - 30 * kMs, 10, RV_EV_THREAD_RESUMED, 0x1000, 10);
  backend_.Record(check - 20 * kMs, 10, RV_EV_THREAD_SUSPENDED, 0x2000, 11);
  backend_.Record(check - 5 * kMs, 10, RV_EV_THREAD_READY, 0x2000, 11);
  backend_.DiscardedTraps(10, 40000);
  const int consumes = backend_.consumes;
  clock_.mono = check;
  ASSERT_TRUE(agent_->RunOnce(0).ok());
  ASSERT_TRUE(host->paused);
  ASSERT_EQ(backend_.consumes, consumes) << "the pause was not made between two reads";
  // Past the reorder window of the pause, still before the next read. Released up to now, the pause would reach the
  // profile here, before the READY still in the ring (which would then arrive late).
  clock_.mono = check + Agent::kReorderWindowNs + 10 * kMs;
  ASSERT_LT(clock_.mono, read);
  ASSERT_TRUE(agent_->RunOnce(0).ok());
  Run(20 * kS);
  ASSERT_FALSE(host->paused);
  backend_.Record(clock_.mono + 1 * kMs, 10, RV_EV_THREAD_RESUMED, 0x2000, 11);
  Run(3 * kS);
  EXPECT_EQ(agent_->late_records(), 0u);
  EXPECT_TRUE(UploadsFor(10, "gvl_wait").empty()) << "the pause reached the profile before the earlier READY";
}

// A quiet agent sleeps until its next timed work: a ring read, a budget check, a cut or the housekeeping, and wakes
// every Agent::kShortWaitNs only while a new process's EC route is pending (an exec'd pid: at its next inspection).
TEST_F(AgentTest, TheLoopWaitsUntilItsNextTimedWork) {
  drain_period_ns_ = std::nullopt;
  backend_.wake_at_queued = SIZE_MAX;
  StartAgent();
  int wakeups = 0;
  int longest_ms = 0;
  // With `late`, each wait ends 1-4 ms after it was due, varying, as a real poll does (scheduling latency).
  auto run_as_main = [&](uint64_t ns, bool late = false) {
    const uint64_t end = clock_.mono + ns;
    while (clock_.mono < end) {
      const int wait_ms = agent_->NextWaitMs(clock_.mono, Agent::kPollMs);
      longest_ms = std::max(longest_ms, wait_ms);
      ASSERT_GE(wait_ms, 0);
      ASSERT_LE(wait_ms, Agent::kPollMs);
      const uint64_t now = clock_.mono;
      const uint64_t due = std::min({agent_->next_drain_ns(), agent_->next_budget_check_ns(),
                                     agent_->next_cut_ns(), agent_->next_housekeeping_ns()});
      // Never past the earliest due work (rounded up to a whole ms).
      ASSERT_LE(now + static_cast<uint64_t>(wait_ms) * kMs, std::max(due, now) + kMs - 1);
      clock_.mono += std::max(wait_ms, 1) * kMs + (late ? static_cast<uint64_t>(1 + wakeups % 4) * kMs : 0);
      ASSERT_TRUE(agent_->RunOnce(0).ok());
      ++wakeups;
    }
  };
  // Processes attached less than kEcEagerNs ago have their EC routes retried: short waits only.
  run_as_main(Agent::kEcEagerNs - 100 * kMs);
  EXPECT_LE(static_cast<uint64_t>(longest_ms) * kMs, Agent::kShortWaitNs);
  run_as_main(1 * kS);
  // Steady: budgets checked every kBudgetCheckNs, and the ring reads, the housekeeping and the cuts (a whole number of
  // checks apart) fall on those checks: nothing else wakes it.
  wakeups = 0;
  longest_ms = 0;
  const uint64_t steady = clock_.mono;
  backend_.Record(clock_.mono + 1 * kMs, 10, RV_EV_THREAD_RESUMED, 0x1000, 10);
  const int consumes = backend_.consumes;
  run_as_main(10 * kS, /*late=*/true);
  const uint64_t seconds = (clock_.mono - steady) / kS;
  const uint64_t most = seconds * (kS / Agent::kBudgetCheckNs) + 2;
  EXPECT_LE(static_cast<uint64_t>(wakeups), most) << "woke more often than its budget checks";
  // The ring is read at every third check (kDrainPeriodNs), and once more at each housekeeping and cut.
  EXPECT_LE(static_cast<uint64_t>(backend_.consumes - consumes),
            seconds * (kS / Agent::kDrainPeriodNs + 2 * kS / Agent::kHousekeepingNs) + 4);
  EXPECT_GE(static_cast<uint64_t>(wakeups), seconds * (kS / Agent::kBudgetCheckNs));
  EXPECT_GT(static_cast<uint64_t>(longest_ms) * kMs, Agent::kShortWaitNs);
  EXPECT_EQ(agent_->events(), 1u);
  // An exec'd pid awaiting inspection (a Ruby whose libruby is not mapped yet): the loop wakes for its attempts,
  // each when due (not before kShortWaitNs from the last wakeup), and in between only for its own timed work.
  const std::string exe = proc_.AddExe("host", "ruby");
  proc_.AddProcess(77, "ruby", "host", exe, {});
  backend_.Record(clock_.mono + 1 * kMs, 77, RV_EV_PROC_EXEC);
  backend_.wake_at_queued = 1;
  clock_.mono += 50 * kMs;
  ASSERT_TRUE(agent_->RunOnce(0).ok());
  clock_.mono += 50 * kMs;
  ASSERT_TRUE(agent_->RunOnce(0).ok());  // released past the reorder window: the exec is scheduled
  ASSERT_GT(agent_->retries().size(), 0u);
  int attempts_due = 0;
  while (agent_->retries().size() > 0) {
    const std::optional<uint64_t> retry = agent_->retries().next_due_ns();
    ASSERT_TRUE(retry.has_value());
    const uint64_t now = clock_.mono;
    const uint64_t wait_ns = static_cast<uint64_t>(agent_->NextWaitMs(now, Agent::kPollMs)) * kMs;
    const uint64_t due = std::min({agent_->next_drain_ns(), agent_->next_budget_check_ns(), agent_->next_cut_ns(),
                                   agent_->next_housekeeping_ns(), std::max(*retry, now + Agent::kShortWaitNs)});
    ASSERT_LE(now + wait_ns, std::max(due, now) + kMs - 1) << "slept past the pid's next attempt";
    ASSERT_GE(now + wait_ns + kMs, due) << "woke before anything was due";
    attempts_due += *retry <= now + wait_ns ? 1 : 0;
    clock_.mono += std::max<uint64_t>(wait_ns, kMs);
    ASSERT_TRUE(agent_->RunOnce(0).ok());
  }
  EXPECT_GE(attempts_due, static_cast<int>(ExecRetrySchedule::kDelaysNs.size()) - 1);
}

TEST_F(AgentTest, DroppedRecordsTriggerARescanThatFindsProcessesWhoseExecWasLost) {
  StartAgent();
  AddRuby(40, "host", "ruby");
  backend_.counters.dropped = 3;
  Run(Agent::kMinRescanGapNs + 100 * kMs);
  EXPECT_NE(agent_->process(40), nullptr);
  agent_->UpdateMetrics();
  EXPECT_NE(metrics_.RenderPrometheus().find("rvbpfd_dropped_total{reason=\"ring_full_events\"} 3"),
            std::string::npos);
}

TEST_F(AgentTest, ShutdownSubmitsTheLastPartialIntervalAndFlushes) {
  StartAgent();
  backend_.Stack(clock_.mono + 5 * kMs, 10, RV_EV_SAMPLE, 0x1000, {111});
  Run(700 * kMs);
  EXPECT_TRUE(agent_->Shutdown(std::chrono::milliseconds(100)));
  ASSERT_EQ(UploadsFor(10).size(), 1u);
  EXPECT_EQ(sink_->flushes, 1);
  const std::string m = metrics_.RenderPrometheus();
  EXPECT_NE(m.find("rvbpfd_profiles_built_total 1"), std::string::npos) << m;
  EXPECT_NE(m.find("rvbpfd_agent_rss_bytes"), std::string::npos) << m;
}

TEST_F(AgentTest, ItsOwnUsageIsReadOnlyWhenTheMetricsAreRendered) {
  StartAgent();
  backend_.Stack(clock_.mono + 5 * kMs, 10, RV_EV_SAMPLE, 0x1000, {111});
  Run(5 * Agent::kHousekeepingNs);  // five housekeepings, which update the other metrics
  EXPECT_EQ(self_usage_reads_, 0);
  const std::string m = metrics_.RenderPrometheus();
  EXPECT_EQ(self_usage_reads_, 1);
  EXPECT_NE(m.find("rvbpfd_agent_cpu_seconds_total 1.5\n"), std::string::npos) << m;
  EXPECT_NE(m.find("rvbpfd_agent_rss_bytes 10485760\n"), std::string::npos) << m;
  EXPECT_NE(m.find("rvbpfd_samples_total 1\n"), std::string::npos) << m;
}

TEST_F(AgentTest, AgentNeedsASink) {
  AgentEnv env;
  env.backend = &backend_;
  env.clock = &clock_;
  env.preparer = [](const std::string&, const std::string& v, std::shared_ptr<ElfFile>,
                     std::shared_ptr<const FileFd>) -> Result<PreparedBinary> { return FakePrepared(v); };
  env.make_sinks = [](const AgentConfig&) -> Result<AgentSinks> { return AgentSinks{}; };
  Result<std::unique_ptr<Agent>> a = Agent::Create(config_, env);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.error().code(), ErrorCode::kUsage);
}

TEST_F(AgentTest, AProcessWhoseMemoryDoesNotMatchItsBinarysLayoutIsSkippedLoggedOnceAndCounted) {
  layout_ = FakeLayout();
  memory_[10] = FakeVmMemory(10);
  memory_[11] = FakeVmMemory(4711);  // its main thread's nt->tid is not its pid: the table does not fit this process
  memory_[20] = FakeVmMemory(20);
  StartAgent();
  EXPECT_EQ(agent_->watched_pids(), (std::vector<int>{10, 20}));
  EXPECT_EQ(backend_.pids, (std::set<uint32_t>{10, 20}));
  EXPECT_GE(memory_opened_, 3);
  const std::string log = log_text_.str();
  EXPECT_NE(log.find("its memory does not match its binary's analysis"), std::string::npos) << log;
  EXPECT_NE(log.find("is 4711, not the pid (11 in its pid namespace)"), std::string::npos) << log;
  agent_->UpdateMetrics();
  std::string m = metrics_.RenderPrometheus();
  EXPECT_NE(m.find("rvbpfd_processes_skipped_total{reason=\"layout\"} 1"), std::string::npos) << m;
  // Its records never reach a profile, and looking at it again logs and counts nothing new.
  backend_.Stack(clock_.mono + 5 * kMs, 11, RV_EV_SAMPLE, 0x1000, {111});
  backend_.Record(clock_.mono + 6 * kMs, 11, RV_EV_PROC_EXEC);
  Run(200 * kMs);
  EXPECT_EQ(agent_->process(11), nullptr);
  EXPECT_EQ(backend_.pids.count(11), 0u);
  agent_->UpdateMetrics();
  m = metrics_.RenderPrometheus();
  EXPECT_NE(m.find("rvbpfd_processes_skipped_total{reason=\"layout\"} 1"), std::string::npos) << m;
  size_t warnings = 0;
  for (size_t at = 0; (at = log_text_.str().find("is 4711, not the pid", at)) != std::string::npos; ++at) ++warnings;
  EXPECT_EQ(warnings, 1u);
}

TEST_F(AgentTest, AProcessAloneOnItsBinaryWithAMismatchLeavesNoProbesAttached) {
  layout_ = FakeLayout();
  proc_.Remove(10);
  proc_.Remove(11);
  memory_[20] = FakeVmMemory(21);  // the container's own libruby: its only process does not match
  StartAgent();
  EXPECT_TRUE(agent_->watched_pids().empty());
  EXPECT_EQ(agent_->probe_sets().active_sets(), 0u);
  EXPECT_EQ(backend_.attached_groups(), 0u);
}

TEST_F(AgentTest, AnExecdProcessWhoseVmIsStillStartingIsCheckedAgainAtTheNextAttempt) {
  layout_ = FakeLayout();
  memory_[10] = FakeVmMemory(10);
  memory_[11] = FakeVmMemory(11);
  memory_[20] = FakeVmMemory(20);
  StartAgent();
  AddRuby(30, "host", "ruby");
  memory_[30] = FakeVmMemory(30, /*main_thread=*/0);  // mapped, but ruby_setup has not set the main thread up yet
  backend_.Record(clock_.mono + 1 * kMs, 30, RV_EV_PROC_EXEC);
  Run(50 * kMs);  // the 20 ms inspection
  EXPECT_EQ(agent_->process(30), nullptr);
  EXPECT_TRUE(agent_->retries().contains(30));
  memory_[30] = FakeVmMemory(30);
  Run(60 * kMs);  // the 100 ms inspection
  ASSERT_NE(agent_->process(30), nullptr);
  EXPECT_TRUE(backend_.pids.count(30));
  agent_->UpdateMetrics();
  EXPECT_NE(metrics_.RenderPrometheus().find("rvbpfd_processes_skipped_total{reason=\"layout\"} 0"),
            std::string::npos);
  // One whose main thread never appears (a threads.main offset that reads a field staying NULL) is refused at the
  // last attempt, 2 s after its exec, and counted.
  AddRuby(31, "host", "ruby");
  memory_[31] = FakeVmMemory(31, /*main_thread=*/0);
  backend_.Record(clock_.mono + 1 * kMs, 31, RV_EV_PROC_EXEC);
  Run(1900 * kMs);
  EXPECT_EQ(agent_->process(31), nullptr);
  EXPECT_TRUE(agent_->retries().contains(31));
  Run(200 * kMs);
  EXPECT_EQ(agent_->process(31), nullptr);
  EXPECT_FALSE(agent_->retries().contains(31));
  EXPECT_NE(log_text_.str().find("process 31 does not match the layout rvbpfd derived: its main thread is not set up"),
            std::string::npos)
      << log_text_.str();
  agent_->UpdateMetrics();
  EXPECT_NE(metrics_.RenderPrometheus().find("rvbpfd_processes_skipped_total{reason=\"layout\"} 1"),
            std::string::npos);
}

}  // namespace
}  // namespace rvbpfd

namespace rvbpfd {
namespace {

// Hostile processes against the memory budget: each of three processes has kFrames distinct ISEQ frames whose labels
// and paths are 4 KB (the symbolizer keeps 1 KiB of each, marked) and samples them 64 deep, a different slice each
// time. Their frames are named by real StackResolvers over fake memories. With a 4 MiB budget (a share of ~1.3 MiB
// per process) the caches, ~4.5 MB each unbounded, are evicted, and the bytes they hold together (with the stack
// tables) never pass the budget.
class AgentMemoryBudgetTest : public AgentTest {
 protected:
  static constexpr size_t kFrames = 2000;
  static constexpr size_t kText = 4096;
  static constexpr uint64_t kHeap = 0x100000000;

  void BuildMemory(int pid) {
    auto off = RubyOffsets::ForVersion(3, 4);
    ASSERT_TRUE(off.ok());
    offsets_ = off.value();
    testing::FakeMemory& m = fake_mem_[pid];
    m.Map(kHeap, kFrames * (2 * (kText + 48) + 1024));
    testing::SyntheticObjects objects(&m, kHeap);
    auto string = [&](const std::string& s) {
      const uint64_t str = objects.Alloc(24 + s.size() + 1);
      m.Put64(str, 0x05);  // T_STRING, embedded
      m.Put64(str + 16, s.size());
      m.Put(str + 24, s.data(), s.size());
      return str;
    };
    for (size_t i = 0; i < kFrames; ++i) {
      const std::string n = std::to_string(pid) + "_" + std::to_string(i) + "_";
      const uint64_t label = string("m" + n + std::string(kText, 'x'));
      const uint64_t path = string("/srv/p" + n + std::string(kText, 'p'));
      frames_[pid].push_back(objects.TopIseqFrame(offsets_, label, path));
    }
  }

  // What the per-process caches hold now, by their own accounts (not the budget's counter).
  size_t RealHeld() {
    size_t total = 0;
    for (int pid : agent_->watched_pids()) {
      const WatchedProcess* p = agent_->process(pid);
      if (p->frames) total += p->frames->cache_bytes();
      total += p->profile->stack_table().approx_memory_bytes();
    }
    return total;
  }

  std::map<int, testing::FakeMemory> fake_mem_;
  std::map<int, std::vector<rv_ruby_frame>> frames_;
  RubyOffsets offsets_;
};

TEST_F(AgentMemoryBudgetTest, HostileFramesStayWithinTheBudgetAndAreEvicted) {
  config_.memory_budget = 4u << 20;
  for (int pid : {10, 11, 20}) BuildMemory(pid);
  frame_source_override_ = [this](int pid) {
    return MakeResolverFrameSource(
        std::make_unique<StackResolver>(std::make_unique<testing::FakeMemory>(fake_mem_[pid]), offsets_, 0));
  };
  StartAgent();
  ASSERT_EQ(agent_->watched_pids(), (std::vector<int>{10, 11, 20}));
  size_t peak = 0;
  for (size_t step = 0; step < 120; ++step) {
    for (int pid : {10, 11, 20}) {
      std::vector<rv_ruby_frame> stack;
      for (size_t j = 0; j < 64; ++j) stack.push_back(frames_[pid][(step * 64 + j * 7) % kFrames]);
      backend_.StackFrames(clock_.mono + 1 * kMs, static_cast<uint32_t>(pid), RV_EV_SAMPLE, 0x1000, stack);
    }
    Run(50 * kMs);
    const size_t held = RealHeld();
    peak = std::max(peak, held);
    ASSERT_LE(held, config_.memory_budget) << "at step " << step;
    ASSERT_LE(agent_->memory_budget().held(), config_.memory_budget);
  }
  EXPECT_GT(peak, config_.memory_budget / 4) << "the caches did fill their shares";
  EXPECT_GT(agent_->memory_budget().evictions(), 0u);
  agent_->UpdateMetrics();
  const std::string text = metrics_.RenderPrometheus();
  EXPECT_NE(text.find("rvbpfd_memory_budget_bytes 4194304"), std::string::npos) << text;
  EXPECT_NE(text.find("rvbpfd_memory_evictions_total"), std::string::npos);
  EXPECT_NE(text.find("rvbpfd_memory_held_bytes"), std::string::npos);
  // Profiles still come, with every frame named as the target names it (evicted frames were named again), cut to
  // the label bound and marked.
  for (int pid : {10, 11, 20}) {
    std::vector<ProfileUpload> cpu = UploadsFor(pid);
    ASSERT_FALSE(cpu.empty()) << pid;
    const std::string pb = Gunzip(cpu[0].pprof_gz);
    EXPECT_NE(pb.find("m" + std::to_string(pid) + "_"), std::string::npos) << pid;
    EXPECT_NE(pb.find(std::string(kTruncatedMark)), std::string::npos) << pid;
    for (int other : {10, 11, 20}) {
      if (other != pid) EXPECT_EQ(pb.find("m" + std::to_string(other) + "_"), std::string::npos) << pid;
    }
  }
}

}  // namespace
}  // namespace rvbpfd
