#include "export/perfetto.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "export/format_checks.h"
#include "trace/writer.h"
#include "model/model_test_util.h"

namespace rvbpfd {
namespace {

using nlohmann::json;
using testing::CheckTraceEventFormat;
using testing::EveryRuleSequence;

json ExportToJson(const Model& model) {
  std::ostringstream out;
  const Status status = ExportPerfetto(model, out);
  EXPECT_TRUE(status.ok()) << status.error().ToString();
  return json::parse(out.str());
}

// ts/dur are microseconds with ns precision: back to integer ns.
uint64_t Ns(const json& us) { return static_cast<uint64_t>(us.get<double>() * 1000.0 + 0.5); }

std::vector<json> EventsOn(const json& doc, int pid, uint64_t tid, const std::string& ph) {
  std::vector<json> out;
  for (const json& e : doc["traceEvents"]) {
    if (e["pid"] == pid && e["tid"] == tid && e["ph"] == ph) out.push_back(e);
  }
  return out;
}

TEST(PerfettoExport, ConformsToTheTraceEventFormat) {
  const Model model = EveryRuleSequence().Build("3.2.5", 0);
  const json doc = ExportToJson(model);
  const std::vector<std::string> errors = CheckTraceEventFormat(doc);
  EXPECT_TRUE(errors.empty()) << errors.front();
  EXPECT_GT(doc["traceEvents"].size(), 20u);
}

TEST(PerfettoExport, CheckerCatchesBrokenFiles) {
  // The conformance test above is only as good as the checker: prove it rejects each violation it names.
  const json unmatched_b = json::parse(R"({"traceEvents":[{"ph":"B","name":"a","pid":1,"tid":1,"ts":1}]})");
  const json stray_e = json::parse(R"({"traceEvents":[{"ph":"E","name":"a","pid":1,"tid":1,"ts":1}]})");
  const json backwards = json::parse(R"({"traceEvents":[{"ph":"X","name":"a","pid":1,"tid":1,"ts":5,"dur":1},
                                                        {"ph":"X","name":"b","pid":1,"tid":1,"ts":4,"dur":1}]})");
  const json no_tid = json::parse(R"({"traceEvents":[{"ph":"X","name":"a","pid":1,"ts":5,"dur":1}]})");
  const json overlap = json::parse(R"({"traceEvents":[{"ph":"X","name":"a","pid":1,"tid":1,"ts":1,"dur":5},
                                                      {"ph":"X","name":"b","pid":1,"tid":1,"ts":3,"dur":5}]})");
  const json ok = json::parse(R"({"traceEvents":[{"ph":"B","name":"a","pid":1,"tid":1,"ts":1},
                                                 {"ph":"E","name":"a","pid":1,"tid":1,"ts":2},
                                                 {"ph":"X","name":"b","pid":1,"tid":2,"ts":1,"dur":5},
                                                 {"ph":"X","name":"c","pid":1,"tid":2,"ts":2,"dur":1}]})");
  EXPECT_FALSE(CheckTraceEventFormat(unmatched_b).empty());
  EXPECT_FALSE(CheckTraceEventFormat(stray_e).empty());
  EXPECT_FALSE(CheckTraceEventFormat(backwards).empty());
  EXPECT_FALSE(CheckTraceEventFormat(no_tid).empty());
  EXPECT_FALSE(CheckTraceEventFormat(overlap).empty());
  EXPECT_TRUE(CheckTraceEventFormat(ok).empty());
}

