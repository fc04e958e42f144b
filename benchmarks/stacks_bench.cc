// Host-side cost of Ruby stacks, measured over the coredump regression cases (coredump-testdata/<ruby>/<case>.json):
//   walk      the frame walker (bpf/ruby_walker.h compiled for the host) over every golden thread, in ns per frame,
//             into a reused buffer of RV_MAX_STACK_FRAMES (4,096) frames as the BPF side has; walk_api is the same
//             through WalkRubyStack(), whose default limits size (and zero) a 65,536-frame vector (2 MiB) per call;
//   symbolize the Symbolizer alone on every frame, no cache at all, in ns per frame;
//   cold      symbolizing each stack with a fresh StackResolver (empty cache), in stacks per second;
//   warm      one StackResolver reused across repeats in one GC epoch (pure cache hits), in stacks per second;
//   reval     one StackResolver, a new GC epoch per pass (each hit re-reads the object heads first), stacks/s.
// Memory comes from the core already inflated into RAM, so these are the walker's and symbolizer's CPU costs; the
// daemon reads a live target with process_vm_readv (one syscall per read), which makes its cold path slower. The BPF
// walk cost is benchmarks/bpf_walk_cost.sh.
//
// Usage: stacks_bench [COREDUMP_TESTDATA_DIR] [SECONDS_PER_MEASUREMENT]
//   (defaults: the source tree's coredump-testdata/, 0.5 s). Prints one JSON line per case, then a summary.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "rvbpfd/abi.h"
#include "session/stack_resolver.h"
#include "stacks/memory_reader.h"
#include "stacks/ruby_offsets.h"
#include "stacks/ruby_walker_host.h"
#include "stacks/symbolizer.h"
#include "stacks/walker.h"

#ifndef RVBPFD_COREDUMP_TESTDATA_DIR
#define RVBPFD_COREDUMP_TESTDATA_DIR "coredump-testdata"
#endif

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// A measurement repeats whole passes until at least this long has elapsed (seconds), so timer resolution and
// one-off cache misses are negligible next to the total.
constexpr double kDefaultSeconds = 0.5;

// StackResolver owns its reader; the cold measurement creates one resolver per stack over the same core, so each
// gets a non-owning view of the one CoreFileReader (re-inflating the core per stack would measure gzip, not us).
class BorrowedReader : public rvbpfd::MemoryReader {
 public:
  explicit BorrowedReader(rvbpfd::MemoryReader* inner) : inner_(inner) {}
  bool Read(uint64_t addr, void* dst, size_t len) override { return inner_->Read(addr, dst, len); }

 private:
  rvbpfd::MemoryReader* inner_;
};

