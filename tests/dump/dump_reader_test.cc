// Reading the threads of a VM from synthetic memory laid out as the dump layout says: the thread list, each thread's
// fields, the Mutex a thread waits for and its owner, the GVL, torn and corrupt lists.
#include "dump/dump_reader.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "stacks/fake_memory.h"

namespace rvbpfd {
namespace {

constexpr uint64_t kVmPtr = 0x1000, kVm = 0x2000, kRactor = 0x10000;
constexpr uint64_t kThreads[] = {0x20000, 0x21000, 0x22000};
constexpr uint64_t kMutex = 0x50000, kMutexType = 0x51000, kMutexName = 0x52000, kMutexData = 0x53000;

DumpLayout Layout() {
  DumpLayout l;
  l.vm_main_ractor = 32;
  l.ractor_threads_set = 256;
  l.ractor_threads_cnt = 272;
  l.th_lt_node = 0;
  l.th_ractor = 24;
  l.th_nt = 40;
  l.th_ec = 48;
  l.th_status_bit = 8 * 100 + 2;
  l.th_locking_mutex = 200;
  l.th_name = 208;
  l.th_join_list = 216;
  l.nt_tid = 24;
  l.ec_cfp = 16;
  l.ec_fiber_ptr = 40;
  l.ec_thread_ptr = 48;
  l.mutex_fiber = 0;
  l.typed_type = 16;
  l.typed_flag = 24;
  l.typed_data = 32;
  l.waiting_next = 0;
  l.waiting_thread = 8;
  l.gvl = rv_gvl_offsets{.base = RV_GVL_BASE_THREAD_RACTOR, .th_ractor = 24, .holder = 328, .queue = 344,
                         .queue_count = 360, .th_queue_node = 72};
  return l;
}

uint64_t Nt(size_t i) { return 0x30000 + 0x100 * i; }
uint64_t Ec(size_t i) { return 0x40000 + 0x100 * i; }
uint64_t Fiber(size_t i) { return 0x48000 + 0x100 * i; }

// A VM with one ractor and three threads: 1 (main) holds the GVL, 2 waits for a Mutex thread 3 owns, 3 is queued for
// the GVL. Thread 2 is named through the string hook.
class DumpReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const DumpLayout l = Layout();
    mem_.Map(kVmPtr, 8);
    mem_.Put64(kVmPtr, kVm);
    mem_.Map(kVm, 0x100);
    mem_.Put64(kVm + l.vm_main_ractor, kRactor);
    mem_.Map(kRactor, 0x1000);
    for (size_t i = 0; i < 3; i++) {
      const uint64_t th = kThreads[i];
      mem_.Map(th, 0x400);
      mem_.Put64(th + l.th_ractor, kRactor);
      mem_.Put64(th + l.th_nt, Nt(i));
      mem_.Put64(th + l.th_ec, Ec(i));
      mem_.Map(Nt(i), 0x100);
      mem_.Put32(Nt(i) + l.nt_tid, static_cast<uint32_t>(500 + i));
      mem_.Map(Ec(i), 0x100);
      mem_.Put64(Ec(i) + l.ec_cfp, 0x9000 + i);
      mem_.Put64(Ec(i) + l.ec_fiber_ptr, Fiber(i));
      mem_.Put64(Ec(i) + l.ec_thread_ptr, th);
      SetStatus(i, i == 1 ? RubyThreadStatus::kStoppedForever : RubyThreadStatus::kRunnable);
      mem_.Put64(th + l.th_name, i == 1 ? 0x77000 : 0x08);  // a String, nil
    }
    Link({kThreads[0], kThreads[1], kThreads[2]});
    // Thread 2 sleeps to lock the Mutex that thread 3's fiber owns.
    mem_.Put64(kThreads[1] + l.th_locking_mutex, kMutex);
    mem_.Map(kMutex, 40);
    mem_.Put64(kMutex, 0x0c);  // T_DATA
    mem_.Put64(kMutex + l.typed_type, kMutexType);
    mem_.Put64(kMutex + l.typed_flag, 1);
    mem_.Put64(kMutex + l.typed_data, kMutexData);
    mem_.Map(kMutexType, 8);
    mem_.Put64(kMutexType, kMutexName);
    mem_.Map(kMutexName, 8);
    mem_.Put(kMutexName, "mutex\0\0", 8);
    mem_.Map(kMutexData, 32);
    mem_.Put64(kMutexData + l.mutex_fiber, Fiber(2));
    // GVL: thread 1 holds it, thread 3 is queued.
    mem_.Put64(kRactor + l.gvl.holder, kThreads[0]);
    mem_.Put64(kRactor + l.gvl.queue, kThreads[2] + l.gvl.th_queue_node);
    mem_.Put64(kThreads[2] + l.gvl.th_queue_node, kRactor + l.gvl.queue);
    mem_.Put32(kRactor + l.gvl.queue_count, 1);
    hooks_.stack = [](uint64_t ec) {
      StackReading s;
      s.frames = {FrameInfo{"Object#at_" + std::to_string(ec), "/x.rb", 1, FrameKind::kRuby}};
      return s;
    };
    hooks_.string = [](uint64_t v) -> std::optional<std::string> {
      if (v == 0x77000) return "worker";
      return std::nullopt;
    };
  }
  void SetStatus(size_t i, RubyThreadStatus s) {
    const DumpLayout l = Layout();
    const uint8_t byte = static_cast<uint8_t>(static_cast<uint8_t>(s) << (l.th_status_bit % 8));
    mem_.Put(kThreads[i] + l.th_status_bit / 8, &byte, 1);
  }
  // The ractor's thread list: these threads in order, and its count.
  void Link(const std::vector<uint64_t>& ths) {
    const DumpLayout l = Layout();
    const uint64_t head = kRactor + l.ractor_threads_set;
    uint64_t prev = head;
    for (uint64_t th : ths) {
      mem_.Put64(prev, th + l.th_lt_node);
      prev = th + l.th_lt_node;
    }
    mem_.Put64(prev, head);
    mem_.Put32(kRactor + l.ractor_threads_cnt, static_cast<uint32_t>(ths.size()));
  }