TEST(PerfettoExport, OneTrackPerRubyThreadWithItsBlocks) {
  const Model model = EveryRuleSequence().Build("3.2.5", 0);
  const json doc = ExportToJson(model);
  std::map<uint64_t, std::string> names;  // tid -> thread_name on the Ruby process
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name" && e["pid"] == kPerfettoRubyPid) {
      names[e["tid"].get<uint64_t>()] = e["args"]["name"];
    }
  }
  EXPECT_EQ(names[kPerfettoOwnerTid], "GVL owner");
  EXPECT_EQ(names[kPerfettoGcTid], "GC");
  for (const RubyThread& thread : model.threads()) {
    const uint64_t tid = kPerfettoThreadTidBase + thread.ruby_thread;
    EXPECT_EQ(names[tid], model.ThreadLabel(thread.ruby_thread));
    const std::vector<json> slices = EventsOn(doc, kPerfettoRubyPid, tid, "X");
    ASSERT_EQ(slices.size(), thread.blocks.size()) << names[tid];
    for (size_t i = 0; i < slices.size(); ++i) {
      const StateBlock& b = thread.blocks[i];
      EXPECT_EQ(slices[i]["name"], StateBlockLabel(b));
      EXPECT_EQ(Ns(slices[i]["ts"]), b.start_ns);
      EXPECT_EQ(Ns(slices[i]["dur"]), b.duration_ns());
      EXPECT_EQ(slices[i]["cat"], std::string(ProvenanceString(b.provenance)));
      EXPECT_EQ(slices[i]["args"]["provenance"], std::string(ProvenanceString(b.provenance)));
      if (b.rule != ModelRule::kNone) {
        EXPECT_EQ(slices[i]["args"]["rule"], std::string(ModelRuleName(b.rule)));
      }
      if (b.opened_by) {
        const TraceEvent& opener = model.events()[*b.opened_by];
        EXPECT_EQ(slices[i]["args"]["opened_by"]["event"], std::string(EventNameString(opener.event)));
        EXPECT_EQ(slices[i]["args"]["opened_by"]["t_ns"], opener.t_ns);
      }
    }
  }
}

TEST(PerfettoExport, DerivedBlocksNameTheirRuleAndCrubyEvent) {
  const Model model = EveryRuleSequence().Build("3.2.5", 0);
  const json doc = ExportToJson(model);
  bool saw_preempted = false, saw_sleeping = false;
  for (const json& e : EventsOn(doc, kPerfettoRubyPid, kPerfettoThreadTidBase + 2, "X")) {
    if (e["name"] == "wants_gvl: preempted") {
      saw_preempted = true;
      EXPECT_EQ(e["cat"], "derived");
      EXPECT_EQ(e["args"]["rule"], "preempted_by_resume");
      // Closed the owner at T3's RESUMED.
      EXPECT_EQ(e["args"]["opened_by"]["cruby"], "RUBY_INTERNAL_THREAD_EVENT_RESUMED");
    }
    if (e["name"] == "released: sleeping") {
      saw_sleeping = true;
      EXPECT_EQ(e["cat"], "derived");
      EXPECT_EQ(e["args"]["rule"], "sleep_probe");
      EXPECT_EQ(e["args"]["repeated_transitions"], 1);
      EXPECT_EQ(e["args"]["opened_by"]["cruby"], "RUBY_INTERNAL_THREAD_EVENT_SUSPENDED");
    }
  }
  EXPECT_TRUE(saw_preempted);
  EXPECT_TRUE(saw_sleeping);
}

