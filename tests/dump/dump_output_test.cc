// `rvbpfd dump --json` keeps its contract (docs/dump.md) and the text names the deadlock and what each thread runs.
#include "dump/dump_output.h"

#include <gtest/gtest.h>

#include <sstream>

#include "dump/dump_analysis.h"

namespace rvbpfd {
namespace {

FrameInfo C(const char* label) { return FrameInfo{label, "<cfunc>", 0, FrameKind::kCfunc}; }
FrameInfo R(const char* label, int line) { return FrameInfo{label, "/app/x.rb", line, FrameKind::kRuby}; }

DumpSnapshot Snapshot() {
  DumpSnapshot s;
  s.pid = 4242;
  s.ruby_version = "3.4.5";
  s.attempts = 1;
  for (int i = 0; i < 4; i++) {
    DumpedThread t;
    t.ruby_thread = i + 1;
    t.th = 0x1000 * (i + 1);
    t.fiber = t.th + 8;
    t.native_tid = 4242 + i;
    t.ns_tid = t.native_tid;
    t.status = RubyThreadStatus::kStoppedForever;
    s.threads.push_back(t);
  }
  s.threads[0].name = "main-ish";
  s.threads[0].frames = {C("Kernel#sleep"), R("<main>", 40)};
  s.threads[1].frames = {C("Thread::Mutex#lock"), R("Object#lock_b", 12), R("block in <main>", 30)};
  s.threads[2].frames = {C("Thread::Mutex#lock"), R("Object#lock_a", 18)};
  s.threads[3].frames = {R("Worker#crunch", 7)};
  s.threads[3].status = RubyThreadStatus::kRunnable;
  s.threads[3].holds_gvl = true;
  s.threads[3].task_state = 'R';
  s.threads[1].locking_mutex = 0x7f00;
  s.threads[1].mutex_owner_fiber = s.threads[2].fiber;
  s.threads[2].locking_mutex = 0x7f40;
  s.threads[2].mutex_owner_fiber = s.threads[1].fiber;
  s.gvl_holder = 3;
  DeriveStates(&s);
  return s;
}

TEST(DumpJsonTest, TheContractFields) {
  const nlohmann::json j = DumpToJson(Snapshot());
  EXPECT_EQ(j["pid"], 4242);
  EXPECT_EQ(j["ruby_version"], "3.4.5");
  ASSERT_EQ(j["threads"].size(), 4u);
  const nlohmann::json& main = j["threads"][0];
  EXPECT_EQ(main["ruby_thread"], 1);
  EXPECT_EQ(main["native_tid"], 4242);
  EXPECT_EQ(main["name"], "main-ish");
  EXPECT_EQ(main["state"], "blocked");
  EXPECT_EQ(main["reason"], "sleep");
  EXPECT_EQ(main["holds_gvl"], false);
  // Frames leaf first, rb_profile_frame_path: nil for a C frame.
  ASSERT_EQ(main["frames"].size(), 2u);
  EXPECT_EQ(main["frames"][0], (nlohmann::json{{"label", "Kernel#sleep"}, {"path", nullptr}, {"line", 0}}));
  EXPECT_EQ(main["frames"][1], (nlohmann::json{{"label", "<main>"}, {"path", "/app/x.rb"}, {"line", 40}}));
  EXPECT_EQ(main["waiting_for"]["kind"], "sleep");
  EXPECT_TRUE(main["waiting_for"]["owner_native_tid"].is_null());
  EXPECT_TRUE(j["threads"][1]["name"].is_null());
  EXPECT_EQ(j["threads"][1]["waiting_for"]["kind"], "mutex");
  EXPECT_EQ(j["threads"][1]["waiting_for"]["owner_native_tid"], 4244);
  EXPECT_EQ(j["threads"][1]["waiting_for"]["mutex"], "0x7f00");
  EXPECT_EQ(j["threads"][2]["waiting_for"]["owner_native_tid"], 4243);
  EXPECT_EQ(j["threads"][3]["state"], "running");
  EXPECT_EQ(j["threads"][3]["holds_gvl"], true);
  EXPECT_TRUE(j["threads"][3]["reason"].is_null());
  EXPECT_TRUE(j["threads"][3]["waiting_for"].is_null());
  EXPECT_EQ(j["deadlocks"], (nlohmann::json{{4243, 4244}}));
  EXPECT_EQ(j["gvl"]["holder_native_tid"], 4245);
}

TEST(DumpTextTest, NamesTheDeadlockAndEachThreadsStack) {
  std::ostringstream out;
  PrintDumpText(Snapshot(), out);
  const std::string text = out.str();
  EXPECT_NE(text.find("GVL: held by thread 4 (tid 4245)"), std::string::npos) << text;
  EXPECT_NE(text.find("DEADLOCK among 2 threads:\n"
                      "  thread 2 (tid 4243) waiting for Mutex 0x7f00 owned by thread 3 (tid 4244), in "
                      "Object#lock_b at /app/x.rb:12\n"
                      "  thread 3 (tid 4244) waiting for Mutex 0x7f40 owned by thread 2 (tid 4243), in "
                      "Object#lock_a at /app/x.rb:18\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("thread 4 (tid 4245): running\n    Worker#crunch at /app/x.rb:7\n"), std::string::npos) << text;
  EXPECT_NE(text.find("thread 1 \"main-ish\" (tid 4242): blocked (sleep)"), std::string::npos) << text;
}

// The objects waited on, with their waiters in list order, in JSON and text; and each waiter's own line.
TEST(DumpOutputTest, WaitedOnQueuesCondvarsAndMonitors) {
  DumpSnapshot s = Snapshot();
  const FrameInfo pop{"Thread::Queue#pop", "<internal:thread_sync>", 18, FrameKind::kRuby};
  s.threads[0].frames = {pop, R("<main>", 40)};
  s.threads[0].wait_object = 0x5100;
  s.wait_objects = {WaitObject{.object = 0x5100, .type = "sized_queue", .waiters = {0x1000, 0x9999},
                               .push_waiters = {}},
                    WaitObject{.object = 0x5200, .type = "monitor", .owner_fiber = s.threads[3].fiber}};
  DeriveStates(&s);
  const nlohmann::json j = DumpToJson(s);
  const nlohmann::json& w = j["threads"][0]["waiting_for"];
  EXPECT_EQ(w["kind"], "queue");
  EXPECT_EQ(w["object"], "0x5100");
  EXPECT_EQ(w["object_type"], "Thread::SizedQueue");
  EXPECT_EQ(w["operation"], "pop");
  ASSERT_EQ(j["waited_on"].size(), 2u);
  EXPECT_EQ(j["waited_on"][0]["type"], "Thread::SizedQueue");
  EXPECT_EQ(j["waited_on"][0]["waiters_native_tids"], (nlohmann::json{4242}));
  EXPECT_EQ(j["waited_on"][0]["push_waiters_native_tids"], nlohmann::json::array());
  EXPECT_EQ(j["waited_on"][0]["unlisted_waiters"], 1);
  EXPECT_EQ(j["waited_on"][1]["type"], "Monitor");
  EXPECT_EQ(j["waited_on"][1]["owner_native_tid"], 4245);
  std::ostringstream out;
  PrintDumpText(s, out);
  const std::string text = out.str();
  EXPECT_NE(text.find("Waited on:\n  Thread::SizedQueue 0x5100: 1 waiting to pop: thread 1 \"main-ish\" (tid 4242); "
                      "0 waiting to push; 1 not among the threads\n"
                      "  Monitor 0x5200 owned by thread 4 (tid 4245); 0 waiting to enter\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("blocked (queue), waiting to pop Thread::SizedQueue 0x5100\n"), std::string::npos) << text;
}

}  // namespace
}  // namespace rvbpfd
