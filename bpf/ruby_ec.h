/* Finding the execution context (EC) of a sampled native thread from outside the process, shared by the BPF sampler
 * (rv_sample in rvbpfd.bpf.c) and the host (src/stacks/ruby_ec_host.c, for the tests).
 *
 * Routes, in order (docs/design.md, "How a sample finds its EC"):
 *   1. TLS: the thread's own `ruby_current_ec` (what GET_EC() reads), found from its thread pointer (x86-64: fsbase)
 *      the way userspace said for this process (struct rv_proc_ec): a fixed offset from the thread pointer (static
 *      ruby, or TLSDESC resolved to static TLS) or through glibc's DTV (general-dynamic TLS in a shared libruby).
 *      A NULL ruby_current_ec means the native thread runs no Ruby (the timer thread, a C library's thread).
 *   2. Ractor: the main ractor's running_ec (ruby_current_vm_ptr -> vm->ractor.main_ractor -> threads.running_ec),
 *      the GVL holder, taken only when that EC's thread runs on the sampled native thread (th->nt->tid), so a sample
 *      is never given another thread's stack.
 * Either way the EC must agree with its thread both ways (ec->thread_ptr = th, th->ec = ec): a wrong offset or a
 * half-switched fiber reads as "no EC" rather than as somebody else's stack.
 *
 * Plain C99, like ruby_walker.h: the includer defines RV_WALKER_READ(ctx, dst, len, addr) (0 on success, bounded)
 * and optionally RV_WALKER_INLINE, and provides the fixed-width types. No version knowledge: every number comes
 * from struct rv_proc_ec / rv_walk_config, which userspace fills. */
#ifndef RVBPFD_BPF_RUBY_EC_H_
#define RVBPFD_BPF_RUBY_EC_H_

#ifndef RV_WALKER_READ
#error "define RV_WALKER_READ(ctx, dst, len, addr) before including ruby_ec.h"
#endif
#ifndef RV_WALKER_INLINE
#define RV_WALKER_INLINE static inline
#endif

#include "rvbpfd/abi.h"

/* Sanity bound on userspace's DTV entry size (RV_EC_MAX_DTV_MODULE is in abi.h): dtv_t is 16 bytes (glibc). */
#define RV_EC_MAX_DTV_ENTRY 64u
/* glibc's TLS_DTV_UNALLOCATED: the block of a dlopen'ed module this thread never touched. */
#define RV_EC_DTV_UNALLOCATED (~0ull)

enum rv_ec_tls_result {
  RV_EC_TLS_FOUND = 0,       /* *ec is the thread's ruby_current_ec (non-zero) */
  RV_EC_TLS_EMPTY = 1,       /* read fine: ruby_current_ec is NULL, the native thread runs no Ruby */
  RV_EC_TLS_UNAVAILABLE = 2, /* no TLS mode for this process yet, or a read failed */
};

/* Address of the native thread's ruby_current_ec, from its thread pointer tp; 0 when it cannot be computed. */
RV_WALKER_INLINE __u64 rv_ec_tls_slot(void *ctx, const struct rv_proc_ec *pe, __u64 tp) {
  __u64 dtv = 0, block = 0;
  if (tp == 0) return 0;
  if (pe->mode == RV_EC_TLS_TP_OFFSET) return tp + (__u64)pe->tp_offset;
  if (pe->mode != RV_EC_TLS_DTV) return 0;
  if (pe->dtv_module == 0 || pe->dtv_module > RV_EC_MAX_DTV_MODULE || pe->dtv_entry_size == 0 ||
      pe->dtv_entry_size > RV_EC_MAX_DTV_ENTRY) {
    return 0;
  }
  if (RV_WALKER_READ(ctx, &dtv, 8, tp + pe->dtv_offset) != 0 || dtv == 0) return 0;
  /* dtv[0] is the generation counter, dtv[m] the block of module m (its first word: the block's address). */
  if (RV_WALKER_READ(ctx, &block, 8, dtv + pe->dtv_module * pe->dtv_entry_size) != 0) return 0;
  if (block == 0 || block == RV_EC_DTV_UNALLOCATED) return 0;
  return block + pe->tls_offset;
}

