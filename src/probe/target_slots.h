// Slots of the pid_traps array (bpf/rvbpfd.bpf.c), one per process in the BPF pid filter: where BPF counts that
// process's traps (rv_target.slot) and where userspace reads them from the map's shared pages.
//
// A freed slot goes to the back of the free list and a new process takes the front, so a slot is reused as late as
// possible: a BPF program that looked the old process up just before it left the filter may still add a hit to it.
//
// Threading: not thread-safe; BpfSession uses it from the thread that adds and removes pids.
#ifndef RVBPFD_SRC_PROBE_TARGET_SLOTS_H_
#define RVBPFD_SRC_PROBE_TARGET_SLOTS_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <unordered_map>

namespace rvbpfd {

class TargetSlots {
 public:
  // Slots 0 .. capacity-1, all free.
  explicit TargetSlots(uint32_t capacity);

  // pid's slot: the one it has, else the slot freed longest ago. nullopt when every slot is taken.
  std::optional<uint32_t> Assign(uint32_t pid);
  // Frees pid's slot (nothing when it has none).
  void Release(uint32_t pid);
  // Frees the slot of every pid for which gone(pid) holds; returns how many were freed.
  size_t ReleaseIf(const std::function<bool(uint32_t)>& gone);
  // pid -> slot of every pid holding one.
  const std::unordered_map<uint32_t, uint32_t>& assigned() const { return by_pid_; }

 private:
  std::unordered_map<uint32_t, uint32_t> by_pid_;
  std::deque<uint32_t> free_;
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_PROBE_TARGET_SLOTS_H_
