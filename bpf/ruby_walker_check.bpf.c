// SPDX-License-Identifier: GPL-2.0
/* Compile and verifier check for ruby_walker.h under clang -target bpf: the shape the real sampler will use. A uprobe
 * takes an EC address from a map, then bpf_loop calls rv_ruby_walk_step once per control frame, so the verifier sees
 * one bounded step body (the env-chain loop inside it is bounded by RV_RB_MAX_EP_HOPS) and the number of frames is
 * limited by RV_CHECK_MAX_FRAMES, not by the instruction budget. tests/stacks/walker_bpf_test.cc compiles this file
 * and, when the kernel allows it, loads it so the verifier accepts the loop. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "GPL";

#define RV_WALKER_INLINE static __always_inline
#define RV_WALKER_READ(ctx, dst, len, addr) bpf_probe_read_user((dst), (len), (const void *)(unsigned long)(addr))
#include "ruby_walker.h"

/* Frames per stack: at least 4096 deep; a power of two so the index mask is exact. */
#define RV_CHECK_MAX_FRAMES 8192
/* Control frames visited per walk: C frames that CRuby skips (IFUNC, dummy) also cost a step. */
#define RV_CHECK_MAX_STEPS (2 * RV_CHECK_MAX_FRAMES)

struct rv_check_stack {
  __u32 count;
  __u32 status;
  struct rv_ruby_frame frames[RV_CHECK_MAX_FRAMES];
};

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct rv_ruby_walk_offsets);
} walk_offsets SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, __u64);
} walk_ec SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct rv_check_stack);
} walk_out SEC(".maps");

struct rv_loop_ctx {
  const struct rv_ruby_walk_offsets *off;
  struct rv_check_stack *out;
  struct rv_ruby_walk walk;
};

static long rv_walk_cb(__u64 index, void *data) {
  struct rv_loop_ctx *c = data;
  struct rv_ruby_frame frame = {};
  int r;
  __u32 n;
  (void)index;
  r = rv_ruby_walk_step((void *)0, c->off, &c->walk, &frame);
  if (r == RV_STEP_SKIP) return 0;
  if (r != RV_STEP_FRAME) return 1; /* done or error: stop the loop */
  n = c->out->count;
  if (n >= RV_CHECK_MAX_FRAMES) return 1;
  c->out->frames[n & (RV_CHECK_MAX_FRAMES - 1)] = frame;
  c->out->count = n + 1;
  return 0;
}

SEC("uprobe")
int rv_walker_check(void *regs) {
  __u32 zero = 0;
  struct rv_loop_ctx c = {};
  const __u64 *ec = bpf_map_lookup_elem(&walk_ec, &zero);
  c.off = bpf_map_lookup_elem(&walk_offsets, &zero);
  c.out = bpf_map_lookup_elem(&walk_out, &zero);
  (void)regs;
  if (!ec || !c.off || !c.out) return 0;
  c.out->count = 0;
  if (rv_ruby_walk_begin((void *)0, c.off, *ec, &c.walk) == 0) bpf_loop(RV_CHECK_MAX_STEPS, rv_walk_cb, &c, 0);
  c.out->status = c.walk.status;
  return 0;
}
