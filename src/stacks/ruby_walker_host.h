/* C interface between the host build of the walker (ruby_walker_host.c) and walker.cc. */
#ifndef RVBPFD_SRC_STACKS_RUBY_WALKER_HOST_H_
#define RVBPFD_SRC_STACKS_RUBY_WALKER_HOST_H_

#include <linux/types.h>

#include "rvbpfd/ruby_walker_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Reads len bytes at addr through the MemoryReader ctx points to; 0 on success, -1 otherwise. */
int rv_host_read(void *ctx, void *dst, __u32 len, __u64 addr);

/* Walks the EC at ec: up to max_frames reported frames, up to max_steps control frames visited. Returns RV_STEP_DONE
 * (complete), RV_STEP_ERROR (*status says why; frames before the failure are kept) or RV_STEP_FRAME (stopped by a
 * limit with frames remaining). */
int rv_host_walk(void *ctx, const struct rv_ruby_walk_offsets *off, __u64 ec, struct rv_ruby_frame *frames,
                 __u32 max_frames, __u64 max_steps, __u32 *count, __u32 *status);

#ifdef __cplusplus
}
#endif

#endif /* RVBPFD_SRC_STACKS_RUBY_WALKER_HOST_H_ */
