/* BPF-only: the shared walkers (ruby_walker.h, ruby_ec.h, ruby_gvl.h) behind global BPF subprograms.
 *
 * The kernel verifies a global (non-static, noinline) subprogram once per program, against its argument types alone,
 * instead of once for every distinct verifier state a caller reaches the call in. The programs reach these walks on
 * many paths (site kinds, pid namespaces, EC routes), and the walks have bounded loops of their own (the env chain,
 * the GVL queue), so inlined they were re-verified on each path: most of the ~180 ms a run spent verifying
 * rv_site_multi and rv_sample before its first event. Behind these calls the same code verifies in a fraction of that.
 *
 * Rules the verifier sets for these functions: pointer arguments are memory of the pointee's size that may be NULL
 * (each function checks), their contents are unknown scalars (no pointers inside), and results are scalars. */
#ifndef RVBPFD_BPF_SUBPROGS_BPF_H_
#define RVBPFD_BPF_SUBPROGS_BPF_H_

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#include "rvbpfd/abi.h"

#define RV_WALKER_INLINE static __always_inline
#define RV_WALKER_READ(ctx, dst, len, addr) bpf_probe_read_user((dst), (len), (const void *)(unsigned long)(addr))
#include "ruby_ec.h"
#include "ruby_gvl.h"
#include "ruby_walker.h"

/* rv_ruby_walk_step(): one control frame of the walk in *walk, into *out. */
__noinline int rv_walk_step_subprog(const struct rv_ruby_walk_offsets *off, struct rv_ruby_walk *walk,
                                    struct rv_ruby_frame *out) {
  if (!off || !walk || !out) return RV_STEP_ERROR;
  return rv_ruby_walk_step((void *)0, off, walk, out);
}

/* What rv_find_ec_subprog is asked and answers (on the caller's stack: BPF calls take at most five arguments). */
struct rv_ec_query {
  __u64 tp;       /* in: the task's thread pointer (fsbase) */
  __u32 tid;      /* in: its tid as the VM knows it (the target's pid namespace) */
  __u32 th_nt;    /* in: rv_offsets.th_nt */
  __u32 nt_tid;   /* in: rv_offsets.nt_tid */
  __u32 tls_unavailable; /* out: the TLS route could not be evaluated (not set up, unreadable) */
  __u64 ec;       /* out: the EC found, 0 when none */
  __u64 th;       /* out: its rb_thread_t *, 0 when none */
};

/* rv_find_ec(): which EC (and thread) the sampled task runs; returns the RV_EC_ROUTE_* taken. */
__noinline __u32 rv_find_ec_subprog(const struct rv_proc_ec *pe, const struct rv_walk_config *wc,
                                    struct rv_ec_query *q) {
  __u64 ec = 0, th = 0;
  int tls_unavailable = 1;
  __u32 route;
  if (!q) return RV_EC_ROUTE_NONE;
  q->ec = 0;
  q->th = 0;
  q->tls_unavailable = 1;
  if (!pe || !wc) return RV_EC_ROUTE_NONE;
  route = rv_find_ec((void *)0, pe, wc, q->th_nt, q->nt_tid, q->tp, q->tid, &ec, &th, &tls_unavailable);
  q->ec = ec;
  q->th = th;
  q->tls_unavailable = tls_unavailable != 0;
  return route;
}

/* rv_read_gvl(): the GVL holder and queue of the VM running th, into *out; 0 on success. */
__noinline int rv_read_gvl_subprog(const struct rv_gvl_offsets *g, __u64 vm_ptr, __u64 th,
                                   struct rv_gvl_reading *out) {
  if (!g || !out) return -1;
  return rv_read_gvl((void *)0, g, vm_ptr, th, out);
}

/* rv_read_gvl_holder(): who holds the GVL of the VM running th, into *holder; 0 on success. */
__noinline int rv_read_gvl_holder_subprog(const struct rv_gvl_offsets *g, __u64 vm_ptr, __u64 th, __u64 *holder) {
  if (!g || !holder) return -1;
  return rv_read_gvl_holder((void *)0, g, vm_ptr, th, holder);
}

#endif /* RVBPFD_BPF_SUBPROGS_BPF_H_ */
