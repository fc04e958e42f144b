/* Reading the GVL of a sampled thread's VM from outside the process: who holds it and which threads are queued for
 * it. Shared by the BPF sampler (rv_sample in rvbpfd.bpf.c) and the host (src/stacks/ruby_gvl_host.c, for the
 * tests), so that the tests run the code BPF runs.
 *
 * The reading is a snapshot taken without the VM's scheduler lock: the queue may change while it is walked. Every
 * read is bounded and checked: the walk visits at most RV_GVL_MAX_QUEUED nodes (and no more than the VM's count),
 * stops at the first one it cannot read, and a count that is not a plausible number of threads makes the whole
 * reading invalid, so a torn or corrupt queue yields a shorter list (flagged), never a read outside the bound.
 *
 * Plain C99, like ruby_ec.h: the includer defines RV_WALKER_READ(ctx, dst, len, addr) (0 on success) and optionally
 * RV_WALKER_INLINE, and provides the fixed-width types. No version knowledge: every offset comes from struct
 * rv_gvl_offsets, which userspace fills. */
#ifndef RVBPFD_BPF_RUBY_GVL_H_
#define RVBPFD_BPF_RUBY_GVL_H_

#ifndef RV_WALKER_READ
#error "define RV_WALKER_READ(ctx, dst, len, addr) before including ruby_gvl.h"
#endif
#ifndef RV_WALKER_INLINE
#define RV_WALKER_INLINE static inline
#endif

#include "rvbpfd/abi.h"

/* More queued threads than this is no real VM's count (a process has at most a few hundred thousand threads): a
 * reading with a larger count is taken as unreadable. */
#define RV_GVL_MAX_PLAUSIBLE_WAITING (1u << 20)

/* The address of the scheduler state (the base of struct rv_gvl_offsets) of the VM that runs thread `th`, into
 * *base; 0 on success (a non-null base). */
RV_WALKER_INLINE int rv_gvl_base(void *ctx, const struct rv_gvl_offsets *g, __u64 vm_ptr, __u64 th, __u64 *base) {
  *base = 0;
  if (g->base == RV_GVL_BASE_THREAD_RACTOR) {
    if (th == 0 || RV_WALKER_READ(ctx, base, 8, th + g->th_ractor) != 0) return -1;
  } else if (g->base == RV_GVL_BASE_VM) {
    if (vm_ptr == 0 || RV_WALKER_READ(ctx, base, 8, vm_ptr) != 0) return -1;
  } else {
    return -1;
  }
  return *base != 0 ? 0 : -1;
}

/* Reads only the holder of the GVL of the VM that runs thread `th` (rv_read_gvl without the queue): a READY reads
 * whom its thread waits for. Returns 0 with *holder set (0: nobody holds it), -1 when this binary has no GVL layout
 * or the holder cannot be read (*holder 0). */
RV_WALKER_INLINE int rv_read_gvl_holder(void *ctx, const struct rv_gvl_offsets *g, __u64 vm_ptr, __u64 th,
                                        __u64 *holder) {
  __u64 base = 0;
  *holder = 0;
  if (g->holder == RV_GVL_NO_FIELD || rv_gvl_base(ctx, g, vm_ptr, th, &base) != 0) return -1;
  if (RV_WALKER_READ(ctx, holder, 8, base + g->holder) != 0) {
    *holder = 0;
    return -1;
  }
  return 0;
}

/* Reads the GVL state of the VM that runs thread `th` (rb_thread_t *, already checked against its EC) into *out.
 * vm_ptr: runtime address of ruby_current_vm_ptr (RV_GVL_BASE_VM only). Returns 0 with *out filled, -1 when this
 * binary has no GVL layout or the holder or the count cannot be read (then *out says nothing). */
RV_WALKER_INLINE int rv_read_gvl(void *ctx, const struct rv_gvl_offsets *g, __u64 vm_ptr, __u64 th,
                                 struct rv_gvl_reading *out) {
  __u64 base = 0, holder = 0, head = 0, node = 0;
  __s32 count = 0;
  __u32 i, n = 0, limit;
  out->holder = 0;
  out->waiting = 0;
  out->nqueued = 0;
  out->flags = 0;
  out->pad = 0;
  if (rv_gvl_base(ctx, g, vm_ptr, th, &base) != 0) return -1;
  if (g->holder == RV_GVL_NO_FIELD || g->queue == RV_GVL_NO_FIELD ||
      g->th_queue_node == RV_GVL_NO_FIELD) {
    return -1;
  }
  if (RV_WALKER_READ(ctx, &holder, 8, base + g->holder) != 0) return -1;
  if (g->queue_count != RV_GVL_NO_FIELD) {
    if (RV_WALKER_READ(ctx, &count, 4, base + g->queue_count) != 0 || count < 0 ||
        (__u32)count > RV_GVL_MAX_PLAUSIBLE_WAITING) {
      return -1;
    }
  }
  out->holder = holder;
  /* The list head is a node of its own (ccan_list_head { node n }): the walk ends when it comes back to it, and after
   * the VM's count of nodes when it keeps one (a queue relinked under the walk cannot make it list a thread twice by
   * going round, nor more threads than the count). */
  limit = RV_GVL_MAX_QUEUED;
  if (g->queue_count != RV_GVL_NO_FIELD && (__u32)count < limit) limit = (__u32)count;
  head = base + g->queue;
  if (RV_WALKER_READ(ctx, &node, 8, head) != 0) {
    out->flags |= RV_GVL_F_QUEUE_UNREADABLE;
    node = head;
  }
  for (i = 0; i < RV_GVL_MAX_QUEUED; i++) {
    __u64 next = 0;
    if (node == head || node == 0 || i >= limit) break;
    if (node < g->th_queue_node) { /* no rb_thread_t can hold this node */
      out->flags |= RV_GVL_F_QUEUE_UNREADABLE;
      node = head;
      break;
    }
    if (RV_WALKER_READ(ctx, &next, 8, node) != 0) {
      out->flags |= RV_GVL_F_QUEUE_UNREADABLE;
      node = head;
      break;
    }
    out->queued[n & (RV_GVL_MAX_QUEUED - 1)] = node - g->th_queue_node;
    n++;
    node = next;
  }
  /* Nodes left after the bound: more threads than RV_GVL_MAX_QUEUED, or than the count (the queue grew meanwhile). */
  if (node != head && node != 0 && !(out->flags & RV_GVL_F_QUEUE_UNREADABLE)) out->flags |= RV_GVL_F_QUEUE_TRUNCATED;
  if (node == 0 && n > 0) out->flags |= RV_GVL_F_QUEUE_UNREADABLE; /* a NULL link: a node unlinked mid-walk */
  out->nqueued = n;
  /* The count is the VM's when it keeps one (it and the list may disagree by a thread queued or dequeued between the
   * two reads: consumers take the names as a subset of the count); else the walk's, cut at the bound. */
  out->waiting = g->queue_count != RV_GVL_NO_FIELD ? (__u32)count : n;
  return 0;
}

#endif /* RVBPFD_BPF_RUBY_GVL_H_ */
