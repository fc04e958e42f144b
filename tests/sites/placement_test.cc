// PlaceOnEmulatedInstructions on hand-written shapes: where a probe may move from its check to the next instruction
// the kernel emulates, and every rule that keeps it on the check. The real binaries' placement is checked in
// sites_test.cc (RealBinaryTest: every probe on an emulated instruction, th unchanged).
#include "sites/placement.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "elf/elf_fixtures.h"

namespace rvbpfd {
namespace {

using testing::CompileC;
using testing::TempDir;

// Each function starts with its "check" (a RIP-relative cmp, as CRuby's hook checks); the comments say what the
// placement must do with a site there.
constexpr const char* kShapes = R"(
__attribute__((visibility("hidden"))) volatile long rv_flag;
__asm__(
    ".text\n"
    /* moves to the jne: nothing in between */
    ".globl shape_next\n.type shape_next,@function\nshape_next:\n"
    "  cmpq $0, rv_flag(%rip)\n  jne 1f\n  movq %rdi, %rax\n1: ret\n.size shape_next, .-shape_next\n"
    /* moves past a mov that writes rax (th in rdi stays valid) */
    ".globl shape_mov\n.type shape_mov,@function\nshape_mov:\n"
    "  cmpq $0, rv_flag(%rip)\n  movq $1, %rax\n  je 1f\n  movq %rdi, %rax\n1: ret\n.size shape_mov, .-shape_mov\n"
    /* stays: a later jmp lands between the check and the jcc */
    ".globl shape_landing\n.type shape_landing,@function\nshape_landing:\n"
    "  cmpq $0, rv_flag(%rip)\n2: movq %rsi, %rax\n  jne 1f\n  jmp 2b\n1: ret\n.size shape_landing, .-shape_landing\n"
    /* stays: its .cold piece jumps back between the check and the jcc */
    ".globl shape_split\n.type shape_split,@function\nshape_split:\n"
    "  cmpq $0, rv_flag(%rip)\nshape_split_back: movq %rsi, %rax\n  jne 1f\n1: ret\n.size shape_split, .-shape_split\n"
    ".globl shape_split.cold\n.type shape_split.cold,@function\nshape_split.cold:\n"
    "  jmp shape_split_back\n.size shape_split.cold, .-shape_split.cold\n"
    /* stays: rsp changes before the jcc (a function entry's return address would no longer be at [rsp]) */
    ".globl shape_rsp\n.type shape_rsp,@function\nshape_rsp:\n"
    "  cmpq $0, rv_flag(%rip)\n  subq $8, %rsp\n  jne 1f\n1: addq $8, %rsp\n  ret\n.size shape_rsp, .-shape_rsp\n"
    /* moves only when th's register survives: rbx is written in between */
    ".globl shape_clobber\n.type shape_clobber,@function\nshape_clobber:\n"
    "  cmpq $0, rv_flag(%rip)\n  movq $0, %rbx\n  jne 1f\n1: ret\n.size shape_clobber, .-shape_clobber\n"
    /* stays: the path leaves by a ret (not emulated) before any emulated instruction */
    ".globl shape_ret\n.type shape_ret,@function\nshape_ret:\n"
    "  cmpq $0, rv_flag(%rip)\n  ret\n.size shape_ret, .-shape_ret\n"
    /* stays: the check is a push, emulated itself */
    ".globl shape_push\n.type shape_push,@function\nshape_push:\n"
    "  pushq %rbx\n  cmpq $0, rv_flag(%rip)\n  popq %rbx\n  ret\n.size shape_push, .-shape_push\n"
    /* stays: jrcxz is a branch the kernel single-steps, and it ends the straight-line path */
    ".globl shape_jrcxz\n.type shape_jrcxz,@function\nshape_jrcxz:\n"
    "  cmpq $0, rv_flag(%rip)\n  jrcxz 1f\n  jne 1f\n1: ret\n.size shape_jrcxz, .-shape_jrcxz\n"
    /* stays: too far (more than a few instructions to the branch) */
    ".globl shape_far\n.type shape_far,@function\nshape_far:\n"
    "  cmpq $0, rv_flag(%rip)\n  movq $1, %rax\n  movq $2, %rax\n  movq $3, %rax\n  movq $4, %rax\n"
    "  movq $5, %rax\n  movq $6, %rax\n  movq $7, %rax\n  jne 1f\n1: ret\n.size shape_far, .-shape_far\n");
)";

class PlacementTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.Join("libshapes.so");
    ASSERT_TRUE(CompileC(kShapes, path_, "-shared -fPIC -O2 -g0"));
    Result<ElfFile> elf = ElfFile::Open(path_);
    ASSERT_TRUE(elf.ok()) << elf.error().ToString();
    elf_.emplace(std::move(*elf));
  }

  // One site at the start of `fn`, placed; returns it.
  ProbeSite Place(const std::string& fn, const std::string& method = "hook-site",
                  ThLocation th = ThLocation{RV_LOC_CURRENT, 0, 0}, const std::string& th_source = "current") {
    std::optional<ElfSymbol> sym = elf_->FindSymbol(fn);
    EXPECT_TRUE(sym.has_value()) << fn;
    ProbeSite s;
    s.vaddr = sym ? sym->value : 0;
    s.event = RV_EV_THREAD_SUSPENDED;
    s.method = method;
    s.th = th;
    s.th_source = th_source;
    std::vector<ProbeSite> sites = {s};
    Result<Disassembler> dis = Disassembler::Create();
    EXPECT_TRUE(dis.ok());
    PlaceOnEmulatedInstructions(*elf_, *dis, nullptr, &sites);
    EXPECT_EQ(sites[0].check(), s.vaddr) << "check_vaddr is where the site was found";
    return sites[0];
  }
  uint64_t Addr(const std::string& fn) { return elf_->FindSymbol(fn)->value; }

  TempDir dir_;
  std::string path_;
  std::optional<ElfFile> elf_;
};

