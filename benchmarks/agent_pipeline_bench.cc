// The fleet agent's host cost per record, independent of machine load: a deterministic synthetic stream of PROCESSES
// Ruby processes (each: 4 threads cycling READY -> RESUMED -> SUSPENDED, each release carrying a 20-frame stack drawn
// from a small set of its own, one on-CPU sample per 16 events, each reading the GVL, a GC every 200 ms per process
// at 1 process and every second beyond) goes through the agent's own
// per-record path (Agent::OnStack/OnRecord -> reorder window -> Dispatch -> ProcessProfile, cuts and pprof builds
// included) with the production FrameSource (MakeResolverFrameSource: StackResolver) over a fake target memory
// holding real iseq objects. Only the BPF ring and /proc are fakes.
//
// Prints ns per event (wall and this thread's CPU time: both depend on the machine) and two checksums of every profile
// the agent produced, of the gzip bytes and of the pprof bytes inside (equal checksums = byte-identical output, for
// comparing builds; the second alone stays equal across a change of compression). Compare builds by the CPU time per
// event over interleaved runs. callgrind (valgrind 3.19, Debian 12) cannot give instruction counts: it does not
// implement openat2, which target files are opened with, so no fake process is watched.
//
// The host-wide event rate is the same for every PROCESSES (12,000 events/s: each thread cycles every PROCESSES ms),
// so PROCESSES 50 (agent_budget.py's count) gives the real agent's working set: 50 profiles, span trackers and
// resolver caches, each touched every few records, with the cache misses that brings.
//
// Usage: agent_pipeline_bench [SIMULATED_SECONDS (default 20)] [PROCESSES (default 1)]
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "agent/agent.h"
#include "agent/agent_fakes.h"
#include "export/pprof_test_util.h"
#include "session/stack_resolver.h"
#include "stacks/fake_memory.h"
#include "stacks/ruby_offsets.h"

namespace rvbpfd {
namespace {

// This thread's CPU time (CLOCK_THREAD_CPUTIME_ID), ns: unlike wall time, not inflated by other processes' use of
// the machine's cores (the agent's work is all on this thread here; the fake sink delivers inline).
uint64_t ThreadCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

using agent_testing::FakeClock;
using agent_testing::FakePrepared;
using agent_testing::FakeProc;
using testing::FakeMemory;

constexpr uint64_t kMs = 1'000'000;
constexpr uint64_t kHeap = 0x800000;
constexpr uint64_t kTString = 0x05;
constexpr uint64_t kImemoIseqFlags = RV_RB_T_IMEMO | (7ull << RV_RB_IMEMO_SHIFT);
constexpr int kPid = 4242;
constexpr int kThreads = 4;
constexpr int kDistinctFrames = 40;
constexpr int kDistinctStacks = 12;
constexpr int kFramesPerStack = 20;

// A target address space holding kDistinctFrames top-level iseqs with realistic (heap-allocated) names and paths.
class FakeRuby {
 public:
  FakeRuby() {
    off_ = RubyOffsets::ForVersion(3, 3).value();
    mem_ = std::make_unique<FakeMemory>();
    mem_->Map(kHeap, 1 << 20);
    for (int i = 0; i < kDistinctFrames; ++i) {
      frames_.push_back(MakeTopIseq("block in ActiveRecord::Relation#method_" + std::to_string(i),
                                    "/app/vendor/bundle/ruby/3.3.0/gems/activerecord-7.1.3/lib/file_" +
                                        std::to_string(i % 7) + ".rb"));
    }
  }
  const RubyOffsets& offsets() const { return off_; }
  std::unique_ptr<FakeMemory> TakeMemory() { return std::move(mem_); }
  const rv_ruby_frame& frame(int i) const { return frames_[static_cast<size_t>(i)]; }

 private:
  uint64_t Alloc(size_t n) {
    const uint64_t a = next_;
    next_ += (n + 15) & ~size_t{15};
    return a;
  }
  uint64_t String(const std::string& s) {
    const uint64_t str = Alloc(24 + s.size() + 1);
    mem_->Put64(str, kTString);  // embedded
    mem_->Put64(str + 16, s.size());
    mem_->Put(str + 24, s.data(), s.size());
    return str;
  }
  rv_ruby_frame MakeTopIseq(const std::string& label, const std::string& path) {
    const uint64_t iseq = Alloc(64), body = Alloc(400), encoded = Alloc(64);
    mem_->Put64(iseq, kImemoIseqFlags);
    mem_->Put64(iseq + off_.iseq_body, body);
    mem_->Put32(body + off_.body_type, 0);
    mem_->Put64(body + off_.body_iseq_encoded, encoded);
    mem_->Put32(body + off_.body_iseq_size, 8);
    mem_->Put32(body + off_.body_insns_info_size, 0);
    const uint64_t l = String(label);
    mem_->Put64(body + off_.body_location + off_.loc_label, l);
    mem_->Put64(body + off_.body_location + off_.loc_base_label, l);
    mem_->Put64(body + off_.body_location + off_.loc_pathobj, String(path));
    mem_->Put64(body + off_.body_local_iseq, iseq);
    return rv_ruby_frame{iseq, encoded, iseq, RV_RB_FRAME_ISEQ, 0};
  }

