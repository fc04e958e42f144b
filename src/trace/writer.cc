#include "trace/writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <ctime>
#include <utility>

#include "trace/json_format.h"

namespace rvbpfd {
namespace {

// Writes all of [data, data+size), retrying short writes and EINTR. Returns 0 or the errno.
int WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return 0;
}

void AppendOptionalUint(std::string* out, const std::optional<uint32_t>& value) {
  if (value) {
    AppendUint(out, *value);
  } else {
    out->append("null");
  }
}

}  // namespace

std::string FormatIso8601Utc(std::chrono::system_clock::time_point time) {
  const auto since_epoch = time.time_since_epoch();
  const auto secs = std::chrono::floor<std::chrono::seconds>(since_epoch);
  const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(since_epoch - secs).count();
  const std::time_t t = static_cast<std::time_t>(secs.count());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<long long>(micros));
  return buf;
}

TraceWriter::TraceWriter(std::string path, OutputFile file, const TraceHeader& header)
    : path_(std::move(path)),
      file_(std::move(file)),
      last_timed_flush_(std::chrono::steady_clock::now()),
      accounting_(header.main_thread) {
  buffer_.reserve(kFlushBytes + 4096);
}

TraceWriter::TraceWriter(TraceWriter&& other) noexcept
    : path_(std::move(other.path_)),
      file_(std::move(other.file_)),
      finished_(other.finished_),
      buffer_(std::move(other.buffer_)),
      zstd_(std::move(other.zstd_)),
      compressed_(std::move(other.compressed_)),
      last_timed_flush_(other.last_timed_flush_),
      first_events_flushed_(other.first_events_flushed_),
      accounting_(std::move(other.accounting_)),
      stacks_(std::move(other.stacks_)),
      counts_(other.counts_),
      events_written_(other.events_written_),
      dropped_total_(other.dropped_total_),
      last_t_ns_(other.last_t_ns_) {
  other.finished_ = true;
  other.buffer_.clear();
}

TraceWriter& TraceWriter::operator=(TraceWriter&& other) noexcept {
  if (this != &other) {
    Close();
    path_ = std::move(other.path_);
    file_ = std::move(other.file_);
    finished_ = other.finished_;
    buffer_ = std::move(other.buffer_);
    zstd_ = std::move(other.zstd_);
    compressed_ = std::move(other.compressed_);
    last_timed_flush_ = other.last_timed_flush_;
    first_events_flushed_ = other.first_events_flushed_;
    accounting_ = std::move(other.accounting_);
    stacks_ = std::move(other.stacks_);
    counts_ = other.counts_;
    events_written_ = other.events_written_;
    dropped_total_ = other.dropped_total_;
    last_t_ns_ = other.last_t_ns_;
    other.finished_ = true;
    other.buffer_.clear();
  }
  return *this;
}

TraceWriter::~TraceWriter() { Close(); }

void TraceWriter::Close() {
  if (file_.fd() < 0) return;
  if (!buffer_.empty() || (zstd_ && zstd_->frame_open())) {
    // Best effort: a destructor cannot report, and what reaches the file is whole lines (whole frames) either way.
    (void)Flush();
  }
  // The file is at its name since Create: committing only closes it, keeping what was written (a cut trace).
  (void)file_.Commit();
}

