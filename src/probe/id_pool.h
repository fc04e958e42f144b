// IdPool: the small integer ids BPF indexes its arrays with (a VM binary's slot in `offsets` / `walk_config`, a
// site's cookie in `sites` / `site_hits`), handed out lowest free first and taken back when their user goes, so a
// long-running agent that sees thousands of distinct binaries over weeks never runs out of the fixed-size arrays.
//
// Threading: every member may be called from any thread (a probe group returns its cookies from whichever thread
// releases it; BpfProbeBackend::ReleaseGroup may run on two threads at once).
#ifndef RVBPFD_SRC_PROBE_ID_POOL_H_
#define RVBPFD_SRC_PROBE_ID_POOL_H_

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

namespace rvbpfd {

class IdPool {
 public:
  explicit IdPool(uint32_t limit) : used_(limit, false) {}
  IdPool(const IdPool&) = delete;
  IdPool& operator=(const IdPool&) = delete;

  // n free ids, lowest first, or nullopt (nothing taken) when fewer than n are free.
  std::optional<std::vector<uint32_t>> Take(size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    if (n > used_.size() - in_use_) return std::nullopt;
    std::vector<uint32_t> ids;
    ids.reserve(n);
    for (uint32_t id = 0; ids.size() < n; ++id) {
      if (used_[id]) continue;
      used_[id] = true;
      ids.push_back(id);
    }
    in_use_ += n;
    if (!ids.empty() && ids.back() + 1 > high_water_) high_water_ = ids.back() + 1;
    return ids;
  }
  // Returns ids; one not in use (never taken, or returned already) is ignored.
  template <typename Id>
  void Give(std::span<const Id> ids) {
    std::lock_guard<std::mutex> lock(mu_);
    for (Id id : ids) {
      if (id < used_.size() && used_[static_cast<size_t>(id)]) {
        used_[static_cast<size_t>(id)] = false;
        --in_use_;
      }
    }
  }
  void GiveOne(uint32_t id) { Give(std::span<const uint32_t>(&id, 1)); }

  uint32_t limit() const { return static_cast<uint32_t>(used_.size()); }
  size_t in_use() const {
    std::lock_guard<std::mutex> lock(mu_);
    return in_use_;
  }
  // One past the highest id ever handed out: every id a reader of the arrays may find set is below it.
  uint32_t high_water() const {
    std::lock_guard<std::mutex> lock(mu_);
    return high_water_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<bool> used_;  // index = id
  size_t in_use_ = 0;
  uint32_t high_water_ = 0;
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_PROBE_ID_POOL_H_
