/* BPF-only helpers: register access by DWARF x86-64 register number. */
#ifndef RVBPFD_BPF_REGS_BPF_H_
#define RVBPFD_BPF_REGS_BPF_H_

#include "vmlinux.h"
#include "rvbpfd/abi.h"

/* Returns the value of DWARF register `reg` at the probed instruction. An unknown number yields 0, which the caller
 * treats as "th unknown" rather than reading a wrong address. `regs` must be a copy on the BPF stack, not the
 * program's ctx: clang folds the switch into ctx+variable offset, which the verifier rejects for ctx pointers. */
static __always_inline __u64 rv_reg_value(const struct pt_regs *regs, __u8 reg) {
  switch (reg) {
    case RV_REG_RAX: return regs->ax;
    case RV_REG_RDX: return regs->dx;
    case RV_REG_RCX: return regs->cx;
    case RV_REG_RBX: return regs->bx;
    case RV_REG_RSI: return regs->si;
    case RV_REG_RDI: return regs->di;
    case RV_REG_RBP: return regs->bp;
    case RV_REG_RSP: return regs->sp;
    case RV_REG_R8: return regs->r8;
    case RV_REG_R9: return regs->r9;
    case RV_REG_R10: return regs->r10;
    case RV_REG_R11: return regs->r11;
    case RV_REG_R12: return regs->r12;
    case RV_REG_R13: return regs->r13;
    case RV_REG_R14: return regs->r14;
    case RV_REG_R15: return regs->r15;
    default: return 0;
  }
}

#endif /* RVBPFD_BPF_REGS_BPF_H_ */
