#include "sites/disasm.h"

#include <utility>

namespace rvbpfd {

int CapstoneRegToDwarf(unsigned reg) {
  switch (reg) {
    case X86_REG_AL: case X86_REG_AH: case X86_REG_AX: case X86_REG_EAX: case X86_REG_RAX: return 0;
    case X86_REG_DL: case X86_REG_DH: case X86_REG_DX: case X86_REG_EDX: case X86_REG_RDX: return 1;
    case X86_REG_CL: case X86_REG_CH: case X86_REG_CX: case X86_REG_ECX: case X86_REG_RCX: return 2;
    case X86_REG_BL: case X86_REG_BH: case X86_REG_BX: case X86_REG_EBX: case X86_REG_RBX: return 3;
    case X86_REG_SIL: case X86_REG_SI: case X86_REG_ESI: case X86_REG_RSI: return 4;
    case X86_REG_DIL: case X86_REG_DI: case X86_REG_EDI: case X86_REG_RDI: return 5;
    case X86_REG_BPL: case X86_REG_BP: case X86_REG_EBP: case X86_REG_RBP: return 6;
    case X86_REG_SPL: case X86_REG_SP: case X86_REG_ESP: case X86_REG_RSP: return 7;
    case X86_REG_R8B: case X86_REG_R8W: case X86_REG_R8D: case X86_REG_R8: return 8;
    case X86_REG_R9B: case X86_REG_R9W: case X86_REG_R9D: case X86_REG_R9: return 9;
    case X86_REG_R10B: case X86_REG_R10W: case X86_REG_R10D: case X86_REG_R10: return 10;
    case X86_REG_R11B: case X86_REG_R11W: case X86_REG_R11D: case X86_REG_R11: return 11;
    case X86_REG_R12B: case X86_REG_R12W: case X86_REG_R12D: case X86_REG_R12: return 12;
    case X86_REG_R13B: case X86_REG_R13W: case X86_REG_R13D: case X86_REG_R13: return 13;
    case X86_REG_R14B: case X86_REG_R14W: case X86_REG_R14D: case X86_REG_R14: return 14;
    case X86_REG_R15B: case X86_REG_R15W: case X86_REG_R15D: case X86_REG_R15: return 15;
    case X86_REG_RIP: case X86_REG_EIP: return 16;
    default: return -1;
  }
}

Result<Disassembler> Disassembler::Create() {
  Disassembler d;
  if (cs_open(CS_ARCH_X86, CS_MODE_64, &d.handle_) != CS_ERR_OK) {
    return Error(ErrorCode::kInternal, "capstone: cs_open(x86-64) failed; reinstall libcapstone4");
  }
  cs_option(d.handle_, CS_OPT_DETAIL, CS_OPT_ON);
  d.insn_ = cs_malloc(d.handle_);
  if (d.insn_ == nullptr) return Error(ErrorCode::kInternal, "capstone: cs_malloc failed");
  return d;
}

Disassembler::Disassembler(Disassembler&& other) noexcept
    : handle_(std::exchange(other.handle_, 0)),
      insn_(std::exchange(other.insn_, nullptr)),
      deadline_(other.deadline_),
      expired_(other.expired_) {}

bool Disassembler::expired() {
  if (!expired_ && ++since_check_ >= kCheckEvery) {
    since_check_ = 0;
    expired_ = std::chrono::steady_clock::now() >= deadline_;
  }
  return expired_;
}

Disassembler::~Disassembler() {
  if (insn_ != nullptr) cs_free(insn_, 1);
  if (handle_ != 0) cs_close(&handle_);
}

const cs_insn* Disassembler::DecodeAt(const ElfFile& elf, uint64_t vaddr) {
  if (expired()) return nullptr;
  // x86 instructions are at most 15 bytes; near the end of a segment fewer bytes are available.
  for (uint64_t len = 15; len > 0; --len) {
    std::span<const uint8_t> bytes = elf.BytesAt(vaddr, len);
    if (bytes.empty()) continue;
    const uint8_t* code = bytes.data();
    size_t size = bytes.size();
    uint64_t address = vaddr;
    if (cs_disasm_iter(handle_, &code, &size, &address, insn_)) return insn_;
    return nullptr;
  }
  return nullptr;
}

void Disassembler::DecodeRange(std::span<const uint8_t> code, uint64_t vaddr,
                               const std::function<bool(const cs_insn&)>& fn) {
  const uint8_t* p = code.data();
  size_t size = code.size();
  uint64_t address = vaddr;
  while (size > 0 && !expired() && cs_disasm_iter(handle_, &p, &size, &address, insn_)) {
    if (!fn(*insn_)) return;
  }
}

uint32_t Disassembler::WrittenRegs(const cs_insn& insn) const {
  cs_regs read, write;
  uint8_t nread = 0, nwrite = 0;
  uint32_t mask = 0;
  if (cs_regs_access(handle_, &insn, read, &nread, write, &nwrite) != CS_ERR_OK) return ~0u;  // unknown: assume all
  for (uint8_t i = 0; i < nwrite; ++i) {
    int r = CapstoneRegToDwarf(write[i]);
    if (r >= 0) mask |= 1u << r;
  }
  return mask;
}

std::optional<uint64_t> RipRelativeTarget(const cs_insn& insn) {
  const cs_x86& x86 = insn.detail->x86;
  for (uint8_t i = 0; i < x86.op_count; ++i) {
    const cs_x86_op& op = x86.operands[i];
    if (op.type == X86_OP_MEM && op.mem.base == X86_REG_RIP && op.mem.index == X86_REG_INVALID) {
      return insn.address + insn.size + static_cast<uint64_t>(op.mem.disp);
    }
  }
  return std::nullopt;
}

std::optional<uint64_t> DirectBranchTarget(const cs_insn& insn) {
  bool branch = false;
  for (uint8_t i = 0; i < insn.detail->groups_count; ++i) {
    uint8_t g = insn.detail->groups[i];
    if (g == CS_GRP_JUMP || g == CS_GRP_CALL) branch = true;
  }
  const cs_x86& x86 = insn.detail->x86;
  if (!branch || x86.op_count != 1 || x86.operands[0].type != X86_OP_IMM) return std::nullopt;
  return static_cast<uint64_t>(x86.operands[0].imm);
}

bool IsKernelEmulated(const cs_insn& insn) {
  const cs_x86& x86 = insn.detail->x86;
  for (uint8_t p : x86.prefix) {
    if (p != 0) return false;
  }
  switch (insn.id) {
    case X86_INS_JRCXZ:
    case X86_INS_JECXZ:
    case X86_INS_JCXZ:
    case X86_INS_LOOP:
    case X86_INS_LOOPE:
    case X86_INS_LOOPNE:
      return false;  // 0xe0-0xe3: single-stepped
    case X86_INS_NOP:
      return true;
    case X86_INS_PUSH:
      return x86.op_count == 1 && x86.operands[0].type == X86_OP_REG && x86.operands[0].size == 8;
    case X86_INS_CALL:
      return insn.size == 5 && DirectBranchTarget(insn).has_value();  // e8 rel32
    default:
      return (insn.id == X86_INS_JMP || IsConditionalJump(insn)) && DirectBranchTarget(insn).has_value();
  }
}

bool IsControlTransfer(const cs_insn& insn) {
  for (uint8_t i = 0; i < insn.detail->groups_count; ++i) {
    const uint8_t g = insn.detail->groups[i];
    if (g == CS_GRP_JUMP || g == CS_GRP_CALL || g == CS_GRP_RET || g == CS_GRP_INT || g == CS_GRP_IRET) return true;
  }
  return insn.id == X86_INS_SYSCALL || insn.id == X86_INS_UD2 || insn.id == X86_INS_HLT;
}

bool IsConditionalJump(const cs_insn& insn) {
  bool jump = false;
  for (uint8_t i = 0; i < insn.detail->groups_count; ++i) jump |= insn.detail->groups[i] == CS_GRP_JUMP;
  return jump && insn.id != X86_INS_JMP && insn.id != X86_INS_LJMP;
}

}  // namespace rvbpfd
