// The walker's frame selection on a synthetic VM stack: which frames CRuby reports and with what, and that corrupt
// stacks end the walk with a status instead of a crash or a loop.
#include "stacks/walker.h"

#include <gtest/gtest.h>

#include "fake_memory.h"
#include "stacks/ruby_offsets.h"

namespace rvbpfd {
namespace {

using testing::FakeMemory;

constexpr uint64_t kEc = 0x1000;
constexpr uint64_t kVmStack = 0x100000;
constexpr uint64_t kVmStackWords = 0x10000;  // 512 KiB: room for 6,000 56-byte frames
constexpr uint64_t kHeap = 0x800000;
constexpr uint64_t kMagicMethod = 0x11110001, kMagicBlock = 0x22220001, kMagicCfunc = 0x55550001,
                   kMagicIfunc = 0x66660001, kMagicDummy = 0x79990001;
constexpr uint64_t kLocal = RV_RB_VM_ENV_FLAG_LOCAL, kCframe = RV_RB_VM_FRAME_FLAG_CFRAME;

uint64_t ImemoFlags(uint64_t imemo) { return RV_RB_T_IMEMO | (imemo << RV_RB_IMEMO_SHIFT); }

class WalkerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto o = RubyOffsets::ForVersion(3, 4);
    ASSERT_TRUE(o.ok());
    off_ = o.value();
    mem_.Map(kEc, 0x100);
    mem_.Map(kVmStack, kVmStackWords * 8);
    mem_.Map(kHeap, 0x100000);
    mem_.Put64(kEc + off_.walk.ec_vm_stack, kVmStack);
    mem_.Put64(kEc + off_.walk.ec_vm_stack_size, kVmStackWords);
    end_ = kVmStack + kVmStackWords * 8;
    // th_init's dummy frame at the very end: never reported.
    next_cfp_ = end_ - off_.walk.cfp_size;
    AddFrame(0, 0, Env(kMagicDummy | kLocal | kCframe, 0, 0));
  }

  // A method entry of the given method type.
  uint64_t Cme(uint32_t method_type) {
    uint64_t cme = Alloc(64), def = Alloc(64);
    mem_.Put64(cme, ImemoFlags(RV_RB_IMEMO_MENT));
    mem_.Put64(cme + off_.walk.cme_def, def);
    mem_.Put32(def, method_type);
    return cme;
  }
  uint64_t Svar(uint64_t cref_or_me) {
    uint64_t svar = Alloc(40);
    mem_.Put64(svar, ImemoFlags(RV_RB_IMEMO_SVAR));
    mem_.Put64(svar + off_.walk.svar_cref_or_me, cref_or_me);
    return svar;
  }
  // An env {me_cref, specval, flags}; returns ep (the flags word).
  uint64_t Env(uint64_t flags, uint64_t me_cref, uint64_t prev_ep) {
    uint64_t base = Alloc(24);
    mem_.Put64(base, me_cref);
    mem_.Put64(base + 8, prev_ep | (prev_ep ? 1 : 0));  // tagged like GC_GUARDED_PTR
    mem_.Put64(base + 16, flags);
    return base + 16;
  }
  // Pushes a control frame below the previous one (frames grow downwards); the last pushed is the newest.
  uint64_t AddFrame(uint64_t pc, uint64_t iseq, uint64_t ep) {
    uint64_t cfp = next_cfp_;
    mem_.Put64(cfp + off_.walk.cfp_pc, pc);
    mem_.Put64(cfp + off_.walk.cfp_iseq, iseq);
    mem_.Put64(cfp + off_.walk.cfp_ep, ep);
    next_cfp_ -= off_.walk.cfp_size;
    mem_.Put64(kEc + off_.walk.ec_cfp, cfp);
    return cfp;
  }
  uint64_t Alloc(size_t n) {
    uint64_t a = heap_next_;
    heap_next_ += (n + 15) & ~size_t{15};
    return a;
  }

  FakeMemory mem_;
  RubyOffsets off_;
  uint64_t end_ = 0, next_cfp_ = 0, heap_next_ = kHeap + 0x10;
};

