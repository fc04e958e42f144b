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

/* Frames whose records have woken the daemon: a direct-mapped set of tags of (process, kind, CME or iseq, cfp iseq),
 * RV_SEEN_FRAME_SLOTS of them (256 KiB). A stack holding a frame whose tag is not in its slot is submitted with a
 * wakeup, so the daemon names that frame at once, while the objects it points to are alive: a file's top-level iseq
 * is garbage as soon as the file is loaded, and the daemon otherwise reads the ring only every 20 ms. A caller frame's
 * pc is part of its tag, the leaf's is not: a caller's pc is a call site (a few per method, so few extra wakeups),
 * and it tells a new iseq apart from a freed one whose slot it took (the same address, but its bytecode, where pc
 * points, lies elsewhere: without it, a file's top-level iseq allocated where an earlier file's had been was never
 * new, and was freed before the daemon's next poll named it); a leaf's pc is any instruction a sample hit (limit: a
 * new iseq in a freed one's slot, seen first as a sample's leaf, is taken for seen). Races between CPUs and
 * collisions only cost an extra wakeup; a slot holds a tag only once a record carrying it went to the ring with a
 * wakeup (or was dropped, after which a later record with that frame waits for the daemon's next poll, <= 20 ms).
 * Userspace may zero the set (every frame new again). One array lookup (inlined) and a compare per frame, next to
 * the walk's ~5 user-memory reads per frame; written only when a frame is new. */
struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, RV_SEEN_FRAME_SLOTS);
  __uint(map_flags, BPF_F_MMAPABLE);
  __type(key, __u32);
  __type(value, __u64);
} seen_frames SEC(".maps");

struct rv_stack_loop {
  const struct rv_ruby_walk_offsets *off;
  struct rv_stack_header *hdr;   /* in the scratch slot (a map value) */
  struct rv_ruby_frame *frames;  /* RV_MAX_STACK_FRAMES of them, in the same slot */
  struct rv_ruby_walk walk;
  __u64 tgid; /* the walked process (the current task's), mixed into seen_frames' tags */
  __u32 done; /* the walk reached the end of the VM stack or failed: not truncated by our bounds */
  __u32 fresh; /* 1 once a frame not in seen_frames was walked: submit with a wakeup */
};

/* The seen_frames tag of a frame of process tgid (never 0, the empty slot's value): a 64-bit mix of its identity;
 * `pc`: the frame's pc for a caller frame, 0 for the leaf (see seen_frames). */
static __always_inline __u64 rv_frame_tag(__u64 tgid, const struct rv_ruby_frame *f, __u64 pc) {
  __u64 x = f->addr ^ (f->cfp_iseq * 0x9e3779b97f4a7c15ull) ^ (tgid << 40) ^ ((__u64)f->kind << 32) ^
            (pc * 0xd6e8feb86659fd93ull);
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  return x | 1;
}

/* Marks the walk fresh when frame f's tag is not in its seen_frames slot, and puts it there; leaf: f is the stack's
 * first (innermost) frame. */
static __always_inline void rv_note_frame_seen(struct rv_stack_loop *c, const struct rv_ruby_frame *f, int leaf) {
  __u64 tag = rv_frame_tag(c->tgid, f, leaf ? 0 : f->pc);
  __u32 slot = (__u32)(tag >> 40) & (RV_SEEN_FRAME_SLOTS - 1);
  __u64 *seen = bpf_map_lookup_elem(&seen_frames, &slot);
  if (seen && *seen != tag) {
    *seen = tag;
    c->fresh = 1;
  }
}

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
  rv_note_frame_seen(c, &frame, n == 0);
  return 0;
}

/* Fills *hdr and frames[] (RV_MAX_STACK_FRAMES of them, right after hdr in a scratch slot) with the stack of the
 * execution context at ec (of the current process); returns the size in bytes of the header and the frames filled.
 * *fresh is set to 1 when a frame was not in seen_frames (the entry should wake the daemon), else 0. */
static __always_inline __u32 rv_walk_ec_stack_into(const struct rv_walk_config *cfg, __u64 ec,
                                                   struct rv_stack_header *hdr, struct rv_ruby_frame *frames,
                                                   __u32 *fresh) {
  struct rv_stack_loop c = {};
  __u32 n;
  *fresh = 0;
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
  c.tgid = bpf_get_current_pid_tgid() >> 32;
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
  *fresh = c.fresh;
  return sizeof(struct rv_stack_header) + n * sizeof(struct rv_ruby_frame);
}

/* The same into a struct rv_stack_record; returns the ring entry size in bytes (record + header + frames). out->rec
 * is left to the caller. */
static __always_inline __u32 rv_walk_ec_stack(const struct rv_walk_config *cfg, __u64 ec, struct rv_stack_record *out,
                                              __u32 *fresh) {
  return sizeof(struct rv_record) + rv_walk_ec_stack_into(cfg, ec, &out->hdr, out->frames, fresh);
}

/* The same for the thread at th, through th->ec (the scheduler sites know th, not the EC). */
static __always_inline __u32 rv_walk_thread_stack(const struct rv_walk_config *cfg, __u64 th,
                                                  struct rv_stack_record *out, __u32 *fresh) {
  __u64 ec = 0;
  if (th == 0 || bpf_probe_read_user(&ec, sizeof(ec), (const void *)(unsigned long)(th + cfg->thread_ec)) != 0) ec = 0;
  return rv_walk_ec_stack(cfg, ec, out, fresh);
}

#endif /* RVBPFD_BPF_RUBY_STACK_BPF_H_ */