  RubyOffsets off_;
  std::unique_ptr<FakeMemory> mem_;
  uint64_t next_ = kHeap;
  std::vector<rv_ruby_frame> frames_;
};

// Delivers one poll's worth of prebuilt records per Poll (no allocation on the delivery path).
class BenchBackend : public ProbeBackend {
 public:
  struct Rec {
    rv_record rec;
    int stack = -1;  // index into stacks, -1: none
    int gvl = -1;    // index into readings (a sample's GVL reading), -1: none
  };
  void SetHandlers(RecordHandler on_record, StackHandler on_stack) override {
    on_record_ = std::move(on_record);
    on_stack_ = std::move(on_stack);
  }
  Result<uint8_t> AddBinary(const rv_offsets&) override { return uint8_t{0}; }
  Status RemoveBinary(uint8_t) override { return Status::Ok(); }
  BpfSession::SlotUsage slot_usage() const override { return {0, RV_MAX_BINARIES, 0, RV_MAX_SITES}; }
  Status SetWalkConfig(uint8_t, const rv_walk_config&) override { return Status::Ok(); }
  using ProbeBackend::AttachGroup;
  Result<int> AttachGroup(const std::string&, const std::vector<SiteSpec>&, int) override { return groups_++; }
  void DetachGroup(int, std::span<const uint64_t>) override {}
  void DetachGroup(int) override {}
  Status ReattachGroup(int, const std::string&) override { return Status::Ok(); }
  bool GroupAttached(int) const override { return true; }
  std::vector<uint64_t> GroupCookies(int) const override { return {}; }
  void ReleaseGroup(int) override {}
  Status AddPid(uint32_t, const rv_pidns&, std::span<const std::pair<uint32_t, uint32_t>>) override {
    return Status::Ok();
  }
  Status RemovePid(uint32_t) override { return Status::Ok(); }
  Status StartSampling(int) override { return Status::Ok(); }
  Status WatchProcesses() override { return Status::Ok(); }
  ProcessEcInstaller::State PollEc(ProcessEcInstaller&) override { return ProcessEcInstaller::State::kInstalled; }
  // BPF wakes the ring only once it is a quarter full, which these rates never reach: the agent reads it on its own
  // period.
  Result<bool> Wait(int) override { return false; }
  Result<int> Consume() override {
    int n = 0;
    for (; next_ < ready_; ++next_, ++n) {
      const Rec& r = recs[next_];
      if (r.stack >= 0) {
        rv_stack_header h{};
        const std::vector<rv_ruby_frame>& f = stacks[static_cast<size_t>(r.stack)];
        h.nframes = static_cast<uint32_t>(f.size());
        on_stack_(r.rec, h, f, r.gvl >= 0 ? &readings[static_cast<size_t>(r.gvl)] : nullptr);
      } else {
        on_record_(r.rec);
      }
    }
    return n;
  }
  void WakePollOn(int) override {}
  rv_counters ReadCounters() const override { return rv_counters{}; }
  std::vector<uint64_t> ReadSiteHits() const override { return {}; }
  std::optional<rv_pid_traps> PidTraps(uint32_t) const override { return std::nullopt; }
  bool uses_multi_links() const override { return true; }
  // Makes the records with ts_ns <= upto deliverable.
  void ReleaseUpTo(uint64_t upto) {
    while (ready_ < recs.size() && recs[ready_].rec.ts_ns <= upto) ++ready_;
  }

  std::vector<Rec> recs;
  std::vector<std::vector<rv_ruby_frame>> stacks;
  std::vector<rv_gvl_reading> readings;

