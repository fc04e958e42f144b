#include "report/report.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <sstream>

#include "model/model_test_util.h"
#include "report/report_data.h"
#include "report/report_template.h"

namespace rvbpfd {
namespace {

using nlohmann::json;
using testing::EventSeq;
using testing::EveryRuleSequence;
using testing::kMs;
using testing::kUs;

constexpr std::string_view kDataOpen = R"(<script id="rv-data" type="application/json">)";

std::string RenderHtml(const Model& model, const std::string& title = "trace.rvtrace") {
  std::ostringstream out;
  ReportOptions options;
  options.title = title;
  const Status status = WriteReportHtml(model, options, out);
  EXPECT_TRUE(status.ok()) << status.error().ToString();
  return out.str();
}

// The embedded data object, parsed back: what the page's script reads.
json EmbeddedData(const std::string& html) {
  const size_t open = html.find(kDataOpen);
  EXPECT_NE(open, std::string::npos);
  const size_t from = open + kDataOpen.size();
  const size_t close = html.find("</script>", from);
  EXPECT_NE(close, std::string::npos);
  return json::parse(html.substr(from, close - from));
}

// Decoders mirroring the page's: delta columns back to absolute values, "+1" optionals back to optionals.
std::vector<uint64_t> Undelta(const json& column) {
  std::vector<uint64_t> out;
  int64_t v = 0;
  for (const json& d : column) {
    v += d.get<int64_t>();
    out.push_back(static_cast<uint64_t>(v));
  }
  return out;
}
EventRef RefFromPlusOne(uint64_t v) { return v == 0 ? EventRef() : EventRef(v - 1); }

struct Span {
  uint64_t start, end;
};
std::vector<Span> Spans(const json& columns) {
  const std::vector<uint64_t> s = Undelta(columns["s"]);
  std::vector<Span> out;
  for (size_t i = 0; i < s.size(); ++i) out.push_back({s[i], s[i] + columns["d"][i].get<uint64_t>()});
  return out;
}

// A 3.4-style trace of four busy threads trading the GVL, with sleeps, mutex waits, GC and lost events: a larger,
// irregular input for the owner-lane checks (fixed seed, so failures reproduce).
EventSeq RandomBusySequence(uint32_t seed, int transitions) {
  std::mt19937 rng(seed);
  EventSeq s;
  uint64_t t = 0;
  s.Add(t, EventName::kTracingStarted);
  const uint32_t kThreads[] = {2, 3, 4, 5};
  for (uint32_t th : kThreads) {
    t += 10 * kUs;
    s.Add(t, EventName::kThreadStarted, th, 100);
    s.Add(t + kUs, EventName::kWantsGvl, th, 100);
  }
  t += 10 * kUs;
  s.Add(t, EventName::kGvlReleased, 1, 100);
  uint32_t owner = 0;  // 0: idle
  std::vector<uint32_t> waiting(std::begin(kThreads), std::end(kThreads));
  for (int i = 0; i < transitions; ++i) {
    t += 1 + rng() % (200 * kUs);
    if (owner == 0 && !waiting.empty()) {
      const size_t k = rng() % waiting.size();
      owner = waiting[k];
      waiting.erase(waiting.begin() + static_cast<long>(k));
      s.Add(t, EventName::kGvlAcquired, owner, 200 + owner);
      continue;
    }
    if (owner == 0) {
      for (uint32_t th : kThreads) {
        if (std::find(waiting.begin(), waiting.end(), th) == waiting.end()) waiting.push_back(th);
        s.Add(t, EventName::kWantsGvl, th, 200 + th);
      }
      continue;
    }
    switch (rng() % 6) {
      case 0:
        s.Add(t, EventName::kSleepEnter, owner, 200 + owner);
        break;
      case 1:
        s.Add(t, EventName::kMutexLockEnter, owner, 200 + owner);
        break;
      case 2:
        s.Add(t, EventName::kGcEnter);
        s.Add(t + 5 * kUs, EventName::kGcExit);
        t += 5 * kUs;
        break;
      case 3:
        if (rng() % 20 == 0) s.Dropped(t, 1 + rng() % 50);
        break;
      default:
        break;
    }
    t += 1 + rng() % (50 * kUs);
    s.Add(t, EventName::kGvlReleased, owner, 200 + owner);
    s.Add(t + 1, EventName::kWantsGvl, owner, 200 + owner);
    waiting.push_back(owner);
    owner = 0;
  }
  s.Add(t + kMs, EventName::kTracingStopped);
  return s;
}

TEST(ReportTemplate, HasExactlyOneDataSlotInsideTheDataScript) {
  const std::string_view page = kReportTemplate;
  const size_t slot = page.find(kReportDataSlot);
  ASSERT_NE(slot, std::string_view::npos);
  EXPECT_EQ(page.find(kReportDataSlot, slot + 1), std::string_view::npos);
  EXPECT_EQ(page.substr(slot - kDataOpen.size(), kDataOpen.size()), kDataOpen);
}

TEST(Report, IsSelfContained) {
  const std::string html = RenderHtml(EveryRuleSequence().Build("3.2.5", 0));
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  std::string lower = html;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  EXPECT_EQ(lower.find("http://"), std::string::npos);
  EXPECT_EQ(lower.find("https://"), std::string::npos);
  EXPECT_EQ(lower.find("//cdn"), std::string::npos);
  // No element loads anything: no src/href attributes, stylesheets links, CSS imports or urls.
  EXPECT_FALSE(std::regex_search(lower, std::regex(R"(\s(src|href|srcset|action|poster)\s*=)")));
  EXPECT_EQ(lower.find("<link"), std::string::npos);
  EXPECT_EQ(lower.find("<iframe"), std::string::npos);
  EXPECT_EQ(lower.find("@import"), std::string::npos);
  EXPECT_EQ(lower.find("url("), std::string::npos);
  // No script makes requests.
  for (const char* api : {"fetch(", "xmlhttprequest", "websocket", "eventsource", "import(", "sendbeacon", "importscripts"}) {
    EXPECT_EQ(lower.find(api), std::string::npos) << api;
  }
  // And the page forbids them itself, in case a future edit adds one.
  EXPECT_NE(html.find("Content-Security-Policy\" content=\"default-src 'none'"), std::string::npos);
}

TEST(Report, EmbedsEveryThreadAndEveryBlock) {
  const Model model = EveryRuleSequence().Build("3.2.5", 0);
  const json data = EmbeddedData(RenderHtml(model));
  EXPECT_EQ(data["v"], kReportDataVersion);
  ASSERT_EQ(data["threads"].size(), model.threads().size());
  const json& names = data["names"];
  for (size_t k = 0; k < model.threads().size(); ++k) {
    const RubyThread& thread = model.threads()[k];
    const json& t = data["threads"][k];
    EXPECT_EQ(t["id"], thread.ruby_thread);
    EXPECT_EQ(t["label"], model.ThreadLabel(thread.ruby_thread));
    const json& b = t["blocks"];
    const std::vector<Span> spans = Spans(b);
    const std::vector<uint64_t> opened = Undelta(b["o"]);
    const std::vector<uint64_t> closed = Undelta(b["c"]);
    ASSERT_EQ(spans.size(), thread.blocks.size()) << thread.ruby_thread;
    for (size_t i = 0; i < thread.blocks.size(); ++i) {
      const StateBlock& want = thread.blocks[i];
      SCOPED_TRACE("thread " + std::to_string(thread.ruby_thread) + " block " + std::to_string(i));
      EXPECT_EQ(spans[i].start, want.start_ns);
      EXPECT_EQ(spans[i].end, want.end_ns);
      EXPECT_EQ(names["state"][b["st"][i].get<size_t>()], ThreadStateName(want.state));
      EXPECT_EQ(names["reason"][b["rs"][i].get<size_t>()], ReleaseReasonName(want.reason));
      EXPECT_EQ(names["prov"][b["pv"][i].get<size_t>()], ProvenanceString(want.provenance));
      EXPECT_EQ(names["rule"][b["ru"][i].get<size_t>()], ModelRuleName(want.rule));
      EXPECT_EQ(RefFromPlusOne(opened[i]), want.opened_by);
      EXPECT_EQ(RefFromPlusOne(closed[i]), want.closed_by);
      EXPECT_EQ(b["rp"][i], want.repeats);
      const uint64_t nt = b["nt"][i];
      if (want.native_tid) {
        ASSERT_GT(nt, 0u);
        EXPECT_EQ(data["tids"][nt - 1], *want.native_tid);
      } else {
        EXPECT_EQ(nt, 0u);
      }
    }
  }
  // The owner lane, GC spans, native threads, markers and events are all there too.
  const std::vector<Span> owner = Spans(data["owner"]);
  ASSERT_EQ(owner.size(), model.owner_lane().size());
  for (size_t i = 0; i < owner.size(); ++i) {
    EXPECT_EQ(owner[i].start, model.owner_lane()[i].start_ns);
    EXPECT_EQ(owner[i].end, model.owner_lane()[i].end_ns);
    const uint64_t ow = data["owner"]["ow"][i];
    EXPECT_EQ(ow == 0 ? std::optional<uint32_t>() : std::optional<uint32_t>(ow - 1), model.owner_lane()[i].owner);
  }
  EXPECT_EQ(data["gc"]["s"].size(), model.gc_spans().size());
  EXPECT_EQ(data["unknown"]["s"].size(), model.unknown_windows().size());
  ASSERT_EQ(data["native"].size(), model.native_threads().size());
  for (size_t i = 0; i < model.native_threads().size(); ++i) {
    EXPECT_EQ(data["native"][i]["tid"], model.native_threads()[i].native_tid);
    EXPECT_EQ(data["native"][i]["spans"]["s"].size(), model.native_threads()[i].spans.size());
  }
  EXPECT_EQ(data["markers"]["t"].size(), model.markers().size());
  const std::vector<uint64_t> event_t = Undelta(data["events"]["t"]);
  ASSERT_EQ(event_t.size(), model.events().size());
  for (size_t i = 0; i < event_t.size(); ++i) {
    EXPECT_EQ(event_t[i], model.events()[i].t_ns);
    EXPECT_EQ(names["event"][data["events"]["e"][i].get<size_t>()], EventNameString(model.events()[i].event));
  }
  // The CRuby constant of an event is one table lookup away, as the card needs it.
  EXPECT_EQ(names["cruby"][static_cast<size_t>(EventName::kGvlAcquired)], "RUBY_INTERNAL_THREAD_EVENT_RESUMED");
  // The events_dropped count travels in "extra".
  bool saw_dropped = false;
  for (const json& x : data["extra"]) {
    if (model.events()[x[0].get<size_t>()].event == EventName::kEventsDropped) {
      EXPECT_EQ(x[1]["count"], 12);
      saw_dropped = true;
    }
  }
  EXPECT_TRUE(saw_dropped);
}

TEST(Report, HostileTraceStringsCannotInjectMarkup) {
  const std::string hostile = "</script><script>alert(1)</script><!-- <img src=x onerror=alert(2)> & \"q\" \\ \xff";
  EventSeq s;
  s.Add(0, EventName::kTracingStarted);
  s.Add(10 * kUs, EventName::kGvlAcquired, 1, 100);
  const size_t paused = s.Add(20 * kUs, EventName::kTracingPaused);
  s.Add(30 * kUs, EventName::kTracingResumed);
  s.Add(40 * kUs, EventName::kTracingStopped);
  std::vector<TraceEvent> events = s.events();
  events[paused].reason = hostile;
  events[paused].source = InternSource(hostile);
  ModelOptions options;
  options.ruby_version = "3.4.5" + hostile;
  options.main_thread = 1;
  Result<Model> model = Model::Build(events, options);
  ASSERT_TRUE(model.ok()) << model.error().ToString();
  const std::string html = RenderHtml(*model, hostile);

  // Exactly the template's own script elements, and none of the hostile markup, are in the page.
  auto count = [](std::string_view text, std::string_view what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string_view::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count(html, "<script"), count(kReportTemplate, "<script"));
  EXPECT_EQ(count(html, "</script"), count(kReportTemplate, "</script"));
  EXPECT_EQ(html.find("alert(1)</script>"), std::string::npos);
  EXPECT_EQ(html.find("<img"), std::string::npos);
  EXPECT_EQ(count(html, "<!--"), count(kReportTemplate, "<!--"));
  // The data still carries the strings (JSON-escaped), so the page shows them as text.
  const json data = EmbeddedData(html);
  EXPECT_EQ(data["meta"]["title"].get<std::string>().substr(0, 20), hostile.substr(0, 20));
  EXPECT_NE(data["meta"]["ruby_version"].get<std::string>().find("</script><script>alert(1)"), std::string::npos);
  bool reason_found = false;
  for (const json& x : data["extra"]) {
    if (x[1].contains("reason")) {
      EXPECT_NE(x[1]["reason"].get<std::string>().find("<img src=x onerror=alert(2)>"), std::string::npos);
      reason_found = true;
    }
  }
  EXPECT_TRUE(reason_found);
  bool source_found = false;
  for (const json& src : data["names"]["source"]) source_found |= src.get<std::string>().rfind("</script>", 0) == 0;
  EXPECT_TRUE(source_found);
}

TEST(Report, ScriptSafeStringsEscapeTheHtmlSpecials) {
  std::string out;
  AppendScriptSafeJsonString(&out, "a</script>&<!--\\<");
  EXPECT_EQ(out, R"("a\u003c/script\u003e\u0026\u003c!--\\\u003c")");
  EXPECT_EQ(json::parse(out).get<std::string>(), "a</script>&<!--\\<");
}

// Problems with the embedded owner lane: blocks out of order or overlapping, an owned block naming no thread, or
// two thread lanes holding the GVL (running or GC) at once. Empty when the page can never show two owners at once.
std::vector<std::string> OwnerProblems(const json& data) {
  std::vector<std::string> problems;
  const json& owner = data["owner"];
  const std::vector<Span> spans = Spans(owner);
  if (spans.empty()) problems.push_back("no owner blocks");
  const json& kinds = data["names"]["owner_kind"];
  for (size_t i = 0; i < spans.size(); ++i) {
    if (spans[i].start > spans[i].end) problems.push_back("owner block " + std::to_string(i) + " ends before it starts");
    if (i > 0 && spans[i - 1].end > spans[i].start) {
      problems.push_back("owner blocks " + std::to_string(i - 1) + " and " + std::to_string(i) + " overlap");
    }
    const bool owned = kinds[owner["k"][i].get<size_t>()] == "owned";
    if (owned != (owner["ow"][i].get<uint64_t>() != 0)) problems.push_back("owner block " + std::to_string(i));
  }
  std::vector<std::pair<Span, uint32_t>> running;
  for (const json& t : data["threads"]) {
    const std::vector<Span> blocks = Spans(t["blocks"]);
    for (size_t i = 0; i < blocks.size(); ++i) {
      const std::string state = data["names"]["state"][t["blocks"]["st"][i].get<size_t>()];
      if ((state == "running" || state == "gc") && blocks[i].end > blocks[i].start) {
        running.push_back({blocks[i], t["id"].get<uint32_t>()});
      }
    }
  }
  std::sort(running.begin(), running.end(), [](const auto& a, const auto& b) { return a.first.start < b.first.start; });
  for (size_t i = 1; i < running.size(); ++i) {
    if (running[i - 1].first.end > running[i].first.start) {
      problems.push_back("threads " + std::to_string(running[i - 1].second) + " and " +
                         std::to_string(running[i].second) + " both hold the GVL at " +
                         std::to_string(running[i].first.start));
    }
  }
  return problems;
}

TEST(Report, OwnerLaneNeverOverlapsOnEveryRuleSequence) {
  const std::vector<std::string> problems = OwnerProblems(EmbeddedData(RenderHtml(EveryRuleSequence().Build("3.2.5", 0))));
  EXPECT_TRUE(problems.empty()) << problems.front();
}

TEST(Report, OwnerLaneNeverOverlapsOnBusyRandomTraces) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const Model model = RandomBusySequence(seed, 2000).Build("3.4.5", 1);
    EXPECT_GT(model.owner_lane().size(), 1000u);
    const std::vector<std::string> problems = OwnerProblems(EmbeddedData(RenderHtml(model)));
    EXPECT_TRUE(problems.empty()) << problems.front();
  }
}

