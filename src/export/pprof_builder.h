// PprofBuilder: encodes one pprof Profile message (schema: proto/profile.proto) from sample types, frames and
// samples, with the protobuf wire format written by hand (only varints and length-delimited fields are needed).
// Shared by `rvbpfd export --pprof` (export/pprof.h) and the fleet agent's per-process profiles
// (agent/process_profile.h).
//
// What it guarantees, so every pprof reader accepts the result:
//   - string_table[0] is "" and every string is stored once;
//   - function, location and the one mapping have dense ids starting at 1, and every id a sample names is defined;
//   - a function is a frame's (label, path); a location is a frame (label, path, line, kind) at its line, so pprof's
//     line-level views work; every location belongs to mapping 1, which says functions, file names and line numbers
//     are present (tools must not try to symbolize addresses);
//   - Function.system_name stays empty on purpose: pprof treats a function whose name equals its system name as not
//     yet demangled, and its C++ heuristics then cut "<main>", "block in <main>" or "#<Class:0x...>#hi" at the '<'.
// Output is deterministic: the same calls in the same order give the same bytes.
//
// Not thread-safe; one builder per profile. Memory: the encoded samples plus one copy of each distinct string and
// a few integers per distinct function and frame, all freed with the builder.
#ifndef RVBPFD_SRC_EXPORT_PPROF_BUILDER_H_
#define RVBPFD_SRC_EXPORT_PPROF_BUILDER_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/error.h"
#include "common/flat_map64.h"
#include "trace/stacks.h"

namespace rvbpfd {

// One pprof sample label: a string label (str) or, when num is set, a numeric one. Numeric labels are written even
// when 0 (proto3 would otherwise leave the field out and readers would see a string label "").
struct PprofLabel {
  std::string_view key;
  std::string_view str;
  std::optional<int64_t> num;
  std::string_view num_unit;  // optional unit of a numeric label ("" = none)
};

class PprofBuilder {
 public:
  PprofBuilder();
  PprofBuilder(const PprofBuilder&) = delete;
  PprofBuilder& operator=(const PprofBuilder&) = delete;
  PprofBuilder(PprofBuilder&&) = default;
  PprofBuilder& operator=(PprofBuilder&&) = default;

  // Index of `s` in the string table, adding it if new. Exposed so callers can fix the table's order (the export
  // keeps its historical byte layout this way) and for tests.
  int64_t String(std::string_view s);

  // Value types of each sample, in order (e.g. samples/count, cpu/nanoseconds). Every sample then carries exactly
  // this many values.
  void AddSampleType(std::string_view type, std::string_view unit);
  size_t sample_type_count() const { return sample_type_count_; }
  // The event one period stands for, e.g. cpu/nanoseconds with period = ns between samples.
  void SetPeriod(std::string_view type, std::string_view unit, int64_t period);
  // The sample type a viewer shows first (its `type`).
  void SetDefaultSampleType(std::string_view type) { default_sample_type_ = type; }
  void SetTimeNanos(int64_t unix_ns) { time_nanos_ = unix_ns; }
  void SetDurationNanos(int64_t ns) { duration_nanos_ = ns; }
  // The one mapping's file name (e.g. "ruby 3.4.5") and hex build id ("" = none).
  void SetMapping(std::string_view filename, std::string_view build_id);
  void AddComment(std::string_view comment) { comments_.emplace_back(comment); }

  // The location id of `frame`, interning its function and location on first use. Lines below 0 are written as 0.
  uint64_t Location(const FrameInfo& frame);

  // Appends one sample. `location_ids` are leaf first and must be ids Location returned; `values` must have
  // sample_type_count() entries. Fails with kInternal (a caller bug) otherwise, adding nothing.
  Status AddSample(std::span<const uint64_t> location_ids, std::span<const int64_t> values,
                   std::span<const PprofLabel> labels = {});
  // Same, naming the frames (leaf first) rather than location ids.
  Status AddSample(std::span<const FrameInfo> frames, std::span<const int64_t> values,
                   std::span<const PprofLabel> labels = {});

  size_t sample_count() const { return sample_count_; }
  size_t location_count() const { return locations_.size(); }
  size_t function_count() const { return functions_.size(); }

  // The serialized (uncompressed) Profile message. The builder may be used again afterwards only to call Build again
  // (which gives the same bytes).
  std::string Build();

 private:
  // The id of `s` in text_ (every distinct string the builder has seen, stored once), adding it if new.
  uint32_t Text(std::string_view s);
  // The string_table index of text id `text`, adding it to the table if it is not there yet.
  int64_t TableIndex(uint32_t text);

  // Every distinct string, once; a deque so the views in text_ids_ stay valid as it grows.
  std::deque<std::string> text_;
  std::unordered_map<std::string_view, uint32_t> text_ids_;
  std::vector<int64_t> table_index_;  // text id -> string_table index, -1 = not in the table (yet)
  std::vector<uint32_t> table_;       // string_table index -> text id; [0] is ""
  std::string sample_types_;  // encoded Profile.sample_type fields, in order
  size_t sample_type_count_ = 0;
  std::string samples_;  // encoded Profile.sample fields, in order
  size_t sample_count_ = 0;
  // id - 1 -> the function's (label, path) as text ids: label << 32 | path, which is also function_ids_' key.
  std::vector<uint64_t> functions_;
  FlatMap64<uint64_t> function_ids_;
  struct LocationRow {
    uint64_t function_id;
    int32_t line;  // the frame's own line (written as 0 when below 0)
    FrameKind kind;
    uint64_t next = 0;  // the next location of the same location_ids_ key (0: none)
  };
  std::vector<LocationRow> locations_;  // id - 1 -> row
  // A frame is a location when its (label, path, line, kind) is new. Key: its function id << 32 | line (as 32 bits),
  // whose value is the latest location of that key; the rest of the key's locations follow through `next`, each
  // compared whole, so a key shared by frames of different kinds (or, past 2^32 functions, of different functions)
  // still gives each frame its own location.
  FlatMap64<uint64_t> location_ids_;
  std::string sample_scratch_;  // AddSample's message, reused
  bool has_period_ = false;
  std::string period_type_;
  std::string period_unit_;
  int64_t period_ = 0;
  std::string default_sample_type_;
  int64_t time_nanos_ = 0;
  int64_t duration_nanos_ = 0;
  std::string mapping_filename_ = "ruby";
  std::string mapping_build_id_;
  std::vector<std::string> comments_;
  std::vector<uint64_t> location_scratch_;  // reused by AddSample(frames)
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_EXPORT_PPROF_BUILDER_H_