  testing::FakeMemory mem_;
  DumpReadHooks hooks_;
};

TEST_F(DumpReaderTest, ReadsEveryThreadItsFieldsTheMutexOwnerAndTheGvl) {
  Result<DumpSnapshot> s = ReadRubyThreads(mem_, Layout(), VmRoots{kVmPtr, 0}, hooks_);
  ASSERT_TRUE(s.ok()) << s.error().ToString();
  ASSERT_EQ(s->threads.size(), 3u);
  EXPECT_EQ(s->attempts, 1);
  EXPECT_FALSE(s->torn);
  for (size_t i = 0; i < 3; i++) {
    const DumpedThread& t = s->threads[i];
    EXPECT_EQ(t.ruby_thread, static_cast<int>(i + 1));
    EXPECT_EQ(t.th, kThreads[i]);
    EXPECT_EQ(t.ns_tid, static_cast<int>(500 + i));
    EXPECT_EQ(t.fiber, Fiber(i));
    ASSERT_EQ(t.frames.size(), 1u);
    EXPECT_EQ(t.frames[0].label, "Object#at_" + std::to_string(Ec(i)));
    EXPECT_FALSE(t.changed);
  }
  EXPECT_EQ(s->threads[0].name, std::nullopt);
  EXPECT_EQ(s->threads[1].name, "worker");
  EXPECT_EQ(s->threads[1].status, RubyThreadStatus::kStoppedForever);
  EXPECT_EQ(s->threads[0].status, RubyThreadStatus::kRunnable);
  EXPECT_EQ(s->threads[1].locking_mutex, kMutex);
  EXPECT_EQ(s->threads[1].mutex_owner_fiber, Fiber(2));
  EXPECT_EQ(s->threads[0].locking_mutex, 0u);
  EXPECT_TRUE(s->threads[0].holds_gvl);
  EXPECT_EQ(s->gvl_holder, 0u);
  EXPECT_EQ(s->threads[2].gvl_queue_position, 0);
  EXPECT_EQ(s->gvl_waiters, (std::vector<size_t>{2}));
}