TEST(Report, OverlapCheckCatchesOverlappingOwners) {
  // The checks above are only as good as the checker: stretched blocks must be reported.
  json data = EmbeddedData(RenderHtml(EveryRuleSequence().Build("3.2.5", 0)));
  ASSERT_TRUE(OwnerProblems(data).empty());
  json stretched_owner = data;
  stretched_owner["owner"]["d"][0] = stretched_owner["owner"]["d"][0].get<uint64_t>() + 1;
  EXPECT_FALSE(OwnerProblems(stretched_owner).empty());
  json two_running = data;
  for (json& t : two_running["threads"]) {
    for (json& st : t["blocks"]["st"]) st = static_cast<int>(ThreadState::kRunning);
  }
  EXPECT_FALSE(OwnerProblems(two_running).empty());
}

class WriteReportFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("rvbpfd_report_test_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
    trace_ = (dir_ / "t.rvtrace").string();
    std::ofstream f(trace_);
    f << R"({"rvtrace":1,"recorder":"rvbpfd","recorder_version":"0.1.0","pid":42,"ruby_version":"3.4.5",)"
      << R"("clock":"monotonic","origin_ns":1000,"started_at":"2025-01-31T12:34:56.789012Z","channels":[],"main_thread":1})"
      << "\n"
      << R"({"t_ns":0,"ruby_thread":null,"native_tid":null,"probe_tid":null,"event":"tracing_started","cruby_event":null,"source":"daemon","provenance":"observed"})"
      << "\n"
      << R"({"thread":{"ruby_thread":1,"main":true}})"
      << "\n"
      << R"({"t_ns":500,"ruby_thread":1,"native_tid":7,"probe_tid":7,"event":"gvl_released","cruby_event":"RUBY_INTERNAL_THREAD_EVENT_SUSPENDED","source":"thread_hook_site","provenance":"observed"})"
      << "\n";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
  std::string trace_;
};