TEST(PerfettoExport, OwnerTrackGcInstantsAndNativeThreads) {
  const Model model = EveryRuleSequence().Build("3.2.5", 0);
  const json doc = ExportToJson(model);
  const std::vector<json> owner = EventsOn(doc, kPerfettoRubyPid, kPerfettoOwnerTid, "X");
  ASSERT_EQ(owner.size(), model.owner_lane().size());
  for (size_t i = 0; i < owner.size(); ++i) {
    const OwnerBlock& b = model.owner_lane()[i];
    const std::string expected = b.kind == OwnerKind::kOwned ? model.ThreadLabel(*b.owner)
                                 : b.kind == OwnerKind::kIdle ? "idle" : "unknown";
    EXPECT_EQ(owner[i]["name"], expected);
    if (i > 0) {
      EXPECT_EQ(Ns(owner[i]["ts"]), Ns(owner[i - 1]["ts"]) + Ns(owner[i - 1]["dur"])) << "owners overlap";
    }
  }
  const std::vector<json> gc = EventsOn(doc, kPerfettoRubyPid, kPerfettoGcTid, "X");
  ASSERT_EQ(gc.size(), model.gc_spans().size());
  EXPECT_EQ(Ns(gc[0]["ts"]), model.gc_spans()[0].start_ns);

  // Probe instants on their thread's track; drop and pause as global instants.
  const auto t2_instants = EventsOn(doc, kPerfettoRubyPid, kPerfettoThreadTidBase + 2, "i");
  ASSERT_EQ(t2_instants.size(), 1u);
  EXPECT_EQ(t2_instants[0]["name"], "Kernel#sleep");
  EXPECT_EQ(t2_instants[0]["s"], "t");
  const auto t3_instants = EventsOn(doc, kPerfettoRubyPid, kPerfettoThreadTidBase + 3, "i");
  ASSERT_EQ(t3_instants.size(), 1u);
  EXPECT_EQ(t3_instants[0]["name"], "Thread::Mutex#lock");
  const auto global = EventsOn(doc, kPerfettoRubyPid, kPerfettoMarkerTid, "i");
  ASSERT_EQ(global.size(), 3u);
  EXPECT_EQ(global[0]["name"], "events_dropped");
  EXPECT_EQ(global[0]["args"]["count"], 12);
  EXPECT_EQ(global[0]["s"], "g");

  // Native process: T2 and T3 both on tid 135.
  const auto native = EventsOn(doc, kPerfettoNativePid, 135, "X");
  std::set<std::string> ran;
  for (const json& e : native) ran.insert(e["name"].get<std::string>());
  EXPECT_EQ(ran, (std::set<std::string>{"Thread #2", "Thread #3"}));
}

TEST(PerfettoExport, StreamFailureIsAnIoError) {
  const Model model = EveryRuleSequence().Build("3.2.5", 0);
  std::ostringstream out;
  out.setstate(std::ios::badbit);
  const Status status = ExportPerfetto(model, out);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.error().code(), ErrorCode::kIo);
}

TEST(PerfettoExport, ReleasedBlocksCarryTheStackAndDerivedReasonOfTheirEvent) {
  char dir[] = "/tmp/rvperfetto-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/s.rvtrace";
  {
    TraceHeader header;
    header.pid = 42;
    header.ruby_version = "3.4.5";
    Result<TraceWriter> w = TraceWriter::Create(path, header);
    ASSERT_TRUE(w.ok()) << w.error().ToString();
    const uint32_t sleep = w->InternFrame(FrameInfo{"Kernel#sleep", "<cfunc>", 0, FrameKind::kCfunc});
    const uint32_t top = w->InternFrame(FrameInfo{"<main>", "/app/x.rb", 3, FrameKind::kRuby});
    const uint32_t frames[] = {sleep, top};
    const uint32_t stack = w->InternStack(frames);
    TraceEvent acquired;
    acquired.t_ns = 1000;
    acquired.ruby_thread = 1;
    acquired.native_tid = 42;
    acquired.event = EventName::kGvlAcquired;
    acquired.source = kSourceThreadHookSite;
    ASSERT_TRUE(w->Write(acquired).ok());
    TraceEvent released = acquired;
    released.t_ns = 5000;
    released.event = EventName::kGvlReleased;
    released.stack = stack;
    released.reason = "sleep";
    released.reason_provenance = Provenance::kDerived;
    ASSERT_TRUE(w->Write(released).ok());
    ASSERT_TRUE(w->Finish(FinishInfo{9000, 0, 0, "duration"}).ok());
  }
  std::ostringstream out;
  ASSERT_TRUE(ExportPerfetto(path, out).ok());
  const json doc = json::parse(out.str());
  bool found = false;
  for (const json& e : EventsOn(doc, kPerfettoRubyPid, kPerfettoThreadTidBase + 1, "X")) {
    if (!e["args"].contains("opened_by") || e["args"]["opened_by"]["event"] != "gvl_released") continue;
    found = true;
    const json& opened = e["args"]["opened_by"];
    EXPECT_EQ(opened["reason"], "sleep");
    EXPECT_EQ(opened["reason_provenance"], "derived");
    ASSERT_TRUE(opened.contains("stack"));
    EXPECT_EQ(opened["stack"], json::array({"Kernel#sleep (<cfunc>:0)", "<main> (/app/x.rb:3)"}));
  }
  EXPECT_TRUE(found) << out.str();
  std::remove(path.c_str());
  rmdir(dir);
}

