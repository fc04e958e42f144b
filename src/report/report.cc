#include "report/report.h"

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string_view>
#include <utility>

#include "common/safe_file.h"
#include "report/report_data.h"
#include "report/report_ui.h"
#include "trace/processes.h"
#include "trace/reader.h"

namespace rvbpfd {
namespace {

constexpr size_t kWriteChunk = 1 << 20;  // bytes per write to the stream, so a 50 MB page is not one huge write

void WriteChunked(std::ostream& out, std::string_view s) {
  for (size_t at = 0; at < s.size() && out; at += kWriteChunk) {
    const size_t n = std::min(kWriteChunk, s.size() - at);
    out.write(s.data() + at, static_cast<std::streamsize>(n));
  }
}

}  // namespace

Status WriteReportHtml(const Model& model, const ReportOptions& options, std::ostream& out) {
  struct Slot {
    std::string_view marker;
    std::string_view text;
    size_t at = 0;
  };
  Slot slots[] = {{kReportCssSlot, kReportCss}, {kReportJsSlot, kReportJs}, {kReportDataSlot, {}}};
  const std::string_view page = kReportHtml;
  for (Slot& slot : slots) {
    slot.at = page.find(slot.marker);
    if (slot.at == std::string_view::npos || page.find(slot.marker, slot.at + 1) != std::string_view::npos) {
      const std::string_view name = slot.marker.substr(0, slot.marker.find('\n'));
      return Error(ErrorCode::kInternal, "the report page does not have exactly one " + std::string(name));
    }
  }
  std::string data;
  // About 45 bytes per event for the events and the blocks they produce; reserving avoids repeated copies of a
  // string that reaches tens of MB.
  data.reserve(4096 + model.events().size() * 48);
  AppendReportData(model, options, &data);
  slots[2].text = data;
  std::sort(std::begin(slots), std::end(slots), [](const Slot& a, const Slot& b) { return a.at < b.at; });
  for (size_t i = 1; i < std::size(slots); ++i) {
    if (slots[i].at < slots[i - 1].at + slots[i - 1].marker.size()) {
      return Error(ErrorCode::kInternal, "the report page's slots overlap");
    }
  }
  size_t at = 0;
  for (const Slot& slot : slots) {
    WriteChunked(out, page.substr(at, slot.at - at));
    WriteChunked(out, slot.text);
    at = slot.at + slot.marker.size();
  }
  WriteChunked(out, page.substr(at));
  out.flush();
  if (!out) return Error(ErrorCode::kIo, "writing the report failed");
  return Status::Ok();
}

Result<ReportPart> SelectReportProcess(TraceFile trace, std::optional<uint32_t> process) {
  if (!trace.MultiProcess()) {
    if (process && *process != kRootProcessId) {
      return Error(ErrorCode::kUsage, "--process " + std::to_string(*process) +
                                          ": the trace has one process (id 1)");
    }
    return ReportPart{.trace = std::move(trace)};
  }
  std::vector<ProcessTrace> parts = SplitByProcess(trace);
  std::string ids;
  for (size_t i = 0; i < parts.size(); ++i) {
    ids += (ids.empty() ? "" : ", ") + std::to_string(parts[i].info.id);
  }
  const uint32_t want = process.value_or(kRootProcessId);
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].info.id != want) continue;
    return ReportPart{.trace = std::move(parts[i].trace),
                      .title_suffix = " · " + parts[i].label + ", process " + std::to_string(want) + " of " +
                                      std::to_string(trace.processes.size()) + " (rvbpfd report --process ID: " +
                                      ids + ")"};
  }
  return Error(ErrorCode::kUsage, "--process " + std::to_string(want) +
                                      ": not a traced process of this trace; its traced processes are " +
                                      (ids.empty() ? "none" : ids) + " (rvbpfd inspect lists them)");
}

Status WriteReport(const std::string& trace_path, const std::string& out_path, uint64_t max_output_bytes,
                   std::optional<uint32_t> process) {
  Result<TraceFile> whole = TraceReader::ReadFile(trace_path);
  if (!whole.ok()) return whole.error();
  Result<ReportPart> part = SelectReportProcess(std::move(whole).value(), process);
  if (!part.ok()) return part.error();
  std::optional<TraceFile> trace(std::move(part->trace));
  // The model keeps the events (with their stack ids); the dictionaries they index stay here for the page.
  const std::unordered_map<uint32_t, FrameInfo> frames = std::move(trace->frames);
  const std::unordered_map<uint32_t, std::vector<uint32_t>> stacks = std::move(trace->stacks);
  const std::optional<uint32_t> sample_hz = trace->header.sample_hz;
  Result<Model> model = Model::FromTrace(std::move(trace).value());
  if (!model.ok()) return model.error();
  ReportOptions options;
  options.title = std::filesystem::path(trace_path).filename().string() + part->title_suffix;
  options.frames = &frames;
  options.stacks = &stacks;
  options.sample_hz = sample_hz;
  OutputFileOptions file_options;
  file_options.owner = SudoInvokerOfProcess();
  file_options.allow_fifo_or_device = true;
  file_options.max_bytes = max_output_bytes;
  return WriteOutputFile(out_path, file_options, [&](std::ostream& out) -> Status {
    const Status status = WriteReportHtml(*model, options, out);
    if (!status.ok()) return status.error().Wrap(out_path);
    return Status::Ok();
  });
}

}  // namespace rvbpfd
