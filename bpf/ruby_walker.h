/* CRuby control-frame walker, shared by the BPF programs and the host (userspace tests, coredump suite).
 *
 * It reproduces vm_backtrace.c's thread_profile_frames (CRuby 3.2 - 4.0; 3.1's rb_profile_frames through the
 * RV_RB_WALK_F_* flags): frames are visited from ec->cfp towards the oldest frame and stop before the dummy frame
 * th_init pushes at the very end of the VM stack. A frame is a "Ruby
 * frame" when its env flags lack VM_FRAME_FLAG_CFRAME and its pc is non-zero; it is reported with its callable method
 * entry (CME) when rb_vm_frame_method_entry finds one of type ISEQ, else with cfp->iseq. Any other frame is reported
 * only when a CME of type CFUNC is found; IFUNC, dummy and bmethod C frames are skipped exactly as CRuby skips them.
 *
 * Plain C99. The includer provides, before including this file:
 *   RV_WALKER_READ(ctx, dst, len, addr)  copies len bytes of target memory at addr into dst; 0 on success. It must
 *                                        be bounded (a BPF probe read, process_vm_readv, a coredump lookup).
 *   the fixed-width types __u8, __u32, __u64 (vmlinux.h in BPF, <linux/types.h> on the host).
 * Optionally RV_WALKER_INLINE (default: static inline; BPF builds use __always_inline).
 *
 * No version #ifdefs: every layout fact comes from struct rv_ruby_walk_offsets, filled by userspace per VM binary.
 * The flag constants below are identical in 3.1 - 4.0 (vm_core.h, internal/imemo.h, method.h).
 *
 * Driving it: rv_ruby_walk_begin() once, then rv_ruby_walk_step() until it returns RV_STEP_DONE or RV_STEP_ERROR.
 * One step visits one control frame, so the BPF side calls it from a bpf_loop callback and the number of frames is
 * limited only by the caller's buffer, not by the verifier's instruction budget. */
#ifndef RVBPFD_BPF_RUBY_WALKER_H_
#define RVBPFD_BPF_RUBY_WALKER_H_

#ifndef RV_WALKER_READ
#error "define RV_WALKER_READ(ctx, dst, len, addr) before including ruby_walker.h"
#endif
#ifndef RV_WALKER_INLINE
#define RV_WALKER_INLINE static inline
#endif

#include "rvbpfd/ruby_walker_types.h"

/* Sets up a walk of the execution context at ec. Returns 0, or -1 with walk->status set (the walk then yields
 * RV_STEP_ERROR). A NULL ec->cfp (thread created but not started) is an empty walk, as in CRuby. */
RV_WALKER_INLINE int rv_ruby_walk_begin(void *ctx, const struct rv_ruby_walk_offsets *off, __u64 ec,
                                        struct rv_ruby_walk *walk) {
  __u64 vm_stack = 0, vm_stack_size = 0, cfp = 0, end;
  walk->cfp = 0;
  walk->end_cfp = 0;
  walk->top_cfp = 0;
  walk->visited = 0;
  walk->status = RV_WALK_OK;
  if (ec == 0 || RV_WALKER_READ(ctx, &vm_stack, 8, ec + off->ec_vm_stack) != 0 ||
      RV_WALKER_READ(ctx, &vm_stack_size, 8, ec + off->ec_vm_stack_size) != 0 ||
      RV_WALKER_READ(ctx, &cfp, 8, ec + off->ec_cfp) != 0) {
    walk->status = RV_WALK_READ_EC;
    return -1;
  }
  if (cfp == 0) return 0; /* empty: cfp == end_cfp == 0 */
  if (off->cfp_size == 0 || vm_stack == 0 || vm_stack_size == 0 || vm_stack_size > RV_RB_MAX_VM_STACK_WORDS) {
    walk->status = RV_WALK_BAD_STACK;
    return -1;
  }
  /* RUBY_VM_END_CONTROL_FRAME = vm_stack + vm_stack_size words; the dummy frame is the one just below it. */
  end = vm_stack + vm_stack_size * 8;
  if (end < vm_stack || end < off->cfp_size || cfp < vm_stack || cfp >= end || (end - cfp) % off->cfp_size != 0) {
    walk->status = RV_WALK_BAD_STACK;
    return -1;
  }
  walk->cfp = cfp;
  walk->top_cfp = cfp;
  walk->end_cfp = (off->flags & RV_RB_WALK_F_INCLUDE_END_FRAME) ? end : end - off->cfp_size;
  return 0;
}

