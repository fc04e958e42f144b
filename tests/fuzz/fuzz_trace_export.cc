// libFuzzer harness: every exporter fed from a parsed .rvtrace: pprof (and its gzip), folded (both weights),
// Perfetto, speedscope and the HTML report. Besides not crashing, each output must keep its format's promise:
// Perfetto, speedscope and the report's data are JSON a strict parser accepts (valid UTF-8 included), the report's
// data can never close its <script> element, folded lines are "frames weight", and the pprof profile is well-formed
// protobuf whose string table starts with "" and holds UTF-8 only.
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>

#include "export/folded.h"
#include "export/inspect_views.h"
#include "export/perfetto.h"
#include "export/pprof.h"
#include "export/speedscope.h"
#include "fuzz/fuzz_util.h"
#include "model/model.h"
#include "report/report.h"
#include "report/report_data.h"
#include "trace/reader.h"

namespace {

// Protobuf wire format: reads a varint at *at, false when it runs past the end or over 10 bytes.
bool ReadVarint(std::string_view b, size_t* at, uint64_t* out) {
  *out = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (*at >= b.size()) return false;
    const uint8_t byte = static_cast<uint8_t>(b[(*at)++]);
    *out |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) return true;
  }
  return false;
}

bool ValidUtf8(std::string_view s) {
  // nlohmann's parser validates UTF-8 strictly (no overlongs, no surrogates): reuse it on a JSON string literal.
  std::string doc = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20) return true;  // escapes: not about UTF-8
    doc.push_back(c);
  }
  doc.push_back('"');
  return nlohmann::json::accept(doc);
}

// A Profile message (proto/profile.proto): every field well-formed; field 6 (string_table) starts with "" and holds
// only UTF-8.
void CheckPprof(std::string_view b) {
  size_t at = 0;
  bool first_string = true;
  while (at < b.size()) {
    uint64_t key = 0;
    FUZZ_CHECK(ReadVarint(b, &at, &key));
    const uint64_t field = key >> 3;
    switch (key & 7) {
      case 0: {
        uint64_t v;
        FUZZ_CHECK(ReadVarint(b, &at, &v));
        break;
      }
      case 2: {
        uint64_t len;
        FUZZ_CHECK(ReadVarint(b, &at, &len));
        FUZZ_CHECK(len <= b.size() - at);
        const std::string_view payload = b.substr(at, len);
        if (field == 6) {
          if (first_string) FUZZ_CHECK(payload.empty());
          first_string = false;
          FUZZ_CHECK(ValidUtf8(payload));
        }
        at += len;
        break;
      }
      default:
        FUZZ_CHECK(!"pprof: a wire type the builder never writes");
    }
  }
  FUZZ_CHECK(!first_string);
}

void CheckFolded(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t space = line.rfind(' ');
    FUZZ_CHECK(space != std::string::npos && space + 1 < line.size());
    FUZZ_CHECK(line.find_first_not_of("0123456789", space + 1) == std::string::npos);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rvbpfd;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  Result<TraceFile> trace = TraceReader::Parse(text, "fuzz.rvtrace");
  if (!trace.ok()) return 0;

  fuzz::NullStream sink;
  const std::string profile = BuildPprofProfile(*trace);
  CheckPprof(profile);
  FUZZ_CHECK(ExportPprof(*trace, sink).ok());
  for (FoldedWeight w : {FoldedWeight::kCpuSamples, FoldedWeight::kGvlWaitNs}) {
    std::ostringstream folded;
    FUZZ_CHECK(ExportFolded(*trace, folded, w).ok());
    CheckFolded(folded.str());
  }

  if (trace->MultiProcess()) {
    // A trace of several processes: each tool's per-process path (trace/processes.h). Errors are allowed (a part can
    // name a Ruby older than 3.2, the root can have no threads); what is written must still be valid.
    std::ostringstream perfetto, speedscope;
    if (ExportPerfetto(*trace, perfetto).ok()) FUZZ_CHECK(nlohmann::json::accept(perfetto.str()));
    if (ExportSpeedscope(*trace, speedscope).ok()) FUZZ_CHECK(nlohmann::json::accept(speedscope.str()));
    fuzz::NullStream text;
    (void)PrintInspectSummary(*trace, text);
    (void)PrintInspectEvents(*trace, EventFilter{}, text);
    (void)PrintTraceStats(*trace, text);
    (void)SelectReportProcess(*trace, std::nullopt);
  }

  const auto frames = trace->frames;
  const auto stacks = trace->stacks;
  const std::optional<uint32_t> sample_hz = trace->header.sample_hz;
  Result<Model> model = Model::FromTrace(std::move(trace).value());
  if (!model.ok()) return 0;

  std::ostringstream perfetto;
  FUZZ_CHECK(ExportPerfetto(*model, perfetto, PerfettoStacks{&frames, &stacks}).ok());
  FUZZ_CHECK(nlohmann::json::accept(perfetto.str()));
  std::ostringstream speedscope;
  FUZZ_CHECK(ExportSpeedscope(*model, speedscope).ok());
  FUZZ_CHECK(nlohmann::json::accept(speedscope.str()));

  ReportOptions options;
  options.title = "fuzz </script><!--";
  options.frames = &frames;
  options.stacks = &stacks;
  options.sample_hz = sample_hz;
  std::string report_data;
  AppendReportData(*model, options, &report_data);
  FUZZ_CHECK(nlohmann::json::accept(report_data));
  FUZZ_CHECK(report_data.find('<') == std::string::npos);
  FUZZ_CHECK(WriteReportHtml(*model, options, sink).ok());
  return 0;
}
