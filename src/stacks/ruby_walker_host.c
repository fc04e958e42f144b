/* Host build of bpf/ruby_walker.h: the same walker the BPF programs run, with reads served by a C++ MemoryReader
 * (process_vm_readv or a coredump) through rv_host_read, which walker.cc implements. */
#include <linux/types.h>

#include "ruby_walker_host.h"

#define RV_WALKER_READ(ctx, dst, len, addr) rv_host_read((ctx), (dst), (len), (addr))
#include "ruby_walker.h"

int rv_host_walk(void *ctx, const struct rv_ruby_walk_offsets *off, __u64 ec, struct rv_ruby_frame *frames,
                 __u32 max_frames, __u64 max_steps, __u32 *count, __u32 *status) {
  struct rv_ruby_walk walk;
  __u64 step;
  *count = 0;
  if (rv_ruby_walk_begin(ctx, off, ec, &walk) != 0) {
    *status = walk.status;
    return RV_STEP_ERROR;
  }
  for (step = 0; step < max_steps; step++) {
    struct rv_ruby_frame frame;
    int r = rv_ruby_walk_step(ctx, off, &walk, &frame);
    if (r == RV_STEP_SKIP) continue;
    if (r != RV_STEP_FRAME) {
      *status = walk.status;
      return r;
    }
    if (*count >= max_frames) {
      *status = walk.status;
      return RV_STEP_FRAME; /* truncated: more frames remain */
    }
    frames[(*count)++] = frame;
  }
  *status = walk.status;
  return RV_STEP_FRAME; /* step budget exhausted */
}