double Seconds(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

std::vector<fs::path> CaseFiles(const fs::path& root) {
  std::vector<fs::path> cases;
  if (!fs::is_directory(root)) return cases;
  for (const auto& ruby_dir : fs::directory_iterator(root)) {
    // programs/ holds the Ruby sources the cases were recorded from, not cases.
    if (!ruby_dir.is_directory() || ruby_dir.path().filename() == "programs") continue;
    for (const auto& f : fs::directory_iterator(ruby_dir.path())) {
      const std::string name = f.path().filename().string();
      if (f.path().extension() == ".json" && name[0] != '.') cases.push_back(f.path());
    }
  }
  std::sort(cases.begin(), cases.end());
  return cases;
}

struct CaseResult {
  std::string name;
  size_t threads = 0;
  size_t frames = 0;                  // frames in one pass over every thread
  double walk_ns_per_frame = 0;       // host walker, ns
  double walk_ns_per_stack = 0;       // host walker, ns (one thread's whole stack)
  double walk_api_ns_per_frame = 0;   // through WalkRubyStack(), ns
  double symbolize_ns_per_frame = 0;  // Symbolizer without any cache, ns
  double cold_stacks_per_s = 0;       // fresh resolver per stack
  double warm_stacks_per_s = 0;       // one resolver, same GC epoch
  double reval_stacks_per_s = 0;      // one resolver, new GC epoch every pass
  uint64_t unresolved = 0;            // unresolved frames in one pass (should be 0 on a good case)
};

// Runs `pass` (which returns the number of stacks it handled) until `seconds` have elapsed; returns stacks/s.
template <typename Pass>
double StacksPerSecond(double seconds, Pass pass) {
  uint64_t stacks = 0;
  const Clock::time_point start = Clock::now();
  double elapsed = 0;
  do {
    stacks += pass();
    elapsed = Seconds(start);
  } while (elapsed < seconds);
  return static_cast<double>(stacks) / elapsed;
}

bool RunCase(const fs::path& json_path, double seconds, CaseResult* out) {
  nlohmann::json c;
  try {
    std::ifstream in(json_path);
    c = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", json_path.c_str(), e.what());
    return false;
  }
  out->name = json_path.parent_path().filename().string() + "/" + json_path.stem().string();
  const fs::path core = json_path.parent_path() / c["core"].get<std::string>();
  // Self-contained, as in the regression suite: nothing is read from binaries installed on this machine.
  auto reader = rvbpfd::CoreFileReader::Open(core.string(), rvbpfd::CoreFileReader::Options{"", false});
  if (!reader.ok()) {
    std::fprintf(stderr, "%s: %s\n", core.c_str(), reader.error().ToString().c_str());
    return false;
  }
  rvbpfd::MemoryReader& mem = **reader;
  int major = 0, minor = 0;
  std::sscanf(c["ruby_version"].get<std::string>().c_str(), "%d.%d", &major, &minor);
  auto off = rvbpfd::RubyOffsets::ForVersion(major, minor);
  if (!off.ok()) {
    std::fprintf(stderr, "%s: %s\n", out->name.c_str(), off.error().ToString().c_str());
    return false;
  }
  const rvbpfd::RubyOffsets& offsets = off.value();
  const uint64_t gsym = std::stoull(c["vm"]["global_symbols"].get<std::string>(), nullptr, 16);

  std::vector<uint64_t> ecs;
  for (const nlohmann::json& t : c["golden"]["threads"]) {
    const uint64_t th = std::stoull(t["th"].get<std::string>(), nullptr, 16);
    if (auto ec = rvbpfd::ThreadEc(mem, th, offsets.thread_ec)) ecs.push_back(*ec);
  }
  out->threads = ecs.size();
  if (ecs.empty()) {
    std::fprintf(stderr, "%s: no readable thread\n", out->name.c_str());
    return false;
  }

  // One pass collects the stacks the symbolizer measurements use (walker frames, newest first).
  std::vector<std::vector<rv_ruby_frame>> stacks;
  for (uint64_t ec : ecs) stacks.push_back(rvbpfd::WalkRubyStack(mem, offsets.walk, ec).frames);
  for (const auto& s : stacks) out->frames += s.size();

  // (1) Walk, the way the BPF program drives it: one bounded buffer, reused. `sink` keeps the compiler from dropping
  // walks whose result is unused.
  {
    std::vector<rv_ruby_frame> buf(RV_MAX_STACK_FRAMES);
    uint64_t frames = 0, walks = 0;
    volatile uint64_t sink = 0;
    const Clock::time_point start = Clock::now();
    double elapsed = 0;
    do {
      for (uint64_t ec : ecs) {
        uint32_t count = 0, status = RV_WALK_OK;
        rv_host_walk(&mem, &offsets.walk, ec, buf.data(), static_cast<__u32>(buf.size()), RV_MAX_STACK_STEPS, &count,
                     &status);
        frames += count;
        sink = sink + (count == 0 ? 0 : buf[count - 1].addr);
        walks++;
      }
      elapsed = Seconds(start);
    } while (elapsed < seconds);
    out->walk_ns_per_frame = frames == 0 ? 0 : elapsed * 1e9 / static_cast<double>(frames);
    out->walk_ns_per_stack = elapsed * 1e9 / static_cast<double>(walks);
  }
  // (1b) The same through the public C++ entry point.
  {
    uint64_t frames = 0, walks = 0;
    volatile uint64_t sink = 0;
    const Clock::time_point start = Clock::now();
    double elapsed = 0;
    do {
      for (uint64_t ec : ecs) {
        rvbpfd::WalkResult w = rvbpfd::WalkRubyStack(mem, offsets.walk, ec);
        frames += w.frames.size();
        sink = sink + (w.frames.empty() ? 0 : w.frames.back().addr);
        walks++;
      }
      elapsed = Seconds(start);
    } while (elapsed < seconds);
    out->walk_api_ns_per_frame = frames == 0 ? 0 : elapsed * 1e9 / static_cast<double>(frames);
    (void)walks;
  }

  // (2) Symbolizer alone: every frame resolved from memory, as if each one were new (the deep recursion's 1,000
  // identical frames included, which a resolver would otherwise cache within the stack).
  {
    rvbpfd::Symbolizer sym(&mem, offsets, gsym);
    uint64_t frames = 0;
    volatile size_t sink = 0;
    const Clock::time_point start = Clock::now();
    double elapsed = 0;
    do {
      for (const auto& s : stacks) {
        for (const rv_ruby_frame& f : s) sink = sink + sym.Symbolize(f).line;
        frames += s.size();
      }
      elapsed = Seconds(start);
    } while (elapsed < seconds);
    out->symbolize_ns_per_frame = frames == 0 ? 0 : elapsed * 1e9 / static_cast<double>(frames);
  }

  std::vector<rvbpfd::FrameInfo> resolved;
  // (2a) Cold: every stack starts from an empty cache, as the first sight of a stack does in the daemon.
  out->cold_stacks_per_s = StacksPerSecond(seconds, [&] {
    for (const auto& s : stacks) {
      rvbpfd::StackResolver r(std::make_unique<BorrowedReader>(&mem), offsets, gsym);
      r.Resolve(s, &resolved);
    }
    return stacks.size();
  });

  // (2b) Warm: one resolver; the first (unmeasured) pass fills the cache, later ones hit it in the same GC epoch.
  rvbpfd::StackResolver warm(std::make_unique<BorrowedReader>(&mem), offsets, gsym);
  for (const auto& s : stacks) {
    warm.Resolve(s, &resolved);
    for (const rvbpfd::FrameInfo& f : resolved) out->unresolved += f.kind == rvbpfd::FrameKind::kUnresolved;
  }
  out->warm_stacks_per_s = StacksPerSecond(seconds, [&] {
    for (const auto& s : stacks) warm.Resolve(s, &resolved);
    return stacks.size();
  });

  // (2c) Warm after a GC: each pass is a new epoch, so every hit re-reads and compares its object heads once.
  uint64_t epoch = 1;
  out->reval_stacks_per_s = StacksPerSecond(seconds, [&] {
    warm.set_epoch(epoch++);
    for (const auto& s : stacks) warm.Resolve(s, &resolved);
    return stacks.size();
  });
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const fs::path root = argc > 1 ? fs::path(argv[1]) : fs::path(RVBPFD_COREDUMP_TESTDATA_DIR);
  const double seconds = argc > 2 ? std::atof(argv[2]) : kDefaultSeconds;
  if (seconds <= 0) {
    std::fprintf(stderr, "usage: %s [COREDUMP_TESTDATA_DIR] [SECONDS > 0]\n", argv[0]);
    return 2;
  }
  const std::vector<fs::path> cases = CaseFiles(root);
  if (cases.empty()) {
    std::fprintf(stderr, "no coredump cases under %s\n", root.c_str());
    return 1;
  }
  std::vector<CaseResult> results;
  int failed = 0;
  for (const fs::path& p : cases) {
    CaseResult r;
    if (!RunCase(p, seconds, &r)) {
      failed++;
      continue;
    }
    nlohmann::ordered_json line = {{"case", r.name},
                                   {"threads", r.threads},
                                   {"frames", r.frames},
                                   {"unresolved_frames", r.unresolved},
                                   {"walk_ns_per_frame", r.walk_ns_per_frame},
                                   {"walk_ns_per_stack", r.walk_ns_per_stack},
                                   {"walk_api_ns_per_frame", r.walk_api_ns_per_frame},
                                   {"symbolize_uncached_ns_per_frame", r.symbolize_ns_per_frame},
                                   {"symbolize_cold_stacks_per_s", r.cold_stacks_per_s},
                                   {"symbolize_warm_stacks_per_s", r.warm_stacks_per_s},
                                   {"symbolize_revalidate_stacks_per_s", r.reval_stacks_per_s}};
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);
    results.push_back(r);
  }

  std::printf("\n%-28s %7s %6s %10s %10s %10s %11s %11s %11s\n", "case", "threads", "frames", "walk ns/fr", "api ns/fr",
              "sym ns/fr", "cold st/s", "warm st/s", "reval st/s");
  for (const CaseResult& r : results) {
    std::printf("%-28s %7zu %6zu %10.1f %10.1f %10.1f %11.0f %11.0f %11.0f\n", r.name.c_str(), r.threads, r.frames,
                r.walk_ns_per_frame, r.walk_api_ns_per_frame, r.symbolize_ns_per_frame, r.cold_stacks_per_s,
                r.warm_stacks_per_s, r.reval_stacks_per_s);
  }
  size_t total_frames = 0, total_threads = 0;
  for (const CaseResult& r : results) total_frames += r.frames, total_threads += r.threads;
  std::printf(
      "stacks are these cases' threads (avg %.0f frames each); memory is the inflated core, not "
      "process_vm_readv\n",
      total_threads == 0 ? 0.0 : static_cast<double>(total_frames) / static_cast<double>(total_threads));
  return failed == 0 ? 0 : 1;
}
