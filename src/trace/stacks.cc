#include "trace/stacks.h"

#include <functional>

namespace rvbpfd {
std::string_view FrameKindString(FrameKind kind) {
  switch (kind) {
    case FrameKind::kRuby: return "ruby";
    case FrameKind::kCfunc: return "cfunc";
    case FrameKind::kGc: return "gc";
    case FrameKind::kUnresolved: return "unresolved";
  }
  return "unresolved";
}

std::optional<FrameKind> ParseFrameKind(std::string_view name) {
  if (name == "ruby") return FrameKind::kRuby;
  if (name == "cfunc") return FrameKind::kCfunc;
  if (name == "gc") return FrameKind::kGc;
  if (name == "unresolved") return FrameKind::kUnresolved;
  return std::nullopt;
}

bool IsVmLibraryFrame(const FrameInfo& f) {
  return f.kind == FrameKind::kCfunc || (f.kind == FrameKind::kRuby && f.path.starts_with("<internal:"));
}

size_t HashFrame(const FrameInfo& f) {
  uint64_t h = std::hash<std::string>()(f.label);
  h = MixHash(h ^ std::hash<std::string>()(f.path));
  h = MixHash(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(f.line)) << 8) ^ static_cast<uint64_t>(f.kind));
  return static_cast<size_t>(h);
}

size_t HashStackIds(std::span<const uint32_t> ids) {
  uint64_t h = ids.size();
  for (uint32_t id : ids) h = MixHash(h ^ id);
  return static_cast<size_t>(h);
}

size_t StackTable::FrameHash::operator()(const FrameInfo& f) const { return HashFrame(f); }

size_t StackTable::StackHash::operator()(const std::vector<uint32_t>& ids) const { return HashStackIds(ids); }

InternResult StackTable::InternFrame(const FrameInfo& frame) {
  auto it = frame_ids_.find(frame);
  if (it != frame_ids_.end()) return {it->second, false};
  const auto id = static_cast<uint32_t>(frames_.size() + 1);
  frames_.push_back(frame);
  frame_ids_.emplace(frame, id);
  return {id, true};
}

InternResult StackTable::InternStack(std::span<const uint32_t> frame_ids) {
  probe_.assign(frame_ids.begin(), frame_ids.end());
  auto it = stack_ids_.find(probe_);
  if (it != stack_ids_.end()) return {it->second, false};
  const auto id = static_cast<uint32_t>(stacks_.size() + 1);
  stacks_.push_back(probe_);
  stack_ids_.emplace(probe_, id);
  return {id, true};
}

const FrameInfo* StackTable::frame(uint32_t id) const {
  return id >= 1 && id <= frames_.size() ? &frames_[id - 1] : nullptr;
}

const std::vector<uint32_t>* StackTable::stack(uint32_t id) const {
  return id >= 1 && id <= stacks_.size() ? &stacks_[id - 1] : nullptr;
}

}  // namespace rvbpfd