 private:
  RecordHandler on_record_;
  StackHandler on_stack_;
  size_t next_ = 0;
  size_t ready_ = 0;
  int groups_ = 0;
};

class ChecksumSink : public ProfileSink {
 public:
  void Submit(ProfileUpload upload) override {
    ++uploads;
    for (unsigned char c : upload.profile_type) Mix(hash, c);
    for (unsigned char c : upload.pprof_gz) Mix(hash, c);
    kept.emplace_back(std::move(upload.profile_type), std::move(upload.pprof_gz));
  }
  void SubmitAll(std::vector<ProfileUpload> all) override {
    for (ProfileUpload& u : all) Submit(std::move(u));
  }
  // Of the pprof bytes inside, after the timed run (inflating is not the agent's cost).
  uint64_t PprofHash() const {
    uint64_t h = 1469598103934665603ull;
    for (const auto& [type, gz] : kept) {
      for (unsigned char c : type) Mix(h, c);
      for (unsigned char c : testing::Gunzip(gz)) Mix(h, c);
    }
    return h;
  }
  bool Flush(std::chrono::milliseconds) override { return true; }
  SinkStats stats() const override { return SinkStats{}; }
  static void Mix(uint64_t& h, unsigned char c) { h = (h ^ c) * 1099511628211ull; }
  uint64_t hash = 1469598103934665603ull;  // of the gzip bytes
  uint64_t uploads = 0;
  std::vector<std::pair<std::string, std::string>> kept;  // (profile type, gzip bytes) of every upload
};

int Main(int argc, char** argv) {
  const double sim_s = argc > 1 ? std::atof(argv[1]) : 20;
  const int processes = argc > 2 ? std::max(1, std::atoi(argv[2])) : 1;
  FakeProc proc;
  const std::string exe = proc.AddExe("app", "ruby");
  const std::string libruby = proc.AddLibruby("app", "3.3.8");
  std::vector<std::unique_ptr<FakeRuby>> rubies;
  for (int p = 0; p < processes; ++p) {
    proc.AddProcess(kPid + p, "puma", "app", exe, {libruby});
    rubies.push_back(std::make_unique<FakeRuby>());
  }

  BenchBackend backend;
  FakeClock clock;
  // The stream: each process's stacks drawn from its own frames (deterministic LCG), then the timeline.
  uint64_t lcg = 12345;
  auto next_rand = [&lcg](uint64_t n) {
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (lcg >> 33) % n;
  };
  for (int p = 0; p < processes; ++p) {
    for (int s = 0; s < kDistinctStacks; ++s) {
      std::vector<rv_ruby_frame> st;
      for (int i = 0; i < kFramesPerStack; ++i) {
        st.push_back(rubies[static_cast<size_t>(p)]->frame(static_cast<int>(next_rand(kDistinctFrames))));
      }
      backend.stacks.push_back(std::move(st));
    }
  }
  const uint64_t t0 = clock.mono + kMs;
  const uint64_t end = t0 + static_cast<uint64_t>(sim_s * 1e9);
  uint64_t events = 0;
  // Each sample reads the GVL as the agent's samples do: held by the sampled thread, the next one queued.
  for (int t = 0; t < kThreads; ++t) {
    rv_gvl_reading g{};
    g.holder = 0x7f0000001000ull + static_cast<uint64_t>(t) * 0x100;
    g.waiting = 1;
    g.nqueued = 1;
    g.queued[0] = 0x7f0000001000ull + static_cast<uint64_t>((t + 1) % kThreads) * 0x100;
    backend.readings.push_back(g);
  }
  auto add = [&](uint64_t ts, int p, uint16_t kind, uint64_t th, int stack) {
    BenchBackend::Rec r{};
    r.rec.ts_ns = ts;
    r.rec.pid = static_cast<uint32_t>(kPid + p);
    r.rec.kind = kind;
    r.rec.th = th;
    if (stack >= 0) {
      r.rec.flags = RV_REC_HAS_STACK;
      stack += p * kDistinctStacks;
    }
    r.stack = stack;
    if (kind == RV_EV_SAMPLE) {
      r.rec.flags |= RV_REC_HAS_GVL;
      r.gvl = static_cast<int>((th - 0x7f0000001000ull) / 0x100);
    }
    backend.recs.push_back(r);
    if (kind != RV_EV_SAMPLE) ++events;
  };
  // Each millisecond one process runs a cycle of its threads, in turn: every process cycles every `processes` ms.
  const uint64_t gc_period = processes == 1 ? 200 * kMs : 1000 * kMs;
  std::vector<uint64_t> next_gc(static_cast<size_t>(processes));
  for (int p = 0; p < processes; ++p) next_gc[static_cast<size_t>(p)] = t0 + gc_period * (p + 1) / processes;
  for (uint64_t ts = t0; ts < end; ts += 1 * kMs) {
    const int p = static_cast<int>((ts - t0) / kMs % static_cast<uint64_t>(processes));
    for (int t = 0; t < kThreads; ++t) {
      const uint64_t th = 0x7f0000001000ull + static_cast<uint64_t>(t) * 0x100;
      const uint64_t base = ts + static_cast<uint64_t>(t) * 200'000;
      add(base, p, RV_EV_THREAD_READY, th, -1);
      add(base + 20'000, p, RV_EV_THREAD_RESUMED, th, -1);
      if (events % 16 < 3) add(base + 60'000, p, RV_EV_SAMPLE, th, static_cast<int>(next_rand(kDistinctStacks)));
      add(base + 150'000, p, RV_EV_THREAD_SUSPENDED, th, static_cast<int>(next_rand(kDistinctStacks)));
    }
    if (ts >= next_gc[static_cast<size_t>(p)]) {
      add(ts + 900'000, p, RV_EV_GC_ENTER, 0, -1);
      add(ts + 950'000, p, RV_EV_GC_EXIT, 0, -1);
      next_gc[static_cast<size_t>(p)] += gc_period;
    }
  }

  AgentConfig config;
  config.interval_s = 10;
  config.hz = 19;
  config.max_overhead_pct = 0;  // never pause: every event takes the full path
  config.proc_root = proc.root();
  config.host = "bench";
  AgentEnv env;
  env.backend = &backend;
  env.clock = &clock;
  env.preparer = [](const std::string&, const std::string& v, std::shared_ptr<ElfFile>,
                     std::shared_ptr<const FileFd>) -> Result<PreparedBinary> { return FakePrepared(v); };
  env.frame_source = [&rubies](int pid, const RubyTarget&, const ProbeSet&) -> std::unique_ptr<FrameSource> {
    FakeRuby& ruby = *rubies[static_cast<size_t>(pid - kPid)];
    return MakeResolverFrameSource(std::make_unique<StackResolver>(ruby.TakeMemory(), ruby.offsets(), 0));
  };
  ChecksumSink* sink = nullptr;
  env.make_sinks = [&sink](const AgentConfig&) -> Result<AgentSinks> {
    auto s = std::make_unique<ChecksumSink>();
    sink = s.get();
    AgentSinks out;
    out.dir = std::move(s);
    return out;
  };
  env.self_usage = []() -> Result<SelfUsage> { return SelfUsage{}; };
  std::ostringstream log_text;
  Logger log(LogFormat::kText, &log_text);
  env.log = &log;
  Result<std::unique_ptr<Agent>> created = Agent::Create(config, env);
  if (!created) {
    std::fprintf(stderr, "agent: %s\n", created.error().message().c_str());
    return 1;
  }
  Agent& agent = **created;
  if (Status st = agent.Start(); !st) {
    std::fprintf(stderr, "start: %s\n", st.error().message().c_str());
    return 1;
  }
  if (agent.watched_pids().size() != static_cast<size_t>(processes)) {
    std::fprintf(stderr, "%zu of the %d fake Ruby processes were watched\n", agent.watched_pids().size(), processes);
    return 1;
  }

  const auto w0 = std::chrono::steady_clock::now();
  const uint64_t cpu0 = ThreadCpuNs();
  while (clock.mono < end + 100 * kMs) {
    clock.mono += 50 * kMs;
    backend.ReleaseUpTo(clock.mono);
    if (Status st = agent.RunOnce(0); !st) {
      std::fprintf(stderr, "run: %s\n", st.error().message().c_str());
      return 1;
    }
  }
  agent.Shutdown(std::chrono::milliseconds(0));
  const double wall_ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - w0).count();
  const double cpu_ns = static_cast<double>(ThreadCpuNs() - cpu0);
  std::printf("records %zu (events %llu, samples %llu)  handled events %llu samples %llu  profiles %llu\n",
              backend.recs.size(), static_cast<unsigned long long>(events),
              static_cast<unsigned long long>(backend.recs.size() - events),
              static_cast<unsigned long long>(agent.events()), static_cast<unsigned long long>(agent.samples()),
              static_cast<unsigned long long>(sink->uploads));
  std::printf("wall: %.0f ns per event, CPU: %.0f ns per event (machine-dependent; CPU excludes time the thread waited "
              "for a core)\n",
              wall_ns / static_cast<double>(events), cpu_ns / static_cast<double>(events));
  std::printf("profiles checksum: %016llx (pprof inside: %016llx)\n", static_cast<unsigned long long>(sink->hash),
              static_cast<unsigned long long>(sink->PprofHash()));
  size_t gz_bytes = 0;
  for (const auto& [type, gz] : sink->kept) gz_bytes += gz.size();
  std::printf("profile upload bytes: %zu gzip\n", gz_bytes);
  return 0;
}

}  // namespace
}  // namespace rvbpfd

int main(int argc, char** argv) { return rvbpfd::Main(argc, argv); }
