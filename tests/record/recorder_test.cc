// The recorder's pipeline from an analysed target on (record/recording.h), driven with the fake probe backend, a
// settable clock, an eventfd standing for the target's pidfd and a fake target memory for its stacks: no BPF, no
// root, no Ruby (launch mode runs a real shell command). Each test scripts what
// the kernel side does as the clock advances (the fake's Poll advances it by the poll's timeout, as a wait would)
// and reads the written .rvtrace back.
#include "record/recording.h"

#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "elf/elf_fixtures.h"
#include "probe/fake_probe_backend.h"
#include "rvbpfd/abi.h"
#include "stacks/fake_memory.h"
#include "stacks/synthetic_objects.h"
#include "trace/event.h"
#include "trace/reader.h"

namespace rvbpfd {
namespace {

using testing::FakeProbeBackend;
using testing::TempDir;

constexpr uint64_t kMs = 1'000'000;
constexpr uint64_t kStartNs = 1'000'000'000'000;  // the fake monotonic clock at the start: 1000 s after boot
const std::string kVmPath = "/fake/usr/lib/libruby.so.3.3.8";
// The prepared binary's sites: two that stay attached (thread start/exit) and three high-rate ones that
// --max-overhead pauses. Cookies follow attach order: 0-1 low, 2-4 high.
constexpr uint64_t kStartedSite = 0x100, kExitedSite = 0x180;
constexpr uint64_t kResumedSite = 0x300, kSuspendedSite = 0x400, kGcEnterSite = 0x500;
constexpr int kLowGroup = 0, kHighGroup = 1;

// The recording owns its backend; this one lends it the test's fake, so the fake outlives the recording.
class BackendRef : public ProbeBackend {
 public:
  explicit BackendRef(FakeProbeBackend* fake) : f_(fake) {}
  void SetHandlers(RecordHandler on_record, StackHandler on_stack) override {
    f_->SetHandlers(std::move(on_record), std::move(on_stack));
  }
  Result<uint8_t> AddBinary(const rv_offsets& offsets) override { return f_->AddBinary(offsets); }
  Status RemoveBinary(uint8_t binary) override { return f_->RemoveBinary(binary); }
  BpfSession::SlotUsage slot_usage() const override { return f_->slot_usage(); }
  Status SetWalkConfig(uint8_t binary, const rv_walk_config& config) override {
    return f_->SetWalkConfig(binary, config);
  }
  using ProbeBackend::AttachGroup;
  Result<int> AttachGroup(const std::string& path, const std::vector<SiteSpec>& sites, int pid) override {
    return f_->AttachGroup(path, sites, pid);
  }
  void DetachGroup(int group, std::span<const uint64_t> site_hits) override { f_->DetachGroup(group, site_hits); }
  void DetachGroup(int group) override { f_->DetachGroup(group); }
  Status ReattachGroup(int group, const std::string& path) override { return f_->ReattachGroup(group, path); }
  bool GroupAttached(int group) const override { return f_->GroupAttached(group); }
  std::vector<uint64_t> GroupCookies(int group) const override { return f_->GroupCookies(group); }
  void ReleaseGroup(int group) override { f_->ReleaseGroup(group); }
  Status AddPid(uint32_t pid, const rv_pidns& pidns,
                std::span<const std::pair<uint32_t, uint32_t>> threads) override {
    return f_->AddPid(pid, pidns, threads);
  }
  Status RemovePid(uint32_t pid) override { return f_->RemovePid(pid); }
  Status StartSampling(int hz) override { return f_->StartSampling(hz); }
  Status WatchProcesses() override { return f_->WatchProcesses(); }
  ProcessEcInstaller::State PollEc(ProcessEcInstaller& installer) override { return f_->PollEc(installer); }
  Result<bool> Wait(int timeout_ms) override { return f_->Wait(timeout_ms); }
  Result<int> Consume() override { return f_->Consume(); }
  void WakePollOn(int fd) override { f_->WakePollOn(fd); }
  rv_counters ReadCounters() const override { return f_->ReadCounters(); }
  std::vector<uint64_t> ReadSiteHits() const override { return f_->ReadSiteHits(); }
  std::optional<rv_pid_traps> PidTraps(uint32_t pid) const override { return f_->PidTraps(pid); }
  bool uses_multi_links() const override { return f_->uses_multi_links(); }

 private:
  FakeProbeBackend* f_;
};

std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

ProbeSite Site(uint64_t offset, uint8_t event) {
  ProbeSite s;
  s.file_offset = offset;
  s.event = event;
  s.function = "f" + std::to_string(offset);
  return s;
}

class RecorderTest : public ::testing::Test {
 protected:
  struct Open {
    SessionOptions options;
    bool on_main_thread;
  };

