/* BPF-only helpers: register access by DWARF x86-64 register number. */
#ifndef RVBPFD_BPF_REGS_BPF_H_
#define RVBPFD_BPF_REGS_BPF_H_

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#include "rvbpfd/abi.h"

/* Byte offset in struct pt_regs of DWARF register `reg`, or -1 for a number this table does not know. */
static __always_inline long rv_reg_offset(__u8 reg) {
  switch (reg) {
    case RV_REG_RAX: return __builtin_offsetof(struct pt_regs, ax);
    case RV_REG_RDX: return __builtin_offsetof(struct pt_regs, dx);
    case RV_REG_RCX: return __builtin_offsetof(struct pt_regs, cx);
    case RV_REG_RBX: return __builtin_offsetof(struct pt_regs, bx);
    case RV_REG_RSI: return __builtin_offsetof(struct pt_regs, si);
    case RV_REG_RDI: return __builtin_offsetof(struct pt_regs, di);
    case RV_REG_RBP: return __builtin_offsetof(struct pt_regs, bp);
    case RV_REG_RSP: return __builtin_offsetof(struct pt_regs, sp);
    case RV_REG_R8: return __builtin_offsetof(struct pt_regs, r8);
    case RV_REG_R9: return __builtin_offsetof(struct pt_regs, r9);
    case RV_REG_R10: return __builtin_offsetof(struct pt_regs, r10);
    case RV_REG_R11: return __builtin_offsetof(struct pt_regs, r11);
    case RV_REG_R12: return __builtin_offsetof(struct pt_regs, r12);
    case RV_REG_R13: return __builtin_offsetof(struct pt_regs, r13);
    case RV_REG_R14: return __builtin_offsetof(struct pt_regs, r14);
    case RV_REG_R15: return __builtin_offsetof(struct pt_regs, r15);
    default: return -1;
  }
}

/* Reads DWARF register `reg` at the probed instruction from the program's ctx into *out; 0 on success. An unknown
 * number fails, which the caller treats as "th unknown" rather than reading a wrong address. The register is fetched
 * with a probe read at a computed offset: the verifier allows direct ctx loads only at constant offsets, and copying
 * the whole pt_regs (168 bytes) would take a third of the BPF stack the stack walk needs. */
static __always_inline int rv_reg_value(const struct pt_regs *ctx, __u8 reg, __u64 *out) {
  long off = rv_reg_offset(reg);
  *out = 0;
  if (off < 0 || off > (long)(sizeof(struct pt_regs) - sizeof(__u64))) return -1;
  return bpf_probe_read_kernel(out, sizeof(*out), (const char *)ctx + off) == 0 ? 0 : -1;
}

#endif /* RVBPFD_BPF_REGS_BPF_H_ */