TEST_F(DumpReaderTest, AnObjectThatIsNoMutexIsNotReportedAsOne) {
  mem_.Put(kMutexName, "queue\0\0", 8);
  Result<DumpSnapshot> s = ReadRubyThreads(mem_, Layout(), VmRoots{kVmPtr, 0}, hooks_);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->threads[1].locking_mutex, 0u);
  EXPECT_EQ(ReadMutexOwnerFiber(mem_, Layout(), kMutex), std::nullopt);
  mem_.Put(kMutexName, "mutex\0\0", 8);
  EXPECT_EQ(ReadMutexOwnerFiber(mem_, Layout(), kMutex), Fiber(2));
  mem_.Put64(kMutex, 0x05);  // T_STRING
  EXPECT_EQ(ReadMutexOwnerFiber(mem_, Layout(), kMutex), std::nullopt);
}

TEST_F(DumpReaderTest, AThreadListChangedDuringTheReadingIsReadAgain) {
  // The first stack read of thread 2 removes thread 3 from the list: the first reading is torn, the second not.
  int calls = 0;
  hooks_.stack = [&](uint64_t) {
    if (++calls == 2) Link({kThreads[0], kThreads[1]});
    return StackReading{{FrameInfo{"x", "/x.rb", 1, FrameKind::kRuby}}, true};
  };
  Result<DumpSnapshot> s = ReadRubyThreads(mem_, Layout(), VmRoots{kVmPtr, 0}, hooks_);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->attempts, 2);
  EXPECT_FALSE(s->torn);
  EXPECT_EQ(s->threads.size(), 2u);
}

TEST_F(DumpReaderTest, AThreadThatKeepsMovingIsMarkedChanged) {
  // Every stack read of thread 1 moves its cfp: it never holds still for a reading.
  uint64_t cfp = 0x9000;
  hooks_.stack = [&](uint64_t ec) {
    if (ec == Ec(0)) mem_.Put64(Ec(0) + Layout().ec_cfp, ++cfp);
    return StackReading{};
  };
  Result<DumpSnapshot> s = ReadRubyThreads(mem_, Layout(), VmRoots{kVmPtr, 0}, hooks_);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->threads[0].changed);
  EXPECT_FALSE(s->threads[1].changed);
  EXPECT_EQ(cfp, 0x9000u + kMaxThreadRereads);
}

TEST_F(DumpReaderTest, AListLongerThanItsCountOrOfAnotherRactorIsRefused) {
  mem_.Put32(kRactor + Layout().ractor_threads_cnt, 1);  // 3 nodes, count 1: a walk bounded at 2 cannot end
  Result<DumpSnapshot> s = ReadRubyThreads(mem_, Layout(), VmRoots{kVmPtr, 0}, hooks_);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kNoSymbols);
  Link({kThreads[0], kThreads[1], kThreads[2]});
  mem_.Put64(kThreads[1] + Layout().th_ractor, 0x123000);
  s = ReadRubyThreads(mem_, Layout(), VmRoots{kVmPtr, 0}, hooks_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message().find("point back at its ractor"), std::string::npos);
}

TEST_F(DumpReaderTest, WithoutTheVmPointerTheMainRactorPointerServes) {
  mem_.Map(0x3000, 8);
  mem_.Put64(0x3000, kRactor);  // ruby_single_main_ractor
  Result<DumpSnapshot> s = ReadRubyThreads(mem_, Layout(), VmRoots{0, 0x3000}, hooks_);
  ASSERT_TRUE(s.ok()) << s.error().ToString();
  EXPECT_EQ(s->threads.size(), 3u);
  EXPECT_EQ(s->gvl_holder, 0u);
  mem_.Put64(0x3000, 0);  // several ractors: the single-ractor pointer is NULL
  EXPECT_FALSE(ReadRubyThreads(mem_, Layout(), VmRoots{0, 0x3000}, hooks_).ok());
}