Result<TraceWriter> TraceWriter::Create(const std::string& path, const TraceHeader& header, TraceFormat format) {
  std::unique_ptr<ZstdCompressor> zstd;
  if (format == TraceFormat::kZstd) {
    Result<std::unique_ptr<ZstdCompressor>> c = ZstdCompressor::Create();
    if (!c) return c.error();
    zstd = std::move(c).value();
  }
  OutputFileOptions options;
  options.owner = SudoInvokerOfProcess();
  options.publish_at_create = true;
  options.allow_fifo_or_device = true;  // a crash or a follower (tail -f) sees the trace as it is written
  Result<OutputFile> file = OutputFile::Create(path, options);
  if (!file) return file.error();
  TraceWriter writer(path, std::move(file).value(), header);
  writer.zstd_ = std::move(zstd);
  writer.AppendHeader(header);
  TraceEvent started;
  started.event = EventName::kTracingStarted;
  started.source = kSourceDaemon;
  started.provenance = Provenance::kObserved;
  started.t_ns = 0;
  writer.AppendEvent(started);
  // A whole frame in the zstd format: the file reads at once.
  const int err = writer.WriteBuffer(/*end_frame=*/true);
  if (err != 0) {
    writer.Abandon();
    return Error(ErrorCode::kOutputUnwritable,
                 ErrnoMessage("cannot write output file " + path, err) + "; choose another path with -o");
  }
  return writer;
}

void TraceWriter::AppendHeader(const TraceHeader& header) {
  std::string& b = buffer_;
  b.append("{\"rvtrace\":");
  AppendUint(&b, kRvtraceVersion);
  b.append(",\"recorder\":");
  AppendJsonString(&b, header.recorder);
  b.append(",\"recorder_version\":");
  AppendJsonString(&b, header.recorder_version);
  b.append(",\"pid\":");
  b.append(std::to_string(header.pid));
  b.append(",\"ruby_version\":");
  AppendJsonString(&b, header.ruby_version);
  b.append(",\"clock\":");
  AppendJsonString(&b, header.clock);
  b.append(",\"origin_ns\":");
  AppendUint(&b, header.origin_ns);
  b.append(",\"started_at\":");
  AppendJsonString(&b, header.started_at.empty() ? FormatIso8601Utc(std::chrono::system_clock::now())
                                                 : header.started_at);
  b.append(",\"channels\":[");
  for (size_t i = 0; i < header.channels.size(); ++i) {
    if (i > 0) b.push_back(',');
    AppendJsonString(&b, header.channels[i]);
  }
  b.append("],\"main_thread\":");
  AppendOptionalUint(&b, header.main_thread);
  if (!header.command.empty()) {
    b.append(",\"command\":[");
    for (size_t i = 0; i < header.command.size(); ++i) {
      if (i > 0) b.push_back(',');
      AppendJsonString(&b, header.command[i]);
    }
    b.push_back(']');
  }
  if (!header.build_id.empty()) {
    b.append(",\"build_id\":");
    AppendJsonString(&b, header.build_id);
  }
  if (header.sample_hz) {
    b.append(",\"sample_hz\":");
    AppendUint(&b, *header.sample_hz);
  }
  if (!header.stacks.empty()) {
    b.append(",\"stacks\":");
    AppendJsonString(&b, header.stacks);
  }
  b.append("}\n");
}

void TraceWriter::AppendThreadInfoKeys(const ThreadInfo& info) {
  std::string& b = buffer_;
  if (info.name) {
    b.append(",\"name\":");
    AppendJsonString(&b, *info.name);
  }
  if (info.native_name) {
    b.append(",\"native_name\":");
    AppendJsonString(&b, *info.native_name);
  }
  if (info.ns_tid) {
    b.append(",\"ns_tid\":");
    AppendUint(&b, *info.ns_tid);
  }
}

void TraceWriter::SetThreadInfo(uint32_t ruby_thread, const ThreadInfo& info, uint64_t t_ns) {
  if (finished_) return;
  ThreadInfoState& st = thread_infos_[ruby_thread];
  ThreadInfo changed;
  if (info.name && info.name != st.info.name) changed.name = st.info.name = info.name;
  if (info.native_name && info.native_name != st.info.native_name) {
    changed.native_name = st.info.native_name = info.native_name;
  }
  if (info.ns_tid && info.ns_tid != st.info.ns_tid) changed.ns_tid = st.info.ns_tid = info.ns_tid;
  if (!st.written || changed.empty()) return;
  buffer_.append("{\"thread_info\":{\"ruby_thread\":");
  AppendUint(&buffer_, ruby_thread);
  buffer_.append(",\"t_ns\":");
  AppendUint(&buffer_, t_ns);
  AppendThreadInfoKeys(changed);
  buffer_.append("}}\n");
}

