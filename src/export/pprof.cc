#include "export/pprof.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <numeric>
#include <unordered_map>
#include <vector>

#include "trace/inspect.h"

namespace rvbpfd {
namespace {

// --- Protobuf wire format (https://protobuf.dev/programming-guides/encoding/) -----------------------------------
// Only what Profile needs: varint fields (wire type 0) and length-delimited fields (wire type 2), including packed
// repeated varints. Nested messages are built in their own buffer and appended with their length.
class ProtoBuffer {
 public:
  void Varint(uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    out_.push_back(static_cast<char>(v));
  }
  void Tag(uint32_t field, uint32_t wire_type) { Varint((static_cast<uint64_t>(field) << 3) | wire_type); }
  // int64 fields are varints of the two's complement value; proto3 leaves zero values out.
  void IntField(uint32_t field, int64_t v) {
    if (v == 0) return;
    Tag(field, 0);
    Varint(static_cast<uint64_t>(v));
  }
  void BoolField(uint32_t field, bool v) {
    if (!v) return;
    Tag(field, 0);
    Varint(1);
  }
  void BytesField(uint32_t field, std::string_view bytes) {
    Tag(field, 2);
    Varint(bytes.size());
    out_.append(bytes);
  }
  void MessageField(uint32_t field, const ProtoBuffer& message) { BytesField(field, message.out_); }
  template <typename Int>
  void PackedField(uint32_t field, const std::vector<Int>& values) {
    if (values.empty()) return;
    ProtoBuffer packed;
    for (Int v : values) packed.Varint(static_cast<uint64_t>(v));
    BytesField(field, packed.out_);
  }
  const std::string& bytes() const { return out_; }
  std::string Take() { return std::move(out_); }
  void Clear() { out_.clear(); }

 private:
  std::string out_;
};

// Field numbers of proto/profile.proto.
namespace field {
constexpr uint32_t kProfileSampleType = 1, kProfileSample = 2, kProfileMapping = 3, kProfileLocation = 4,
                   kProfileFunction = 5, kProfileStringTable = 6, kProfileTimeNanos = 9, kProfileDurationNanos = 10,
                   kProfilePeriodType = 11, kProfilePeriod = 12, kProfileComment = 13,
                   kProfileDefaultSampleType = 14;
constexpr uint32_t kValueTypeType = 1, kValueTypeUnit = 2;
constexpr uint32_t kSampleLocationId = 1, kSampleValue = 2, kSampleLabel = 3;
constexpr uint32_t kLabelKey = 1, kLabelStr = 2, kLabelNum = 3;
constexpr uint32_t kMappingId = 1, kMappingFilename = 5, kMappingBuildId = 6, kMappingHasFunctions = 7,
                   kMappingHasFilenames = 8, kMappingHasLineNumbers = 9;
constexpr uint32_t kLocationId = 1, kLocationMappingId = 2, kLocationLine = 4;
constexpr uint32_t kLineFunctionId = 1, kLineLine = 2;
constexpr uint32_t kFunctionId = 1, kFunctionName = 2, kFunctionFilename = 4;
}  // namespace field

class StringTable {
 public:
  StringTable() { Index(""); }  // pprof requires string_table[0] == ""
  int64_t Index(std::string_view s) {
    auto it = index_.find(std::string(s));
    if (it != index_.end()) return it->second;
    const auto i = static_cast<int64_t>(strings_.size());
    strings_.emplace_back(s);
    index_.emplace(strings_.back(), i);
    return i;
  }
  const std::vector<std::string>& strings() const { return strings_; }

 private:
  std::vector<std::string> strings_;
  std::unordered_map<std::string, int64_t> index_;
};

// "2025-01-31T12:34:56.789012Z" -> ns since the Unix epoch; nullopt for anything else.
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
  return static_cast<int64_t>(secs) * 1'000'000'000 + frac_ns;
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