  void SetUp() override {
    exit_event_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    ASSERT_GE(exit_event_, 0);
    pid_ = static_cast<uint32_t>(getpid());
    options_.pid = getpid();
    options_.output = dir_.Join("out.rvtrace");
    options_.quiet = true;
    options_.stacks = "off";
    options_.hz = 0;
    options_.duration_s = 30;  // a safety net: every test ends sooner

    const std::thread::id main_thread = std::this_thread::get_id();
    env_.open_backend = [this, main_thread](const SessionOptions& so) -> Result<std::unique_ptr<ProbeBackend>> {
      std::lock_guard<std::mutex> l(opens_mu_);
      opens_.push_back(Open{so, std::this_thread::get_id() == main_thread});
      return std::unique_ptr<ProbeBackend>(new BackendRef(&fake_));
    };
    env_.monotonic_ns = [this] { return now_; };
    env_.thread_cpu_ns = [] { return uint64_t{0}; };
    env_.open_exit_fd = [this](int pid) {
      exit_fd_pid_ = pid;
      exit_fd_ = dup(exit_event_);
      return exit_fd_;
    };
    env_.hand_off_release = [this] {
      ++hand_offs_;
      return false;
    };
    env_.stop_requested = &stop_;
    env_.make_stack_resolver = [this](int pid, const std::string& /*vm_path*/, const StackSetup& setup) {
      resolver_pid_ = pid;
      auto mem = std::make_unique<testing::FakeMemory>(target_memory_);
      memory_ = mem.get();
      return std::make_unique<StackResolver>(std::move(mem), setup.offsets, 0);
    };
    fake_.before_poll = [this](int timeout_ms) {
      if (timeout_ms > 0) now_ += static_cast<uint64_t>(timeout_ms) * kMs;
      // Ends a loop that a broken stop condition would keep running; the tests then fail on the stop reason.
      if (++steps_ > 100'000) stop_.store(true);
      if (script_) script_(now_ - kStartNs);
    };

    target_.pid = getpid();
    target_.vm_path = kVmPath;
    target_.open_path = kVmPath;
    target_.ruby_version = "3.3.8";
    target_.build_id = "0123456789abcdef";
    prepared_.sites.ruby_version = "3.3.8";
    prepared_.sites.sites = {Site(kStartedSite, RV_EV_THREAD_STARTED), Site(kExitedSite, RV_EV_THREAD_EXITED),
                             Site(kResumedSite, RV_EV_THREAD_RESUMED), Site(kSuspendedSite, RV_EV_THREAD_SUSPENDED),
                             Site(kGcEnterSite, RV_EV_GC_ENTER)};
  }
  void TearDown() override { close(exit_event_); }

  // Runs the recording to its end (the script decides when) and reads its trace back.
  Result<int> Run() {
    Result<int> r = RecordAnalysedTarget(options_, env_, target_, prepared_);
    if (r.ok()) {
      Result<TraceFile> t = TraceReader::ReadFile(options_.output);
      EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().ToString());
      if (t.ok()) trace_ = std::move(t.value());
    }
    return r;
  }
  // Launch mode with a real shell command whose "VM" is the libc it maps; the script gives the command's first thread
  // event once it runs the program and has mapped that file (however slow the machine: the live check's 5 s limit is
  // on the fake clock). *command_pid is set once the command's pid was added to the BPF filter. False when this
  // machine has no /lib/x86_64-linux-gnu/libc.so.6 (the test skips).
  bool LaunchShellOnLibc(const std::string& shell_script, uint32_t* command_pid) {
    options_.command = {"/bin/sh", "-c", shell_script};
    options_.pid = 0;
    target_.pid = 0;
    std::error_code ec;
    target_.vm_path = target_.open_path = std::filesystem::canonical("/lib/x86_64-linux-gnu/libc.so.6", ec).string();
    if (ec) return false;
    options_.duration_s = 3600;  // the fake clock runs ahead of real time; the command's exit ends the recording
    *command_pid = 0;
    script_ = [this, command_pid, started = false](uint64_t) mutable {
      usleep(1000);  // real time passes for the command: ~1 ms a poll
      if (*command_pid == 0 && !fake_.pids.empty()) *command_pid = *fake_.pids.begin();
      if (*command_pid != 0 && !started &&
          ReadFileOrEmpty("/proc/" + std::to_string(*command_pid) + "/maps").find(target_.open_path) !=
              std::string::npos) {
        started = true;
        fake_.Record(now_ + 1 * kMs, *command_pid, RV_EV_THREAD_STARTED, 0x5000);
      }
    };
    return true;
  }
  // A record the target's probes took at t_ns after the recording's origin.
  void Inject(uint64_t t_ns, uint16_t kind, uint64_t th) { fake_.Record(kStartNs + t_ns, pid_, kind, th); }
  void TargetExits() {
    const uint64_t one = 1;
    ASSERT_EQ(write(exit_event_, &one, sizeof(one)), static_cast<ssize_t>(sizeof(one)));
  }
  std::vector<TraceEvent> Events(EventName name) const {
    std::vector<TraceEvent> out;
    for (const TraceEvent& e : trace_.events) {
      if (e.event == name) out.push_back(e);
    }
    return out;
  }
  const TraceEvent* Stopped() const {
    for (const TraceEvent& e : trace_.events) {
      if (e.event == EventName::kTracingStopped) return &e;
    }
    return nullptr;
  }