/* The thread's ruby_current_ec through TLS (enum rv_ec_tls_result). */
RV_WALKER_INLINE int rv_ec_from_tls(void *ctx, const struct rv_proc_ec *pe, __u64 tp, __u64 *ec) {
  __u64 slot = rv_ec_tls_slot(ctx, pe, tp);
  __u64 v = 0;
  *ec = 0;
  if (slot == 0 || RV_WALKER_READ(ctx, &v, 8, slot) != 0) return RV_EC_TLS_UNAVAILABLE;
  *ec = v;
  return v == 0 ? RV_EC_TLS_EMPTY : RV_EC_TLS_FOUND;
}

/* The rb_thread_t that owns ec, checked both ways (ec->thread_ptr = th and th->ec = ec). 0 on success. */
RV_WALKER_INLINE int rv_ec_thread(void *ctx, const struct rv_walk_config *wc, __u64 ec, __u64 *th) {
  __u64 t = 0, back = 0;
  *th = 0;
  if (ec == 0 || wc->ec_thread_ptr == 0) return -1;
  if (RV_WALKER_READ(ctx, &t, 8, ec + wc->ec_thread_ptr) != 0 || t == 0) return -1;
  if (RV_WALKER_READ(ctx, &back, 8, t + wc->thread_ec) != 0 || back != ec) return -1;
  *th = t;
  return 0;
}

/* The main ractor's running EC, when its thread runs on native thread `tid` (th_nt / nt_tid: rb_thread_t.nt and
 * rb_native_thread.tid). 0 on success with *ec and *th set. */
RV_WALKER_INLINE int rv_ec_from_ractor(void *ctx, const struct rv_proc_ec *pe, const struct rv_walk_config *wc,
                                       __u32 th_nt, __u32 nt_tid, __u32 tid, __u64 *ec, __u64 *th) {
  __u64 vm = 0, ractor = 0, e = 0, t = 0, nt = 0;
  __s32 running_tid = 0;
  *ec = 0;
  *th = 0;
  if (pe->vm_ptr == 0 || wc->vm_main_ractor == 0 || wc->ractor_running_ec == 0 || th_nt == 0) return -1;
  if (RV_WALKER_READ(ctx, &vm, 8, pe->vm_ptr) != 0 || vm == 0) return -1;
  if (RV_WALKER_READ(ctx, &ractor, 8, vm + wc->vm_main_ractor) != 0 || ractor == 0) return -1;
  if (RV_WALKER_READ(ctx, &e, 8, ractor + wc->ractor_running_ec) != 0 || e == 0) return -1;
  if (rv_ec_thread(ctx, wc, e, &t) != 0) return -1;
  if (RV_WALKER_READ(ctx, &nt, 8, t + th_nt) != 0 || nt == 0) return -1;
  if (RV_WALKER_READ(ctx, &running_tid, 4, nt + nt_tid) != 0 || running_tid <= 0 || (__u32)running_tid != tid) {
    return -1;
  }
  *ec = e;
  *th = t;
  return 0;
}

/* Routes 1 and 2 for the native thread `tid` whose thread pointer is tp. Returns enum rv_ec_route: TLS or RACTOR with
 * *ec and *th set, or NONE. *tls_unavailable is 1 when the TLS route could not be evaluated at all (no mode yet, a
 * read failed, or an EC that does not match its thread): only then may the caller still trust an older hint (the
 * th of the native_threads map); an empty TLS slot says the thread runs no Ruby. */
RV_WALKER_INLINE __u32 rv_find_ec(void *ctx, const struct rv_proc_ec *pe, const struct rv_walk_config *wc, __u32 th_nt,
                                  __u32 nt_tid, __u64 tp, __u32 tid, __u64 *ec, __u64 *th, int *tls_unavailable) {
  __u64 e = 0, t = 0;
  int r = rv_ec_from_tls(ctx, pe, tp, &e);
  *ec = 0;
  *th = 0;
  *tls_unavailable = 0;
  if (r == RV_EC_TLS_FOUND && rv_ec_thread(ctx, wc, e, &t) == 0) {
    *ec = e;
    *th = t;
    return RV_EC_ROUTE_TLS;
  }
  if (r != RV_EC_TLS_EMPTY) *tls_unavailable = 1;
  if (rv_ec_from_ractor(ctx, pe, wc, th_nt, nt_tid, tid, &e, &t) == 0) {
    *ec = e;
    *th = t;
    return RV_EC_ROUTE_RACTOR;
  }
  return RV_EC_ROUTE_NONE;
}

#endif /* RVBPFD_BPF_RUBY_EC_H_ */
