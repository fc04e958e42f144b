// The sampler's GVL reading (bpf/ruby_gvl.h, run here through its host build) on fake memory laid out like a 3.4
// VM: the ractor's threads.sched (holder, readyq, readyq_cnt) and threads linked through rb_thread_t.sched.node.readyq.
// Hostile and torn queues: longer than the bound, cyclic, a node that cannot be read, a pointer no thread can hold, an
// implausible count, and the layout variants a table entry can choose (no count kept, the lock kept by the VM).
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "fake_memory.h"
#include "stacks/ec_route.h"
#include "stacks/ruby_offsets.h"

namespace rvbpfd {
namespace {

constexpr uint64_t kRactor = 0x10000;
constexpr uint64_t kVmPtr = 0x5000;  // &ruby_current_vm_ptr
constexpr uint64_t kThreads = 0x100000;
constexpr uint64_t kThreadSize = 0x1000;

uint64_t Th(int i) { return kThreads + static_cast<uint64_t>(i) * kThreadSize; }

class FakeVm {
 public:
  explicit FakeVm(int threads) : g_(RubyOffsets::ForVersion(3, 4)->gvl) {
    mem_.Map(kRactor, 0x1000);
    mem_.Map(kVmPtr, 8);
    for (int i = 0; i < threads; ++i) {
      mem_.Map(Th(i), 0x800);
      mem_.Put64(Th(i) + g_.th_ractor, kRactor);
    }
    Queue({});
  }
  uint64_t Node(int i) const { return Th(i) + g_.th_queue_node; }
  uint64_t Head() const { return kRactor + g_.queue; }
  void Holder(uint64_t th) { mem_.Put64(kRactor + g_.holder, th); }
  void Count(int32_t n) { mem_.Put32(kRactor + g_.queue_count, static_cast<uint32_t>(n)); }
  // Links the threads `order` into the queue (next pointers only: the walk follows those), head last.
  void Queue(const std::vector<int>& order) {
    uint64_t prev = Head();
    for (int i : order) {
      mem_.Put64(prev, Node(i));
      prev = Node(i);
    }
    mem_.Put64(prev, Head());
    Count(static_cast<int32_t>(order.size()));
  }
  std::optional<rv_gvl_reading> Read(int sampled = 0, const rv_gvl_offsets* g = nullptr) {
    return ReadGvlForThread(mem_, g != nullptr ? *g : g_, kVmPtr, Th(sampled));
  }
  testing::FakeMemory& mem() { return mem_; }
  const rv_gvl_offsets& offsets() const { return g_; }

 private:
  rv_gvl_offsets g_;
  testing::FakeMemory mem_;
};

std::vector<uint64_t> Queued(const rv_gvl_reading& r) {
  return std::vector<uint64_t>(r.queued, r.queued + std::min<uint32_t>(r.nqueued, RV_GVL_MAX_QUEUED));
}

TEST(GvlReading, HolderCountAndQueueInOrder) {
  FakeVm vm(5);
  vm.Holder(Th(4));
  vm.Queue({2, 0, 3});
  std::optional<rv_gvl_reading> r = vm.Read(4);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->holder, Th(4));
  EXPECT_EQ(r->waiting, 3u);
  EXPECT_EQ(Queued(*r), (std::vector<uint64_t>{Th(2), Th(0), Th(3)}));
  EXPECT_EQ(r->flags, 0u);
}

TEST(GvlReading, AFreeLockAndAnEmptyQueue) {
  FakeVm vm(2);
  vm.Holder(0);
  std::optional<rv_gvl_reading> r = vm.Read(1);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->holder, 0u);
  EXPECT_EQ(r->waiting, 0u);
  EXPECT_EQ(r->nqueued, 0u);
  EXPECT_EQ(r->flags, 0u);
}