void TraceWriter::WriteProcess(const ProcessInfo& p, std::optional<uint32_t> main_ruby_thread) {
  if (finished_) return;
  if (main_ruby_thread) process_mains_.insert(*main_ruby_thread);  // marked once its thread line is written
  std::string& b = buffer_;
  b.append("{\"process\":{\"id\":");
  AppendUint(&b, p.id);
  b.append(",\"pid\":");
  AppendUint(&b, p.pid);
  if (p.parent) {
    b.append(",\"parent\":");
    AppendUint(&b, *p.parent);
  }
  if (!p.cause.empty()) {
    b.append(",\"cause\":");
    AppendJsonString(&b, p.cause);
  }
  b.append(",\"t_ns\":");
  AppendUint(&b, p.t_ns);
  if (!p.command.empty()) {
    b.append(",\"command\":[");
    for (size_t i = 0; i < p.command.size(); ++i) {
      if (i > 0) b.push_back(',');
      AppendJsonString(&b, p.command[i]);
    }
    b.push_back(']');
  }
  if (!p.ruby_version.empty() && p.skipped.empty()) {
    b.append(",\"ruby_version\":");
    AppendJsonString(&b, p.ruby_version);
  }
  if (!p.build_id.empty()) {
    b.append(",\"build_id\":");
    AppendJsonString(&b, p.build_id);
  }
  if (!p.skipped.empty()) {
    b.append(",\"skipped\":");
    AppendJsonString(&b, p.skipped);
  }
  b.append("}}\n");
}

void TraceWriter::WriteProcessEnd(const ProcessEnd& e) {
  if (finished_) return;
  std::string& b = buffer_;
  b.append("{\"process_end\":{\"id\":");
  AppendUint(&b, e.id);
  b.append(",\"t_ns\":");
  AppendUint(&b, e.t_ns);
  b.append(",\"how\":");
  AppendJsonString(&b, e.how);
  if (e.exit_code) {
    b.append(",\"exit_code\":");
    b.append(std::to_string(*e.exit_code));
  }
  if (e.signal) {
    b.append(",\"signal\":");
    b.append(std::to_string(*e.signal));
  }
  b.append("}}\n");
}

