/* BPF-only helper: walks the Ruby stack of one thread into a ring-entry scratch slot (struct rv_stack_record, or the
 * header and frames of a struct rv_sample_record).
 *
 * The walk is ruby_walker.h's step function driven by bpf_loop, one control frame per iteration, so the verifier sees
 * one bounded step body and the depth is limited by RV_MAX_STACK_FRAMES (4096), not by the instruction budget.
 * Cost: about 5 user-memory reads per control frame plus the env-chain hops of block frames. */
#ifndef RVBPFD_BPF_RUBY_STACK_BPF_H_
#define RVBPFD_BPF_RUBY_STACK_BPF_H_

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#include "rvbpfd/abi.h"

#include "subprogs.bpf.h"

struct rv_stack_loop {
  const struct rv_ruby_walk_offsets *off;
  struct rv_stack_header *hdr;   /* in the scratch slot (a map value) */
  struct rv_ruby_frame *frames;  /* RV_MAX_STACK_FRAMES of them, in the same slot */
  struct rv_ruby_walk walk;
  __u32 done; /* the walk reached the end of the VM stack or failed: not truncated by our bounds */
};

static long rv_stack_step_cb(__u64 index, void *data) {
  struct rv_stack_loop *c = data;
  struct rv_ruby_frame frame = {};
  __u32 n;
  int r;
  (void)index;
  r = rv_walk_step_subprog(c->off, &c->walk, &frame);
  if (r == RV_STEP_SKIP) return 0;
  if (r != RV_STEP_FRAME) {
    c->done = 1;
    return 1;
  }
  /* The count lives in the map value, not in this struct on the stack: a stack constant that grows each iteration
   * would keep the verifier from ever finding two equal states of the callback. */
  n = c->hdr->nframes;
  if (n >= RV_MAX_STACK_FRAMES) return 1; /* a frame that does not fit: truncated */
  c->frames[n & (RV_MAX_STACK_FRAMES - 1)] = frame;
  c->hdr->nframes = n + 1;
  return 0;
}

/* Fills *hdr and frames[] (RV_MAX_STACK_FRAMES of them, right after hdr in a scratch slot) with the stack of the
 * execution context at ec; returns the size in bytes of the header and the frames filled. */
static __always_inline __u32 rv_walk_ec_stack_into(const struct rv_walk_config *cfg, __u64 ec,
                                                   struct rv_stack_header *hdr, struct rv_ruby_frame *frames) {
  struct rv_stack_loop c = {};
  __u32 n;
  hdr->nframes = 0;
  hdr->walk_status = RV_WALK_OK;
  hdr->visited = 0;
  hdr->flags = 0;
  if (ec == 0) {
    hdr->flags = RV_STACK_F_NO_EC;
    return sizeof(struct rv_stack_header);
  }
  c.off = &cfg->walk;
  c.hdr = hdr;
  c.frames = frames;
  if (rv_ruby_walk_begin((void *)0, &cfg->walk, ec, &c.walk) == 0) {
    bpf_loop(RV_MAX_STACK_STEPS, rv_stack_step_cb, &c, 0);
  } else {
    c.done = 1;
  }
  n = hdr->nframes;
  if (n > RV_MAX_STACK_FRAMES) n = RV_MAX_STACK_FRAMES;
  hdr->nframes = n;
  hdr->walk_status = c.walk.status;
  hdr->visited = c.walk.visited;
  if (!c.done) hdr->flags |= RV_STACK_F_TRUNCATED;
  return sizeof(struct rv_stack_header) + n * sizeof(struct rv_ruby_frame);
}

/* The same into a struct rv_stack_record; returns the ring entry size in bytes (record + header + frames). out->rec
 * is left to the caller. */
static __always_inline __u32 rv_walk_ec_stack(const struct rv_walk_config *cfg, __u64 ec, struct rv_stack_record *out) {
  return sizeof(struct rv_record) + rv_walk_ec_stack_into(cfg, ec, &out->hdr, out->frames);
}

/* The same for the thread at th, through th->ec (the scheduler sites know th, not the EC). */
static __always_inline __u32 rv_walk_thread_stack(const struct rv_walk_config *cfg, __u64 th,
                                                  struct rv_stack_record *out) {
  __u64 ec = 0;
  if (th == 0 || bpf_probe_read_user(&ec, sizeof(ec), (const void *)(unsigned long)(th + cfg->thread_ec)) != 0) ec = 0;
  return rv_walk_ec_stack(cfg, ec, out);
}

#endif /* RVBPFD_BPF_RUBY_STACK_BPF_H_ */
