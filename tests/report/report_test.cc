#include "report/report.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>
#include <unordered_map>

#include "model/model_test_util.h"
#include "report/report_data.h"
#include "report/report_ui.h"
#include "trace/multi_process_trace.h"

namespace rvbpfd {
namespace {

using nlohmann::json;
using testing::EventSeq;
using testing::EveryRuleSequence;
using testing::kMs;
using testing::kUs;

constexpr std::string_view kDataOpen = R"(<script id="rv-data" type="application/json">)";

size_t Count(std::string_view text, std::string_view what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string_view::npos; at = text.find(what, at + 1)) ++n;
  return n;
}
// How often `what` occurs in the page's own files (the page without data).
size_t CountInPageFiles(std::string_view what) {
  return Count(kReportHtml, what) + Count(kReportCss, what) + Count(kReportJs, what);
}

std::string ReadSourceFile(const std::string& relative) {
  std::ifstream in(std::string(RVBPFD_SOURCE_DIR) + "/" + relative, std::ios::binary);
  EXPECT_TRUE(in) << relative;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// `page` with the one occurrence of `slot` replaced by `text`.
std::string Fill(std::string page, std::string_view slot, std::string_view text) {
  const size_t at = page.find(slot);
  EXPECT_NE(at, std::string::npos) << slot;
  if (at != std::string::npos) page.replace(at, slot.size(), text);
  return page;
}

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

TEST(ReportUi, EmbeddedFilesAreTheSourceFilesByteForByte) {
  EXPECT_EQ(kReportHtml, ReadSourceFile("src/report/ui/report.html"));
  EXPECT_EQ(kReportCss, ReadSourceFile("src/report/ui/report.css"));
  EXPECT_EQ(kReportJs, ReadSourceFile("src/report/ui/report.js"));
}

TEST(ReportUi, HasExactlyOneOfEachSlotAndTheDataSlotIsInsideTheDataScript) {
  for (std::string_view slot : {kReportCssSlot, kReportJsSlot, kReportDataSlot}) {
    EXPECT_EQ(Count(kReportHtml, slot), 1u) << slot;
  }
  const size_t slot = kReportHtml.find(kReportDataSlot);
  ASSERT_NE(slot, std::string_view::npos);
  ASSERT_GE(slot, kDataOpen.size());
  EXPECT_EQ(kReportHtml.substr(slot - kDataOpen.size(), kDataOpen.size()), kDataOpen);
  EXPECT_NE(kReportHtml.find("<style>\n" + std::string(kReportCssSlot) + "</style>\n"), std::string_view::npos);
  EXPECT_NE(kReportHtml.find("<script>\n" + std::string(kReportJsSlot) + "</script>\n"), std::string_view::npos);
}

TEST(ReportUi, StyleAndScriptCannotEndTheirElementEarly) {
  // The files are pasted into <style> and <script> as raw text: a closing tag inside them would cut the element
  // there (HTML matches it case-insensitively), and a missing final line break would join the closing tag's line.
  auto lower = [](std::string_view s) {
    std::string out(s);
    std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
    return out;
  };
  EXPECT_EQ(lower(kReportCss).find("</style"), std::string::npos);
  EXPECT_EQ(lower(kReportJs).find("</script"), std::string::npos);
  EXPECT_EQ(lower(kReportJs).find("<!--"), std::string::npos);
  ASSERT_FALSE(kReportCss.empty());
  ASSERT_FALSE(kReportJs.empty());
  EXPECT_EQ(kReportCss.back(), '\n');
  EXPECT_EQ(kReportJs.back(), '\n');
}

TEST(ReportUi, PageIsTheFilesWithTheDataInItsSlot) {
  const std::string html = RenderHtml(EveryRuleSequence().Build("3.2.5", 0));
  // Assembled from the source files, independently of the embedding.
  const std::string files = Fill(Fill(ReadSourceFile("src/report/ui/report.html"), kReportCssSlot,
                                      ReadSourceFile("src/report/ui/report.css")),
                                 kReportJsSlot, ReadSourceFile("src/report/ui/report.js"));
  const size_t slot = files.find(kReportDataSlot);
  ASSERT_NE(slot, std::string::npos);
  const std::string before = files.substr(0, slot), after = files.substr(slot + kReportDataSlot.size());
  ASSERT_GE(html.size(), before.size() + after.size());
  EXPECT_EQ(html.substr(0, before.size()), before);
  EXPECT_EQ(html.substr(html.size() - after.size()), after);
  const std::string data = html.substr(before.size(), html.size() - before.size() - after.size());
  EXPECT_EQ(json::parse(data), EmbeddedData(html));
  EXPECT_EQ(data.find("@@RVBPFD_REPORT_"), std::string::npos);
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
  EXPECT_EQ(Count(html, "<script"), CountInPageFiles("<script"));
  EXPECT_EQ(Count(html, "</script"), CountInPageFiles("</script"));
  EXPECT_EQ(html.find("alert(1)</script>"), std::string::npos);
  EXPECT_EQ(html.find("<img"), std::string::npos);
  EXPECT_EQ(Count(html, "<!--"), CountInPageFiles("<!--"));
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

// Stacks as the reader leaves them: dictionaries by id, and events naming stack ids.
struct StackDicts {
  std::unordered_map<uint32_t, FrameInfo> frames;
  std::unordered_map<uint32_t, std::vector<uint32_t>> stacks;
};

std::string RenderWithStacks(const Model& model, const StackDicts& dicts, std::optional<uint32_t> sample_hz = 997) {
  std::ostringstream out;
  ReportOptions options;
  options.title = "stacks.rvtrace";
  options.frames = &dicts.frames;
  options.stacks = &dicts.stacks;
  options.sample_hz = sample_hz;
  const Status status = WriteReportHtml(model, options, out);
  EXPECT_TRUE(status.ok()) << status.error().ToString();
  return out.str();
}

// Stack `sk` (index + 1 into "stacks", 0 = none) as the page decodes it: "label|path|line|kind" per frame, leaf
// first; empty for none.
std::vector<std::string> StackOfIndex(const json& data, uint64_t sk) {
  std::vector<std::string> out;
  if (sk == 0) return out;
  const json& n = data["stacks"]["n"];
  size_t from = 0;
  for (size_t k = 0; k + 1 < sk; ++k) from += n[k].get<size_t>();
  const json& frames = data["frames"];
  for (size_t k = from; k < from + n[sk - 1].get<size_t>(); ++k) {
    const size_t f = data["stacks"]["f"][k];
    const std::string& path = data["paths"][frames["p"][f].get<size_t>()].get_ref<const std::string&>();
    const std::string& kind = data["names"]["frame_kind"][frames["k"][f].get<size_t>()].get_ref<const std::string&>();
    out.push_back(frames["l"][f].get<std::string>() + "|" + path + "|" + std::to_string(frames["ln"][f].get<int>()) +
                  "|" + kind);
  }
  return out;
}
// The stack of event `i` as the page decodes it.
std::vector<std::string> DecodedStack(const json& data, size_t i) {
  if (!data["events"].contains("sk")) return {};
  return StackOfIndex(data, data["events"]["sk"][i]);
}

class ReportStacks : public ::testing::Test {
 protected:
  void SetUp() override {
    dicts_.frames[1] = {"<main>", "/app/main.rb", 1, FrameKind::kRuby};
    dicts_.frames[2] = {"Worker#run", "/app/worker.rb", 10, FrameKind::kRuby};
    dicts_.frames[3] = {"IO#read", "<cfunc>", 0, FrameKind::kCfunc};
    dicts_.frames[4] = {"Worker#hot", "/app/worker.rb", 20, FrameKind::kRuby};
    dicts_.frames[5] = {"(garbage collection)", "", 0, FrameKind::kGc};
    dicts_.frames[9] = {"Unused#frame", "/app/unused.rb", 99, FrameKind::kRuby};
    dicts_.stacks[10] = {3, 2, 1};  // leaf first
    dicts_.stacks[11] = {4, 2, 1};
    dicts_.stacks[12] = {9, 1};     // no event uses it
    dicts_.stacks[13] = {5};
    s_.Add(0, EventName::kTracingStarted);
    s_.Add(10 * kUs, EventName::kGvlAcquired, 1, 100);
    for (int k = 0; k < 3; ++k) samples_.push_back(Sample(20 * kUs + k, 1, 11));
    samples_.push_back(Sample(30 * kUs, 1, 10));
    samples_.push_back(Sample(31 * kUs, 1, 13));
    samples_.push_back(Sample(32 * kUs, 1, std::nullopt));
    release_ = s_.Add(40 * kUs, EventName::kGvlReleased, 1, 100);
    unknown_stack_ = s_.Add(50 * kUs, EventName::kGvlAcquired, 1, 100);
    s_.Add(60 * kUs, EventName::kTracingStopped);
  }
  size_t Sample(uint64_t t, uint32_t thread, std::optional<uint32_t> stack) {
    const size_t i = s_.Add(t, EventName::kSample, thread, 100);
    stack_of_[i] = stack;
    return i;
  }
  Model Build(const std::string& reason = "io") {
    return BuildWith([&](std::vector<TraceEvent>& events) {
      events[release_].stack = 10;
      events[release_].reason = reason;
      events[release_].reason_provenance = Provenance::kDerived;
      events[unknown_stack_].stack = 77;  // not in the dictionary: shown as no stack
    });
  }
  // The sequence's events, the samples with their stacks, then `edit`, as a 3.4.5 model.
  Model BuildWith(const std::function<void(std::vector<TraceEvent>&)>& edit) {
    std::vector<TraceEvent> events = s_.events();
    for (const auto& [i, stack] : stack_of_) {
      events[i].stack = stack;
      events[i].source = kSourcePerfEvent;
    }
    edit(events);
    ModelOptions options;
    options.ruby_version = "3.4.5";
    options.main_thread = 1;
    Result<Model> model = Model::Build(events, options);
    EXPECT_TRUE(model.ok()) << model.error().ToString();
    return std::move(model).value();
  }

  EventSeq s_;
  StackDicts dicts_;
  std::map<size_t, std::optional<uint32_t>> stack_of_;
  std::vector<size_t> samples_;
  size_t release_ = 0;
  size_t unknown_stack_ = 0;
};

TEST_F(ReportStacks, EmbedsTheUsedStacksOnceLeafFirst) {
  const Model model = Build();
  const json data = EmbeddedData(RenderWithStacks(model, dicts_));
  // Only the stacks events use (10, 11, 13), each once, with only their frames (1-5, not 9).
  EXPECT_EQ(data["stacks"]["n"], json::array({3, 3, 1}));
  EXPECT_EQ(data["frames"]["l"].size(), 5u);
  EXPECT_EQ(data["meta"]["stacks"], 3);
  for (const json& label : data["frames"]["l"]) EXPECT_NE(label, "Unused#frame");
  // Each path once.
  std::set<std::string> paths;
  for (const json& p : data["paths"]) EXPECT_TRUE(paths.insert(p.get<std::string>()).second) << p;
  EXPECT_EQ(paths.size(), 4u);  // main.rb, worker.rb, <cfunc>, ""

  const std::vector<std::string> released = {"IO#read|<cfunc>|0|cfunc", "Worker#run|/app/worker.rb|10|ruby",
                                             "<main>|/app/main.rb|1|ruby"};
  EXPECT_EQ(DecodedStack(data, release_), released);
  const std::vector<std::string> hot = {"Worker#hot|/app/worker.rb|20|ruby", "Worker#run|/app/worker.rb|10|ruby",
                                        "<main>|/app/main.rb|1|ruby"};
  for (size_t k = 0; k < 3; ++k) EXPECT_EQ(DecodedStack(data, samples_[k]), hot) << k;
  EXPECT_EQ(DecodedStack(data, samples_[3]), released);
  EXPECT_EQ(DecodedStack(data, samples_[4]), std::vector<std::string>{"(garbage collection)||0|gc"});
  EXPECT_TRUE(DecodedStack(data, samples_[5]).empty());
  EXPECT_TRUE(DecodedStack(data, unknown_stack_).empty());
  EXPECT_TRUE(DecodedStack(data, 0).empty());
  // The samples are counted for the flame graph, with the sampling rate.
  EXPECT_EQ(data["meta"]["samples"], 6);
  EXPECT_EQ(data["meta"]["sample_hz"], 997);
  for (size_t i : samples_) EXPECT_EQ(data["names"]["event"][data["events"]["e"][i].get<size_t>()], "sample");
}

TEST_F(ReportStacks, ReleaseReasonTravelsWithItsProvenance) {
  const Model model = Build("condition_variable");
  const json data = EmbeddedData(RenderWithStacks(model, dicts_, std::nullopt));
  const json& ev = data["events"];
  ASSERT_TRUE(ev.contains("rr"));
  for (size_t i = 0; i < model.events().size(); ++i) {
    if (i == release_) {
      ASSERT_GT(ev["rr"][i].get<size_t>(), 0u);
      EXPECT_EQ(data["reasons"][ev["rr"][i].get<size_t>() - 1], "condition_variable");
      EXPECT_EQ(data["names"]["prov"][ev["rp"][i].get<size_t>()], "derived");
    } else {
      EXPECT_EQ(ev["rr"][i], 0) << i;
    }
  }
  // Not also in "extra", which is for the daemon events' fields.
  for (const json& x : data["extra"]) EXPECT_NE(x[0].get<size_t>(), release_);
  EXPECT_TRUE(data["meta"]["sample_hz"].is_null());
}

TEST_F(ReportStacks, HostileFrameStringsAreEscaped) {
  const std::string hostile = "</script><script>alert(1)</script><!-- & \xff";
  dicts_.frames[4].label = "Worker#" + hostile;
  dicts_.frames[2].path = "/app/" + hostile + ".rb";
  const Model model = Build(hostile);
  const std::string html = RenderWithStacks(model, dicts_);
  EXPECT_EQ(Count(html, "<script"), CountInPageFiles("<script"));
  EXPECT_EQ(Count(html, "</script"), CountInPageFiles("</script"));
  EXPECT_EQ(Count(html, "<!--"), CountInPageFiles("<!--"));
  EXPECT_EQ(html.find("<script>alert(1)"), std::string::npos);  // only as \u003c-escaped JSON
  EXPECT_NE(html.find("\\u003cscript\\u003ealert(1)"), std::string::npos);
  const json data = EmbeddedData(html);
  const std::vector<std::string> hot = DecodedStack(data, samples_[0]);
  ASSERT_EQ(hot.size(), 3u);
  EXPECT_EQ(hot[0].rfind("Worker#</script><script>alert(1)</script><!-- & ", 0), 0u) << hot[0];
  EXPECT_NE(hot[1].find("|/app/</script><script>alert(1)</script>"), std::string::npos) << hot[1];
  EXPECT_EQ(data["reasons"][0].get<std::string>().rfind("</script><script>alert(1)", 0), 0u);
}

// A holds the GVL running Worker#hot (three samples) while B waits; nobody holds it for 5 us; then A waits while B
// runs with no sample (blamed on B's release stack, IO#read).
class ReportBlame : public ReportStacks {
 protected:
  void SetUp() override {
    ReportStacks::SetUp();
    s_ = EventSeq();
    stack_of_.clear();
    s_.Add(0, EventName::kTracingStarted);
    s_.Add(10 * kUs, EventName::kGvlAcquired, 1, 100);
    b_release_ = s_.Add(12 * kUs, EventName::kGvlReleased, 2, 101);
    s_.Add(20 * kUs, EventName::kWantsGvl, 2, 101);
    for (uint64_t t : {30, 40, 50}) Sample(t * kUs, 1, 11);
    a_release_ = s_.Add(60 * kUs, EventName::kGvlReleased, 1, 100);
    s_.Add(65 * kUs, EventName::kGvlAcquired, 2, 101);
    s_.Add(70 * kUs, EventName::kWantsGvl, 1, 100);
    b_release2_ = s_.Add(80 * kUs, EventName::kGvlReleased, 2, 101);
    s_.Add(80 * kUs, EventName::kGvlAcquired, 1, 100);
    s_.Add(100 * kUs, EventName::kTracingStopped);
  }
  Model BuildBlame() {
    return BuildWith([&](std::vector<TraceEvent>& events) {
      events[b_release_].stack = 10;
      events[a_release_].stack = 11;
      events[b_release2_].stack = 10;
    });
  }
  size_t b_release_ = 0, a_release_ = 0, b_release2_ = 0;
};

const std::vector<std::string> kHot = {"Worker#hot|/app/worker.rb|20|ruby", "Worker#run|/app/worker.rb|10|ruby",
                                       "<main>|/app/main.rb|1|ruby"};
const std::vector<std::string> kIoRead = {"IO#read|<cfunc>|0|cfunc", "Worker#run|/app/worker.rb|10|ruby",
                                          "<main>|/app/main.rb|1|ruby"};

TEST_F(ReportBlame, EachWaitSaysWhoHeldTheLockAndWhatTheyRanWithProvenance) {
  const json data = EmbeddedData(RenderWithStacks(BuildBlame(), dicts_));
  const json& b = data["blame"];
  const json& names = data["names"]["blame_source"];
  EXPECT_EQ(b["total_ns"], 55 * kUs);
  // Two waits, by waiter: A's (thread 1, "th" 2) then B's.
  const json& w = b["waits"];
  EXPECT_EQ(w["th"], json::array({2, 3}));
  const std::vector<Span> waits = Spans(w);
  ASSERT_EQ(waits.size(), 2u);
  EXPECT_EQ(waits[0].start, 70 * kUs);
  EXPECT_EQ(waits[0].end, 80 * kUs);
  EXPECT_EQ(waits[1].start, 20 * kUs);
  EXPECT_EQ(waits[1].end, 65 * kUs);
  EXPECT_EQ(w["ns"], json::array({1, 2}));
  const json& seg = b["segs"];
  const std::vector<Span> segs = Spans(seg);
  const std::vector<uint64_t> release_t = Undelta(seg["rt"]);
  ASSERT_EQ(segs.size(), 3u);
  // A's wait: B held [70, 80), ended by its release at 80 in IO#read; no sample, so that stack is blamed.
  EXPECT_EQ(seg["h"][0], 3);
  EXPECT_EQ(segs[0].start, 70 * kUs);
  EXPECT_EQ(segs[0].end, 80 * kUs);
  EXPECT_EQ(StackOfIndex(data, seg["rs"][0]), kIoRead);
  EXPECT_EQ(release_t[0], 80 * kUs);
  // B's wait: A held [20, 60) running Worker#hot (three samples), released at 60; then nobody for 5 us.
  EXPECT_EQ(seg["h"][1], 2);
  EXPECT_EQ(segs[1].start, 20 * kUs);
  EXPECT_EQ(segs[1].end, 60 * kUs);
  EXPECT_EQ(StackOfIndex(data, seg["rs"][1]), kHot);
  EXPECT_EQ(release_t[1], 60 * kUs);
  EXPECT_EQ(seg["h"][2], 0);
  EXPECT_EQ(segs[2].end - segs[2].start, 5 * kUs);
  EXPECT_EQ(release_t[2], 0u);
  EXPECT_EQ(seg["np"], json::array({1, 1, 1}));
  const json& parts = b["parts"];
  ASSERT_EQ(parts["ns"].size(), 3u);
  EXPECT_EQ(names[parts["src"][0].get<size_t>()], "release_stack");
  EXPECT_EQ(StackOfIndex(data, parts["sk"][0]), kIoRead);
  EXPECT_EQ(parts["ns"][0], 10 * kUs);
  EXPECT_EQ(names[parts["src"][1].get<size_t>()], "sampled");
  EXPECT_EQ(StackOfIndex(data, parts["sk"][1]), kHot);
  EXPECT_EQ(parts["n"][1], 3);
  EXPECT_EQ(parts["ns"][1], 40 * kUs);
  EXPECT_EQ(names[parts["src"][2].get<size_t>()], "gvl_free");
  EXPECT_EQ(parts["sk"][2], 0);
  EXPECT_EQ(parts["ns"][2], 5 * kUs);
  EXPECT_EQ(parts["gc"], json::array({0, 0, 0}));
}

TEST_F(ReportBlame, FlameWeightsAreBlameByHolderStackAndSumToEveryCountedWait) {
  const Model model = BuildBlame();
  const json data = EmbeddedData(RenderWithStacks(model, dicts_));
  const json& f = data["blame"]["flame"];
  std::map<std::tuple<uint64_t, std::vector<std::string>, std::string>, uint64_t> by;
  uint64_t sum = 0;
  for (size_t i = 0; i < f["ns"].size(); ++i) {
    const uint64_t ns = f["ns"][i];
    by[{f["h"][i], StackOfIndex(data, f["sk"][i]),
        data["names"]["blame_source"][f["src"][i].get<size_t>()]}] += ns;
    sum += ns;
  }
  using Key = std::tuple<uint64_t, std::vector<std::string>, std::string>;
  EXPECT_EQ(by, (std::map<Key, uint64_t>{{{2, kHot, "sampled"}, 40 * kUs},
                                         {{3, kIoRead, "release_stack"}, 10 * kUs},
                                         {{0, {}, "gvl_free"}, 5 * kUs}}));
  // The weights sum to the total blame, which is every counted wait of the model's spans.
  uint64_t waited = 0;
  for (const auto& s : model.spans()) {
    if (s.kind == SpanKind::kGvlWait && s.counted && s.end == SpanEnd::kAcquired) waited += s.duration_ns();
  }
  EXPECT_EQ(sum, waited);
  EXPECT_EQ(data["blame"]["total_ns"], waited);
}

// The top blockers table's rows come from model/blockers.h: the holders' Ruby method (Worker#run for IO#read, which
// is beneath it), the threads that held, and the C function it was in.
TEST_F(ReportBlame, BlockersAreTheHoldersRubyMethodsWithTheCFunctionBeneath) {
  const json data = EmbeddedData(RenderWithStacks(BuildBlame(), dicts_));
  const json& rows = data["blame"]["blockers"];
  ASSERT_EQ(rows.size(), 3u) << rows.dump();
  EXPECT_EQ(rows[0]["m"], "Worker#hot");
  EXPECT_EQ(rows[0]["ns"], 40 * kUs);
  EXPECT_EQ(rows[0]["h"], json::parse("[[2, 40000]]"));
  EXPECT_EQ(rows[0]["c"], json::array());
  EXPECT_EQ(rows[1]["m"], "Worker#run");
  EXPECT_EQ(rows[1]["h"], json::parse("[[3, 10000]]"));
  EXPECT_EQ(rows[1]["c"], json::parse(R"([["IO#read", 10000]])"));
  EXPECT_EQ(rows[2]["m"], "[GVL not held]");
  EXPECT_EQ(rows[2]["h"], json::parse("[[0, 5000]]"));
}

TEST(Report, BlameOnEveryRuleSequenceSumsToItsWaitsAndLeavesOutThoseAcrossGaps) {
  const Model model = EveryRuleSequence().Build("3.2.5", 0);
  const json data = EmbeddedData(RenderHtml(model));
  const json& b = data["blame"];
  uint64_t waited = 0, counted = 0;
  for (const auto& s : model.spans()) {
    if (s.kind != SpanKind::kGvlWait || !s.counted || s.end != SpanEnd::kAcquired) continue;
    waited += s.duration_ns();
    ++counted;
  }
  ASSERT_GT(counted, 0u);
  EXPECT_EQ(b["waits"]["th"].size(), counted);
  EXPECT_EQ(b["total_ns"], waited);
  uint64_t flame = 0, parts = 0, segs = 0, np = 0;
  for (const json& v : b["flame"]["ns"]) flame += v.get<uint64_t>();
  for (const json& v : b["parts"]["ns"]) parts += v.get<uint64_t>();
  for (const json& v : b["segs"]["d"]) segs += v.get<uint64_t>();
  for (const json& v : b["segs"]["np"]) np += v.get<uint64_t>();
  EXPECT_EQ(flame, waited);
  EXPECT_EQ(parts, waited);
  EXPECT_EQ(segs, waited);
  EXPECT_EQ(np, b["parts"]["ns"].size());
  // The wait open across the lost events (thread 3 from 220 ms is after them) and the one across the pause are not
  // among the blamed: no blamed wait contains 210 ms or 230-260 ms.
  const std::vector<Span> waits = Spans(b["waits"]);
  for (const Span& w : waits) {
    EXPECT_FALSE(w.start < 210 * kMs && w.end > 210 * kMs) << w.start;
    EXPECT_FALSE(w.start < 260 * kMs && w.end > 230 * kMs) << w.start;
  }
}

TEST(Report, TraceWithoutStacksHasNoStackColumns) {
  const json data = EmbeddedData(RenderHtml(EveryRuleSequence().Build("3.2.5", 0)));
  EXPECT_FALSE(data["events"].contains("sk"));
  EXPECT_FALSE(data["events"].contains("rr"));
  EXPECT_FALSE(data["events"].contains("rp"));
  EXPECT_TRUE(data["stacks"]["n"].empty());
  EXPECT_TRUE(data["frames"]["l"].empty());
  EXPECT_EQ(data["meta"]["samples"], 0);
  EXPECT_EQ(data["meta"]["stacks"], 0);
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

TEST_F(WriteReportFile, EmbedsTheTracesFramesStacksAndSamples) {
  {
    std::ofstream f(trace_, std::ios::app);
    f << R"({"frame":{"id":1,"label":"<main>","path":"/app/main.rb","line":3,"kind":"ruby"}})" << "\n"
      << R"({"frame":{"id":2,"label":"Kernel#sleep","path":"<cfunc>","line":0,"kind":"cfunc"}})" << "\n"
      << R"({"frame":{"id":3,"label":"Unused","path":"/x.rb","line":1,"kind":"ruby"}})" << "\n"
      << R"({"stack":{"id":1,"frames":[2,1]}})" << "\n"
      << R"({"stack":{"id":2,"frames":[3]}})" << "\n"
      << R"({"t_ns":600,"ruby_thread":1,"native_tid":7,"probe_tid":7,"event":"gvl_released","cruby_event":"RUBY_INTERNAL_THREAD_EVENT_SUSPENDED","source":"thread_hook_site","provenance":"observed","reason":"sleep","reason_provenance":"derived","stack":1})"
      << "\n"
      << R"({"t_ns":700,"ruby_thread":1,"native_tid":7,"probe_tid":7,"event":"sample","cruby_event":null,"source":"perf_event","provenance":"observed","stack":1})"
      << "\n";
  }
  const std::string out = (dir_ / "r.html").string();
  const Status status = WriteReport(trace_, out);
  ASSERT_TRUE(status.ok()) << status.error().ToString();
  std::ifstream in(out);
  const json data = EmbeddedData(std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()));
  EXPECT_EQ(data["meta"]["samples"], 1);
  EXPECT_EQ(data["meta"]["stacks"], 1);  // stack 2 is defined but unused
  const std::vector<std::string> want = {"Kernel#sleep|<cfunc>|0|cfunc", "<main>|/app/main.rb|3|ruby"};
  // Events: tracing_started, gvl_released (500), gvl_released (600), sample (700).
  EXPECT_TRUE(DecodedStack(data, 1).empty());
  EXPECT_EQ(DecodedStack(data, 2), want);
  EXPECT_EQ(DecodedStack(data, 3), want);
  EXPECT_EQ(data["reasons"], json::array({"sleep"}));
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

// A trace of several processes is reported one process at a time, with that process's own model (its own GVL) and a
// title naming it.
namespace multi {

TraceFile MultiProcessTrace() {
  Result<TraceFile> f = TraceReader::Parse(testing::kMultiProcessTrace, "multi");
  EXPECT_TRUE(f.ok());
  return f.ok() ? std::move(f).value() : TraceFile{};
}

TEST(ReportProcesses, DefaultIsTheRootAndTheTitleNamesTheProcess) {
  Result<ReportPart> part = SelectReportProcess(MultiProcessTrace(), std::nullopt);
  ASSERT_TRUE(part.ok()) << part.error().ToString();
  EXPECT_EQ(part->title_suffix, " · pid 4242 (ruby app.rb), process 1 of 4 (rvbpfd report --process ID: 1, 2, 4)");
  ASSERT_EQ(part->trace.threads.size(), 1u);
}

TEST(ReportProcesses, DataOfOneProcessHasOnlyItsThreadsAndOwners) {
  Result<ReportPart> part = SelectReportProcess(MultiProcessTrace(), 2);
  ASSERT_TRUE(part.ok()) << part.error().ToString();
  Result<Model> model = Model::FromTrace(part->trace);
  ASSERT_TRUE(model.ok());
  std::string data;
  AppendReportData(*model, ReportOptions{.title = "t" + part->title_suffix}, &data);
  const json d = json::parse(data);
  EXPECT_EQ(d["meta"]["pid"], 4243);
  std::set<int> ids;
  for (const json& t : d["threads"]) ids.insert(t["id"].get<int>());
  EXPECT_EQ(ids, (std::set<int>{2, 3}));
  // Owners ("ow": Ruby thread + 1, 0 for none) are the child's threads only.
  for (const json& ow : d["owner"]["ow"]) EXPECT_TRUE(ow == 0 || ow == 3 || ow == 4) << ow;
  EXPECT_NE(d["meta"]["title"].get<std::string>().find("process 2 of 4"), std::string::npos);
}

TEST(ReportProcesses, UnknownOrSkippedProcessIsAUsageError) {
  for (uint32_t id : {3u, 9u}) {
    Result<ReportPart> part = SelectReportProcess(MultiProcessTrace(), id);
    ASSERT_FALSE(part.ok());
    EXPECT_EQ(part.error().code(), ErrorCode::kUsage);
    EXPECT_NE(part.error().message().find("traced processes are 1, 2, 4"), std::string::npos);
  }
  Result<TraceFile> one = TraceReader::Parse(
      R"({"rvtrace":1,"recorder":"rvbpfd","pid":5})"
      "\n",
      "one");
  ASSERT_TRUE(one.ok());
  EXPECT_FALSE(SelectReportProcess(*one, 2).ok());
  Result<ReportPart> root = SelectReportProcess(*one, 1);
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(root->title_suffix, "");
}

}  // namespace multi
}  // namespace
}  // namespace rvbpfd
