#include "export/pprof_builder.h"

#include <algorithm>
#include <functional>

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

size_t PprofBuilder::FrameHash::operator()(const FrameInfo& f) const { return HashFrame(f); }

size_t PprofBuilder::FunctionKeyHash::operator()(const FunctionKey& k) const {
  return static_cast<size_t>(MixHash(std::hash<std::string>()(k.label) ^ std::hash<std::string>()(k.path) * 31));
}

PprofBuilder::PprofBuilder() { String(""); }  // pprof requires string_table[0] == ""

int64_t PprofBuilder::String(std::string_view s) {
  auto it = string_index_.find(std::string(s));
  if (it != string_index_.end()) return it->second;
  const auto i = static_cast<int64_t>(strings_.size());
  strings_.emplace_back(s);
  string_index_.emplace(strings_.back(), i);
  return i;
}

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
  auto it = location_ids_.find(frame);
  if (it != location_ids_.end()) return it->second;
  FunctionKey key{frame.label, frame.path};
  auto [fn, inserted] = function_ids_.try_emplace(key, functions_.size() + 1);
  if (inserted) functions_.push_back(std::move(key));
  locations_.push_back({fn->second, std::max<int64_t>(frame.line, 0)});
  const uint64_t id = locations_.size();
  location_ids_.emplace(frame, id);
  return id;
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
  std::string msg;
  ProtoBuffer m(&msg);
  m.PackedField(field::kSampleLocationId, location_ids);
  m.PackedField(field::kSampleValue, values);
  for (const PprofLabel& l : labels) {
    std::string label;
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
    lm.IntField(field::kLineLine, locations_[i].line);
    m.BytesField(field::kLocationLine, line);
    profile.BytesField(field::kProfileLocation, msg);
  }
  for (size_t i = 0; i < functions_.size(); ++i) {
    msg.clear();
    m.IntField(field::kFunctionId, static_cast<int64_t>(i + 1));
    m.IntField(field::kFunctionName, String(functions_[i].label));
    m.IntField(field::kFunctionFilename, String(functions_[i].path));
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
  for (const std::string& s : strings_) profile.BytesField(field::kProfileStringTable, s);
  return out;
}

}  // namespace rvbpfd
