#include "stacks/walker.h"

#include "stacks/ruby_walker_host.h"

extern "C" int rv_host_read(void* ctx, void* dst, __u32 len, __u64 addr) {
  return static_cast<rvbpfd::MemoryReader*>(ctx)->Read(addr, dst, len) ? 0 : -1;
}

namespace rvbpfd {

WalkResult WalkRubyStack(MemoryReader& mem, const rv_ruby_walk_offsets& offsets, uint64_t ec,
                         const WalkLimits& limits) {
  WalkResult result;
  result.frames.resize(limits.max_frames);
  uint32_t count = 0, status = RV_WALK_OK;
  int r = rv_host_walk(&mem, &offsets, ec, result.frames.data(), limits.max_frames, limits.max_steps, &count, &status);
  result.frames.resize(count);
  result.complete = r == RV_STEP_DONE;
  result.status = status;
  return result;
}

std::optional<uint64_t> ThreadEc(MemoryReader& mem, uint64_t th, uint32_t thread_ec_offset) {
  uint64_t ec = 0;
  if (th == 0 || !mem.ReadValue(th + thread_ec_offset, &ec)) return std::nullopt;
  return ec;
}

}  // namespace rvbpfd
