// Writes the generated seed corpora of the fuzz harnesses (tools/run-fuzzers.sh runs it after the build):
//   <out>/trace/*.rvtrace    traces written by TraceWriter itself (two Ruby layouts, stacks and samples, lost events,
//                            a pause, a finished one, one cut by a crash and one cut inside a line), plain and
//                            zstd-compressed (finished, cut after a flush, cut inside a frame);
//   <out>/site_cache/*.json  the site cache form of FindSites over each ELF seed given with --elf;
//   <out>/stacks/*           for each coredump case given with --core (its .json; the .core.gz beside it), a few
//                            threads' memory as the stacks harness reads it: exactly the bytes a walk, symbolization
//                            and EC lookup of that thread read from the core (tests/fuzz/stacks_input.h).
// Usage: fuzz_make_seeds OUT_DIR [--elf ELF]... [--core CASE.json]...
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "elf/elf_file.h"
#include "fuzz/stacks_input.h"
#include "sites/sites.h"
#include "stacks/memory_reader.h"
#include "trace/writer.h"

namespace rvbpfd {
namespace {

TraceEvent Ev(uint64_t t_ns, EventName name, std::optional<uint32_t> thread, std::string_view source) {
  TraceEvent e;
  e.t_ns = t_ns;
  e.event = name;
  e.ruby_thread = thread;
  e.native_tid = thread ? std::optional<uint32_t>(4000 + *thread) : std::nullopt;
  e.probe_tid = e.native_tid;
  e.source = source;
  return e;
}

bool Check(const Status& s, const std::string& what) {
  if (!s.ok()) std::fprintf(stderr, "make_seeds: %s: %s\n", what.c_str(), s.error().ToString().c_str());
  return s.ok();
}

// Two threads handing the GVL back and forth on 3.3+, with stacks at releases, samples, GC, both probes, lost events
// and a pause. `finish`: write tracing_stopped and the summary.
bool WriteThreads34(const std::string& path, bool finish, TraceFormat format = TraceFormat::kJsonl) {
  TraceHeader h;
  h.pid = 4001;
  h.ruby_version = "3.4.5";
  h.origin_ns = 1'000'000'000;
  h.started_at = "2026-01-31T12:34:56.789012Z";
  h.channels = {"thread_hook_site", "gc_hook_site", "probe", "perf_event"};
  h.build_id = "5f0c2a";
  h.sample_hz = 99;
  h.stacks = "release";
  Result<TraceWriter> w = TraceWriter::Create(path, h, format);
  if (!w.ok()) return Check(w.error(), path);
  const uint32_t f_main = w->InternFrame({"<main>", "/app/main.rb", 1, FrameKind::kRuby});
  const uint32_t f_times = w->InternFrame({"Integer#times", "<internal:numeric>", 238, FrameKind::kRuby});
  const uint32_t f_hot = w->InternFrame({"block in Worker#run;x", "/app/worker.rb", 12, FrameKind::kRuby});
  const uint32_t f_sleep = w->InternFrame({"Kernel#sleep", "<cfunc>", 0, FrameKind::kCfunc});
  const uint32_t f_gc = w->InternFrame({std::string(kGcFrameLabel), "", 0, FrameKind::kGc});
  const uint32_t f_bad = w->InternFrame({"<unresolved iseq 0x7f00>", "", 0, FrameKind::kUnresolved});
  const uint32_t s_sleep = w->InternStack(std::vector<uint32_t>{f_sleep, f_main});
  const uint32_t s_hot = w->InternStack(std::vector<uint32_t>{f_hot, f_times, f_main});
  const uint32_t s_gc = w->InternStack(std::vector<uint32_t>{f_gc, f_hot, f_times, f_main});
  const uint32_t s_bad = w->InternStack(std::vector<uint32_t>{f_bad});

  std::vector<TraceEvent> ev;
  ev.push_back(Ev(1000, EventName::kGvlAcquired, 1, kSourceThreadHookSite));
  ev.push_back(Ev(2000, EventName::kThreadStarted, 2, kSourceThreadHookSite));
  // A contended READY: thread 1 holds the GVL, running Worker#run (docs/rvtrace.md, "Contention").
  TraceEvent wants = Ev(2500, EventName::kWantsGvl, 2, kSourceThreadHookSite);
  wants.gvl = std::make_shared<GvlReading>();
  wants.gvl->held = true;
  wants.gvl->holder = 1;
  wants.holder_stack = s_hot;
  ev.push_back(wants);
  ev.push_back(Ev(3000, EventName::kSleepEnter, 1, kSourceProbe));
  TraceEvent rel = Ev(3100, EventName::kGvlReleased, 1, kSourceThreadHookSite);
  rel.stack = s_sleep;
  rel.reason = "sleep";
  rel.reason_provenance = Provenance::kDerived;
  ev.push_back(rel);
  ev.push_back(Ev(3200, EventName::kGvlAcquired, 2, kSourceThreadHookSite));
  TraceEvent sample = Ev(13'000'000, EventName::kSample, 2, kSourcePerfEvent);
  sample.stack = s_hot;
  ev.push_back(sample);
  ev.push_back(Ev(14'000'000, EventName::kGcEnter, 2, kSourceGcHookSite));
  sample = Ev(14'500'000, EventName::kSample, 2, kSourcePerfEvent);
  sample.stack = s_gc;
  ev.push_back(sample);
  ev.push_back(Ev(15'000'000, EventName::kGcExit, std::nullopt, kSourceGcHookSite));
  ev.push_back(Ev(15'100'000, EventName::kWantsGvl, 1, kSourceThreadHookSite));
  ev.push_back(Ev(15'200'000, EventName::kMutexLockEnter, 2, kSourceProbe));
  rel = Ev(15'300'000, EventName::kGvlReleased, 2, kSourceThreadHookSite);
  rel.stack = s_hot;
  rel.reason = "waiting_mutex";
  ev.push_back(rel);
  ev.push_back(Ev(15'400'000, EventName::kGvlAcquired, 1, kSourceThreadHookSite));
  TraceEvent drop = Ev(16'000'000, EventName::kEventsDropped, std::nullopt, kSourceDaemon);
  drop.count = 3;
  ev.push_back(drop);
  TraceEvent pause = Ev(17'000'000, EventName::kTracingPaused, std::nullopt, kSourceDaemon);
  pause.reason = "overhead budget";
  pause.overhead_pct = 7.25;
  ev.push_back(pause);
  // While paused, a sample's GVL reading: thread 2 holds, 1 and a thread not named wait (the estimate's input).
  sample = Ev(17'500'000, EventName::kSample, 2, kSourcePerfEvent);
  sample.stack = s_hot;
  sample.gvl = std::make_shared<GvlReading>();
  sample.gvl->held = true;
  sample.gvl->holder = 2;
  sample.gvl->waiting = 2;
  sample.gvl->queued = {1};
  ev.push_back(sample);
  TraceEvent resume = Ev(18'000'000, EventName::kTracingResumed, std::nullopt, kSourceDaemon);
  resume.reason = "overhead budget";
  resume.overhead_pct = 0.5;
  ev.push_back(resume);
  sample = Ev(18'100'000, EventName::kSample, 1, kSourcePerfEvent);
  sample.stack = s_bad;
  ev.push_back(sample);
  ev.push_back(Ev(18'200'000, EventName::kGvlAcquired, 2, kSourceThreadHookSite));
  ev.push_back(Ev(18'300'000, EventName::kThreadExited, 2, kSourceThreadHookSite));
  for (const TraceEvent& e : ev) {
    if (!Check(w->Write(e), path)) return false;
  }
  if (!finish) return Check(w->Flush(), path);
  FinishInfo info;
  info.end_t_ns = 19'000'000;
  info.ring_high_water_bytes = 4096;
  info.late_events = 1;
  info.stop_reason = "signal";
  info.probe_hits = 40;
  info.hits_discarded = 2;
  info.cold_hits = 5;
  info.stepped_hits = 1;
  info.sample_ec_routes = SampleEcRoutes{2, 1, 0, 1};
  info.gvl_readings = 1;
  info.gvl_queue_truncated = 0;
  return Check(w->Finish(info), path);
}

// 3.2's scheduler: main thread 0, a timeslice as READY then RESUMED with no SUSPENDED, a doubled SUSPENDED; written
// by the in-process recorder.
bool WriteTimeslice32(const std::string& path) {
  TraceHeader h;
  h.recorder = "in-process";
  h.pid = 77;
  h.ruby_version = "3.2.9";
  h.origin_ns = 5;
  h.started_at = "2026-02-01T00:00:00.000000Z";
  h.main_thread = 0;
  h.command = {"ruby", "-e", "2.times.map { Thread.new { 1 } }.each(&:join)"};
  Result<TraceWriter> w = TraceWriter::Create(path, h);
  if (!w.ok()) return Check(w.error(), path);
  const std::vector<TraceEvent> ev = {
      Ev(10, EventName::kGvlAcquired, 0, kSourceThreadHookSite),
      Ev(20, EventName::kThreadStarted, 1, kSourceThreadHookSite),
      Ev(30, EventName::kWantsGvl, 1, kSourceThreadHookSite),
      Ev(40, EventName::kWantsGvl, 0, kSourceThreadHookSite),
      Ev(50, EventName::kGvlAcquired, 1, kSourceThreadHookSite),
      Ev(60, EventName::kGvlReleased, 1, kSourceThreadHookSite),
      Ev(61, EventName::kGvlReleased, 1, kSourceThreadHookSite),
      Ev(70, EventName::kGvlAcquired, 0, kSourceThreadHookSite),
      Ev(80, EventName::kThreadExited, 1, kSourceThreadHookSite),
  };
  for (const TraceEvent& e : ev) {
    if (!Check(w->Write(e), path)) return false;
  }
  FinishInfo info;
  info.end_t_ns = 90;
  return Check(w->Finish(info), path);
}

// The file `from` without its last 17 bytes: inside the last line of a plain trace, inside the last zstd frame of a
// compressed one.
bool CutInsideLastLine(const std::string& from, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  std::string text = s.str();
  if (text.size() < 40) return false;
  text.resize(text.size() - 17);
  std::ofstream out(to, std::ios::binary | std::ios::trunc);
  out << text;
  return static_cast<bool>(out);
}

bool WriteSiteCaches(const std::string& dir, const std::vector<std::string>& elfs) {
  int written = 0;
  for (size_t i = 0; i < elfs.size(); ++i) {
    Result<ElfFile> elf = ElfFile::Open(elfs[i]);
    if (!elf.ok()) return Check(elf.error(), elfs[i]);
    for (const char* version : {"3.2.9", "3.4.5"}) {
      Result<SiteSet> set = FindSites(*elf, version);
      if (!set.ok()) continue;  // e.g. the stripped seed: no sites, no cache file
      std::ofstream out(dir + "/sites-" + std::to_string(i) + "-" + version + ".json", std::ios::trunc);
      out << SiteSetToJson(*set);
      written++;
    }
  }
  if (!elfs.empty() && written == 0) {
    std::fprintf(stderr, "make_seeds: FindSites found sites in none of the ELF seeds\n");
    return false;
  }
  return true;
}

// Forwards reads to a core and keeps every byte range that was read successfully.
class RecordingReader : public MemoryReader {
 public:
  explicit RecordingReader(MemoryReader* inner) : inner_(inner) {}
  bool Read(uint64_t addr, void* dst, size_t len) override {
    if (!inner_->Read(addr, dst, len)) return false;
    const uint8_t* p = static_cast<const uint8_t*>(dst);
    read_[addr].assign(p, p + len);  // one key per address: repeated reads of a word are kept once
    return true;
  }
  const std::map<uint64_t, std::vector<uint8_t>>& read() const { return read_; }

