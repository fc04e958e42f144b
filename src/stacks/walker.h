// Host-side driver of the CRuby frame walker (bpf/ruby_walker.h compiled for the host, reads through a MemoryReader).
#ifndef RVBPFD_SRC_STACKS_WALKER_H_
#define RVBPFD_SRC_STACKS_WALKER_H_

#include <linux/types.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "rvbpfd/ruby_walker_types.h"
#include "stacks/memory_reader.h"

namespace rvbpfd {

struct WalkResult {
  std::vector<rv_ruby_frame> frames;  // newest first, as rb_profile_frames orders them
  bool complete = false;              // reached the end of the VM stack
  uint32_t status = RV_WALK_OK;       // rv_ruby_walk_status when !complete because of an error
};

struct WalkLimits {
  uint32_t max_frames = 65536;
  uint64_t max_steps = 1 << 20;  // control frames visited (skipped C frames count too)
};

// Walks the execution context at `ec` (rb_execution_context_t *).
WalkResult WalkRubyStack(MemoryReader& mem, const rv_ruby_walk_offsets& offsets, uint64_t ec,
                         const WalkLimits& limits = {});

// The EC of a Ruby thread: *(th + thread_ec_offset); nullopt when unreadable.
std::optional<uint64_t> ThreadEc(MemoryReader& mem, uint64_t th, uint32_t thread_ec_offset);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_STACKS_WALKER_H_
