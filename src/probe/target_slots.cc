#include "probe/target_slots.h"

#include <vector>

namespace rvbpfd {

TargetSlots::TargetSlots(uint32_t capacity) {
  for (uint32_t i = 0; i < capacity; ++i) free_.push_back(i);
}

std::optional<uint32_t> TargetSlots::Assign(uint32_t pid) {
  if (auto it = by_pid_.find(pid); it != by_pid_.end()) return it->second;
  if (free_.empty()) return std::nullopt;
  const uint32_t slot = free_.front();
  free_.pop_front();
  by_pid_.emplace(pid, slot);
  return slot;
}

void TargetSlots::Release(uint32_t pid) {
  auto it = by_pid_.find(pid);
  if (it == by_pid_.end()) return;
  free_.push_back(it->second);
  by_pid_.erase(it);
}

size_t TargetSlots::ReleaseIf(const std::function<bool(uint32_t)>& gone) {
  std::vector<uint32_t> pids;
  for (const auto& [pid, slot] : by_pid_) {
    if (gone(pid)) pids.push_back(pid);
  }
  for (uint32_t pid : pids) Release(pid);
  return pids.size();
}

}  // namespace rvbpfd