  TempDir dir_;
  FakeProbeBackend fake_;
  RecorderEnv env_;
  RecordOptions options_;
  RecordTarget target_;
  PreparedBinary prepared_;
  uint32_t pid_ = 0;
  uint64_t now_ = kStartNs;
  int steps_ = 0;
  std::function<void(uint64_t t_ns)> script_;  // called at every poll with the time since the origin
  std::atomic<bool> stop_{false};
  int exit_event_ = -1;  // written when the target "exits"; the recording gets a dup of it as the target's pidfd
  int exit_fd_ = -1;
  int exit_fd_pid_ = 0;
  int hand_offs_ = 0;
  std::mutex opens_mu_;
  std::vector<Open> opens_;
  TraceFile trace_;
  // The target's memory as the stack resolver starts with it; memory_ is the resolver's own copy (valid while the
  // recording runs), which a script may change as the target would.
  testing::FakeMemory target_memory_;
  testing::FakeMemory* memory_ = nullptr;
  int resolver_pid_ = 0;
};

// With stacks: the 3.4 layout, and the target's heap holding two named top-level iseqs.
class RecorderStackTest : public RecorderTest {
 protected:
  static constexpr uint64_t kHeap = 0x800000;
  void SetUp() override {
    RecorderTest::SetUp();
    Result<RubyOffsets> o = RubyOffsets::ForVersion(3, 4);
    ASSERT_TRUE(o.ok());
    off_ = o.value();
    StackSetup setup;
    setup.offsets = off_;
    prepared_.stacks = setup;
    options_.stacks = "release";
    target_memory_.Map(kHeap, 0x10000);
    testing::SyntheticObjects objects(&target_memory_, kHeap);
    auto string = [&](const std::string& s) {  // an embedded T_STRING (3.4: length at +16, bytes at +24)
      const uint64_t str = objects.Alloc(24 + s.size() + 1);
      target_memory_.Put64(str, 0x05);
      target_memory_.Put64(str + 16, s.size());
      target_memory_.Put(str + 24, s.data(), s.size());
      return str;
    };
    main_ = objects.TopIseqFrame(off_, string("<main>"), string("/app/main.rb"));
    lib_ = objects.TopIseqFrame(off_, string("<top (required)>"), string("/app/lib.rb"));
  }
  // The frames of an event's stack in the trace, leaf first, as "label@path".
  std::vector<std::string> StackOf(const TraceEvent& e) const {
    std::vector<std::string> out;
    if (!e.stack) return out;
    for (uint32_t f : trace_.stacks.at(*e.stack)) {
      const FrameInfo& info = trace_.frames.at(f);
      out.push_back(info.label + "@" + info.path);
    }
    return out;
  }

