#include "trace/inspect.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <sstream>

#include "trace_test_util.h"

namespace rvbpfd {
namespace {

using ::rvbpfd::testing::InspectFile;
using ::rvbpfd::testing::ScratchDir;
using ::rvbpfd::testing::StatsFile;
using ::rvbpfd::testing::WriteAll;

// One hand-written event; the test renders it to JSON itself and derives every expectation from these fields.
struct Row {
  uint64_t t_ns;
  int ruby_thread;  // -1: null
  int native_tid;   // -1: null
  const char* event;
  const char* cruby;  // nullptr: null
  const char* source;
  uint64_t count = 0;
};

const Row kRows[] = {
    {0, -1, -1, "tracing_started", nullptr, "daemon"},
    {383'456, 2, 304051, "thread_started", "RUBY_INTERNAL_THREAD_EVENT_STARTED", "thread_hook_site"},
    {531'000, 2, 304051, "wants_gvl", "RUBY_INTERNAL_THREAD_EVENT_READY", "thread_hook_site"},
    {607'999, 1, 304051, "gvl_released", "RUBY_INTERNAL_THREAD_EVENT_SUSPENDED", "thread_hook_site"},
    {733'000, 2, 304135, "gvl_acquired", "RUBY_INTERNAL_THREAD_EVENT_RESUMED", "thread_hook_site"},
    {800'000, -1, -1, "events_dropped", nullptr, "daemon", 7},
    {900'000, -1, -1, "events_dropped", nullptr, "daemon", 4},
    {102'454'000, 2, 304135, "gvl_released", "RUBY_INTERNAL_THREAD_EVENT_SUSPENDED", "thread_hook_site"},
    {102'610'000, 3, 304136, "gvl_acquired", "RUBY_INTERNAL_THREAD_EVENT_RESUMED", "thread_hook_site"},
    {451'038'000, 3, 304136, "sleep_enter", nullptr, "probe"},
    {451'045'000, 3, 304136, "gvl_released", "RUBY_INTERNAL_THREAD_EVENT_SUSPENDED", "thread_hook_site"},
    {651'335'000, 2, 304135, "gvl_acquired", "RUBY_INTERNAL_THREAD_EVENT_RESUMED", "thread_hook_site"},
};

std::string Num(int v) { return v < 0 ? "null" : std::to_string(v); }

std::string RenderTrace(const std::string& summary_line) {
  std::string out =
      R"({"rvtrace":1,"recorder":"rvbpfd","recorder_version":"0.1.0","pid":304051,"ruby_version":"3.4.5","clock":"monotonic","origin_ns":1000,"started_at":"2025-01-01T00:00:00.000000Z","channels":["thread_hook_site","gc_hook_site","probe"],"main_thread":1})"
      "\n";
  for (const Row& r : kRows) {
    out += "{\"t_ns\":" + std::to_string(r.t_ns) + ",\"ruby_thread\":" + Num(r.ruby_thread) +
           ",\"native_tid\":" + Num(r.native_tid) + ",\"event\":\"" + r.event + "\",\"cruby_event\":" +
           (r.cruby ? "\"" + std::string(r.cruby) + "\"" : "null") + ",\"source\":\"" + r.source +
           "\",\"provenance\":\"observed\"";
    if (std::string(r.event) == "events_dropped") out += ",\"count\":" + std::to_string(r.count);
    out += "}\n";
  }
  out += summary_line;
  return out;
}

std::string Ms(uint64_t ns) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.3f ms", ns / 1e6);
  return buf;
}

std::string Label(int thread) {
  if (thread < 0) return "-";
  return thread == 1 ? "main" : "Thread #" + std::to_string(thread);
}

// Splits a table row on runs of two or more spaces (cells themselves contain single spaces: "Thread #2").
std::vector<std::string> Cells(const std::string& line) {
  std::vector<std::string> cells;
  size_t pos = line.find_first_not_of(' ');
  while (pos != std::string::npos && pos < line.size()) {
    size_t end = line.find("  ", pos);
    if (end == std::string::npos) end = line.size();
    cells.push_back(line.substr(pos, end - pos));
    pos = line.find_first_not_of(' ', end);
  }
  return cells;
}

std::vector<std::string> OutputLines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(Inspect, EventTableRowsFollowTheTrace) {
  ScratchDir dir;
  const std::string path = dir.File("t.rvtrace");
  WriteAll(path, RenderTrace(""));
  std::ostringstream out;
  ASSERT_TRUE(InspectFile(path, out).ok());
  const std::vector<std::string> lines = OutputLines(out.str());
  ASSERT_GT(lines.size(), std::size(kRows));
  EXPECT_EQ(Cells(lines[0]), (std::vector<std::string>{"time", "ruby_thread", "native", "event", "cruby event",
                                                       "source"}));
  for (size_t i = 0; i < std::size(kRows); ++i) {
    const Row& r = kRows[i];
    std::string cruby = r.cruby ? r.cruby : "-";
    if (std::string(r.event) == "sleep_enter") cruby = "Kernel#sleep";
    std::vector<std::string> want = {Ms(r.t_ns), Label(r.ruby_thread), Num(r.native_tid) == "null" ? "-" : Num(r.native_tid),
                                     r.event, cruby, r.source};
    if (r.count) want.push_back("count=" + std::to_string(r.count));
    EXPECT_EQ(Cells(lines[i + 1]), want) << "row " << i << ": " << lines[i + 1];
  }
}

// Each filter alone and together, against the rows of kRows they must keep (computed here from kRows).
TEST(Inspect, FilterKeepsTheThreadsRowsInTheWindowUpToTheLimit) {
  ScratchDir dir;
  const std::string path = dir.File("t.rvtrace");
  WriteAll(path, RenderTrace(""));
  Result<TraceFile> trace = TraceReader::ReadFile(path);
  ASSERT_TRUE(trace.ok());
  struct Case {
    EventFilter filter;
  };
  const Case cases[] = {
      {EventFilter{.thread = 2}},
      {EventFilter{.from_ms = 0.6, .to_ms = 102.5}},
      {EventFilter{.limit = 3}},
      {EventFilter{.thread = 3, .from_ms = 100.0, .limit = 2}},
      {EventFilter{.thread = 9}},
  };
  for (const Case& c : cases) {
    std::vector<std::string> want;
    for (const Row& r : kRows) {
      const bool daemon = r.ruby_thread < 0 && std::string(r.source) == "daemon";
      if (c.filter.thread && r.ruby_thread != static_cast<int>(*c.filter.thread) && !daemon) continue;
      const double ms = r.t_ns / 1e6;
      if ((c.filter.from_ms && ms < *c.filter.from_ms) || (c.filter.to_ms && ms > *c.filter.to_ms)) continue;
      if (c.filter.limit && want.size() >= *c.filter.limit) break;
      want.push_back(Ms(r.t_ns) + " " + r.event);
    }
    std::ostringstream out;
    PrintInspect(*trace, out, c.filter);
    std::vector<std::string> got;
    std::string shown;
    for (const std::string& l : OutputLines(out.str())) {
      const std::vector<std::string> cells = Cells(l);
      if (cells.size() >= 4 && cells[0].size() > 3 && cells[0].substr(cells[0].size() - 3) == " ms") {
        got.push_back(cells[0] + " " + cells[3]);
      }
      if (l.find("events shown") != std::string::npos) shown = l;
    }
    EXPECT_EQ(got, want) << out.str();
    EXPECT_EQ(shown, "(" + std::to_string(want.size()) + " of " + std::to_string(std::size(kRows)) + " events shown)");
  }
  // No filter: no count line.
  std::ostringstream out;
  PrintInspect(*trace, out);
  EXPECT_EQ(out.str().find("events shown"), std::string::npos);
}

// Running time per thread computed here from kRows, independently of ThreadAccounting.
std::map<int, uint64_t> RunningNs(uint64_t end_ns) {
  std::map<int, uint64_t> total;
  std::map<int, int64_t> open;
  for (const Row& r : kRows) {
    if (r.ruby_thread < 0) continue;
    total[r.ruby_thread] += 0;
    if (std::string(r.event) == "gvl_acquired" && !open.count(r.ruby_thread)) open[r.ruby_thread] = r.t_ns;
    if (std::string(r.event) == "gvl_released" && open.count(r.ruby_thread)) {
      total[r.ruby_thread] += r.t_ns - open[r.ruby_thread];
      open.erase(r.ruby_thread);
    }
  }
  for (auto& [t, start] : open) total[t] += end_ns - start;
  return total;
}

TEST(Inspect, ThreadSummaryWithoutSummaryLineIsComputedFromEvents) {
  ScratchDir dir;
  const std::string path = dir.File("t.rvtrace");
  WriteAll(path, RenderTrace(""));
  std::ostringstream out;
  ASSERT_TRUE(InspectFile(path, out).ok());
  const std::string text = out.str();
  const uint64_t last_ns = kRows[std::size(kRows) - 1].t_ns;
  for (auto& [thread, ns] : RunningNs(last_ns)) {
    // Own-thread events only: thread 2's STARTED and READY ran on main's native thread 304051.
    std::string native = thread == 1 ? "304051" : thread == 2 ? "304135" : "304136";
    const std::string want = "  " + Label(thread) + " id=" + std::to_string(thread) + " native=" + native +
                             " running=" + Ms(ns) + "\n";
    EXPECT_NE(text.find(want), std::string::npos) << "missing: " << want << "in:\n" << text;
  }
  EXPECT_NE(text.find("computed from the events"), std::string::npos);
}

TEST(Inspect, ThreadSummaryComesFromTheSummaryLine) {
  ScratchDir dir;
  const std::string path = dir.File("t.rvtrace");
  WriteAll(path, RenderTrace(
                     R"({"summary":{"event_counts":{},"events_dropped":11,"drop_records":2,"ring_high_water_bytes":65536,"threads":[{"ruby_thread":1,"main":true,"native_tids":[304051],"running_ms":0.618},{"ruby_thread":2,"main":false,"native_tids":[304135,304140],"running_ms":509.605}],"duration_ms":700.5,"late_events":3}})"
                     "\n"));
  std::ostringstream out;
  ASSERT_TRUE(InspectFile(path, out).ok());
  const std::string text = out.str();
  EXPECT_NE(text.find("  main id=1 native=304051 running=0.618 ms\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  Thread #2 id=2 native=304135,304140 running=509.605 ms\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("computed from the events"), std::string::npos);
}

TEST(Inspect, SummaryWithoutThreadListFallsBackToTheEvents) {
  ScratchDir dir;
  const std::string path = dir.File("t.rvtrace");
  WriteAll(path, RenderTrace(R"({"summary":{"events":12,"threads":3,"counts":{}}})" "\n"));
  std::ostringstream out;
  ASSERT_TRUE(InspectFile(path, out).ok());
  const uint64_t last_ns = kRows[std::size(kRows) - 1].t_ns;
  const std::string want = "  Thread #2 id=2 native=304135 running=" + Ms(RunningNs(last_ns)[2]) + "\n";
  EXPECT_NE(out.str().find(want), std::string::npos) << out.str();
}

TEST(Stats, CountsDropsHighWaterDurationLate) {
  ScratchDir dir;
  const std::string path = dir.File("t.rvtrace");
  const uint64_t high_water = 65536, late = 3;
  const double duration_ms = 700.5;
  WriteAll(path, RenderTrace("{\"summary\":{\"event_counts\":{},\"events_dropped\":11,\"drop_records\":2,"
                             "\"ring_high_water_bytes\":" + std::to_string(high_water) +
                             ",\"threads\":[],\"duration_ms\":700.5,\"late_events\":" + std::to_string(late) + "}}\n"));
  std::ostringstream out;
  ASSERT_TRUE(StatsFile(path, out).ok());
  const std::string text = out.str();

  std::map<std::string, int> counts;
  uint64_t dropped = 0, drop_records = 0;
  for (const Row& r : kRows) {
    counts[r.event]++;
    dropped += r.count;
    if (r.count) ++drop_records;
  }
  for (auto& [name, n] : counts) {
    const std::vector<std::string> want = {name, std::to_string(n)};
    bool found = false;
    for (const std::string& line : OutputLines(text)) found |= Cells(line) == want;
    EXPECT_TRUE(found) << "no count line for " << name << " = " << n << " in:\n" << text;
  }
  EXPECT_NE(text.find("events: " + std::to_string(std::size(kRows)) + "\n"), std::string::npos) << text;
  EXPECT_NE(text.find("events dropped: " + std::to_string(dropped) + " (in " + std::to_string(drop_records) +
                      " events_dropped records)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("ring buffer high-water mark: " + std::to_string(high_water) + " bytes"), std::string::npos);
  EXPECT_NE(text.find("late (reordered) events: " + std::to_string(late)), std::string::npos);
  char duration[64];
  std::snprintf(duration, sizeof(duration), "duration: %.3f ms", duration_ms);
  EXPECT_NE(text.find(duration), std::string::npos) << text;
  EXPECT_NE(text.find("recorder: rvbpfd 0.1.0 (pid 304051, ruby 3.4.5)"), std::string::npos) << text;
}

TEST(Stats, ProbeHitsAndDiscardedHitsWhenTheSummaryHasThem) {
  ScratchDir dir;
  const std::string with = dir.File("with.rvtrace"), without = dir.File("without.rvtrace");
  WriteAll(with, RenderTrace(R"({"summary":{"event_counts":{},"threads":[],"probe_hits":700351,)"
                             R"("hits_discarded":100001,"cold_hits":2024,"stepped_hits":7}})" "\n"));
  WriteAll(without, RenderTrace(R"({"summary":{"event_counts":{},"threads":[]}})" "\n"));
  std::ostringstream a, b;
  ASSERT_TRUE(StatsFile(with, a).ok());
  ASSERT_TRUE(StatsFile(without, b).ok());
  EXPECT_NE(a.str().find("probe hits (traps): 700351, of which not events: 100001, cold: 2024, single-stepped: 7\n"),
            std::string::npos)
      << a.str();
  EXPECT_EQ(b.str().find("probe hits"), std::string::npos) << "another recorder's trace says nothing about traps";
}

TEST(Stats, CutTraceSaysWhatIsUnknown) {
  ScratchDir dir;
  const std::string path = dir.File("t.rvtrace");
  std::string content = RenderTrace("");
  content += R"({"t_ns":999999999,"ruby_thread":1,"nat)";  // cut mid-line
  WriteAll(path, content);
  std::ostringstream out;
  ASSERT_TRUE(StatsFile(path, out).ok());
  const std::string text = out.str();
  EXPECT_NE(text.find("ring buffer high-water mark: unknown"), std::string::npos) << text;
  EXPECT_NE(text.find("last line was cut"), std::string::npos) << text;
  EXPECT_NE(text.find("duration: " + Ms(kRows[std::size(kRows) - 1].t_ns)), std::string::npos) << text;
}

TEST(Inspect, ErrorsComeFromTheReader) {
  ScratchDir dir;
  const std::string path = dir.File("bad.rvtrace");
  WriteAll(path, "hello\n");
  std::ostringstream out;
  Status s = InspectFile(path, out);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kBadTrace);
  EXPECT_FALSE(StatsFile(dir.File("missing.rvtrace"), out).ok());
}

}  // namespace
}  // namespace rvbpfd