TEST(PerfettoExport, ThreadSlicesCarryTheirEndpoint) {
  char dir[] = "/tmp/rvperfetto-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/e.rvtrace";
  {
    TraceHeader header;
    header.pid = 42;
    header.ruby_version = "3.3.8";
    Result<TraceWriter> w = TraceWriter::Create(path, header);
    ASSERT_TRUE(w.ok()) << w.error().ToString();
    // Leaf first: Kernel#sleep in a Rails action under its dispatch.
    std::vector<uint32_t> frames;
    for (const FrameInfo& f : {FrameInfo{"Kernel#sleep", "<cfunc>", 0, FrameKind::kCfunc},
                               FrameInfo{"LedgerController#nap", "/app/application.rb", 102, FrameKind::kRuby},
                               FrameInfo{"AbstractController::Base#process_action", "/gems/base.rb", 226,
                                         FrameKind::kRuby}}) {
      frames.push_back(w->InternFrame(f));
    }
    const uint32_t stack = w->InternStack(frames);
    TraceEvent e;
    e.ruby_thread = 1;
    e.native_tid = 42;
    e.source = kSourceThreadHookSite;
    for (auto [t, name] : {std::pair{1000, EventName::kGvlAcquired}, std::pair{5000, EventName::kGvlReleased},
                           std::pair{6000, EventName::kWantsGvl}, std::pair{7000, EventName::kGvlAcquired}}) {
      e.t_ns = t;
      e.event = name;
      e.stack = name == EventName::kGvlReleased ? std::optional<uint32_t>(stack) : std::nullopt;
      ASSERT_TRUE(w->Write(e).ok());
    }
    ASSERT_TRUE(w->Finish(FinishInfo{9000, 0, 0, "duration"}).ok());
  }
  std::ostringstream out;
  ASSERT_TRUE(ExportPerfetto(path, out).ok());
  const json doc = json::parse(out.str());
  std::map<uint64_t, json> by_start;  // the thread's slices' args by start ns
  for (const json& e : EventsOn(doc, kPerfettoRubyPid, kPerfettoThreadTidBase + 1, "X")) by_start[Ns(e["ts"])] = e;
  // Running until the release in the action, blocked in it, then waiting for the GVL to go on with it.
  for (uint64_t start : {1000u, 5000u, 6000u}) {
    ASSERT_TRUE(by_start.contains(start)) << out.str();
    EXPECT_EQ(by_start[start]["args"]["endpoint"], "LedgerController#nap") << start;
    EXPECT_EQ(by_start[start]["args"]["endpoint_rule"], "rails_action") << start;
  }
  EXPECT_EQ(by_start[5000]["args"]["opened_by"]["endpoint"], "LedgerController#nap");
  std::remove(path.c_str());
  rmdir(dir);
}

TEST(PerfettoExport, MissingTraceFileFails) {
  std::ostringstream out;
  const Status status = ExportPerfetto(std::string("/nonexistent/rvbpfd/x.rvtrace"), out);
  EXPECT_FALSE(status.ok());
}

}  // namespace
}  // namespace rvbpfd