  RubyOffsets off_;
  rv_ruby_frame main_{}, lib_{};
};

// The EC route cannot be installed (the backend refuses it, as BPF does when proc_ec is full): the recording goes on,
// says so once with the reason, and stops retrying; samples still find their thread through scheduler events.
TEST_F(RecorderStackTest, AnEcRouteTheBackendRefusesIsReportedOnceAndTheRecordingGoesOn) {
  options_.hz = 19;
  options_.quiet = false;
  fake_.ec_refusal = "writing proc_ec: No space left on device (errno 28)";
  bool injected = false;
  script_ = [&](uint64_t t) {
    if (!std::exchange(injected, true)) {
      fake_.StackFrames(kStartNs + 1 * kMs, pid_, RV_EV_THREAD_SUSPENDED, 0x5000, {lib_, main_});
      fake_.StackFrames(kStartNs + 2 * kMs, pid_, RV_EV_SAMPLE, 0x5000, {main_});
    }
    if (t >= 40 * kMs) TargetExits();
  };
  ::testing::internal::CaptureStderr();
  Result<int> r = Run();
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(fake_.ec_polls, 1) << "a refused route is not retried";
  const std::string warning = "rvbpfd: warning: samples find their thread only through scheduler events: " +
                              *fake_.ec_refusal + "\n";
  const size_t at = err.find(warning);
  EXPECT_NE(at, std::string::npos) << err;
  EXPECT_EQ(err.find(warning, at + 1), std::string::npos) << "the warning is given once: " << err;
  ASSERT_EQ(Events(EventName::kGvlReleased).size(), 1u);
  const std::vector<TraceEvent> samples = Events(EventName::kSample);
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_EQ(StackOf(samples[0]), std::vector<std::string>{"<main>@/app/main.rb"});
}

TEST_F(RecorderStackTest, StacksAreNamedFromTheTargetsMemoryAndMarkedWhenCutShort) {
  options_.hz = 19;
  bool injected = false;
  script_ = [&](uint64_t t) {
    if (!std::exchange(injected, true)) {
      fake_.StackFrames(kStartNs + 1 * kMs, pid_, RV_EV_THREAD_SUSPENDED, 0x5000, {lib_, main_});
      fake_.StackFrames(kStartNs + 2 * kMs, pid_, RV_EV_SAMPLE, 0x5000, {main_}, RV_REC_IN_GC);
      fake_.StackFrames(kStartNs + 3 * kMs, pid_, RV_EV_THREAD_SUSPENDED, 0x5000, {lib_}, 0, RV_STACK_F_TRUNCATED);
    }
    if (t >= 40 * kMs) TargetExits();
  };
  Result<int> r = Run();
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(resolver_pid_, getpid());
  EXPECT_EQ(fake_.sampling_hz, 19);
  EXPECT_GT(fake_.ec_polls, 0) << "samples find their thread through the EC route the recorder installs";
  const std::vector<TraceEvent> released = Events(EventName::kGvlReleased);
  ASSERT_EQ(released.size(), 2u);
  EXPECT_EQ(StackOf(released[0]), (std::vector<std::string>{"<top (required)>@/app/lib.rb", "<main>@/app/main.rb"}));
  EXPECT_FALSE(released[0].reason.empty()) << "a release's reason is derived from its stack and site";
  EXPECT_EQ(released[0].reason_provenance, Provenance::kDerived);
  EXPECT_EQ(StackOf(released[1]), (std::vector<std::string>{"<top (required)>@/app/lib.rb", "<truncated>@"}));
  const std::vector<TraceEvent> samples = Events(EventName::kSample);
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_EQ(StackOf(samples[0]), (std::vector<std::string>{std::string(kGcFrameLabel) + "@", "<main>@/app/main.rb"}));
}

TEST_F(RecorderStackTest, AGcBetweenTwoStacksMakesTheResolverLookAgain) {
  int step = 0;  // one step per poll: each stack is named at the poll that delivers it
  script_ = [&](uint64_t t) {
    switch (step++) {
      case 0:
        fake_.StackFrames(kStartNs + 1 * kMs, pid_, RV_EV_THREAD_SUSPENDED, 0x5000, {main_});
        break;
      case 1:
        // A GC freed the iseq and reused its slot for a String: a name cached before it must not be served.
        Inject(2 * kMs, RV_EV_GC_ENTER, 0x5000);
        Inject(3 * kMs, RV_EV_GC_EXIT, 0x5000);
        ASSERT_NE(memory_, nullptr);
        memory_->Put64(main_.addr, 0x05);
        break;
      case 2:
        fake_.StackFrames(kStartNs + 4 * kMs, pid_, RV_EV_THREAD_SUSPENDED, 0x5000, {main_});
        break;
      default:
        if (t >= 40 * kMs) TargetExits();
    }
  };
  Result<int> r = Run();
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  const std::vector<TraceEvent> released = Events(EventName::kGvlReleased);
  ASSERT_EQ(released.size(), 2u);
  EXPECT_EQ(StackOf(released[0]), (std::vector<std::string>{"<main>@/app/main.rb"}));
  ASSERT_EQ(StackOf(released[1]).size(), 1u);
  EXPECT_NE(StackOf(released[1])[0], "<main>@/app/main.rb");
  EXPECT_EQ(trace_.frames.at(trace_.stacks.at(*released[1].stack)[0]).kind, FrameKind::kUnresolved);
}

TEST_F(RecorderTest, AttachesBothGroupsToTheTargetAndWatchesItsExit) {
  script_ = [&](uint64_t t) {
    if (t >= 60 * kMs) TargetExits();
  };
  Result<int> r = Run();
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(*r, 0);
  ASSERT_EQ(fake_.groups.size(), 2u);
  EXPECT_EQ(fake_.groups[kLowGroup].path, kVmPath);
  EXPECT_EQ(fake_.groups[kLowGroup].pid, getpid());
  EXPECT_EQ(fake_.groups[kHighGroup].pid, getpid());
  ASSERT_EQ(fake_.groups[kLowGroup].sites.size(), 2u);
  ASSERT_EQ(fake_.groups[kHighGroup].sites.size(), 3u);
  EXPECT_EQ(fake_.groups[kHighGroup].sites[0].file_offset, kResumedSite);
  EXPECT_EQ(fake_.pids.count(pid_), 1u);
  // The target's pidfd wakes the ring's poll.
  EXPECT_EQ(exit_fd_pid_, getpid());
  ASSERT_EQ(fake_.wake_fds.size(), 1u);
  EXPECT_EQ(fake_.wake_fds[0], exit_fd_);
  EXPECT_GE(exit_fd_, 0);
  EXPECT_EQ(trace_.header.pid, getpid());
  EXPECT_EQ(trace_.header.ruby_version, "3.3.8");
}

TEST_F(RecorderTest, RecordsComeOutInTimeOrder) {
  const uint64_t a = 0x1000, b = 0x2000;
  bool first = false, second = false;
  script_ = [&](uint64_t t) {
    // Two CPUs' records interleave: each poll delivers some out of order, and a later poll one older than two
    // records already delivered (within the 20 ms reorder window of the newest).
    if (t >= 40 * kMs && !first) {
      first = true;
      Inject(30 * kMs, RV_EV_THREAD_RESUMED, a);
      Inject(22 * kMs, RV_EV_THREAD_STARTED, a);
      Inject(35 * kMs, RV_EV_THREAD_SUSPENDED, a);
    }
    if (t >= 60 * kMs && !second) {
      second = true;
      Inject(25 * kMs, RV_EV_THREAD_STARTED, b);
      Inject(50 * kMs, RV_EV_THREAD_RESUMED, b);
    }
    if (t >= 120 * kMs) TargetExits();
  };
  Result<int> r = Run();
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  std::vector<std::pair<uint64_t, EventName>> got;
  for (const TraceEvent& e : trace_.events) {
    if (e.source != kSourceDaemon) got.emplace_back(e.t_ns, e.event);
  }
  const std::vector<std::pair<uint64_t, EventName>> want = {
      {22 * kMs, EventName::kThreadStarted}, {25 * kMs, EventName::kThreadStarted},
      {30 * kMs, EventName::kGvlAcquired},   {35 * kMs, EventName::kGvlReleased},
      {50 * kMs, EventName::kGvlAcquired}};
  EXPECT_EQ(got, want);
  EXPECT_EQ(trace_.out_of_order_events, 0u);
  ASSERT_TRUE(trace_.summary.has_value());
  EXPECT_EQ(trace_.summary->late_events, 0u);
}

// What a sink of the recorder's stream (record/record_sink.h) was given, and when.
struct Collected {
  std::vector<TraceEvent> events;
  int ticks = 0;
  bool finished = false;
  std::string stop_reason;
};

// A sink as rvbpfd top uses one, collecting into *out (the recording owns the sink).
class CollectingSink : public RecordSink {
 public:
  CollectingSink(Collected* out, bool live) : out_(out), live_(live) {}
  uint32_t InternFrame(const FrameInfo& f) override { return table_.InternFrame(f).id; }
  uint32_t InternStack(std::span<const uint32_t> ids) override { return table_.InternStack(ids).id; }
  Status Write(const TraceEvent& e) override {
    out_->events.push_back(e);
    return Status::Ok();
  }
  void SetThreadInfo(uint32_t, const ThreadInfo&, uint64_t) override {}
  Status Tick(std::chrono::steady_clock::time_point, uint64_t) override {
    ++out_->ticks;
    return Status::Ok();
  }
  Status Finish(const FinishInfo& info) override {
    out_->finished = true;
    out_->stop_reason = info.stop_reason;
    return Status::Ok();
  }
  void Abandon() override {}
  const std::string& output_path() const override { return none_; }
  bool live() const override { return live_; }