void TraceWriter::AppendEvent(const TraceEvent& event) {
  std::string& b = buffer_;
  if (accounting_.Observe(event)) {
    b.append("{\"thread\":{\"ruby_thread\":");
    AppendUint(&b, *event.ruby_thread);
    // A followed process's main thread (WriteProcess) is main in the summary too.
    if (!process_mains_.empty() && process_mains_.contains(*event.ruby_thread)) {
      accounting_.MarkMain(*event.ruby_thread);
    }
    b.append(accounting_.IsMain(*event.ruby_thread) ? ",\"main\":true" : ",\"main\":false");
    if (event.process != kRootProcessId) {
      b.append(",\"process\":");
      AppendUint(&b, event.process);
    }
    ThreadInfoState& ti = thread_infos_[*event.ruby_thread];
    AppendThreadInfoKeys(ti.info);
    ti.written = true;
    b.append("}}\n");
  }
  b.append("{\"t_ns\":");
  AppendUint(&b, event.t_ns);
  b.append(",\"ruby_thread\":");
  AppendOptionalUint(&b, event.ruby_thread);
  b.append(",\"native_tid\":");
  AppendOptionalUint(&b, event.native_tid);
  b.append(",\"probe_tid\":");
  AppendOptionalUint(&b, event.probe_tid);
  if (event.th != 0) {
    b.append(",\"th\":");
    AppendHexString(&b, event.th);
  }
  b.append(",\"event\":\"");
  b.append(EventNameString(event.event));  // static names need no escaping
  const std::string_view cruby = CrubyEventConstant(event.event);
  if (cruby.empty()) {
    b.append("\",\"cruby_event\":null");
  } else {
    b.append("\",\"cruby_event\":\"");
    b.append(cruby);
    b.push_back('"');
  }
  b.append(",\"source\":");
  AppendJsonString(&b, event.source);
  b.append(",\"provenance\":\"");
  b.append(ProvenanceString(event.provenance));
  b.push_back('"');
  if (event.event == EventName::kEventsDropped) {
    b.append(",\"count\":");
    AppendUint(&b, event.count);
  }
  if (!event.reason.empty()) {
    b.append(",\"reason\":");
    AppendJsonString(&b, event.reason);
    if (event.event == EventName::kGvlReleased) {
      b.append(",\"reason_provenance\":\"");
      b.append(ProvenanceString(event.reason_provenance));
      b.push_back('"');
    }
  }
  if (event.stack) {
    b.append(",\"stack\":");
    AppendUint(&b, *event.stack);
  }
  if (event.overhead_pct >= 0) {
    b.append(",\"overhead_pct\":");
    AppendDouble(&b, event.overhead_pct);
  }
  if (event.gvl && event.event == EventName::kWantsGvl) {
    // The holder its READY found (docs/rvtrace.md, "Contention").
    b.append(",\"holder\":");
    AppendOptionalUint(&b, event.gvl->holder);
    if (event.holder_stack) {
      b.append(",\"holder_stack\":");
      AppendUint(&b, *event.holder_stack);
    }
  } else if (event.gvl) {
    const GvlReading& g = *event.gvl;
    b.append(g.held ? ",\"gvl\":{\"held\":true,\"holder\":" : ",\"gvl\":{\"held\":false,\"holder\":");
    AppendOptionalUint(&b, g.holder);
    b.append(",\"waiting\":");
    AppendUint(&b, g.waiting);
    b.append(",\"queued\":[");
    for (size_t i = 0; i < g.queued.size(); ++i) {
      if (i > 0) b.push_back(',');
      AppendUint(&b, g.queued[i]);
    }
    b.append("]}");
  }
  b.append("}\n");

  counts_[static_cast<size_t>(event.event)]++;
  if (event.event == EventName::kEventsDropped) dropped_total_ += event.count;
  if (event.t_ns > last_t_ns_) last_t_ns_ = event.t_ns;
  ++events_written_;
}

Status TraceWriter::Write(const TraceEvent& event) {
  if (finished_ || file_.fd() < 0) {
    return Error(ErrorCode::kInternal, "writing trace event to " + path_ + ": the writer is already finished");
  }
  if (event.stack && stacks_.stack(*event.stack) == nullptr) {
    return Error(ErrorCode::kInternal, "writing trace event to " + path_ + ": stack " +
                                           std::to_string(*event.stack) + " was never interned");
  }
  if (event.holder_stack && stacks_.stack(*event.holder_stack) == nullptr) {
    return Error(ErrorCode::kInternal, "writing trace event to " + path_ + ": holder stack " +
                                           std::to_string(*event.holder_stack) + " was never interned");
  }
  AppendEvent(event);
  if (buffer_.size() < kFlushBytes) return Status::Ok();
  // Compressed, the frame stays open: zstd writes out the blocks it has finished and keeps the rest.
  if (const int err = WriteBuffer(/*end_frame=*/false); err != 0) {
    return Error(ErrorCode::kIo, ErrnoMessage("writing trace file " + path_, err) +
                                     "; free space there or choose another path with -o");
  }
  return Status::Ok();
}

uint32_t TraceWriter::InternFrame(const FrameInfo& frame) {
  const InternResult r = stacks_.InternFrame(frame);
  if (r.is_new) AppendFrameLine(r.id, frame);
  return r.id;
}

uint32_t TraceWriter::InternStack(std::span<const uint32_t> frame_ids) {
  const InternResult r = stacks_.InternStack(frame_ids);
  if (r.is_new) AppendStackLine(r.id, frame_ids);
  return r.id;
}