 private:
  MemoryReader* inner_;
  std::map<uint64_t, std::vector<uint8_t>> read_;
};

// Largest seed kept: deeper stacks (the cases' 1,000-frame recursion) add nothing the short ones lack.
constexpr size_t kMaxStacksSeedBytes = 48 * 1024;

bool WriteStacksSeeds(const std::string& dir, const std::vector<std::string>& cases) {
  int written = 0;
  for (const std::string& json_path : cases) {
    std::ifstream in(json_path);
    nlohmann::json c = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (c.is_discarded()) {
      std::fprintf(stderr, "make_seeds: %s is not JSON\n", json_path.c_str());
      return false;
    }
    const std::string core = json_path.substr(0, json_path.size() - 5) + ".core.gz";
    auto reader = CoreFileReader::Open(core, CoreFileReader::Options{"", false});
    if (!reader.ok()) return Check(reader.error(), core);
    int major = 0, minor = 0, teeny = 0;
    if (!ParseRubyVersion(c["ruby_version"].get<std::string>(), &major, &minor, &teeny)) return false;
    fuzz::StacksHeader h;
    for (size_t v = 0; v < std::size(fuzz::kStacksVersions); ++v) {
      if (fuzz::kStacksVersions[v][0] == major && fuzz::kStacksVersions[v][1] == minor) h.version = v;
    }
    h.global_symbols = std::stoull(c["vm"]["global_symbols"].get<std::string>(), nullptr, 16);
    h.id = 0x2b << 4;  // an operator ID ('+'): the symbol table check's own probe
    const std::string base = std::filesystem::path(json_path).stem().string() + "-" + c["ruby"].get<std::string>();
    int kept = 0;
    for (const nlohmann::json& t : c["golden"]["threads"]) {
      if (kept == 3) break;
      h.th = std::stoull(t["th"].get<std::string>(), nullptr, 16);
      RecordingReader rec(reader->get());
      if (!fuzz::ExerciseStacks(rec, h)) continue;
      std::string seed(reinterpret_cast<const char*>(&h), sizeof(h));
      for (const auto& [addr, bytes] : rec.read()) fuzz::AppendMemoryRecord(&seed, addr, bytes);
      if (seed.size() > kMaxStacksSeedBytes) continue;
      std::ofstream out(dir + "/" + base + "-thread" + std::to_string(kept) + ".bin", std::ios::binary);
      out << seed;
      kept++;
      written++;
    }
  }
  if (!cases.empty() && written == 0) {
    std::fprintf(stderr, "make_seeds: no thread of the coredump cases gave a stacks seed\n");
    return false;
  }
  return true;
}

}  // namespace
}  // namespace rvbpfd