 private:
  Collected* out_;
  bool live_;
  StackTable table_;
  const std::string none_;
};

class RecorderSinkTest : public RecorderTest {
 protected:
  // One thread's two records (at 10 and 12 ms, delivered out of order at 20 ms), then nothing until the target exits
  // at 300 ms. seen_while_quiet_: how many events the sink had at 200 ms.
  Collected RunWithSink(bool live) {
    Collected got;
    bool injected = false, looked = false;
    script_ = [&](uint64_t t) {
      if (t >= 20 * kMs && !injected) {
        injected = true;
        Inject(12 * kMs, RV_EV_THREAD_RESUMED, 0x1000);
        Inject(10 * kMs, RV_EV_THREAD_STARTED, 0x1000);
      }
      if (t >= 200 * kMs && !looked) {
        looked = true;
        seen_while_quiet_ = got.events.size();
      }
      if (t >= 300 * kMs) TargetExits();
    };
    Result<int> r = RecordAnalysedTarget(options_, env_, target_, prepared_,
                                         [&](const TraceHeader& header) -> Result<std::unique_ptr<RecordSink>> {
                                           EXPECT_EQ(header.pid, target_.pid);
                                           return std::unique_ptr<RecordSink>(new CollectingSink(&got, live));
                                         });
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().ToString());
    return got;
  }
  static std::vector<std::pair<uint64_t, EventName>> TargetEvents(const Collected& c) {
    std::vector<std::pair<uint64_t, EventName>> out;
    for (const TraceEvent& e : c.events) {
      if (e.source != kSourceDaemon) out.emplace_back(e.t_ns, e.event);
    }
    return out;
  }
  size_t seen_while_quiet_ = 0;
};

TEST_F(RecorderSinkTest, ASinkGetsTheOrderedNumberedStreamAndNoFileIsWritten) {
  const Collected got = RunWithSink(/*live=*/false);
  const std::vector<std::pair<uint64_t, EventName>> want = {{10 * kMs, EventName::kThreadStarted},
                                                            {12 * kMs, EventName::kGvlAcquired}};
  EXPECT_EQ(TargetEvents(got), want);
  for (const TraceEvent& e : got.events) {
    if (e.source != kSourceDaemon) EXPECT_EQ(e.ruby_thread, std::optional<uint32_t>(2));  // main is 1
  }
  EXPECT_GT(got.ticks, 0);
  EXPECT_TRUE(got.finished);
  EXPECT_EQ(got.stop_reason, "target_exited");
  EXPECT_FALSE(std::filesystem::exists(options_.output));
  // Not live: the last records wait in the reorder window for a newer one (or the end).
  EXPECT_EQ(seen_while_quiet_, 0u);
}

TEST_F(RecorderSinkTest, ALiveSinkGetsAQuietProcesssLastEventsByTheClock) {
  const Collected got = RunWithSink(/*live=*/true);
  EXPECT_EQ(seen_while_quiet_, 2u);
  EXPECT_EQ(TargetEvents(got).size(), 2u);
}

TEST_F(RecorderTest, DroppedEventsBecomeEventsDroppedRecords) {
  script_ = [&](uint64_t t) {
    if (t >= 40 * kMs && fake_.counters.dropped == 0) fake_.counters.dropped = 7;
    if (t >= 100 * kMs && fake_.counters.dropped == 7) fake_.counters.dropped = 10;
    if (t >= 160 * kMs) TargetExits();
  };
  Result<int> r = Run();
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  const std::vector<TraceEvent> drops = Events(EventName::kEventsDropped);
  ASSERT_EQ(drops.size(), 2u);
  EXPECT_EQ(drops[0].count, 7u);
  EXPECT_EQ(drops[1].count, 3u);
  // Stamped when the main loop saw the counter move (every 20 ms without a budget).
  EXPECT_EQ(drops[0].t_ns, 40 * kMs);
  EXPECT_EQ(drops[1].t_ns, 100 * kMs);
  EXPECT_EQ(drops[0].source, kSourceDaemon);
  ASSERT_TRUE(trace_.summary.has_value());
  EXPECT_EQ(trace_.summary->events_dropped, 10u);
}

TEST_F(RecorderTest, OverheadBudgetPausesTheHighGroupHottestFirstAndResumesIt) {
  options_.max_overhead_pct = 5;
  options_.duration_s = 1;
  fake_.site_hits.assign(5, 0);
  uint64_t last = 0;  // the time traps were counted up to
  script_ = [&](uint64_t t) {
    // Traps while the high-rate sites are attached: 400 per ms (~60% of the target's time at 1.5 us a hit, far
    // over 5%); the suspended site is the hottest, then GC enter, then resumed. The low sites trap rarely.
    const uint64_t ms = (t - last) / kMs;
    if (ms == 0) return;
    last += ms * kMs;
    uint64_t traps = 2 * ms;
    fake_.site_hits[0] += ms;
    fake_.site_hits[1] += ms;
    if (fake_.GroupAttached(kHighGroup)) {
      fake_.site_hits[2] += 20 * ms;
      fake_.site_hits[3] += 300 * ms;
      fake_.site_hits[4] += 80 * ms;
      traps += 400 * ms;
    }
    fake_.counters.probe_hits += traps;
  };
  Result<int> r = Run();
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  ASSERT_FALSE(fake_.detaches.empty());
  for (const FakeProbeBackend::Detach& d : fake_.detaches) EXPECT_EQ(d.group, kHighGroup);
  EXPECT_EQ(fake_.detaches[0].order, (std::vector<uint64_t>{kSuspendedSite, kGcEnterSite, kResumedSite}));
  EXPECT_GE(fake_.groups[kHighGroup].attaches, 2);  // reattached after a pause
  EXPECT_EQ(fake_.groups[kHighGroup].path, kVmPath);

  const std::vector<TraceEvent> paused = Events(EventName::kTracingPaused);
  const std::vector<TraceEvent> resumed = Events(EventName::kTracingResumed);
  ASSERT_FALSE(paused.empty());
  ASSERT_FALSE(resumed.empty());
  EXPECT_EQ(paused.size(), fake_.detaches.size());
  EXPECT_EQ(resumed.size() + 1, static_cast<size_t>(fake_.groups[kHighGroup].attaches));
  EXPECT_EQ(paused[0].reason, "max-overhead");
  EXPECT_EQ(resumed[0].reason, "budget window over");
  EXPECT_LT(paused[0].t_ns, resumed[0].t_ns);
  // The first pause comes within the first budget window (250 ms), once its allowance is spent.
  EXPECT_LT(paused[0].t_ns, 250 * kMs);
  const TraceEvent* stopped = Stopped();
  ASSERT_NE(stopped, nullptr);
  EXPECT_EQ(stopped->reason, "duration");
}

TEST_F(RecorderTest, DurationEndsTheRecording) {
  options_.duration_s = 0.5;
  Result<int> r = Run();
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(*r, 0);
  const TraceEvent* stopped = Stopped();
  ASSERT_NE(stopped, nullptr);
  EXPECT_EQ(stopped->reason, "duration");
  EXPECT_GE(stopped->t_ns, 500 * kMs);
  EXPECT_LE(stopped->t_ns, 520 * kMs);  // the first 20 ms poll past the end
  // A live target's probes are released before rvbpfd exits, both groups at once.
  EXPECT_EQ(hand_offs_, 0);
  std::vector<int> released = fake_.released;
  std::sort(released.begin(), released.end());
  EXPECT_EQ(released, (std::vector<int>{kLowGroup, kHighGroup}));
}

TEST_F(RecorderTest, TargetExitEndsTheRecording) {
  script_ = [&](uint64_t t) {
    if (t >= 200 * kMs) TargetExits();
  };
  Result<int> r = Run();
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(*r, 0);
  const TraceEvent* stopped = Stopped();
  ASSERT_NE(stopped, nullptr);
  EXPECT_EQ(stopped->reason, "target_exited");
  EXPECT_GE(stopped->t_ns, 200 * kMs);
  EXPECT_LT(stopped->t_ns, 220 * kMs);
  // The exited target's probes are handed to a child to release (here the hand-off declines, so they are released
  // as usual).
  EXPECT_EQ(hand_offs_, 1);
  EXPECT_EQ(fake_.released.size(), 2u);
}

TEST_F(RecorderTest, StopRequestEndsTheRecording) {
  script_ = [&](uint64_t t) {
    if (t >= 100 * kMs) stop_.store(true);
  };
  Result<int> r = Run();
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  const TraceEvent* stopped = Stopped();
  ASSERT_NE(stopped, nullptr);
  EXPECT_EQ(stopped->reason, "signal");
  EXPECT_GE(stopped->t_ns, 100 * kMs);
  EXPECT_LT(stopped->t_ns, 120 * kMs);
  EXPECT_EQ(hand_offs_, 0);
}

TEST_F(RecorderTest, SpeculativeLoadOnAHelperThreadIsRedoneWhenTheBinaryGivesNoStacks) {
  // The flags ask for stacks and samples; the analysis found no stack layout (prepared_.stacks is empty), so the
  // programs loaded speculatively are not the ones the run needs.
  options_.stacks = "release";
  options_.hz = 99;
  options_.ring_buffer_kb = 512;
  script_ = [&](uint64_t t) {
    if (t >= 40 * kMs) TargetExits();
  };
  Result<int> r = Run();
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  ASSERT_EQ(opens_.size(), 2u);
  EXPECT_FALSE(opens_[0].on_main_thread);
  EXPECT_EQ(opens_[0].options.config.sampling, 1u);
  EXPECT_NE(opens_[0].options.config.stack_events, 0u);
  EXPECT_EQ(opens_[0].options.config.holder_stacks, 1u) << "speculated: the binary's GVL layout is known";
  EXPECT_TRUE(opens_[1].on_main_thread);
  EXPECT_EQ(opens_[1].options.config.sampling, 0u);
  EXPECT_EQ(opens_[1].options.config.stack_events, 0u);
  EXPECT_EQ(opens_[1].options.config.holder_stacks, 0u) << "no stack layout: no holder walk";
  EXPECT_EQ(opens_[1].options.ring_buffer_bytes, 512u * 1024u);
  EXPECT_EQ(fake_.sampling_hz, 0);  // no stacks: no sampling
}

TEST_F(RecorderTest, LaunchModeRunsTheCommandAndRecordsItUntilItExits) {
  // A shell that lives ~0.3 s; its "VM" is the libc it maps, whose layout (nothing to compare: no version string, no
  // hook list) passes the live check once the command has mapped it and a thread event came.
  uint32_t command_pid = 0;
  if (!LaunchShellOnLibc("sleep 0.3; exit 3", &command_pid)) GTEST_SKIP() << "no libc.so.6 at the Debian path";
  Result<int> r = Run();
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  ASSERT_NE(command_pid, 0u) << "the command's pid was never added to the BPF filter";
  EXPECT_EQ(trace_.header.pid, static_cast<int>(command_pid));
  EXPECT_EQ(trace_.header.command, options_.command);
  EXPECT_EQ(Events(EventName::kThreadStarted).size(), 1u);
  ASSERT_NE(Stopped(), nullptr);
  EXPECT_EQ(*r, 0);
  EXPECT_EQ(hand_offs_, 1) << "the recording ended because the command exited (not at --duration)";
  EXPECT_EQ(fake_.attached_groups(), 0u) << "the probes are released at the end";
  EXPECT_EQ(exit_fd_pid_, static_cast<int>(command_pid));
}

TEST_F(RecorderTest, LaunchModeRefusesACommandWhoseMemoryDoesNotMatchTheLayoutAndLeavesItRunning) {
  // The same kind of command, but the analysis says its "VM" holds ruby_version "3.3.8" at vaddr 1, where libc has
  // the rest of its ELF magic: the live check fails once the command has mapped it and a thread event came.
  uint32_t command_pid = 0;
  if (!LaunchShellOnLibc("sleep 0.5; exit 3", &command_pid)) GTEST_SKIP() << "no libc.so.6 at the Debian path";
  prepared_.live_layout.vm_path = target_.vm_path;
  prepared_.live_layout.ruby_version = "3.3.8";
  prepared_.live_layout.ruby_version_vaddr = 1;
  prepared_.live_layout.lowest_load_vaddr = 0;
  Result<int> r = Run();
  ASSERT_NE(command_pid, 0u) << "the command's pid was never added to the BPF filter";
  ASSERT_FALSE(r.ok()) << "a command whose memory contradicts the analysis must not be traced";
  EXPECT_EQ(r.error().code(), ErrorCode::kNoSymbols);
  EXPECT_NE(r.error().message().find("its ruby_version is \"ELF"), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find("runs on untraced"), std::string::npos) << r.error().message();
  EXPECT_FALSE(std::filesystem::exists(options_.output)) << "nothing is written for a refused command";
  EXPECT_EQ(fake_.attached_groups(), 0u) << "the probes are released";
  // The command is not rvbpfd's to kill: it runs to its own end.
  int status = 0;
  ASSERT_EQ(waitpid(static_cast<pid_t>(command_pid), &status, 0), static_cast<pid_t>(command_pid));
  ASSERT_TRUE(WIFEXITED(status)) << "the command was killed (status " << status << ")";
  EXPECT_EQ(WEXITSTATUS(status), 3);
}

TEST_F(RecorderTest, SpeculativeLoadIsKeptWhenItMatches) {
  script_ = [&](uint64_t t) {
    if (t >= 40 * kMs) TargetExits();
  };
  Result<int> r = Run();
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  ASSERT_EQ(opens_.size(), 1u);
  EXPECT_FALSE(opens_[0].on_main_thread);
  EXPECT_EQ(opens_[0].options.config.cold_gap_ns, OverheadBudget::kColdGapNs);
}

}  // namespace
}  // namespace rvbpfd