/* check_method_entry(): the CME that obj is, or (with can_be_svar) that the svar it is points to. Returns 0 with *me
 * set (0 when none), or -1 when an object header cannot be read. */
RV_WALKER_INLINE int rv_ruby_check_me(void *ctx, const struct rv_ruby_walk_offsets *off, __u64 obj, int can_be_svar,
                                      __u64 *me) {
  __u64 flags = 0, imemo;
  int pass;
  *me = 0;
  /* At most two objects: the svar, then what its cref_or_me holds (checked without the svar step). */
  for (pass = 0; pass < 2; pass++) {
    /* Qfalse (0) means no entry; special constants and misaligned values are not objects. */
    if (obj == 0 || (obj & 7) != 0) return 0;
    if (RV_WALKER_READ(ctx, &flags, 8, obj) != 0) return -1;
    if ((flags & RV_RB_T_MASK) != RV_RB_T_IMEMO) return 0;
    imemo = (flags >> RV_RB_IMEMO_SHIFT) & RV_RB_IMEMO_MASK;
    if (imemo == RV_RB_IMEMO_MENT) {
      *me = obj;
      return 0;
    }
    if (imemo != RV_RB_IMEMO_SVAR || !can_be_svar) return 0; /* imemo_cref and the rest: no CME */
    can_be_svar = 0;
    if (RV_WALKER_READ(ctx, &obj, 8, obj + off->svar_cref_or_me) != 0) return -1;
  }
  return 0;
}

/* rb_vm_frame_method_entry(): follow the env chain from ep to the local env, checking ep[-2] (me_cref) at each env
 * and allowing an svar only at the local one. Returns 0 with *me set (0 when none), -1 on a read failure or an env
 * chain longer than RV_RB_MAX_EP_HOPS. */
RV_WALKER_INLINE int rv_ruby_frame_me(void *ctx, const struct rv_ruby_walk_offsets *off, __u64 ep, __u64 me_cref,
                                      __u64 specval, __u64 ep_flags, __u64 *me) {
  /* One read per env: env[0] = ep[-2] (me_cref), env[1] = ep[-1] (specval: prev ep | tag bits), env[2] = ep[0]
   * (flags). Each target read costs a few hundred ns in BPF, so the three adjacent words come in one. */
  __u64 env[3];
  int hop;
  *me = 0;
  env[0] = me_cref;
  env[1] = specval;
  env[2] = ep_flags;
  for (hop = 0; hop < RV_RB_MAX_EP_HOPS; hop++) {
    if (hop > 0 && (ep < 16 || RV_WALKER_READ(ctx, env, sizeof(env), ep - 16) != 0)) return -1;
    if (env[2] & RV_RB_VM_ENV_FLAG_LOCAL) return rv_ruby_check_me(ctx, off, env[0], 1, me);
    if (rv_ruby_check_me(ctx, off, env[0], 0, me) != 0) return -1;
    if (*me != 0) return 0;
    ep = env[1] & ~3ull; /* VM_ENV_PREV_EP: GC_GUARDED_PTR_REF */
    if (ep == 0) return -1;
  }
  return -1;
}

/* The method type of a CME (rb_method_definition_t.type), or -1 when unreadable. */
RV_WALKER_INLINE int rv_ruby_cme_type(void *ctx, const struct rv_ruby_walk_offsets *off, __u64 me) {
  __u64 def = 0;
  __u32 word = 0;
  if (RV_WALKER_READ(ctx, &def, 8, me + off->cme_def) != 0 || def == 0 || RV_WALKER_READ(ctx, &word, 4, def) != 0) {
    return -1;
  }
  return (int)(word & RV_RB_METHOD_TYPE_MASK);
}