TEST(GvlReading, ALongQueueIsListedUpToTheBoundWithTheVmsCount) {
  FakeVm vm(41);
  vm.Holder(Th(40));
  std::vector<int> order;
  for (int i = 0; i < 40; ++i) order.push_back(i);
  vm.Queue(order);
  std::optional<rv_gvl_reading> r = vm.Read(40);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->waiting, 40u);
  EXPECT_EQ(r->nqueued, uint32_t{RV_GVL_MAX_QUEUED});
  EXPECT_EQ(r->queued[RV_GVL_MAX_QUEUED - 1], Th(RV_GVL_MAX_QUEUED - 1));
  EXPECT_EQ(r->flags, uint32_t{RV_GVL_F_QUEUE_TRUNCATED});
}

TEST(GvlReading, ACycleNeverListsMoreThanTheCountAndIsFlagged) {
  FakeVm vm(3);
  vm.Holder(Th(2));
  vm.mem().Put64(vm.Head(), vm.Node(0));
  vm.mem().Put64(vm.Node(0), vm.Node(1));
  vm.mem().Put64(vm.Node(1), vm.Node(0));  // relinked under the walk: never back to the head
  vm.Count(2);
  std::optional<rv_gvl_reading> r = vm.Read(2);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(Queued(*r), (std::vector<uint64_t>{Th(0), Th(1)}));
  EXPECT_EQ(r->waiting, 2u);
  EXPECT_EQ(r->flags, uint32_t{RV_GVL_F_QUEUE_TRUNCATED});
}

TEST(GvlReading, AnUnreadableNodeEndsTheListNotTheReading) {
  FakeVm vm(3);
  vm.Holder(Th(2));
  vm.mem().Put64(vm.Head(), vm.Node(0));
  vm.mem().Put64(vm.Node(0), 0xdead0000);  // no memory there
  vm.Count(2);
  std::optional<rv_gvl_reading> r = vm.Read(2);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(Queued(*r), (std::vector<uint64_t>{Th(0)}));
  EXPECT_EQ(r->waiting, 2u);
  EXPECT_EQ(r->flags, uint32_t{RV_GVL_F_QUEUE_UNREADABLE});
  // A pointer below the node's offset cannot be inside any rb_thread_t: not subtracted into a wild address.
  vm.mem().Put64(vm.Head(), 8);
  r = vm.Read(2);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->nqueued, 0u);
  EXPECT_EQ(r->flags, uint32_t{RV_GVL_F_QUEUE_UNREADABLE});
  // A NULL link (a node unlinked mid-walk) after a listed thread.
  vm.mem().Put64(vm.Head(), vm.Node(0));
  vm.mem().Put64(vm.Node(0), 0);
  r = vm.Read(2);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(Queued(*r), (std::vector<uint64_t>{Th(0)}));
  EXPECT_EQ(r->flags, uint32_t{RV_GVL_F_QUEUE_UNREADABLE});
}

TEST(GvlReading, NoReadingWhenTheVmCannotBeReadOrItsCountIsNoCount) {
  FakeVm vm(2);
  vm.Holder(Th(1));
  vm.Queue({0});
  EXPECT_FALSE(ReadGvlForThread(vm.mem(), vm.offsets(), kVmPtr, 0xbad0000).has_value()) << "unreadable th";
  vm.mem().Put64(Th(1) + vm.offsets().th_ractor, 0);
  EXPECT_FALSE(vm.Read(1).has_value()) << "a thread without a ractor";
  vm.mem().Put64(Th(1) + vm.offsets().th_ractor, 0xbad0000);
  EXPECT_FALSE(vm.Read(1).has_value()) << "a ractor that cannot be read";
  vm.mem().Put64(Th(1) + vm.offsets().th_ractor, kRactor);
  vm.Count(-1);
  EXPECT_FALSE(vm.Read(1).has_value()) << "a negative count";
  vm.Count(1 << 30);
  EXPECT_FALSE(vm.Read(1).has_value()) << "more threads than any process has";
  vm.Count(1);
  EXPECT_TRUE(vm.Read(1).has_value());
  rv_gvl_offsets none = vm.offsets();
  none.base = RV_GVL_BASE_NONE;
  EXPECT_FALSE(vm.Read(1, &none).has_value()) << "a binary without a GVL layout";
  rv_gvl_offsets no_holder = vm.offsets();
  no_holder.holder = RV_GVL_NO_FIELD;
  EXPECT_FALSE(vm.Read(1, &no_holder).has_value());
}

