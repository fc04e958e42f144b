// libFuzzer harness: the .rvtrace reader, plain and zstd-compressed (the input layer that tells them apart by the
// zstd magic number and decompresses, whole or cut inside a frame), and the views `rvbpfd inspect` and `rvbpfd stats`
// print from a parsed trace (event table, per-thread summaries, the model's state and contention tables). Any input
// must either be refused with an error or read into a trace every view can print; a crash, a leak, an escaping
// exception or undefined behaviour is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz/fuzz_util.h"
#include "model/model.h"
#include "model/model_summary.h"
#include "trace/inspect.h"
#include "trace/reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rvbpfd;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  // The decompressed text is bounded far below the reader's 4 GiB so a small zstd input that expands hugely is
  // refused within the harness's memory limit, through the same check.
  constexpr uint64_t kMaxText = 16 << 20;
  Result<TraceFile> trace = TraceReader::ParseBytes(bytes, "fuzz.rvtrace", kMaxText);
  if (!trace.ok()) {
    FUZZ_CHECK(!trace.error().ToString().empty());
    return 0;
  }
  // Every id the reader accepted is defined (TraceFile's contract, which the exporters rely on).
  for (const TraceEvent& e : trace->events) {
    if (e.stack) FUZZ_CHECK(trace->Stack(*e.stack) != nullptr);
  }
  for (const auto& [id, frames] : trace->stacks) {
    for (uint32_t f : frames) FUZZ_CHECK(trace->Frame(f) != nullptr);
  }
  fuzz::NullStream out;
  PrintInspect(*trace, out);
  PrintStats(*trace, out);
  (void)ThreadSummaries(*trace);
  Result<Model> model = Model::FromTrace(std::move(trace).value());
  if (!model.ok()) return 0;
  PrintModelSummary(*model, out);
  PrintContentionSummary(*model, out);
  return 0;
}
