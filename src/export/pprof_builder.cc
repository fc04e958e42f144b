#include "export/pprof_builder.h"

#include <algorithm>

#include "common/proto_buffer.h"

namespace rvbpfd {
namespace {

// Field numbers of proto/profile.proto.
namespace field {
constexpr uint32_t kProfileSampleType = 1, kProfileSample = 2, kProfileMapping = 3, kProfileLocation = 4,
                   kProfileFunction = 5, kProfileStringTable = 6, kProfileTimeNanos = 9, kProfileDurationNanos = 10,
                   kProfilePeriodType = 11, kProfilePeriod = 12, kProfileComment = 13,
                   kProfileDefaultSampleType = 14;
constexpr uint32_t kValueTypeType = 1, kValueTypeUnit = 2;
constexpr uint32_t kSampleLocationId = 1, kSampleValue = 2, kSampleLabel = 3;
constexpr uint32_t kLabelKey = 1, kLabelStr = 2, kLabelNum = 3, kLabelNumUnit = 4;
constexpr uint32_t kMappingId = 1, kMappingFilename = 5, kMappingBuildId = 6, kMappingHasFunctions = 7,
                   kMappingHasFilenames = 8, kMappingHasLineNumbers = 9;
constexpr uint32_t kLocationId = 1, kLocationMappingId = 2, kLocationLine = 4;
constexpr uint32_t kLineFunctionId = 1, kLineLine = 2;
constexpr uint32_t kFunctionId = 1, kFunctionName = 2, kFunctionFilename = 4;
}  // namespace field

constexpr uint64_t kMappingIdVm = 1;

}  // namespace

PprofBuilder::PprofBuilder() { String(""); }  // pprof requires string_table[0] == ""

uint32_t PprofBuilder::Text(std::string_view s) {
  auto it = text_ids_.find(s);
  if (it != text_ids_.end()) return it->second;
  const auto id = static_cast<uint32_t>(text_.size());
  text_.emplace_back(s);
  text_ids_.emplace(text_.back(), id);
  table_index_.push_back(-1);
  return id;
}

int64_t PprofBuilder::TableIndex(uint32_t text) {
  int64_t& index = table_index_[text];
  if (index < 0) {
    index = static_cast<int64_t>(table_.size());
    table_.push_back(text);
  }
  return index;
}

int64_t PprofBuilder::String(std::string_view s) { return TableIndex(Text(s)); }

void PprofBuilder::AddSampleType(std::string_view type, std::string_view unit) {
  std::string vt;
  ProtoBuffer m(&vt);
  m.IntField(field::kValueTypeType, String(type));
  m.IntField(field::kValueTypeUnit, String(unit));
  ProtoBuffer(&sample_types_).BytesField(field::kProfileSampleType, vt);
  ++sample_type_count_;
}

void PprofBuilder::SetPeriod(std::string_view type, std::string_view unit, int64_t period) {
  // Encoded at Build: the strings join the table there, after the functions' (the export's historical layout).
  period_type_ = type;
  period_unit_ = unit;
  has_period_ = true;
  period_ = period;
}

void PprofBuilder::SetMapping(std::string_view filename, std::string_view build_id) {
  mapping_filename_ = filename;
  mapping_build_id_ = build_id;
}

uint64_t PprofBuilder::Location(const FrameInfo& frame) {
  // Only the text joins the builder here; the string table takes the function's strings at Build, in function order.
  const uint64_t function_key = uint64_t{Text(frame.label)} << 32 | Text(frame.path);
  auto [function, new_function] = function_ids_.try_emplace(function_key);
  if (new_function) {
    functions_.push_back(function_key);
    *function = functions_.size();
  }
  const uint64_t function_id = *function;
  const uint64_t location_key = function_id << 32 | static_cast<uint32_t>(frame.line);
  auto [latest, new_key] = location_ids_.try_emplace(location_key);
  if (!new_key) {
    for (uint64_t id = *latest; id != 0; id = locations_[id - 1].next) {
      const LocationRow& row = locations_[id - 1];
      if (row.function_id == function_id && row.line == frame.line && row.kind == frame.kind) return id;
    }
  }
  locations_.push_back(
      LocationRow{.function_id = function_id, .line = frame.line, .kind = frame.kind, .next = *latest});
  *latest = locations_.size();
  return *latest;
}

Status PprofBuilder::AddSample(std::span<const uint64_t> location_ids, std::span<const int64_t> values,
                               std::span<const PprofLabel> labels) {
  if (values.size() != sample_type_count_) {
    return Error(ErrorCode::kInternal, "pprof sample has " + std::to_string(values.size()) + " values for " +
                                           std::to_string(sample_type_count_) + " sample types");
  }
  for (uint64_t id : location_ids) {
    if (id == 0 || id > locations_.size()) {
      return Error(ErrorCode::kInternal, "pprof sample names undefined location " + std::to_string(id));
    }
  }
  std::string& msg = sample_scratch_;
  msg.clear();
  ProtoBuffer m(&msg);
  m.PackedField(field::kSampleLocationId, location_ids);
  m.PackedField(field::kSampleValue, values);
  for (const PprofLabel& l : labels) {
    std::string label;  // a label is a few bytes: within the string's own buffer
    ProtoBuffer lm(&label);
    lm.IntField(field::kLabelKey, String(l.key));
    if (l.num) {
      lm.Tag(field::kLabelNum, 0);
      lm.Varint(static_cast<uint64_t>(*l.num));
      if (!l.num_unit.empty()) lm.IntField(field::kLabelNumUnit, String(l.num_unit));
    } else {
      lm.IntField(field::kLabelStr, String(l.str));
    }
    m.BytesField(field::kSampleLabel, label);
  }
  ProtoBuffer(&samples_).BytesField(field::kProfileSample, msg);
  ++sample_count_;
  return Status::Ok();
}

Status PprofBuilder::AddSample(std::span<const FrameInfo> frames, std::span<const int64_t> values,
                               std::span<const PprofLabel> labels) {
  location_scratch_.clear();
  for (const FrameInfo& f : frames) location_scratch_.push_back(Location(f));
  return AddSample(std::span<const uint64_t>(location_scratch_), values, labels);
}

std::string PprofBuilder::Build() {
  std::string out;
  // Grown once: the samples, a few tags and varints per location and function, and each string the table can hold
  // with its tag and length (the text seen so far, and what Build adds: mapping, period, comments, default type).
  size_t strings = 6 * text_.size() + mapping_filename_.size() + mapping_build_id_.size() + period_type_.size() +
                   period_unit_.size() + default_sample_type_.size() + 64;
  for (const std::string& t : text_) strings += t.size();
  for (const std::string& c : comments_) strings += c.size() + 16;
  out.reserve(sample_types_.size() + samples_.size() + locations_.size() * 32 + functions_.size() * 24 + strings);
  ProtoBuffer profile(&out);
  out.append(sample_types_);
  out.append(samples_);

  // Strings join the table in this order (mapping, functions, period type, comments, default type) so that the
  // export's bytes did not change when it moved onto this builder.
  std::string msg;
  ProtoBuffer m(&msg);
  m.IntField(field::kMappingId, kMappingIdVm);
  m.IntField(field::kMappingFilename, String(mapping_filename_));
  if (!mapping_build_id_.empty()) m.IntField(field::kMappingBuildId, String(mapping_build_id_));
  m.BoolField(field::kMappingHasFunctions, true);
  m.BoolField(field::kMappingHasFilenames, true);
  m.BoolField(field::kMappingHasLineNumbers, true);
  profile.BytesField(field::kProfileMapping, msg);

  for (size_t i = 0; i < locations_.size(); ++i) {
    msg.clear();
    m.IntField(field::kLocationId, static_cast<int64_t>(i + 1));
    m.IntField(field::kLocationMappingId, kMappingIdVm);
    std::string line;
    ProtoBuffer lm(&line);
    lm.IntField(field::kLineFunctionId, static_cast<int64_t>(locations_[i].function_id));
    lm.IntField(field::kLineLine, std::max<int64_t>(locations_[i].line, 0));
    m.BytesField(field::kLocationLine, line);
    profile.BytesField(field::kProfileLocation, msg);
  }
  for (size_t i = 0; i < functions_.size(); ++i) {
    msg.clear();
    m.IntField(field::kFunctionId, static_cast<int64_t>(i + 1));
    m.IntField(field::kFunctionName, TableIndex(static_cast<uint32_t>(functions_[i] >> 32)));
    m.IntField(field::kFunctionFilename, TableIndex(static_cast<uint32_t>(functions_[i])));
    profile.BytesField(field::kProfileFunction, msg);
  }

  profile.IntField(field::kProfileTimeNanos, time_nanos_);
  profile.IntField(field::kProfileDurationNanos, duration_nanos_);
  if (has_period_) {
    msg.clear();
    m.IntField(field::kValueTypeType, String(period_type_));
    m.IntField(field::kValueTypeUnit, String(period_unit_));
    profile.BytesField(field::kProfilePeriodType, msg);
    profile.IntField(field::kProfilePeriod, period_);
  }
  for (const std::string& c : comments_) profile.IntField(field::kProfileComment, String(c));
  if (!default_sample_type_.empty()) profile.IntField(field::kProfileDefaultSampleType, String(default_sample_type_));

  // The string table goes last: only now is every string known. Field order does not matter to decoders.
  for (uint32_t text : table_) profile.BytesField(field::kProfileStringTable, text_[text]);
  return out;
}

}  // namespace rvbpfd