void TraceWriter::AppendFrameLine(uint32_t id, const FrameInfo& frame) {
  std::string& b = buffer_;
  b.append("{\"frame\":{\"id\":");
  AppendUint(&b, id);
  b.append(",\"label\":");
  AppendJsonString(&b, frame.label);
  b.append(",\"path\":");
  AppendJsonString(&b, frame.path);
  b.append(",\"line\":");
  b.append(std::to_string(frame.line));
  b.append(",\"kind\":\"");
  b.append(FrameKindString(frame.kind));
  b.append("\"}}\n");
}

void TraceWriter::AppendStackLine(uint32_t id, std::span<const uint32_t> frame_ids) {
  std::string& b = buffer_;
  b.append("{\"stack\":{\"id\":");
  AppendUint(&b, id);
  b.append(",\"frames\":[");
  for (size_t i = 0; i < frame_ids.size(); ++i) {
    if (i > 0) b.push_back(',');
    AppendUint(&b, frame_ids[i]);
  }
  b.append("]}}\n");
}

Status TraceWriter::MaybeFlush(std::chrono::steady_clock::time_point now) {
  // Time is measured between MaybeFlush calls rather than per line, which keeps clock reads off the per-event path.
  const bool first_events = !first_events_flushed_ && events_written_ > 1;  // beyond tracing_started
  if (!first_events && now - last_timed_flush_ < kFlushInterval) return Status::Ok();
  if (events_written_ > 1) first_events_flushed_ = true;
  last_timed_flush_ = now;
  return Flush();
}

int TraceWriter::WriteBuffer(bool end_frame) {
  if (!zstd_) {
    const int err = WriteAll(file_.fd(), buffer_.data(), buffer_.size());
    buffer_.clear();
    return err;
  }
  compressed_.clear();
  const Status s = zstd_->Compress(buffer_, end_frame, &compressed_);
  buffer_.clear();
  if (!s.ok()) return ENOMEM;  // zstd fails only when out of memory; what reached the file stays readable
  return WriteAll(file_.fd(), compressed_.data(), compressed_.size());
}

Status TraceWriter::Flush() {
  if ((buffer_.empty() && !(zstd_ && zstd_->frame_open())) || file_.fd() < 0) return Status::Ok();
  const int err = WriteBuffer(/*end_frame=*/true);
  if (err != 0) {
    return Error(ErrorCode::kIo, ErrnoMessage("writing trace file " + path_, err) +
                                     "; free space there or choose another path with -o");
  }
  return Status::Ok();
}

TraceSummary TraceWriter::CurrentSummary(uint64_t end_t_ns) const {
  TraceSummary summary;
  summary.event_counts = counts_;
  summary.events_dropped = dropped_total_;
  summary.drop_records = counts_[static_cast<size_t>(EventName::kEventsDropped)];
  summary.threads = accounting_.Summarize(end_t_ns);
  summary.duration_ms = static_cast<double>(end_t_ns) / 1e6;
  summary.frames = stacks_.frame_count();
  summary.stacks = stacks_.stack_count();
  return summary;
}

