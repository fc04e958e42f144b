// The release-reason rule on hand-made stacks (leaf first), as docs/design.md "Release reasons" states it.
#include "record/release_reason.h"

#include <gtest/gtest.h>

#include <vector>

namespace rvbpfd {
namespace {

FrameInfo C(const char* label) { return FrameInfo{label, "<cfunc>", 0, FrameKind::kCfunc}; }
FrameInfo R(const char* label, const char* path = "/app/x.rb", int line = 3) {
  return FrameInfo{label, path, line, FrameKind::kRuby};
}
FrameInfo Internal(const char* label, const char* file) { return FrameInfo{label, file, 10, FrameKind::kRuby}; }

ReleaseReason Derive(const std::vector<FrameInfo>& frames, ReleaseSite site = ReleaseSite::kOther) {
  return DeriveReleaseReason(frames, site);
}

TEST(ReleaseReasonTest, BlockingLibraryCallOnTopDecides) {
  EXPECT_EQ(Derive({C("Kernel#sleep"), R("Object#sleeper"), R("block in <main>")}), ReleaseReason::kSleeping);
  EXPECT_EQ(Derive({C("IO#read"), R("Object#reader")}), ReleaseReason::kIo);
  EXPECT_EQ(Derive({C("IO#write"), C("Kernel#puts"), R("<main>")}), ReleaseReason::kIo);
  EXPECT_EQ(Derive({C("IO.select"), R("<main>")}), ReleaseReason::kIo);
  EXPECT_EQ(Derive({Internal("IO#readline", "<internal:io>"), R("<main>")}), ReleaseReason::kIo);
  EXPECT_EQ(Derive({C("BasicSocket#recv"), R("<main>")}), ReleaseReason::kIo);
  EXPECT_EQ(Derive({C("Thread::Mutex#lock"), R("Object#m")}), ReleaseReason::kWaitingMutex);
  EXPECT_EQ(Derive({C("Thread::Mutex#synchronize"), R("Object#m")}), ReleaseReason::kWaitingMutex);
  EXPECT_EQ(Derive({Internal("Thread::Queue#pop", "<internal:thread_sync>"), R("Object#w")}), ReleaseReason::kQueue);
  EXPECT_EQ(Derive({C("Thread::Queue#pop"), R("Object#w")}), ReleaseReason::kQueue);
  EXPECT_EQ(Derive({C("Thread::SizedQueue#push"), R("Object#w")}), ReleaseReason::kQueue);
  EXPECT_EQ(Derive({C("Thread::Mutex#sleep"), C("Thread::ConditionVariable#wait"), R("Object#w")}),
            ReleaseReason::kConditionVariable);
  EXPECT_EQ(Derive({C("Thread::ConditionVariable#wait"), R("Object#w")}), ReleaseReason::kConditionVariable);
  EXPECT_EQ(Derive({C("Thread#join"), R("<main>")}), ReleaseReason::kJoin);
  EXPECT_EQ(Derive({C("Thread#value"), C("Array#map"), R("<main>")}), ReleaseReason::kJoin);
  EXPECT_EQ(Derive({C("Process.wait"), R("<main>")}), ReleaseReason::kProcessWait);
  EXPECT_EQ(Derive({C("Process.waitpid2"), R("<main>")}), ReleaseReason::kProcessWait);
}

TEST(ReleaseReasonTest, OnlyFramesAboveTheProgramsCodeCount) {
  // A sleep further down, under program code, is not what the thread is blocked in now.
  EXPECT_EQ(Derive({C("Digest::SHA256#update"), R("Object#hash_it"), C("Kernel#sleep")}), ReleaseReason::kUnknown);
  // The innermost known call wins (Mutex#sleep inside ConditionVariable#wait inside Mutex#synchronize).
  EXPECT_EQ(Derive({C("Thread::Mutex#sleep"), C("Thread::ConditionVariable#wait"), C("Thread::Mutex#synchronize")}),
            ReleaseReason::kConditionVariable);
  // A label that merely contains a known name is not it.
  EXPECT_EQ(Derive({C("MyIO#read"), R("<main>")}), ReleaseReason::kUnknown);
  EXPECT_EQ(Derive({R("Kernel#sleep", "/app/shadow.rb")}), ReleaseReason::kUnknown);
  EXPECT_EQ(Derive({}), ReleaseReason::kUnknown);
}

TEST(ReleaseReasonTest, SitesDecideYieldAndExit) {
  EXPECT_EQ(Derive({C("Thread.pass"), R("<main>")}, ReleaseSite::kYield), ReleaseReason::kPass);
  EXPECT_EQ(Derive({R("Object#spin"), R("<main>")}, ReleaseSite::kYield), ReleaseReason::kTimeslice);
  EXPECT_EQ(Derive({}, ReleaseSite::kYield), ReleaseReason::kTimeslice);
  EXPECT_EQ(Derive({C("Kernel#sleep")}, ReleaseSite::kThreadEnd), ReleaseReason::kExit);
  EXPECT_EQ(Derive({}, ReleaseSite::kThreadEnd), ReleaseReason::kExit);
  // A pass frame outside the yield site is a plain (unknown) release.
  EXPECT_EQ(Derive({R("Object#spin")}, ReleaseSite::kOther), ReleaseReason::kUnknown);
}

TEST(ReleaseReasonTest, SiteClassificationAndNames) {
  EXPECT_EQ(ClassifyReleaseSite("rb_thread_schedule_limits"), ReleaseSite::kYield);
  EXPECT_EQ(ClassifyReleaseSite("thread_start_func_2"), ReleaseSite::kThreadEnd);
  EXPECT_EQ(ClassifyReleaseSite("rb_nogvl"), ReleaseSite::kOther);
  EXPECT_EQ(ReleaseReasonTraceName(ReleaseReason::kConditionVariable), "condition_variable");
  EXPECT_EQ(ReleaseReasonTraceName(ReleaseReason::kProcessWait), "process_wait");
  EXPECT_EQ(ReleaseReasonTraceName(ReleaseReason::kTimeslice), "timeslice");
  EXPECT_EQ(ReleaseReasonTraceName(ReleaseReason::kUnknown), "unknown");
}


// Stacks as CRuby 3.3 (Debian trixie's ruby3.3) reports them in real servers, with the labels of the libraries'
// own sources (nio4r 2.7, puma 6.6, activerecord 7.2, net-http / net-protocol, monitor.rb).
constexpr const char* kMonitorRb = "/usr/lib/ruby/3.3.0/monitor.rb";
constexpr const char* kPumaPool = "/usr/share/rubygems-integration/all/gems/puma-6.6.0/lib/puma/thread_pool.rb";
constexpr const char* kArQueue =
    "/usr/share/rubygems-integration/all/gems/activerecord-7.2.2/lib/active_record/connection_adapters/abstract/"
    "connection_pool/queue.rb";

TEST(ReleaseReasonTest, PumasReactorSelectIsIo) {
  // nio4r's Selector#select is C; it took its (uncontended) lock with Mutex#lock just before blocking in epoll.
  EXPECT_EQ(Derive({C("NIO::Selector#select"), R("Puma::Reactor#select_loop"), R("block in Puma::Reactor#run"),
                    R("block in Thread.new")}),
            ReleaseReason::kIo);
}

TEST(ReleaseReasonTest, PumasPoolThreadWaitingForWorkIsIdle) {
  // thread_pool.rb spawn_thread: mutex.synchronize { while todo.empty? ... not_empty.wait mutex ... }
  const std::vector<FrameInfo> waiting = {C("Thread::Mutex#sleep"), C("Thread::ConditionVariable#wait"),
                                          R("block (2 levels) in Puma::ThreadPool#spawn_thread", kPumaPool, 237),
                                          C("Thread::Mutex#synchronize"),
                                          R("block in Puma::ThreadPool#spawn_thread", kPumaPool, 213)};
  EXPECT_EQ(Derive(waiting), ReleaseReason::kIdle);
  // rb_profile_frames names a block frame by its method's entry: the same frame as "Puma::ThreadPool#spawn_thread".
  EXPECT_EQ(Derive({C("Thread::Mutex#sleep"), C("Thread::ConditionVariable#wait"),
                    R("Puma::ThreadPool#spawn_thread", kPumaPool, 237), C("Thread::Mutex#synchronize")}),
            ReleaseReason::kIdle);
  EXPECT_EQ(ReleaseReasonTraceName(ReleaseReason::kIdle), "idle");
  // The pool's mutex itself, contended, is contention.
  EXPECT_EQ(Derive({C("Thread::Mutex#synchronize"), R("block in Puma::ThreadPool#spawn_thread", kPumaPool, 213)}),
            ReleaseReason::kWaitingMutex);
  // The server thread waiting for a free pool thread (wait_until_not_full) is back-pressure, not idleness.
  EXPECT_EQ(Derive({C("Thread::Mutex#sleep"), C("Thread::ConditionVariable#wait"),
                    R("block in Puma::ThreadPool#wait_until_not_full", kPumaPool, 324)}),
            ReleaseReason::kConditionVariable);
  // The app's own condition variable, run by a pool thread, is the app's wait.
  EXPECT_EQ(Derive({C("Thread::Mutex#sleep"), C("Thread::ConditionVariable#wait"), R("Cache#fetch"),
                    R("block in Puma::ThreadPool#spawn_thread", kPumaPool, 213)}),
            ReleaseReason::kConditionVariable);
}

TEST(ReleaseReasonTest, ActiveRecordPoolCheckoutIsDbPool) {
  // Queue#wait_poll: permit_concurrent_loads { @cond.wait(timeout - elapsed) }, @cond a MonitorMixin condition.
  const FrameInfo wait = R("MonitorMixin::ConditionVariable#wait", kMonitorRb, 108);
  EXPECT_EQ(Derive({C("Thread::Mutex#sleep"), C("Thread::ConditionVariable#wait"), C("Monitor#wait_for_cond"), wait,
                    R("block (2 levels) in ActiveRecord::ConnectionAdapters::ConnectionPool::Queue#wait_poll",
                      kArQueue, 119),
                    R("ActiveSupport::Concurrency::ShareLock#yield_shares")}),
            ReleaseReason::kDbPool);
  EXPECT_EQ(Derive({C("Thread::Mutex#sleep"), C("Thread::ConditionVariable#wait"), C("Monitor#wait_for_cond"), wait,
                    R("ActiveRecord::ConnectionAdapters::ConnectionPool::Queue#wait_poll", kArQueue, 119)}),
            ReleaseReason::kDbPool);
  // Biased toward a thread (ConnectionLeasingQueue's BiasedConditionVariable#wait).
  EXPECT_EQ(Derive({C("Thread::Mutex#sleep"), C("Thread::ConditionVariable#wait"), C("Monitor#wait_for_cond"), wait,
                    R("ActiveRecord::ConnectionAdapters::ConnectionPool::BiasableQueue::BiasedConditionVariable#wait",
                      kArQueue, 170)}),
            ReleaseReason::kDbPool);
  // The pool's monitor, contended.
  EXPECT_EQ(Derive({C("Monitor#synchronize"), R("MonitorMixin#mon_synchronize", kMonitorRb, 202),
                    R("ActiveRecord::ConnectionAdapters::ConnectionPool::Queue#synchronize", kArQueue, 82)}),
            ReleaseReason::kDbPool);
  EXPECT_EQ(ReleaseReasonTraceName(ReleaseReason::kDbPool), "db_pool");
  // A class merely named like the pool is not it.
  EXPECT_EQ(Derive({C("Thread::Mutex#lock"), R("ActiveRecord::ConnectionAdapters::ConnectionPoolish#x")}),
            ReleaseReason::kWaitingMutex);
}

TEST(ReleaseReasonTest, MonitorAndItsConditionVariable) {
  // MonitorMixin's Ruby wrappers (monitor.rb) are library frames: the C call under them decides.
  EXPECT_EQ(Derive({C("Monitor#wait_for_cond"), R("MonitorMixin::ConditionVariable#wait", kMonitorRb, 108),
                    R("Jobs#next")}),
            ReleaseReason::kConditionVariable);
  EXPECT_EQ(Derive({R("MonitorMixin::ConditionVariable#wait", kMonitorRb, 108), R("Jobs#next")}),
            ReleaseReason::kConditionVariable);
  EXPECT_EQ(Derive({C("Monitor#enter"), R("MonitorMixin#mon_enter", kMonitorRb, 172), R("Jobs#take")}),
            ReleaseReason::kWaitingMutex);
  EXPECT_EQ(Derive({C("Monitor#synchronize"), R("Jobs#take")}), ReleaseReason::kWaitingMutex);
  // A program's own file named otherwise is program code, whatever its labels.
  EXPECT_EQ(Derive({R("MonitorMixin::ConditionVariable#wait", "/app/lib/my_monitor_rb.rb")}), ReleaseReason::kUnknown);
  // Queue and SizedQueue as 3.3's <internal:thread_sync> defines them.
  EXPECT_EQ(Derive({Internal("Thread::SizedQueue#push", "<internal:thread_sync>"), R("Producer#run")}),
            ReleaseReason::kQueue);
  EXPECT_EQ(Derive({Internal("Thread::SizedQueue#pop", "<internal:thread_sync>"), R("Consumer#run")}),
            ReleaseReason::kQueue);
}

TEST(ReleaseReasonTest, NetHttpAndSocketsAreIo) {
  // net-protocol's BufferedIO#rbuf_fill: read_nonblock, then `@io.to_io.wait_readable(@read_timeout)`.
  EXPECT_EQ(Derive({C("IO#wait_readable"), R("Net::BufferedIO#rbuf_fill"), R("Net::BufferedIO#readuntil"),
                    R("Net::BufferedIO#readline"), R("Net::HTTPResponse.read_status_line")}),
            ReleaseReason::kIo);
  // Net::HTTP#connect: TCPSocket.open resolves and connects in TCPSocket#initialize; Socket.tcp resolves with
  // Addrinfo.getaddrinfo; TLS reads.
  EXPECT_EQ(Derive({C("TCPSocket#initialize"), C("IO.open"), R("block in Net::HTTP#connect")}), ReleaseReason::kIo);
  EXPECT_EQ(Derive({C("Addrinfo.getaddrinfo"), R("Addrinfo.foreach"), R("Socket.tcp")}), ReleaseReason::kIo);
  EXPECT_EQ(Derive({C("Socket.getaddrinfo"), R("Resolver#lookup")}), ReleaseReason::kIo);
  EXPECT_EQ(Derive({C("OpenSSL::SSL::SSLSocket#sysread_nonblock"), R("OpenSSL::Buffering#read_nonblock")}),
            ReleaseReason::kIo);
}

}  // namespace
}  // namespace rvbpfd
