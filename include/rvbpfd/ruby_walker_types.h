/* Types and constants of the CRuby control-frame walker (bpf/ruby_walker.h), without the walker code, so C++ can use
 * them without providing a memory reader. Fixed-width fields only: the same layout under clang -target bpf and the
 * host compiler (pinned by the asserts at the end). */
#ifndef RVBPFD_INCLUDE_RVBPFD_RUBY_WALKER_TYPES_H_
#define RVBPFD_INCLUDE_RVBPFD_RUBY_WALKER_TYPES_H_

#include "rvbpfd/abi_base.h"

/* Env flags (ep[VM_ENV_DATA_INDEX_FLAGS]). */
#define RV_RB_VM_FRAME_FLAG_CFRAME 0x80ull
#define RV_RB_VM_ENV_FLAG_LOCAL 0x2ull
/* RBasic.flags: builtin type in the low 5 bits, imemo type in bits 12..15 (FL_USHIFT 12, IMEMO_MASK 0xf). */
#define RV_RB_T_MASK 0x1full
#define RV_RB_T_IMEMO 0x1aull
#define RV_RB_IMEMO_SHIFT 12
#define RV_RB_IMEMO_MASK 0xfull
#define RV_RB_IMEMO_SVAR 2ull
#define RV_RB_IMEMO_MENT 6ull
/* rb_method_definition_t.type: low 4 bits of its first 32-bit word. */
#define RV_RB_METHOD_TYPE_MASK 0xfu
#define RV_RB_METHOD_TYPE_ISEQ 0u
#define RV_RB_METHOD_TYPE_CFUNC 1u

/* Non-local envs between a frame's ep and its local env that the CME search follows. CRuby has no bound; the chain
 * is as long as the block nesting (a block inside a block inside a method = 2 hops), so 64 is far beyond real code
 * and keeps the BPF loop bounded. A longer chain yields an RV_RB_FRAME_UNRESOLVED frame, never a guess. */
#define RV_RB_MAX_EP_HOPS 64
/* Largest VM stack accepted, in VALUE words (CRuby's default is 1 MiB = 131072 words; RUBY_THREAD_VM_STACK_SIZE can
 * raise it). 64 Mi words = 512 MiB: anything larger is a corrupt EC. */
#define RV_RB_MAX_VM_STACK_WORDS (64ull * 1024 * 1024)

/* Per-binary layout, in bytes. All fields are filled by userspace. */
struct rv_ruby_walk_offsets {
  __u32 ec_vm_stack;       /* rb_execution_context_t.vm_stack (VALUE *) */
  __u32 ec_vm_stack_size;  /* rb_execution_context_t.vm_stack_size (size_t, in VALUE words) */
  __u32 ec_cfp;            /* rb_execution_context_t.cfp */
  __u32 cfp_pc;            /* rb_control_frame_t.pc */
  __u32 cfp_iseq;          /* rb_control_frame_t.iseq */
  __u32 cfp_ep;            /* rb_control_frame_t.ep */
  __u32 cfp_jit_return;    /* rb_control_frame_t.jit_return (3.3+: topmost frame reports line 0 when set) */
  __u32 cfp_size;          /* sizeof(rb_control_frame_t): 64 (3.1, 3.2), 56 (3.3 - 4.0) */
  __u32 cme_def;           /* rb_callable_method_entry_t.def */
  __u32 svar_cref_or_me;   /* struct vm_svar.cref_or_me */
  __u32 flags;             /* RV_RB_WALK_F_* */
  __u32 reserved;
};
#define RV_RB_WALK_F_HAS_JIT_RETURN 0x1u
/* 3.1: rb_profile_frames has no `pc != 0` test, so a non-CFRAME frame with pc 0 is a Ruby frame (line: 0 for a TOP
 * iseq, else first_lineno); 3.2+ skip it unless it has a CFUNC CME. */
#define RV_RB_WALK_F_NULL_PC_IS_RUBY_FRAME 0x2u
/* 3.1: rb_profile_frames ends at RUBY_VM_END_CONTROL_FRAME, so it also visits the frame th_init pushed at the very end
 * of the VM stack; on the main thread Init_VM turned that one into the "<main>" TOP frame (line 0). 3.2+ stop one
 * frame earlier. */
#define RV_RB_WALK_F_INCLUDE_END_FRAME 0x4u
/* Capacity in words of the buffer one control frame is read into: rb_control_frame_t is 56 (3.3+) or 64 (3.2)
 * bytes; a power of two so field indexes can be masked for the verifier. */
#define RV_RB_CFP_WORDS 8 /* cfp_jit_return is meaningful (3.3+) */

/* What a reported frame holds in addr. Values are stable: they travel through the ring buffer. */
enum rv_ruby_frame_kind {
  RV_RB_FRAME_NONE = 0,
  RV_RB_FRAME_CME_ISEQ = 1,   /* Ruby frame; addr = CME of type ISEQ (the method owning the frame) */
  RV_RB_FRAME_CME_CFUNC = 2,  /* C frame; addr = CME of type CFUNC */
  RV_RB_FRAME_ISEQ = 3,       /* Ruby frame without an ISEQ CME; addr = cfp->iseq */
  RV_RB_FRAME_UNRESOLVED = 4, /* the CME search failed (unreadable env or object); addr = the cfp */
};
#define RV_RB_FRAME_F_LINE_ZERO 0x1u /* topmost frame with jit_return set: CRuby reports line 0 (stale pc) */

/* One reported frame: {kind, CME or iseq, pc, the cfp's own iseq}. The line number is always computed from cfp_iseq
 * and pc, never from the CME's method iseq (they differ for blocks, which report their method's CME). */
struct rv_ruby_frame {
  __u64 addr;
  __u64 pc;
  __u64 cfp_iseq;
  __u32 kind;  /* enum rv_ruby_frame_kind */
  __u32 flags; /* RV_RB_FRAME_F_* */
};

enum rv_ruby_walk_status {
  RV_WALK_OK = 0,
  RV_WALK_READ_EC = 1,     /* the EC could not be read */
  RV_WALK_BAD_STACK = 2,   /* vm_stack / vm_stack_size / cfp are not a consistent VM stack */
  RV_WALK_READ_CFP = 3,    /* a control frame could not be read: the walk stops there */
};

struct rv_ruby_walk {
  __u64 cfp;     /* next control frame to visit */
  __u64 end_cfp; /* the dummy frame at the end of the VM stack (the end itself with INCLUDE_END_FRAME): not visited */
  __u64 top_cfp; /* ec->cfp when the walk began */
  __u32 status;  /* enum rv_ruby_walk_status */
  __u32 visited; /* control frames visited so far */
};

enum rv_ruby_step_result {
  RV_STEP_SKIP = 0,  /* a frame CRuby does not report; continue */
  RV_STEP_FRAME = 1, /* *out holds a frame; continue */
  RV_STEP_DONE = 2,  /* no more frames */
  RV_STEP_ERROR = 3, /* walk->status says why; no more frames */
};

RV_ABI_ASSERT(sizeof(struct rv_ruby_walk_offsets) == 48, "rv_ruby_walk_offsets ABI");
RV_ABI_ASSERT(sizeof(struct rv_ruby_frame) == 32, "rv_ruby_frame ABI");
RV_ABI_ASSERT(sizeof(struct rv_ruby_walk) == 32, "rv_ruby_walk ABI");

#endif /* RVBPFD_INCLUDE_RVBPFD_RUBY_WALKER_TYPES_H_ */