TEST_F(WalkerTest, ReportsWhatThreadProfileFramesReports) {
  const uint64_t method_cme = Cme(RV_RB_METHOD_TYPE_ISEQ), cfunc_cme = Cme(RV_RB_METHOD_TYPE_CFUNC);
  const uint64_t bmethod_cme = Cme(4);  // VM_METHOD_TYPE_BMETHOD
  // Oldest first: <main> (no CME), a method, a cfunc it calls, an IFUNC frame, a block in the method whose CME is
  // reached through the env chain and an svar at the local env, a bmethod body (block, BMETHOD CME), a C frame with a
  // BMETHOD CME, a Ruby frame with pc 0.
  const uint64_t main_ep = Env(kMagicMethod | kLocal, 0, 0);
  AddFrame(0x5000, 0x7001, main_ep);
  const uint64_t method_ep = Env(kMagicMethod | kLocal, Svar(method_cme), 0);
  AddFrame(0x5008, 0x7002, method_ep);
  AddFrame(0, 0, Env(kMagicCfunc | kLocal | kCframe, cfunc_cme, 0));
  AddFrame(0, 0, Env(kMagicIfunc | kCframe, 0, method_ep));  // IFUNC: C frame whose chain finds an ISEQ CME
  AddFrame(0x5010, 0x7003, Env(kMagicBlock, 0, method_ep));
  AddFrame(0x5018, 0x7004, Env(kMagicBlock | kLocal, bmethod_cme, 0));
  AddFrame(0, 0, Env(kMagicCfunc | kLocal | kCframe, bmethod_cme, 0));
  AddFrame(0, 0x7005, Env(kMagicMethod | kLocal, method_cme, 0));

  WalkResult w = WalkRubyStack(mem_, off_.walk, kEc);
  ASSERT_TRUE(w.complete);
  ASSERT_EQ(w.frames.size(), 5u);
  // Newest first.
  EXPECT_EQ(w.frames[0].kind, RV_RB_FRAME_ISEQ);  // bmethod body: not an ISEQ CME, so the frame's iseq
  EXPECT_EQ(w.frames[0].addr, 0x7004u);
  EXPECT_EQ(w.frames[1].kind, RV_RB_FRAME_CME_ISEQ);  // block: its method's CME, its own iseq and pc for the line
  EXPECT_EQ(w.frames[1].addr, method_cme);
  EXPECT_EQ(w.frames[1].cfp_iseq, 0x7003u);
  EXPECT_EQ(w.frames[1].pc, 0x5010u);
  EXPECT_EQ(w.frames[2].kind, RV_RB_FRAME_CME_CFUNC);
  EXPECT_EQ(w.frames[2].addr, cfunc_cme);
  EXPECT_EQ(w.frames[3].kind, RV_RB_FRAME_CME_ISEQ);  // the svar step at the local env
  EXPECT_EQ(w.frames[3].addr, method_cme);
  EXPECT_EQ(w.frames[4].kind, RV_RB_FRAME_ISEQ);
  EXPECT_EQ(w.frames[4].addr, 0x7001u);
}

// 3.1's rb_profile_frames: no `pc != 0` test and no stop before the VM stack's last frame, which Init_VM turned into
// the main thread's "<main>" TOP frame. Both come from walk flags; without them (3.2+ rules) neither is reported.
TEST_F(WalkerTest, Ruby31ReportsPcLessTopFramesAndTheLastFrame) {
  auto o31 = RubyOffsets::ForVersion(3, 1);
  ASSERT_TRUE(o31.ok());
  off_ = o31.value();
  ASSERT_EQ(off_.walk.cfp_size, 64u);
  const uint64_t cref = Alloc(40);
  mem_.Put64(cref, ImemoFlags(1));  // imemo_cref: no CME
  next_cfp_ = end_ - off_.walk.cfp_size;
  AddFrame(0x5000, 0x7100, Env(kMagicDummy | kLocal, cref, 0));  // Init_VM's <main>: CFRAME cleared, pc set
  AddFrame(0x5008, 0x7101, Env(kMagicMethod | kLocal, 0, 0));    // the script's <main>
  AddFrame(0, 0x7102, Env(0x44440001 | kLocal, cref, 0));        // rb_vm_call_cfunc's TOP frame: pc 0
  AddFrame(0x5010, 0x7103, Env(kMagicMethod | kLocal, Cme(RV_RB_METHOD_TYPE_ISEQ), 0));

  WalkResult w = WalkRubyStack(mem_, off_.walk, kEc);
  ASSERT_TRUE(w.complete);
  ASSERT_EQ(w.frames.size(), 4u);
  EXPECT_EQ(w.frames[0].kind, RV_RB_FRAME_CME_ISEQ);
  EXPECT_EQ(w.frames[1].kind, RV_RB_FRAME_ISEQ);
  EXPECT_EQ(w.frames[1].addr, 0x7102u);
  EXPECT_EQ(w.frames[1].pc, 0u);
  EXPECT_EQ(w.frames[2].addr, 0x7101u);
  EXPECT_EQ(w.frames[3].addr, 0x7100u);

  rv_ruby_walk_offsets later = off_.walk;
  later.flags = 0;
  WalkResult w32 = WalkRubyStack(mem_, later, kEc);
  ASSERT_TRUE(w32.complete);
  ASSERT_EQ(w32.frames.size(), 2u);
  EXPECT_EQ(w32.frames[0].kind, RV_RB_FRAME_CME_ISEQ);
  EXPECT_EQ(w32.frames[1].addr, 0x7101u);
}