// cmpq $0, x(%rip) is 8 bytes; movq $imm32, %rax 7.
constexpr uint64_t kCmp = 8;
constexpr uint64_t kMovImm = 7;

TEST_F(PlacementTest, MovesToTheBranchThatFollowsTheCheck) {
  EXPECT_EQ(Place("shape_next").vaddr, Addr("shape_next") + kCmp);
  ProbeSite s = Place("shape_mov", "hook-site", ThLocation{RV_LOC_REG, RV_REG_RDI, 0}, "disasm");
  EXPECT_EQ(s.vaddr, Addr("shape_mov") + kCmp + kMovImm);
  EXPECT_EQ(s.th, (ThLocation{RV_LOC_REG, RV_REG_RDI, 0}));
  // GC checks and function entries move the same way.
  EXPECT_EQ(Place("shape_next", "gc-hook-site").vaddr, Addr("shape_next") + kCmp);
  EXPECT_EQ(Place("shape_next", "function-entry").vaddr, Addr("shape_next") + kCmp);
}

TEST_F(PlacementTest, StaysWhereAnotherPathCouldReachTheBranchWithoutTheCheck) {
  EXPECT_EQ(Place("shape_landing").vaddr, Addr("shape_landing"));
  EXPECT_EQ(Place("shape_split").vaddr, Addr("shape_split")) << "the .cold piece jumps back in between";
}

TEST_F(PlacementTest, StaysWhenTheStackPointerOrThsRegisterChangesOnTheWay) {
  EXPECT_EQ(Place("shape_rsp").vaddr, Addr("shape_rsp"));
  // th in rbx, which the skipped mov overwrites: stays. th in rdi (untouched) or the current thread: moves.
  EXPECT_EQ(Place("shape_clobber", "hook-site", ThLocation{RV_LOC_REG, RV_REG_RBX, 0}, "disasm").vaddr,
            Addr("shape_clobber"));
  EXPECT_EQ(Place("shape_clobber", "hook-site", ThLocation{RV_LOC_MEM, RV_REG_RBX, 16}, "disasm").vaddr,
            Addr("shape_clobber"));
  EXPECT_EQ(Place("shape_clobber", "hook-site", ThLocation{RV_LOC_REG, RV_REG_RDI, 0}, "disasm").vaddr,
            Addr("shape_clobber") + kCmp + kMovImm);
  EXPECT_EQ(Place("shape_clobber").vaddr, Addr("shape_clobber") + kCmp + kMovImm);
}

TEST_F(PlacementTest, StaysWithoutAnEmulatedInstructionWithinReach) {
  EXPECT_EQ(Place("shape_ret").vaddr, Addr("shape_ret"));
  EXPECT_EQ(Place("shape_jrcxz").vaddr, Addr("shape_jrcxz"));
  EXPECT_EQ(Place("shape_far").vaddr, Addr("shape_far"));
  EXPECT_EQ(Place("shape_push", "function-entry").vaddr, Addr("shape_push")) << "a push is emulated: already cheap";
}

TEST_F(PlacementTest, GcFunctionProbesStayOnTheEntryTheirReturnProbeNeeds) {
  EXPECT_EQ(Place("shape_next", "gc-function-entry").vaddr, Addr("shape_next"));
  EXPECT_EQ(Place("shape_next", "gc-function-return").vaddr, Addr("shape_next"));
}

TEST_F(PlacementTest, ADwarfLocatedThNeedsDwarfAtTheNewAddress) {
  // No DwarfInfo (a stripped binary has none): a DWARF-sourced location cannot be re-evaluated, so the probe stays.
  EXPECT_EQ(Place("shape_next", "hook-site", ThLocation{RV_LOC_REG, RV_REG_RDI, 0}, "dwarf").vaddr,
            Addr("shape_next"));
}

}  // namespace
}  // namespace rvbpfd