  struct ThreadState {
    std::optional<uint64_t> wait_start_ns;  // open wants_gvl
    uint32_t wait_stack = 0;                // stack the open wait is charged to (0: none yet)
    // Stack of the release that began the thread's current time off the GVL; 0 once the thread ran again (3.2
    // reports a timeslice as READY/RESUMED with no SUSPENDED, and the older release's stack would be stale) or when
    // that release carried no stack.
    uint32_t release_stack = 0;
    uint32_t last_sample_stack = 0;
  };
  std::unordered_map<uint32_t, ThreadState> threads;
  auto stack_of = [&](const TraceEvent& e) -> uint32_t {
    // An id the reader did not define cannot occur (it rejects such files), but an empty stack says nothing.
    if (!e.stack) return 0;
    const std::vector<uint32_t>* frames = trace.Stack(*e.stack);
    return frames != nullptr && !frames->empty() ? *e.stack : 0;
  };

  for (size_t idx : order) {
    const TraceEvent& e = trace.events[idx];
    switch (e.event) {
      case EventName::kEventsDropped:
      case EventName::kTracingPaused:
        for (auto& [serial, t] : threads) {
          if (t.wait_start_ns) ++p.waits_skipped;
          t.wait_start_ns.reset();
        }
        continue;
      default:
        break;
    }
    if (e.event == EventName::kSample) {
      const uint32_t stack = stack_of(e);
      const uint32_t serial = e.ruby_thread.value_or(kNoThread);
      p.weights[{stack, serial}].samples++;
      ++p.total_samples;
      if (e.ruby_thread && stack != 0) threads[serial].last_sample_stack = stack;
      continue;
    }
    if (!e.ruby_thread) continue;
    ThreadState& t = threads[*e.ruby_thread];
    switch (e.event) {
      case EventName::kGvlReleased:
        t.release_stack = stack_of(e);
        break;
      case EventName::kWantsGvl:
        if (t.wait_start_ns) break;  // a repeated READY does not restart the wait
        t.wait_start_ns = e.t_ns;
        t.wait_stack = stack_of(e);
        if (t.wait_stack == 0) t.wait_stack = t.release_stack;
        if (t.wait_stack == 0) t.wait_stack = t.last_sample_stack;
        break;
      case EventName::kGvlAcquired:
        if (t.wait_start_ns) {
          const uint64_t wait = e.t_ns - *t.wait_start_ns;  // order is sorted, so never negative
          // A stack still unknown when the wait began may have been learned from a sample during it.
          const uint32_t stack = t.wait_stack != 0 ? t.wait_stack : t.last_sample_stack;
          p.weights[{stack, *e.ruby_thread}].gvl_wait_ns += wait;
          p.total_gvl_wait_ns += wait;
          ++p.waits;
          t.wait_start_ns.reset();
        }
        t.release_stack = 0;
        break;
      case EventName::kThreadExited:
        t.wait_start_ns.reset();
        break;
      default:
        break;
    }
  }
  return p;
}

std::string BuildPprofProfile(const TraceFile& trace) {
  const StackProfile agg = AggregateStacks(trace);
  StringTable strings;
  ProtoBuffer profile;
  ProtoBuffer msg;
  auto value_type = [&](std::string_view type, std::string_view unit) {
    ProtoBuffer vt;
    vt.IntField(field::kValueTypeType, strings.Index(type));
    vt.IntField(field::kValueTypeUnit, strings.Index(unit));
    return vt;
  };
  // Value order: samples/count, cpu/nanoseconds, gvl_wait/nanoseconds (proto/profile.proto).
  profile.MessageField(field::kProfileSampleType, value_type("samples", "count"));
  profile.MessageField(field::kProfileSampleType, value_type("cpu", "nanoseconds"));
  profile.MessageField(field::kProfileSampleType, value_type("gvl_wait", "nanoseconds"));

  // Functions are (label, path); locations are frames (a label at a line), so pprof's line-level views work.
  constexpr uint64_t kMappingIdVm = 1;
  std::map<std::pair<std::string, std::string>, uint64_t> function_ids;
  std::vector<std::pair<std::string, std::string>> functions;  // id - 1 -> (label, path)
  std::unordered_map<uint32_t, uint64_t> location_of_frame;    // trace frame id -> location id
  struct LocationRow {
    uint64_t function_id;
    int64_t line;
  };
  std::vector<LocationRow> locations;  // id - 1 -> row
  auto function_id = [&](const std::string& label, const std::string& path) {
    auto [it, inserted] = function_ids.try_emplace({label, path}, functions.size() + 1);
    if (inserted) functions.emplace_back(label, path);
    return it->second;
  };
  auto location_for_frame = [&](uint32_t frame_id) {
    auto it = location_of_frame.find(frame_id);
    if (it != location_of_frame.end()) return it->second;
    const FrameInfo* f = trace.Frame(frame_id);
    const uint64_t fn = f != nullptr ? function_id(f->label, f->path)
                                     : function_id("<unresolved frame " + std::to_string(frame_id) + ">", "");
    locations.push_back({fn, f != nullptr ? std::max<int64_t>(f->line, 0) : 0});
    location_of_frame.emplace(frame_id, locations.size());
    return static_cast<uint64_t>(locations.size());
  };
  uint64_t no_stack_location = 0;
  auto no_stack = [&] {
    if (no_stack_location == 0) {
      locations.push_back({function_id(std::string(kNoStackFrame), ""), 0});
      no_stack_location = locations.size();
    }
    return no_stack_location;
  };

  const int64_t thread_key = strings.Index("thread");
  const int64_t serial_key = strings.Index("ruby_thread");
  std::vector<uint64_t> location_ids;
  std::vector<int64_t> values;
  for (const auto& [key, w] : agg.weights) {
    const auto [stack_id, serial] = key;
    location_ids.clear();
    if (const std::vector<uint32_t>* frames = stack_id != 0 ? trace.Stack(stack_id) : nullptr; frames != nullptr) {
      for (uint32_t f : *frames) location_ids.push_back(location_for_frame(f));  // leaf first, as pprof wants
    }
    if (location_ids.empty()) location_ids.push_back(no_stack());
    values = {static_cast<int64_t>(w.samples), static_cast<int64_t>(w.samples * agg.period_ns),
              static_cast<int64_t>(w.gvl_wait_ns)};
    msg.Clear();
    msg.PackedField(field::kSampleLocationId, location_ids);
    msg.PackedField(field::kSampleValue, values);
    if (serial != kNoThread) {
      ProtoBuffer label;
      label.IntField(field::kLabelKey, thread_key);
      label.IntField(field::kLabelStr, strings.Index(RubyThreadLabel(trace, serial)));
      msg.MessageField(field::kSampleLabel, label);
      label.Clear();
      label.IntField(field::kLabelKey, serial_key);
      // A numeric label of 0 would be left out by the proto3 rule; main on 3.2 is serial 0, so write it anyway.
      label.Tag(field::kLabelNum, 0);
      label.Varint(serial);
      msg.MessageField(field::kSampleLabel, label);
    }
    profile.MessageField(field::kProfileSample, msg);
  }

  ProtoBuffer mapping;
  mapping.IntField(field::kMappingId, kMappingIdVm);
  mapping.IntField(field::kMappingFilename,
                   strings.Index(trace.header.ruby_version.empty() ? "ruby" : "ruby " + trace.header.ruby_version));
  if (!trace.header.build_id.empty()) mapping.IntField(field::kMappingBuildId, strings.Index(trace.header.build_id));
  // Every location carries its function and line already: tools must not try to symbolize addresses.
  mapping.BoolField(field::kMappingHasFunctions, true);
  mapping.BoolField(field::kMappingHasFilenames, true);
  mapping.BoolField(field::kMappingHasLineNumbers, true);
  profile.MessageField(field::kProfileMapping, mapping);

  for (size_t i = 0; i < locations.size(); ++i) {
    msg.Clear();
    msg.IntField(field::kLocationId, static_cast<int64_t>(i + 1));
    msg.IntField(field::kLocationMappingId, kMappingIdVm);
    ProtoBuffer line;
    line.IntField(field::kLineFunctionId, static_cast<int64_t>(locations[i].function_id));
    line.IntField(field::kLineLine, locations[i].line);
    msg.MessageField(field::kLocationLine, line);
    profile.MessageField(field::kProfileLocation, msg);
  }
  for (size_t i = 0; i < functions.size(); ++i) {
    msg.Clear();
    msg.IntField(field::kFunctionId, static_cast<int64_t>(i + 1));
    // system_name stays empty on purpose: pprof treats a function whose name equals its system name as not yet
    // demangled, and its C++ heuristics then cut "<main>", "block in <main>" or "#<Class:0x...>#hi" at the '<'.
    msg.IntField(field::kFunctionName, strings.Index(functions[i].first));
    msg.IntField(field::kFunctionFilename, strings.Index(functions[i].second));
    profile.MessageField(field::kProfileFunction, msg);
  }

  if (std::optional<int64_t> wall = ParseIso8601Utc(trace.header.started_at)) {
    profile.IntField(field::kProfileTimeNanos, *wall);
  }
  uint64_t duration_ns = 0;
  if (trace.summary) {
    duration_ns = static_cast<uint64_t>(trace.summary->duration_ms * 1e6);
  } else {
    for (const TraceEvent& e : trace.events) duration_ns = std::max(duration_ns, e.t_ns);
  }
  profile.IntField(field::kProfileDurationNanos, static_cast<int64_t>(duration_ns));
  profile.MessageField(field::kProfilePeriodType, value_type("cpu", "nanoseconds"));
  profile.IntField(field::kProfilePeriod, static_cast<int64_t>(agg.period_ns));
  std::vector<std::string> comments = {"rvbpfd export of pid " + std::to_string(trace.header.pid) + " (" +
                                       trace.header.recorder + ", ruby " + trace.header.ruby_version + ")"};
  if (agg.period_assumed && agg.total_samples > 0) {
    comments.push_back("the trace has no sample_hz: " + std::to_string(kDefaultSampleHz) + " Hz assumed");
  }
  if (agg.waits_skipped > 0) {
    comments.push_back(std::to_string(agg.waits_skipped) +
                       " GVL waits not counted: events were lost or tracing paused during them");
  }
  for (const std::string& c : comments) profile.IntField(field::kProfileComment, strings.Index(c));
  profile.IntField(field::kProfileDefaultSampleType, strings.Index("cpu"));

  // The string table goes last: only now is every string known. Field order does not matter to decoders.
  for (const std::string& s : strings.strings()) profile.BytesField(field::kProfileStringTable, s);
  return profile.Take();
}

Result<std::string> Gzip(std::string_view data) {
  z_stream zs{};
  // windowBits 15 + 16: a gzip header and trailer rather than a zlib one (pprof files are .pb.gz).
  if (deflateInit2(&zs, Z_BEST_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    return Error(ErrorCode::kInternal, "zlib deflateInit2 failed");
  }
  std::string out;
  out.resize(deflateBound(&zs, static_cast<uLong>(data.size())) + 32);
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&zs, Z_FINISH);
  const size_t written = out.size() - zs.avail_out;
  deflateEnd(&zs);
  if (rc != Z_STREAM_END) {
    return Error(ErrorCode::kInternal, "zlib deflate did not finish (" + std::to_string(rc) + ")");
  }
  out.resize(written);
  return out;
}

Status ExportPprof(const TraceFile& trace, std::ostream& out) {
  Result<std::string> gz = Gzip(BuildPprofProfile(trace));
  if (!gz.ok()) return gz.error();
  out.write(gz->data(), static_cast<std::streamsize>(gz->size()));
  out.flush();
  if (!out) return Error(ErrorCode::kIo, "writing the pprof export failed");
  return Status::Ok();
}

Status ExportPprof(const std::string& trace_path, std::ostream& out) {
  Result<TraceFile> trace = TraceReader::ReadFile(trace_path);
  if (!trace.ok()) return trace.error();
  return ExportPprof(*trace, out);
}

}  // namespace rvbpfd