/* Visits one control frame. On RV_STEP_FRAME *out holds the frame. */
RV_WALKER_INLINE int rv_ruby_walk_step(void *ctx, const struct rv_ruby_walk_offsets *off, struct rv_ruby_walk *walk,
                                       struct rv_ruby_frame *out) {
  /* The control frame is read whole (one read instead of one per field) and its fields picked by offset; the
   * offsets are 8-aligned word indexes below RV_RB_CFP_WORDS (checked by userspace, masked here for the verifier). */
  __u64 cf[RV_RB_CFP_WORDS] = {0};
  __u64 env[3]; /* ep[-2] (me_cref), ep[-1] (specval), ep[0] (flags) */
  __u64 cfp = walk->cfp, pc, iseq, ep, jit_return = 0, me = 0;
  __u32 cf_len = off->cfp_size; /* exactly one frame: the bottom frame ends where the VM stack does */
  int me_status, me_type = -1;
  if (walk->status != RV_WALK_OK) return RV_STEP_ERROR;
  if (cfp == walk->end_cfp) return RV_STEP_DONE;
  if (cf_len < 8 || cf_len > sizeof(cf)) {
    walk->status = RV_WALK_READ_CFP;
    return RV_STEP_ERROR;
  }
  /* The same length, rewritten so the BPF verifier sees it bounded by the buffer (clang folds the range check above
   * into one unsigned compare that leaves cf_len itself unbounded). sizeof(cf) is a power of two. */
  cf_len = ((cf_len - 1) & (sizeof(cf) - 1)) + 1;
  if (RV_WALKER_READ(ctx, cf, cf_len, cfp) != 0) {
    walk->status = RV_WALK_READ_CFP;
    return RV_STEP_ERROR;
  }
  pc = cf[(off->cfp_pc >> 3) & (RV_RB_CFP_WORDS - 1)];
  iseq = cf[(off->cfp_iseq >> 3) & (RV_RB_CFP_WORDS - 1)];
  ep = cf[(off->cfp_ep >> 3) & (RV_RB_CFP_WORDS - 1)];
  if (ep < 16 || RV_WALKER_READ(ctx, env, sizeof(env), ep - 16) != 0) {
    walk->status = RV_WALK_READ_CFP;
    return RV_STEP_ERROR;
  }
  walk->cfp = cfp + off->cfp_size; /* RUBY_VM_PREVIOUS_CONTROL_FRAME: older frames live at higher addresses */
  walk->visited++;

  me_status = rv_ruby_frame_me(ctx, off, ep, env[0], env[1], env[2], &me);
  if (me_status == 0 && me != 0) {
    me_type = rv_ruby_cme_type(ctx, off, me);
    if (me_type < 0) me_status = -1;
  }
  out->pc = pc;
  out->cfp_iseq = iseq;
  out->flags = 0;
  if (!(env[2] & RV_RB_VM_FRAME_FLAG_CFRAME) && (pc != 0 || (off->flags & RV_RB_WALK_F_NULL_PC_IS_RUBY_FRAME))) {
    /* Ruby frame: always reported. An unreadable env chain still yields a frame (unresolved), so the depth matches. */
    if (me_status != 0) {
      out->kind = RV_RB_FRAME_UNRESOLVED;
      out->addr = cfp;
    } else if (me != 0 && me_type == (int)RV_RB_METHOD_TYPE_ISEQ) {
      out->kind = RV_RB_FRAME_CME_ISEQ;
      out->addr = me;
    } else {
      out->kind = RV_RB_FRAME_ISEQ;
      out->addr = iseq;
    }
    if (cfp == walk->top_cfp && (off->flags & RV_RB_WALK_F_HAS_JIT_RETURN) &&
        RV_WALKER_READ(ctx, &jit_return, 8, cfp + off->cfp_jit_return) == 0 && jit_return != 0) {
      out->flags |= RV_RB_FRAME_F_LINE_ZERO;
    }
    return RV_STEP_FRAME;
  }
  /* C frame (or a Ruby frame with pc 0): reported only with a CFUNC CME. */
  if (me_status != 0) {
    out->kind = RV_RB_FRAME_UNRESOLVED;
    out->addr = cfp;
    return RV_STEP_FRAME;
  }
  if (me != 0 && me_type == (int)RV_RB_METHOD_TYPE_CFUNC) {
    out->kind = RV_RB_FRAME_CME_CFUNC;
    out->addr = me;
    return RV_STEP_FRAME;
  }
  return RV_STEP_SKIP;
}

#endif /* RVBPFD_BPF_RUBY_WALKER_H_ */
