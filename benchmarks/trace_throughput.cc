// Throughput of the daemon's consumer path, without BPF: synthetic rv_records go through FromRecord -> Reorderer ->
// TraceWriter into a temporary file, the way the ring buffer callback feeds them. Prints records per second; the
// target is at least 1,000,000/s on one core, so the daemon is never what makes the BPF ring overflow.
//
// Usage: bench_trace_throughput [RECORDS] [OUTPUT_DIR]   (defaults: 5000000, $TMPDIR or /tmp)
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

}  // namespace

int main(int argc, char** argv) {
  const uint64_t total = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 5'000'000;
  std::string dir = argc > 2 ? argv[2] : (std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp");
  const std::string path = dir + "/bench_trace_throughput." + std::to_string(getpid()) + ".rvtrace";

  rvbpfd::TraceHeader header;
  header.pid = 4242;
  header.ruby_version = "3.4.5";
  header.origin_ns = kOriginNs;
  rvbpfd::Result<rvbpfd::TraceWriter> writer = rvbpfd::TraceWriter::Create(path, header);
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
    source.Next(&batch, n);
    const Clock::time_point start = Clock::now();
    for (const rv_record& r : batch) reorderer.Push(rvbpfd::FromRecord(r, kOriginNs));
    reorderer.PopReady(&ready);
    if (!write_ready()) return 1;
    if (!writer->MaybeFlush(Clock::now()).ok()) return 1;
    busy += Clock::now() - start;
    done += n;
  }
  const Clock::time_point start = Clock::now();
  reorderer.Drain(&ready);
  if (!write_ready()) return 1;
  const uint64_t written = writer->events_written();
  rvbpfd::Status finished = writer->Finish(rvbpfd::FinishInfo{.end_t_ns = 0, .late_events = reorderer.late()});
  busy += Clock::now() - start;
  if (!finished.ok()) {
    std::fprintf(stderr, "%s\n", finished.error().ToString().c_str());
    return 1;
  }

  std::error_code ec;
  const uint64_t bytes = std::filesystem::file_size(path, ec);
  std::filesystem::remove(path, ec);
  const double seconds = std::chrono::duration<double>(busy).count();
  const double rate = static_cast<double>(total) / seconds;
  std::printf("records:        %llu (%llu event lines written, %llu late)\n", static_cast<unsigned long long>(total),
              static_cast<unsigned long long>(written), static_cast<unsigned long long>(reorderer.late()));
  std::printf("consumer time:  %.3f s\n", seconds);
  std::printf("throughput:     %.0f records/s (target >= 1000000): %s\n", rate, rate >= 1e6 ? "OK" : "BELOW TARGET");
  std::printf("output:         %.1f MB, %.1f MB/s, %.1f bytes/record\n", bytes / 1e6, bytes / 1e6 / seconds,
              static_cast<double>(bytes) / static_cast<double>(total));
  return 0;
}