TEST_F(WriteReportFile, WritesTheReport) {
  const std::string out = (dir_ / "r.html").string();
  const Status status = WriteReport(trace_, out);
  ASSERT_TRUE(status.ok()) << status.error().ToString();
  std::ifstream in(out);
  const std::string html((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(EmbeddedData(html)["meta"]["title"], "t.rvtrace");
  EXPECT_NE(html.find("</html>"), std::string::npos);
}

TEST_F(WriteReportFile, UnwritableOutputIsOutputUnwritable) {
  const Status status = WriteReport(trace_, (dir_ / "no-such-dir" / "r.html").string());
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.error().code(), ErrorCode::kOutputUnwritable);
  const Status to_dir = WriteReport(trace_, dir_.string());
  ASSERT_FALSE(to_dir.ok());
  EXPECT_EQ(to_dir.error().code(), ErrorCode::kOutputUnwritable);
}

TEST_F(WriteReportFile, MissingTraceIsNotAnOutputError) {
  const std::string out = (dir_ / "r.html").string();
  const Status status = WriteReport((dir_ / "missing.rvtrace").string(), out);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().code(), ErrorCode::kOutputUnwritable);
  EXPECT_FALSE(std::filesystem::exists(out));
}

}  // namespace
}  // namespace rvbpfd
