// libFuzzer harness: the .rvtrace reader and the views `rvbpfd inspect` and `rvbpfd stats` print from a parsed
// trace (event table, per-thread summaries, the model's state and contention tables). Any input must either be
// refused with an error or read into a trace every view can print; a crash, a leak, an escaping exception or
// undefined behaviour is a bug.
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
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  Result<TraceFile> trace = TraceReader::Parse(text, "fuzz.rvtrace");
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