void TraceWriter::AppendSummary(const TraceSummary& summary) {
  std::string& b = buffer_;
  b.append("{\"summary\":{\"event_counts\":{");
  bool first = true;
  for (size_t i = 0; i < kEventNameCount; ++i) {
    if (summary.event_counts[i] == 0) continue;
    if (!first) b.push_back(',');
    first = false;
    b.push_back('"');
    b.append(EventNameString(static_cast<EventName>(i)));
    b.append("\":");
    AppendUint(&b, summary.event_counts[i]);
  }
  b.append("},\"events_dropped\":");
  AppendUint(&b, summary.events_dropped);
  b.append(",\"drop_records\":");
  AppendUint(&b, summary.drop_records);
  b.append(",\"ring_high_water_bytes\":");
  AppendUint(&b, summary.ring_high_water_bytes);
  b.append(",\"threads\":[");
  for (size_t i = 0; i < summary.threads.size(); ++i) {
    const ThreadSummary& t = summary.threads[i];
    if (i > 0) b.push_back(',');
    b.append("{\"ruby_thread\":");
    AppendUint(&b, t.ruby_thread);
    b.append(t.main ? ",\"main\":true" : ",\"main\":false");
    b.append(",\"native_tids\":[");
    for (size_t k = 0; k < t.native_tids.size(); ++k) {
      if (k > 0) b.push_back(',');
      AppendUint(&b, t.native_tids[k]);
    }
    b.append("],\"running_ms\":");
    AppendFixed(&b, t.running_ms, 6);  // ns resolution
    b.push_back('}');
  }
  b.append("],\"duration_ms\":");
  AppendFixed(&b, summary.duration_ms, 6);
  b.append(",\"late_events\":");
  AppendUint(&b, summary.late_events);
#define RV_TRAP_KEY(field, fold, label)   \
  if (summary.field) {                     \
    b.append(",\"" #field "\":");           \
    AppendUint(&b, *summary.field);        \
  }
  RV_TRAP_COUNTERS(RV_TRAP_KEY)
  RV_GVL_COUNTERS(RV_TRAP_KEY)
#undef RV_TRAP_KEY
  if (summary.sample_ec_routes) {
    const SampleEcRoutes& r = *summary.sample_ec_routes;
    b.append(",\"sample_ec_routes\":{");
    const char* sep = "";
#define RV_ROUTE_KEY(field, fold, label, key) \
  b.append(sep).append("\"" #key "\":");      \
  AppendUint(&b, r.key);                      \
  sep = ",";
    RV_EC_ROUTE_COUNTERS(RV_ROUTE_KEY)
#undef RV_ROUTE_KEY
    b.push_back('}');
  }
  if (summary.frames > 0 || summary.stacks > 0) {
    b.append(",\"frames\":");
    AppendUint(&b, summary.frames);
    b.append(",\"stacks\":");
    AppendUint(&b, summary.stacks);
  }
  b.append("}}\n");
}

Status TraceWriter::Finish(const FinishInfo& info) {
  if (finished_ || file_.fd() < 0) {
    return Error(ErrorCode::kInternal, "finishing trace file " + path_ + ": the writer is already finished");
  }
  TraceEvent stopped;
  stopped.event = EventName::kTracingStopped;
  stopped.source = kSourceDaemon;
  stopped.provenance = Provenance::kObserved;
  // The stop line is the last event, so it cannot be older than what was written before it.
  stopped.t_ns = std::max(info.end_t_ns, last_t_ns_);
  stopped.reason = info.stop_reason;
  AppendEvent(stopped);
  TraceSummary summary = CurrentSummary(stopped.t_ns);
  summary.ring_high_water_bytes = info.ring_high_water_bytes;
  summary.late_events = info.late_events;
#define RV_TRAP_COPY(field, fold, label) summary.field = info.field;
  RV_TRAP_COUNTERS(RV_TRAP_COPY)
  RV_GVL_COUNTERS(RV_TRAP_COPY)
#undef RV_TRAP_COPY
  summary.sample_ec_routes = info.sample_ec_routes;
  AppendSummary(summary);
  finished_ = true;
  Status flushed = Flush();
  // Closing reports a late write error (NFS, quota); the file keeps what reached it either way.
  Status closed = file_.Commit();
  if (!flushed.ok()) return flushed;
  if (!closed.ok()) {
    return Error(ErrorCode::kIo, closed.error().message() + "; free space there or choose another path with -o");
  }
  return Status::Ok();
}

void TraceWriter::Abandon() {
  buffer_.clear();
  zstd_.reset();
  finished_ = true;
  // Removes the file while it is still the one Create made; a FIFO or device output is only closed.
  file_.Abandon();
}

}  // namespace rvbpfd
