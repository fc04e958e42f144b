#include "export/pprof.h"

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <numeric>
#include <unordered_map>
#include <vector>

#include "export/export_util.h"
#include "export/pprof_builder.h"
#include "model/endpoint.h"
#include "model/span_tracker.h"
#include "trace/inspect.h"
#include "trace/processes.h"

namespace rvbpfd {
namespace {

// "2025-01-31T12:34:56.789012Z" -> ns since the Unix epoch; nullopt for anything else, including times int64 ns
// cannot hold (before 1677 or after 2262: the file says something impossible, so no time is claimed).
std::optional<int64_t> ParseIso8601Utc(const std::string& s) {
  std::tm tm{};
  char frac[16] = {0};
  if (std::sscanf(s.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d.%15[0-9]", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
                  &tm.tm_min, &tm.tm_sec, frac) < 7) {
    return std::nullopt;
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  const time_t secs = timegm(&tm);
  if (secs == static_cast<time_t>(-1)) return std::nullopt;
  // Scale the fraction to ns whatever its number of digits.
  int64_t frac_ns = 0;
  int digits = 0;
  for (const char* p = frac; *p != '\0' && digits < 9; ++p, ++digits) frac_ns = frac_ns * 10 + (*p - '0');
  for (; digits < 9; ++digits) frac_ns *= 10;
  int64_t ns = 0;
  if (__builtin_mul_overflow(static_cast<int64_t>(secs), int64_t{1'000'000'000}, &ns) ||
      __builtin_add_overflow(ns, frac_ns, &ns)) {
    return std::nullopt;
  }
  return ns;
}

}  // namespace

StackProfile AggregateStacks(const TraceFile& trace) {
  StackProfile p;
  const uint32_t hz = trace.header.sample_hz.value_or(0);
  p.period_assumed = hz == 0;
  p.period_ns = 1'000'000'000ULL / (hz == 0 ? kDefaultSampleHz : hz);

  // Files are written in time order after the reorder window, but a foreign recorder's may not be: sort indices.
  std::vector<size_t> order(trace.events.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return trace.events[a].t_ns < trace.events[b].t_ns; });

  Attribution attribution(AttributionOptions{.estimate_paused = true, .sample_period_ns = p.period_ns});
  SpanTracker tracker([&p, &attribution](const Span& s) {
    attribution.OnSpan(s);
    if (s.kind != SpanKind::kGvlWait) return;
    if (s.counted && s.end == SpanEnd::kAcquired) {
      const uint64_t wait = s.duration_ns();
      uint64_t& weight = p.weights[{s.stack, *TraceRubyThread(s.thread)}].gvl_wait_ns;
      weight = SaturatingAdd(weight, wait);
      p.total_gvl_wait_ns = SaturatingAdd(p.total_gvl_wait_ns, wait);
      ++p.waits;
    } else if (s.end == SpanEnd::kGap) {
      ++p.waits_skipped;
    }
  });
  auto stack_of = [&](const TraceEvent& e) -> uint32_t {
    // An id the reader did not define cannot occur (it rejects such files), but an empty stack says nothing.
    if (!e.stack) return 0;
    const std::vector<uint32_t>* frames = trace.Stack(*e.stack);
    return frames != nullptr && !frames->empty() ? *e.stack : 0;
  };

  uint64_t end_ns = 0;
  for (size_t idx : order) {
    const TraceEvent& e = trace.events[idx];
    const uint64_t key = TraceThreadKey(e.ruby_thread);
    end_ns = std::max(end_ns, e.t_ns);
    attribution.OnThreadEvent(e.t_ns, key, e.event);
    if (e.event == EventName::kSample) {
      const uint32_t stack = stack_of(e);
      p.weights[{stack, e.ruby_thread.value_or(kNoThread)}].samples++;
      ++p.total_samples;
      tracker.OnSample(key, stack, false);
      attribution.OnSample(e.t_ns, key, stack, false);
      if (e.gvl) attribution.OnGvlReading(GvlSampleOf(e.t_ns, key, stack, trace.StackInGc(stack), *e.gvl));
      continue;
    }
    if (e.event == EventName::kTracingPaused) attribution.OnPause(e.t_ns);
    if (e.event == EventName::kTracingResumed) attribution.OnResume(e.t_ns);
    OnTraceContention(attribution, e, [&trace](uint32_t id) {
      const std::vector<uint32_t>* frames = trace.Stack(id);
      return frames != nullptr && !frames->empty();
    });
    tracker.OnEvent(TrackerEventOf(e, key, stack_of(e)));
  }
  // Spans still open at the last event end there (waits cut so are not counted as GVL wait: their end is unknown).
  tracker.Finish(end_ns);
  p.attribution = attribution.Compute(end_ns);
  for (const auto& [k, ns] : p.attribution.estimated_wait_ns) {
    uint64_t& weight = p.estimated_gvl_wait_ns[{k.stack, TraceRubyThread(k.thread).value_or(kNoThread)}];
    weight = SaturatingAdd(weight, ns);
    p.total_estimated_gvl_wait_ns = SaturatingAdd(p.total_estimated_gvl_wait_ns, ns);
  }
  return p;
}

namespace {

// Label keys, interned before the samples' label values so the string table keeps its order.
constexpr std::string_view kThreadKey = "thread";
constexpr std::string_view kSerialKey = "ruby_thread";
constexpr std::string_view kHolderKey = "holder";
constexpr std::string_view kWaiterKey = "waiter";
constexpr std::string_view kSourceKey = "blame_source";
constexpr std::string_view kStateKey = "state";
constexpr std::string_view kReasonKey = "reason";
constexpr std::string_view kProvenanceKey = "provenance";
constexpr std::string_view kPidKey = "pid";  // only in a profile of several processes
// The sample's stack's endpoint (model/endpoint.h; "-" for none) and the rule that derived it (none: no label).
constexpr std::string_view kEndpointKey = "endpoint";
constexpr std::string_view kEndpointRuleKey = "endpoint_rule";

// Adds the samples of one process's trace (the whole trace when it has one process) to `b`: CPU and GVL wait by
// (stack, thread), estimated waits, blame and wall clock. With `pid`, every sample also gets the numeric label
// pid=PID (a trace of several processes). `location_of_frame` caches trace frame id -> location id across calls
// (the processes of one trace share its frame dictionary).
void AddTraceSamples(PprofBuilder& b, const TraceFile& trace, const StackProfile& agg, std::optional<int64_t> pid,
                     std::unordered_map<uint32_t, uint64_t>& location_of_frame) {
  const std::string_view thread_key = kThreadKey, serial_key = kSerialKey, holder_key = kHolderKey,
                         waiter_key = kWaiterKey, source_key = kSourceKey, state_key = kStateKey,
                         reason_key = kReasonKey, provenance_key = kProvenanceKey;
  // Locations are frames (a label at a line), so pprof's line-level views work. Trace frame ids map 1:1 to
  // FrameInfo (the writer interns them), so caching by id only saves hashing the strings again.
  auto location_for_frame = [&](uint32_t frame_id) {
    auto it = location_of_frame.find(frame_id);
    if (it != location_of_frame.end()) return it->second;
    const FrameInfo* f = trace.Frame(frame_id);
    const uint64_t id =
        f != nullptr ? b.Location(*f)
                     : b.Location(FrameInfo{"<unresolved frame " + std::to_string(frame_id) + ">", "", 0,
                                            FrameKind::kUnresolved});
    location_of_frame.emplace(frame_id, id);
    return id;
  };
  std::vector<uint64_t> location_ids;
  std::vector<PprofLabel> labels;
  TraceEndpoints endpoints(trace);
  // Every sample's last labels: its pid (several processes) and its stack's endpoint.
  auto add_pid = [&] {
    if (pid) labels.push_back(PprofLabel{.key = kPidKey, .num = *pid});
  };
  auto add_endpoint = [&](uint32_t stack_id) {
    const Endpoint& e = endpoints.OfStack(stack_id);
    labels.push_back(PprofLabel{.key = kEndpointKey, .str = e.name});
    if (e.rule != EndpointRule::kNone) {
      labels.push_back(PprofLabel{.key = kEndpointRuleKey, .str = EndpointRuleName(e.rule)});
    }
  };
  // The locations of a stack id, leaf first (as pprof wants); `stand_in` when the stack is unknown or empty.
  auto locations_of = [&](uint32_t stack_id, std::string_view stand_in) {
    location_ids.clear();
    if (const std::vector<uint32_t>* frames = stack_id != 0 ? trace.Stack(stack_id) : nullptr; frames != nullptr) {
      for (uint32_t f : *frames) location_ids.push_back(location_for_frame(f));
    }
    if (location_ids.empty()) {
      location_ids.push_back(b.Location(FrameInfo{std::string(stand_in), "", 0, FrameKind::kUnresolved}));
    }
  };
  // A sample's thread labels: its name and serial, none for kNoThread; `name` keeps the label's string alive.
  auto add_thread_labels = [&](uint32_t serial, std::string* name) {
    if (serial == kNoThread) return;
    *name = RubyThreadLabel(trace, serial);
    labels.push_back(PprofLabel{.key = thread_key, .str = *name});
    // Numeric, written even when 0: main on 3.2 is serial 0.
    labels.push_back(PprofLabel{.key = serial_key, .num = static_cast<int64_t>(serial)});
  };
  for (const auto& [key, w] : agg.weights) {
    const auto [stack_id, serial] = key;
    locations_of(stack_id, kNoStackFrame);
    const int64_t values[] = {SaturatingToInt64(w.samples),
                              SaturatingToInt64(SaturatingMul(w.samples, agg.period_ns)),
                              SaturatingToInt64(w.gvl_wait_ns), 0, 0};
    labels.clear();
    std::string thread_name;
    add_thread_labels(serial, &thread_name);
    add_endpoint(stack_id);
    add_pid();
    // Cannot fail: one value per sample type, ids from Location.
    (void)b.AddSample(std::span<const uint64_t>(location_ids), values, labels);
  }
  // GVL wait estimated while the scheduler probes were paused: apart from the observed waits, labelled inferred.
  for (const auto& [key, ns] : agg.estimated_gvl_wait_ns) {
    if (ns == 0) continue;
    const auto [stack_id, serial] = key;
    locations_of(stack_id, kNoStackFrame);
    const int64_t values[] = {0, 0, SaturatingToInt64(ns), 0, 0};
    labels.clear();
    std::string thread_name;
    add_thread_labels(serial, &thread_name);
    labels.push_back(PprofLabel{.key = provenance_key, .str = ProvenanceString(Provenance::kInferred)});
    add_endpoint(stack_id);
    add_pid();
    (void)b.AddSample(std::span<const uint64_t>(location_ids), values, labels);
  }

  auto thread_name = [&](uint64_t key) -> std::string {
    std::optional<uint32_t> serial = TraceRubyThread(key);
    return serial ? RubyThreadLabel(trace, *serial) : std::string("-");
  };
  const FrameInfo gc_frame{std::string(kGcFrame), "", 0, FrameKind::kUnresolved};
  for (const auto& [key, ns] : agg.attribution.blame_ns) {
    if (ns == 0) continue;
    const std::string_view stand_in = BlameStandInFrame(key.source);
    locations_of(key.stack, stand_in);
    if (key.gc) location_ids.insert(location_ids.begin(), b.Location(gc_frame));
    const std::string holder = key.holder != 0 ? thread_name(key.holder) : std::string("-");
    const std::string waiter = thread_name(key.waiter);
    labels.clear();
    labels.push_back(PprofLabel{.key = holder_key, .str = holder});
    labels.push_back(PprofLabel{.key = waiter_key, .str = waiter});
    labels.push_back(PprofLabel{.key = source_key, .str = BlameSourceName(key.source)});
    labels.push_back(PprofLabel{.key = provenance_key, .str = ProvenanceString(key.provenance)});
    const int64_t values[] = {0, 0, 0, SaturatingToInt64(ns), 0};
    add_endpoint(key.stack);  // the holder's: the blame its endpoint caused to others
    add_pid();
    (void)b.AddSample(std::span<const uint64_t>(location_ids), values, labels);
  }
  for (const auto& [key, ns] : agg.attribution.wall_ns) {
    if (ns == 0) continue;
    locations_of(key.stack, key.state == WallState::kUnknown ? std::string_view("[unknown]") : kNoStackFrame);
    const std::string thread = thread_name(key.thread);
    labels.clear();
    labels.push_back(PprofLabel{.key = thread_key, .str = thread});
    if (std::optional<uint32_t> serial = TraceRubyThread(key.thread)) {
      labels.push_back(PprofLabel{.key = serial_key, .num = static_cast<int64_t>(*serial)});
    }
    labels.push_back(PprofLabel{.key = state_key, .str = WallStateName(key.state)});
    if (key.state == WallState::kBlocked) {
      labels.push_back(PprofLabel{.key = reason_key, .str = ReleaseReasonName(key.reason)});
    }
    if (key.provenance == Provenance::kInferred) {
      labels.push_back(PprofLabel{.key = provenance_key, .str = ProvenanceString(key.provenance)});
    }
    const int64_t values[] = {0, 0, 0, 0, SaturatingToInt64(ns)};
    add_endpoint(key.stack);
    add_pid();
    (void)b.AddSample(std::span<const uint64_t>(location_ids), values, labels);
  }
}

}  // namespace

std::string BuildPprofProfile(const TraceFile& trace) {
  PprofBuilder b;
  // Value order: samples/count, cpu/nanoseconds, gvl_wait/nanoseconds (proto/profile.proto).
  b.AddSampleType("samples", "count");
  b.AddSampleType("cpu", "nanoseconds");
  b.AddSampleType("gvl_wait", "nanoseconds");
  b.AddSampleType("gvl_blame", "nanoseconds");
  b.AddSampleType("wall", "nanoseconds");
  for (std::string_view k :
       {kThreadKey, kSerialKey, kHolderKey, kWaiterKey, kSourceKey, kStateKey, kReasonKey, kProvenanceKey,
        kEndpointKey, kEndpointRuleKey}) {
    b.String(k);
  }
  std::unordered_map<uint32_t, uint64_t> location_of_frame;
  StackProfile agg;
  std::vector<std::string> process_comments;
  if (!trace.MultiProcess()) {
    agg = AggregateStacks(trace);
    AddTraceSamples(b, trace, agg, std::nullopt, location_of_frame);
  } else {
    // Each process is aggregated apart (its own GVL); the comments below add up their counts.
    b.String(kPidKey);
    TraceFile header_only;
    header_only.header = trace.header;
    agg = AggregateStacks(header_only);  // the period, whatever the parts
    for (const ProcessTrace& part : SplitByProcess(trace)) {
      process_comments.push_back("process " + std::to_string(part.info.id) + ": " + part.label + " (label pid)");
      const StackProfile p = AggregateStacks(part.trace);
      AddTraceSamples(b, part.trace, p, static_cast<int64_t>(part.info.pid), location_of_frame);
      agg.period_ns = p.period_ns;
      agg.period_assumed = p.period_assumed;
      agg.total_samples += p.total_samples;
      agg.waits_skipped += p.waits_skipped;
      agg.total_estimated_gvl_wait_ns += p.total_estimated_gvl_wait_ns;
    }
  }

  b.SetMapping(trace.header.ruby_version.empty() ? "ruby" : "ruby " + trace.header.ruby_version,
               trace.header.build_id);
  if (std::optional<int64_t> wall = ParseIso8601Utc(trace.header.started_at)) b.SetTimeNanos(*wall);
  uint64_t duration_ns = 0;
  if (trace.summary) {
    duration_ns = MsToNsSaturated(trace.summary->duration_ms);
  } else {
    for (const TraceEvent& e : trace.events) duration_ns = std::max(duration_ns, e.t_ns);
  }
  b.SetDurationNanos(SaturatingToInt64(duration_ns));
  b.SetPeriod("cpu", "nanoseconds", static_cast<int64_t>(agg.period_ns));
  b.AddComment("rvbpfd export of pid " + std::to_string(trace.header.pid) + " (" + trace.header.recorder +
               ", ruby " + trace.header.ruby_version + ")");
  for (const std::string& c : process_comments) b.AddComment(c);
  if (agg.period_assumed && agg.total_samples > 0) {
    b.AddComment("the trace has no sample_hz: " + std::to_string(kDefaultSampleHz) + " Hz assumed");
  }
  if (agg.waits_skipped > 0) {
    b.AddComment(std::to_string(agg.waits_skipped) +
                 " GVL waits not counted: events were lost or tracing paused during them");
  }
  if (agg.total_estimated_gvl_wait_ns > 0) {
    b.AddComment(std::to_string(agg.total_estimated_gvl_wait_ns / 1'000'000) +
                 " ms of gvl_wait and gvl_blame estimated from the samples' GVL readings while tracing was paused "
                 "(label provenance=inferred)");
  }
  b.SetDefaultSampleType("cpu");
  return b.Build();
}

namespace {

// One deflate state, initialized once and reset per stream (deflateReset keeps the allocations).
class GzipState {
 public:
  // windowBits 15 + 16: a gzip header and trailer rather than a zlib one (pprof files are .pb.gz).
  explicit GzipState(int level) {
    ok_ = deflateInit2(&zs_, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK;
  }
  ~GzipState() {
    if (ok_) deflateEnd(&zs_);
  }
  GzipState(const GzipState&) = delete;
  GzipState& operator=(const GzipState&) = delete;

  Result<std::string> Compress(std::string_view data) {
    if (!ok_) return Error(ErrorCode::kInternal, "zlib deflateInit2 failed");
    if (deflateReset(&zs_) != Z_OK) return Error(ErrorCode::kInternal, "zlib deflateReset failed");
    // Into a scratch buffer that keeps its size between calls (no zero-filling of a fresh bound-sized string).
    const size_t bound = deflateBound(&zs_, static_cast<uLong>(data.size())) + 32;
    if (scratch_.size() < bound) scratch_.resize(bound);
    zs_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
    zs_.avail_in = static_cast<uInt>(data.size());
    zs_.next_out = reinterpret_cast<Bytef*>(scratch_.data());
    zs_.avail_out = static_cast<uInt>(bound);
    const int rc = deflate(&zs_, Z_FINISH);
    std::string out(scratch_.data(), bound - zs_.avail_out);
    // A buffer grown for one large profile is not kept for good.
    if (scratch_.size() > kKeepScratchBytes) std::vector<char>().swap(scratch_);
    if (rc != Z_STREAM_END) {
      return Error(ErrorCode::kInternal, "zlib deflate did not finish (" + std::to_string(rc) + ")");
    }
    return out;
  }

 private:
  static constexpr size_t kKeepScratchBytes = 1 << 20;
  z_stream zs_{};
  bool ok_ = false;
  std::vector<char> scratch_;
};

}  // namespace

Result<std::string> Gzip(std::string_view data) {
  if (data.size() < kGzipStoreBelowBytes) {
    thread_local GzipState stored(0);
    return stored.Compress(data);
  }
  thread_local GzipState fast(Z_BEST_SPEED);
  return fast.Compress(data);
}

Status ExportPprof(const TraceFile& trace, std::ostream& out) {
  Result<std::string> gz = Gzip(BuildPprofProfile(trace));
  if (!gz.ok()) return gz.error();
  out.write(gz->data(), static_cast<std::streamsize>(gz->size()));
  out.flush();
  if (!out) return Error(ErrorCode::kIo, "writing the pprof export failed");
  return Status::Ok();
}

}  // namespace rvbpfd