TEST_F(WalkerTest, TopFrameWithJitReturnReportsLineZero) {
  AddFrame(0x5000, 0x7001, Env(kMagicMethod | kLocal, 0, 0));
  const uint64_t top = AddFrame(0x5008, 0x7002, Env(kMagicMethod | kLocal, 0, 0));
  mem_.Put64(top + off_.walk.cfp_jit_return, 0xdead0);
  WalkResult w = WalkRubyStack(mem_, off_.walk, kEc);
  ASSERT_EQ(w.frames.size(), 2u);
  EXPECT_EQ(w.frames[0].flags & RV_RB_FRAME_F_LINE_ZERO, RV_RB_FRAME_F_LINE_ZERO);
  EXPECT_EQ(w.frames[1].flags & RV_RB_FRAME_F_LINE_ZERO, 0u);
}

TEST_F(WalkerTest, UnwindsMoreThan4096Frames) {
  const uint64_t cme = Cme(RV_RB_METHOD_TYPE_ISEQ);
  const uint64_t ep = Env(kMagicMethod | kLocal, cme, 0);
  constexpr int kDepth = 6000;
  for (int i = 0; i < kDepth; i++) AddFrame(0x5000 + 8 * i, 0x7000, ep);
  WalkResult w = WalkRubyStack(mem_, off_.walk, kEc);
  EXPECT_TRUE(w.complete);
  ASSERT_EQ(w.frames.size(), static_cast<size_t>(kDepth));
  EXPECT_EQ(w.frames.front().pc, 0x5000u + 8 * (kDepth - 1));
  EXPECT_EQ(w.frames.back().pc, 0x5000u);
}

TEST_F(WalkerTest, NullCfpIsAnEmptyStack) {
  mem_.Put64(kEc + off_.walk.ec_cfp, 0);
  WalkResult w = WalkRubyStack(mem_, off_.walk, kEc);
  EXPECT_TRUE(w.complete);
  EXPECT_TRUE(w.frames.empty());
}

TEST_F(WalkerTest, CorruptStacksStopWithAStatus) {
  AddFrame(0x5000, 0x7001, Env(kMagicMethod | kLocal, 0, 0));
  // cfp outside the VM stack, misaligned, and an absurd stack size.
  for (uint64_t bad_cfp : {kVmStack - 56, end_, end_ - 57}) {
    mem_.Put64(kEc + off_.walk.ec_cfp, bad_cfp);
    WalkResult w = WalkRubyStack(mem_, off_.walk, kEc);
    EXPECT_FALSE(w.complete);
    EXPECT_EQ(w.status, static_cast<uint32_t>(RV_WALK_BAD_STACK)) << std::hex << bad_cfp;
  }
  mem_.Put64(kEc + off_.walk.ec_vm_stack_size, uint64_t{1} << 40);
  EXPECT_EQ(WalkRubyStack(mem_, off_.walk, kEc).status, static_cast<uint32_t>(RV_WALK_BAD_STACK));
  EXPECT_EQ(WalkRubyStack(mem_, off_.walk, 0x42).status, static_cast<uint32_t>(RV_WALK_READ_EC));
}

TEST_F(WalkerTest, UnreadableEpEndsTheWalkAndCyclicEnvChainsAreBounded) {
  AddFrame(0x5000, 0x7001, Env(kMagicMethod | kLocal, 0, 0));
  // A block whose env chain points at itself (never LOCAL): an unresolved frame, then the walk goes on.
  uint64_t base = Alloc(24);
  mem_.Put64(base + 8, (base + 16) | 1);
  mem_.Put64(base + 16, kMagicBlock);
  AddFrame(0x5008, 0x7002, base + 16);
  const uint64_t reads_before = mem_.reads();
  WalkResult w = WalkRubyStack(mem_, off_.walk, kEc);
  EXPECT_TRUE(w.complete);
  ASSERT_EQ(w.frames.size(), 2u);
  EXPECT_EQ(w.frames[0].kind, RV_RB_FRAME_UNRESOLVED);
  EXPECT_EQ(w.frames[1].kind, RV_RB_FRAME_ISEQ);
  EXPECT_LT(mem_.reads() - reads_before, 1000u);
  // Now a frame whose ep points nowhere: the walk stops there with READ_CFP, keeping nothing past it.
  AddFrame(0x5010, 0x7003, 0xdead0000);
  w = WalkRubyStack(mem_, off_.walk, kEc);
  EXPECT_FALSE(w.complete);
  EXPECT_EQ(w.status, static_cast<uint32_t>(RV_WALK_READ_CFP));
  EXPECT_TRUE(w.frames.empty());
}

}  // namespace
}  // namespace rvbpfd