TEST_F(DumpReaderTest, ANullVmIsAnError) {
  mem_.Put64(kVmPtr, 0);
  Result<DumpSnapshot> s = ReadRubyThreads(mem_, Layout(), VmRoots{kVmPtr, 0}, hooks_);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kNoSymbols);
}

// A VM pointer recovered from code is type-checked: the main thread's self must be a "VM/thread" object whose data
// is that thread; anything else (another object, another thread's, a non-object, no thread at all) is refused.
TEST_F(DumpReaderTest, TheMainThreadMustBeARubyThreadObject) {
  DumpLayout l = Layout();
  l.th_self = 8;
  constexpr uint64_t kSelf = 0x60000, kThreadType = 0x61000, kThreadName = 0x62000;
  mem_.Map(kSelf, 40);
  mem_.Put64(kSelf, 0x0c);  // T_DATA
  mem_.Put64(kSelf + l.typed_type, kThreadType);
  mem_.Put64(kSelf + l.typed_flag, 1);
  mem_.Put64(kSelf + l.typed_data, kThreads[0]);
  mem_.Map(kThreadType, 8);
  mem_.Put64(kThreadType, kThreadName);
  mem_.Map(kThreadName, 16);
  mem_.Put(kThreadName, "VM/thread\0\0\0\0\0\0", 16);
  mem_.Put64(kThreads[0] + l.th_self, kSelf);
  VmRoots roots{kVmPtr, 0};
  roots.vm_ptr_from_code = true;
  roots.vm_ptr_source = "the global f reads";
  Result<DumpSnapshot> s = ReadRubyThreads(mem_, l, roots, hooks_);
  ASSERT_TRUE(s.ok()) << s.error().ToString();
  EXPECT_EQ(s->threads.size(), 3u);

  auto refused = [&](const std::string& why) {
    Result<DumpSnapshot> r = ReadRubyThreads(mem_, l, roots, hooks_);
    ASSERT_FALSE(r.ok()) << why;
    EXPECT_EQ(r.error().code(), ErrorCode::kNoSymbols) << why;
    EXPECT_NE(r.error().message().find("the global f reads"), std::string::npos) << r.error().message();
  };
  mem_.Put64(kSelf + l.typed_data, kThreads[1]);
  refused("another thread's object");
  mem_.Put64(kSelf + l.typed_data, kThreads[0]);
  mem_.Put64(kThreads[0] + l.th_self, kMutex);
  refused("a Mutex");
  mem_.Put64(kThreads[0] + l.th_self, 0x08);
  refused("nil");
  mem_.Put64(kThreads[0] + l.th_self, kSelf);
  mem_.Put(kThreadName, "VM/threadX", 10);
  refused("a type of another name");
  mem_.Put(kThreadName, "VM/thread\0", 10);
  Link({});
  refused("no thread");
  roots.vm_ptr_from_code = false;  // an exported pointer: an empty list is read as such
  EXPECT_TRUE(ReadRubyThreads(mem_, l, roots, hooks_).ok());
}