int main(int argc, char** argv) {
  using namespace rvbpfd;
  if (argc < 2) {
    std::fprintf(stderr, "usage: fuzz_make_seeds OUT_DIR [--elf ELF]... [--core CASE.json]...\n");
    return 2;
  }
  const std::string out = argv[1];
  std::vector<std::string> elfs, cores;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--elf") {
      elfs.push_back(argv[i + 1]);
    } else if (flag == "--core") {
      cores.push_back(argv[i + 1]);
    } else {
      std::fprintf(stderr, "fuzz_make_seeds: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  const std::string trace = out + "/trace", cache = out + "/site_cache", stacks = out + "/stacks";
  for (const std::string& d : {out, trace, cache, stacks}) mkdir(d.c_str(), 0755);
  bool ok = WriteThreads34(trace + "/threads-3.4-finished.rvtrace", true) &&
            WriteThreads34(trace + "/threads-3.4-cut.rvtrace", false) &&
            WriteTimeslice32(trace + "/timeslice-3.2.rvtrace") &&
            CutInsideLastLine(trace + "/threads-3.4-finished.rvtrace", trace + "/threads-3.4-cut-in-line.rvtrace") &&
            WriteThreads34(trace + "/threads-3.4-finished-zstd.rvtrace", true, TraceFormat::kZstd) &&
            WriteThreads34(trace + "/threads-3.4-cut-zstd.rvtrace", false, TraceFormat::kZstd) &&
            CutInsideLastLine(trace + "/threads-3.4-finished-zstd.rvtrace",
                              trace + "/threads-3.4-cut-in-frame-zstd.rvtrace") &&
            WriteSiteCaches(cache, elfs) && WriteStacksSeeds(stacks, cores);
  return ok ? 0 : 1;
}
