// Throughput of the daemon's consumer path, without BPF: synthetic rv_records go through FromRecord -> Reorderer ->
// TraceWriter into a temporary file, the way the ring buffer callback feeds them. Prints records per second; the
// target is at least 1,000,000/s on one core, so the daemon is never what makes the BPF ring overflow. FORMAT is the
// trace format written (--trace-format: zstd, the default, or jsonl); the bytes per record it prints are of these
// synthetic scheduler events (no stacks), not of a real recording.
//
// It also prints CPU times, which a loaded machine (where the wall-clock rate says more about the other processes)
// still compares across builds: the draining thread's own (what bounds its rate on an idle core) and the consumer's
// total (the process's, any thread, minus what generating the records took).
//
// Usage: bench_trace_throughput [RECORDS] [OUTPUT_DIR] [FORMAT]   (defaults: 5000000, $TMPDIR or /tmp, zstd)
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "rvbpfd/abi.h"
#include "session/reorder.h"
#include "trace/event.h"
#include "trace/writer.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kOriginNs = 1'000'000'000'000;  // an arbitrary CLOCK_MONOTONIC origin
constexpr uint64_t kReorderWindowNs = 5'000'000;    // 5 ms, the order of the daemon's window
constexpr uint64_t kMeanGapNs = 250;                // 4 M events/s of event time: a busy target
constexpr uint64_t kMaxSkewNs = 50'000;             // cross-CPU submit skew, well inside the window
constexpr size_t kBatch = 4096;                     // records per ring drain
constexpr uint32_t kThreads = 8;

// Fills `batch` with the next records of an 8-thread GVL hand-off pattern (READY, RESUMED, SUSPENDED per turn, with
// the odd GC and sleep), timestamps jittered as if submitted from several CPUs.
class RecordSource {
 public:
  void Next(std::vector<rv_record>* batch, size_t n) {
    batch->clear();
    for (size_t i = 0; i < n; ++i) {
      rv_record r{};
      now_ns_ += kMeanGapNs;
      const uint64_t skew = rng_() % kMaxSkewNs;
      r.ts_ns = kOriginNs + (now_ns_ > skew ? now_ns_ - skew : 0);
      const uint32_t thread = 1 + static_cast<uint32_t>(turn_ % kThreads);
      r.serial = thread;
      r.tid = 50'000 + thread;
      r.probe_tid = r.tid;
      r.pid = 4242;
      r.th = 0x7f00'0000'0000ull + thread * 0x1000ull;
      switch (step_++ % 3) {
        case 0: r.kind = RV_EV_THREAD_READY; break;
        case 1: r.kind = RV_EV_THREAD_RESUMED; break;
        default:
          r.kind = (seq_ % 97 == 0) ? RV_EV_GC_ENTER : (seq_ % 89 == 0) ? RV_EV_SLEEP_ENTER : RV_EV_THREAD_SUSPENDED;
          ++turn_;
          break;
      }
      ++seq_;
      batch->push_back(r);
    }
  }

 private:
  std::mt19937_64 rng_{12345};
  uint64_t now_ns_ = 0;
  uint64_t turn_ = 0;
  uint64_t step_ = 0;
  uint64_t seq_ = 0;
};

double CpuSeconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t total = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 5'000'000;
  std::string dir = argc > 2 ? argv[2] : (std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp");
  const std::string path = dir + "/bench_trace_throughput." + std::to_string(getpid()) + ".rvtrace";
  const std::string format_name = argc > 3 ? argv[3] : "zstd";
  if (format_name != "zstd" && format_name != "jsonl") {
    std::fprintf(stderr, "bench_trace_throughput: FORMAT must be zstd or jsonl, not %s\n", format_name.c_str());
    return 2;
  }
  const rvbpfd::TraceFormat format = format_name == "zstd" ? rvbpfd::TraceFormat::kZstd : rvbpfd::TraceFormat::kJsonl;

  rvbpfd::TraceHeader header;
  header.pid = 4242;
  header.ruby_version = "3.4.5";
  header.origin_ns = kOriginNs;
  rvbpfd::Result<rvbpfd::TraceWriter> writer = rvbpfd::TraceWriter::Create(path, header, format);
  if (!writer.ok()) {
    std::fprintf(stderr, "%s\n", writer.error().ToString().c_str());
    return rvbpfd::ExitStatus(writer.error().code());
  }
  rvbpfd::Reorderer<rvbpfd::TraceEvent> reorderer(kReorderWindowNs);
  RecordSource source;
  std::vector<rv_record> batch;
  batch.reserve(kBatch);
  std::vector<rvbpfd::TraceEvent> ready;
  ready.reserve(kBatch * 4);

  // Only the consumer path is timed; generating the synthetic records is not part of the daemon's work.
  Clock::duration busy{};
  const double cpu_start = CpuSeconds(CLOCK_PROCESS_CPUTIME_ID);
  double generator_cpu = 0;
  double drain_cpu = 0;  // the calling thread's CPU inside the timed sections
  uint64_t done = 0;
  auto write_ready = [&]() -> bool {
    for (const rvbpfd::TraceEvent& e : ready) {
      rvbpfd::Status s = writer->Write(e);
      if (!s.ok()) {
        std::fprintf(stderr, "%s\n", s.error().ToString().c_str());
        return false;
      }
    }
    ready.clear();
    return true;
  };
  while (done < total) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kBatch, total - done));
    const double gen_start = CpuSeconds(CLOCK_THREAD_CPUTIME_ID);
    source.Next(&batch, n);
    generator_cpu += CpuSeconds(CLOCK_THREAD_CPUTIME_ID) - gen_start;
    const double drain_start = CpuSeconds(CLOCK_THREAD_CPUTIME_ID);
    const Clock::time_point start = Clock::now();
    for (const rv_record& r : batch) reorderer.Push(rvbpfd::FromRecord(r, kOriginNs));
    reorderer.PopReady(&ready);
    if (!write_ready()) return 1;
    if (!writer->MaybeFlush(Clock::now()).ok()) return 1;
    busy += Clock::now() - start;
    drain_cpu += CpuSeconds(CLOCK_THREAD_CPUTIME_ID) - drain_start;
    done += n;
  }
  const double drain_start = CpuSeconds(CLOCK_THREAD_CPUTIME_ID);
  const Clock::time_point start = Clock::now();
  reorderer.Drain(&ready);
  if (!write_ready()) return 1;
  const uint64_t written = writer->events_written();
  rvbpfd::Status finished = writer->Finish(rvbpfd::FinishInfo{.end_t_ns = 0, .late_events = reorderer.late()});
  busy += Clock::now() - start;
  drain_cpu += CpuSeconds(CLOCK_THREAD_CPUTIME_ID) - drain_start;
  const double consumer_cpu = CpuSeconds(CLOCK_PROCESS_CPUTIME_ID) - cpu_start - generator_cpu;
  if (!finished.ok()) {
    std::fprintf(stderr, "%s\n", finished.error().ToString().c_str());
    return 1;
  }

  std::error_code ec;
  const uint64_t bytes = std::filesystem::file_size(path, ec);
  std::filesystem::remove(path, ec);
  const double seconds = std::chrono::duration<double>(busy).count();
  const double rate = static_cast<double>(total) / seconds;
  std::printf("format:         %s\n", format_name.c_str());
  std::printf("records:        %llu (%llu event lines written, %llu late)\n", static_cast<unsigned long long>(total),
              static_cast<unsigned long long>(written), static_cast<unsigned long long>(reorderer.late()));
  std::printf("consumer time:  %.3f s\n", seconds);
  std::printf("throughput:     %.0f records/s (target >= 1000000): %s\n", rate, rate >= 1e6 ? "OK" : "BELOW TARGET");
  std::printf("drain cpu:      %.3f s, %.0f records per CPU second of the draining thread\n", drain_cpu,
              static_cast<double>(total) / drain_cpu);
  std::printf("consumer cpu:   %.3f s (all threads), %.0f ns per record\n", consumer_cpu,
              consumer_cpu * 1e9 / static_cast<double>(total));
  std::printf("output:         %.1f MB, %.1f MB/s, %.1f bytes/record\n", bytes / 1e6, bytes / 1e6 / seconds,
              static_cast<double>(bytes) / static_cast<double>(total));
  return 0;
}