// A blocked thread whose second frame's receiver is a SizedQueue: the queue is found through its control frames
// and read with its two wait lists (sync_waiter nodes naming threads). A type of another name, or a list that breaks,
// is not taken for one / is marked incomplete.
TEST_F(DumpReaderTest, AQueueAThreadWaitsOnIsReadWithItsWaitLists) {
  DumpLayout l = Layout();
  l.cfp_self = 24;
  l.cfp_size = 56;
  l.waiter_th = 8;
  l.waiter_node = 24;
  l.queue_waitq = 0;
  l.szqueue_pushq = 40;
  constexpr uint64_t kCfp = 0x70000, kQueue = 0x71000, kType = 0x72000, kName = 0x72100, kWaiters = 0x73000;
  mem_.Put64(Ec(1) + l.ec_cfp, kCfp);
  mem_.Map(kCfp, 2 * 56);
  mem_.Put64(kCfp + l.cfp_self, 0x08);             // the leaf's receiver: nil
  mem_.Put64(kCfp + 56 + l.cfp_self, kQueue);      // its caller's: the queue
  mem_.Map(kQueue, 32 + 64);
  mem_.Put64(kQueue, 0x0c);  // T_DATA
  mem_.Put64(kQueue + l.typed_type, kType);
  mem_.Put64(kQueue + l.typed_flag, 3);            // typed, embedded: the rb_szqueue at +32
  mem_.Map(kType, 8);
  mem_.Put64(kType, kName);
  mem_.Map(kName, 16);
  mem_.Put(kName, "sized_queue\0", 12);
  const uint64_t data = kQueue + l.typed_data;
  // waitq: thread 3's waiter; pushq: thread 2's.
  mem_.Map(kWaiters, 0x200);
  auto link = [&](uint64_t head, uint64_t waiter, uint64_t th) {
    mem_.Put64(waiter + l.waiter_th, th);
    mem_.Put64(head, waiter + l.waiter_node);
    mem_.Put64(waiter + l.waiter_node, head);
  };
  link(data + l.queue_waitq, kWaiters, kThreads[2]);
  link(data + l.szqueue_pushq, kWaiters + 0x100, kThreads[1]);
  hooks_.stack = [](uint64_t) {
    StackReading r;
    r.frames = {FrameInfo{"Thread::SizedQueue#push", "<internal:thread_sync>", 63, FrameKind::kRuby},
                FrameInfo{"x", "/x.rb", 1, FrameKind::kRuby}};
    return r;
  };
  Result<DumpSnapshot> s = ReadRubyThreads(mem_, l, VmRoots{kVmPtr, 0}, hooks_);
  ASSERT_TRUE(s.ok()) << s.error().ToString();
  EXPECT_EQ(s->threads[1].wait_object, kQueue);
  EXPECT_EQ(s->threads[1].wait_type, "sized_queue");
  EXPECT_EQ(s->threads[2].wait_object, 0u) << "a runnable thread is not searched";
  ASSERT_EQ(s->wait_objects.size(), 1u);
  const WaitObject& q = s->wait_objects[0];
  EXPECT_EQ(q.object, kQueue);
  EXPECT_EQ(q.waiters, (std::vector<uint64_t>{kThreads[2]}));
  EXPECT_EQ(q.push_waiters, (std::vector<uint64_t>{kThreads[1]}));
  EXPECT_TRUE(q.lists_complete);

  mem_.Put64(kWaiters + 0x100 + l.waiter_node, 0x123000);  // the push list runs into unmapped memory
  s = ReadRubyThreads(mem_, l, VmRoots{kVmPtr, 0}, hooks_);
  ASSERT_TRUE(s.ok()) << s.error().ToString();
  ASSERT_EQ(s->wait_objects.size(), 1u);
  EXPECT_FALSE(s->wait_objects[0].lists_complete);

  // A list linked in a circle that never returns to its head: cut at the threads + 64 nodes, marked incomplete.
  mem_.Put64(kWaiters + 0x100 + l.waiter_node, kWaiters + 0x100 + l.waiter_node);
  s = ReadRubyThreads(mem_, l, VmRoots{kVmPtr, 0}, hooks_);
  ASSERT_TRUE(s.ok()) << s.error().ToString();
  ASSERT_EQ(s->wait_objects.size(), 1u);
  EXPECT_FALSE(s->wait_objects[0].lists_complete);
  EXPECT_EQ(s->wait_objects[0].waiters, (std::vector<uint64_t>{kThreads[2]}));

  mem_.Put(kName, "sized_queuX\0", 12);
  s = ReadRubyThreads(mem_, l, VmRoots{kVmPtr, 0}, hooks_);
  ASSERT_TRUE(s.ok()) << s.error().ToString();
  EXPECT_EQ(s->threads[1].wait_object, 0u);
  EXPECT_TRUE(s->wait_objects.empty());
}

}  // namespace
}  // namespace rvbpfd