// What a READY reads (rv_read_gvl_holder): the holder alone, whatever the queue holds; nothing when the VM cannot say.
TEST(GvlReading, TheHolderAloneAsAReadyReadsIt) {
  FakeVm vm(3);
  vm.Holder(Th(2));
  vm.Count(-1);  // a count no reading accepts: the holder read does not look at the queue
  EXPECT_EQ(ReadGvlHolderForThread(vm.mem(), vm.offsets(), kVmPtr, Th(0)), std::optional<uint64_t>(Th(2)));
  vm.Holder(0);
  EXPECT_EQ(ReadGvlHolderForThread(vm.mem(), vm.offsets(), kVmPtr, Th(0)), std::optional<uint64_t>(0));
  EXPECT_FALSE(ReadGvlHolderForThread(vm.mem(), vm.offsets(), kVmPtr, 0xbad0000).has_value()) << "unreadable th";
  vm.mem().Put64(Th(0) + vm.offsets().th_ractor, 0);
  EXPECT_FALSE(ReadGvlHolderForThread(vm.mem(), vm.offsets(), kVmPtr, Th(0)).has_value()) << "no ractor";
  rv_gvl_offsets none = vm.offsets();
  none.base = RV_GVL_BASE_NONE;
  EXPECT_FALSE(ReadGvlHolderForThread(vm.mem(), none, kVmPtr, Th(1)).has_value()) << "no GVL layout";
  rv_gvl_offsets no_holder = vm.offsets();
  no_holder.holder = RV_GVL_NO_FIELD;
  EXPECT_FALSE(ReadGvlHolderForThread(vm.mem(), no_holder, kVmPtr, Th(1)).has_value());
}

TEST(GvlReading, WithoutACountTheWalkCounts) {
  FakeVm vm(4);
  vm.Holder(Th(3));
  vm.Queue({1, 2});
  rv_gvl_offsets g = vm.offsets();
  g.queue_count = RV_GVL_NO_FIELD;
  vm.Count(99);  // whatever lies there is not read
  std::optional<rv_gvl_reading> r = vm.Read(3, &g);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->waiting, 2u);
  EXPECT_EQ(Queued(*r), (std::vector<uint64_t>{Th(1), Th(2)}));
}

TEST(GvlReading, ALockKeptByTheVmIsFoundThroughRubyCurrentVmPtr) {
  FakeVm vm(3);
  vm.mem().Put64(kVmPtr, kRactor);  // the same fields, reached from the VM instead of the thread's ractor
  vm.Holder(Th(2));
  vm.Queue({0, 1});
  rv_gvl_offsets g = vm.offsets();
  g.base = RV_GVL_BASE_VM;
  g.th_ractor = RV_GVL_NO_FIELD;
  std::optional<rv_gvl_reading> r = ReadGvlForThread(vm.mem(), g, kVmPtr, 0);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->holder, Th(2));
  EXPECT_EQ(Queued(*r), (std::vector<uint64_t>{Th(0), Th(1)}));
  EXPECT_FALSE(ReadGvlForThread(vm.mem(), g, 0, Th(2)).has_value()) << "no ruby_current_vm_ptr";
}

TEST(GvlReading, EveryReadStaysBounded) {
  // A queue far longer than the bound costs the same reads as one of exactly RV_GVL_MAX_QUEUED threads.
  FakeVm vm(200);
  vm.Holder(Th(199));
  std::vector<int> order;
  for (int i = 0; i < 199; ++i) order.push_back(i);
  vm.Queue(order);
  const uint64_t before = vm.mem().reads();
  ASSERT_TRUE(vm.Read(199).has_value());
  // ractor, holder, count, head, then one read per listed node.
  EXPECT_LE(vm.mem().reads() - before, 4u + RV_GVL_MAX_QUEUED);
}

}  // namespace
}  // namespace rvbpfd
