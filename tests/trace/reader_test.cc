#include "trace/reader.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "common/label_bound.h"
#include "trace/writer.h"
#include "trace_test_util.h"

namespace rvbpfd {
namespace {

using ::rvbpfd::testing::ReadAll;
using ::rvbpfd::testing::ScratchDir;
using ::rvbpfd::testing::WriteAll;

// A finished trace with every line type, written by the real writer.
std::string WriteSampleTrace(const ScratchDir& dir) {
  const std::string path = dir.File("sample.rvtrace");
  TraceHeader header;
  header.pid = 99;
  header.ruby_version = "3.3.8";
  header.origin_ns = 5'000'000;
  Result<TraceWriter> writer = TraceWriter::Create(path, header);
  EXPECT_TRUE(writer.ok());
  const EventName cycle[] = {EventName::kWantsGvl, EventName::kGvlAcquired, EventName::kSleepEnter,
                             EventName::kGvlReleased};
  uint64_t t = 1000;
  for (uint32_t thread = 1; thread <= 3; ++thread) {
    for (EventName name : cycle) {
      TraceEvent e;
      e.t_ns = t;
      t += 777;
      e.event = name;
      e.ruby_thread = thread;
      e.native_tid = 4000 + thread;
      e.probe_tid = 4000 + thread;
      e.source = name == EventName::kSleepEnter ? kSourceProbe : kSourceThreadHookSite;
      EXPECT_TRUE(writer->Write(e).ok());
    }
  }
  TraceEvent dropped;
  dropped.t_ns = t;
  dropped.event = EventName::kEventsDropped;
  dropped.count = 5;
  EXPECT_TRUE(writer->Write(dropped).ok());
  EXPECT_TRUE(writer->Finish(FinishInfo{.end_t_ns = t + 10, .ring_high_water_bytes = 1234}).ok());
  return ReadAll(path);
}

TEST(TraceReader, EveryTruncationYieldsOnlyCompleteLines) {
  ScratchDir dir;
  const std::string content = WriteSampleTrace(dir);
  Result<TraceFile> full = TraceReader::Parse(content, "full");
  ASSERT_TRUE(full.ok()) << full.error().ToString();
  ASSERT_TRUE(full->summary.has_value());
  const size_t header_end = content.find('\n') + 1;

  for (size_t cut = 0; cut <= content.size(); ++cut) {
    const std::string_view prefix(content.data(), cut);
    Result<TraceFile> part = TraceReader::Parse(prefix, "cut");
    if (cut < header_end) {
      ASSERT_FALSE(part.ok()) << "cut at " << cut;
      EXPECT_EQ(part.error().code(), ErrorCode::kBadTrace);
      continue;
    }
    ASSERT_TRUE(part.ok()) << "cut at " << cut << ": " << part.error().ToString();
    const size_t complete_lines = static_cast<size_t>(std::count(prefix.begin(), prefix.end(), '\n'));
    EXPECT_EQ(part->lines, complete_lines) << "cut at " << cut;
    EXPECT_EQ(part->truncated_last_line, prefix.back() != '\n') << "cut at " << cut;
    // Whatever was read is exactly the beginning of the full trace.
    ASSERT_LE(part->events.size(), full->events.size());
    for (size_t i = 0; i < part->events.size(); ++i) {
      EXPECT_EQ(part->events[i].t_ns, full->events[i].t_ns);
      EXPECT_EQ(part->events[i].event, full->events[i].event);
    }
    EXPECT_EQ(part->lines, 1 + part->threads.size() + part->events.size() + (part->summary ? 1 : 0));
    EXPECT_EQ(part->summary.has_value(), cut == content.size()) << "cut at " << cut;
  }
}

TEST(TraceReader, TruncatedFileOnDisk) {
  ScratchDir dir;
  const std::string content = WriteSampleTrace(dir);
  const std::string path = dir.File("cut.rvtrace");
  const size_t cut = content.size() / 2;
  WriteAll(path, content.substr(0, cut));
  Result<TraceFile> part = TraceReader::ReadFile(path);
  ASSERT_TRUE(part.ok()) << part.error().ToString();
  EXPECT_FALSE(part->summary.has_value());
  EXPECT_EQ(part->lines, static_cast<size_t>(std::count(content.begin(), content.begin() + cut, '\n')));
}

TEST(TraceReader, BadLinesReportTheLineNumber) {
  const std::string header = R"({"rvtrace":1,"recorder":"rvbpfd","pid":1,"origin_ns":0})" "\n";
  const std::string good = R"({"t_ns":1,"ruby_thread":1,"native_tid":2,"event":"gc_enter","source":"gc_hook_site","provenance":"observed"})" "\n";
  struct Case {
    std::string text;
    std::string expect;
  } cases[] = {
      {header + good + "{not json\n", "line 3: not valid JSON"},
      {header + "[1,2]\n", "line 2: not a JSON object"},
      {header + R"({"t_ns":"5","event":"gc_enter"})" "\n", "line 2: \"t_ns\" must be a non-negative integer"},
      {header + R"({"t_ns":1.5,"event":"gc_enter"})" "\n", "line 2: \"t_ns\" must be a non-negative integer"},
      {header + good + good + R"({"t_ns":3,"event":"gc_enter","ruby_thread":"one"})" "\n", "line 4:"},
      {header + R"({"t_ns":3,"event":"gc_enter","provenance":"guessed"})" "\n", "line 2: unknown provenance"},
      {header + R"({"t_ns":3,"event":"events_dropped"})" "\n", "line 2: missing \"count\""},
      {R"({"t_ns":1,"event":"gc_enter"})" "\n", "line 1: not an .rvtrace file"},
      {R"({"rvtrace":2,"recorder":"rvbpfd"})" "\n", "line 1: unsupported rvtrace version 2"},
      {header + header, "line 2: a second header line"},
      {"", "no complete header line"},
  };
  for (const Case& c : cases) {
    Result<TraceFile> r = TraceReader::Parse(c.text, "t.rvtrace");
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.error().code(), ErrorCode::kBadTrace);
    EXPECT_NE(r.error().message().find(c.expect), std::string::npos) << r.error().message();
    EXPECT_NE(r.error().message().find("t.rvtrace"), std::string::npos) << r.error().message();
  }
}

TEST(TraceReader, GvlReadingsAreOptionalAndCheckedWhenPresent) {
  const std::string header = R"({"rvtrace":1,"recorder":"rvbpfd","pid":1,"origin_ns":0})" "\n";
  auto sample = [](const std::string& gvl) {
    return R"({"t_ns":1,"ruby_thread":2,"event":"sample","source":"perf_event","provenance":"observed")" + gvl +
           "}\n";
  };
  // Absent (in-process recorder traces, older rvbpfd ones): no reading.
  Result<TraceFile> none = TraceReader::Parse(header + sample(""), "t.rvtrace");
  ASSERT_TRUE(none.ok()) << none.error().ToString();
  EXPECT_EQ(none->events.back().gvl, nullptr);
  // A subset of the keys: the rest take their defaults; a holder implies held; a list longer than the count raises it.
  Result<TraceFile> some = TraceReader::Parse(header + sample(R"(,"gvl":{"holder":4,"queued":[5,6],"later":1})"),
                                              "t.rvtrace");
  ASSERT_TRUE(some.ok()) << some.error().ToString();
  ASSERT_NE(some->events.back().gvl, nullptr);
  EXPECT_TRUE(some->events.back().gvl->held);
  EXPECT_EQ(some->events.back().gvl->holder, std::optional<uint32_t>(4));
  EXPECT_EQ(some->events.back().gvl->waiting, 2u);
  const struct {
    std::string gvl, expect;
  } bad[] = {
      {R"(,"gvl":[1])", "\"gvl\" must be an object"},
      {R"(,"gvl":{"held":"yes"})", "\"gvl.held\" must be a boolean"},
      {R"(,"gvl":{"holder":-1})", "\"holder\" must be null or an integer"},
      {R"(,"gvl":{"held":false,"holder":3})", "\"gvl\" names a holder but says the GVL was not held"},
      {R"(,"gvl":{"waiting":4294967296})", "\"waiting\" must be null or an integer"},
      {R"(,"gvl":{"queued":{"a":1}})", "\"gvl.queued\" must be an array of thread ids"},
      {R"(,"gvl":{"queued":[1,null]})", "\"gvl.queued\" must be an array of thread ids"},
      {R"(,"gvl":{"queued":[1,4294967296]})", "\"gvl.queued\" must be an array of thread ids"},
  };
  for (const auto& c : bad) {
    Result<TraceFile> r = TraceReader::Parse(header + sample(c.gvl), "t.rvtrace");
    ASSERT_FALSE(r.ok()) << c.gvl;
    EXPECT_EQ(r.error().code(), ErrorCode::kBadTrace);
    EXPECT_NE(r.error().message().find("line 2: " + c.expect), std::string::npos) << r.error().message();
  }
}

TEST(TraceReader, AWantsGvlsHolderKeysAreCheckedAndTheirStackMustComeFirst) {
  const std::string header = R"({"rvtrace":1,"recorder":"rvbpfd","pid":1,"origin_ns":0})" "\n"
                             R"({"frame":{"id":1,"label":"Object#crunch","path":"/a.rb","line":1,"kind":"ruby"}})" "\n"
                             R"({"stack":{"id":1,"frames":[1]}})" "\n";
  auto wants = [](const std::string& keys) {
    return R"({"t_ns":1,"ruby_thread":2,"event":"wants_gvl","source":"thread_hook_site","provenance":"observed")" +
           keys + "}\n";
  };
  Result<TraceFile> ok = TraceReader::Parse(header + wants(R"(,"holder":4,"holder_stack":1)"), "t.rvtrace");
  ASSERT_TRUE(ok.ok()) << ok.error().ToString();
  ASSERT_NE(ok->events.back().gvl, nullptr);
  EXPECT_EQ(ok->events.back().gvl->holder, std::optional<uint32_t>(4));
  EXPECT_EQ(ok->events.back().holder_stack, std::optional<uint32_t>(1));
  Result<TraceFile> none = TraceReader::Parse(header + wants(""), "t.rvtrace");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->events.back().gvl, nullptr);
  for (const auto& [keys, expect] : std::vector<std::pair<std::string, std::string>>{
           {R"(,"holder":"x","holder_stack":1)", "\"holder\" must be a thread id or null"},
           {R"(,"holder":4,"holder_stack":2)", "holder stack 2 before its stack line"},
       }) {
    Result<TraceFile> r = TraceReader::Parse(header + wants(keys), "t.rvtrace");
    ASSERT_FALSE(r.ok()) << keys;
    EXPECT_NE(r.error().message().find(expect), std::string::npos) << r.error().message();
  }
}

TEST(TraceReader, ReadsAnInProcessRecorderTrace) {
  // Written the way the in-process recorder writes: same header keys, its own recorder name, native_tid of the
  // thread that ran the hook, no probe_tid, a newer event name this version does not know, and no summary.
  const std::string text =
      R"({"rvtrace":1,"recorder":"in-process","recorder_version":"0.3.0","pid":304051,"ruby_version":"3.4.8","clock":"monotonic","origin_ns":777,"started_at":"2025-01-01T00:00:00Z","channels":["thread_hook_site","gc_hook_site","probe"],"main_thread":1})" "\n"
      R"({"t_ns":0,"ruby_thread":1,"native_tid":304051,"event":"tracing_started","cruby_event":null,"source":"daemon","provenance":"observed"})" "\n"
      R"({"thread":{"ruby_thread":2,"main":false}})" "\n"
      R"({"t_ns":383000,"ruby_thread":2,"native_tid":304051,"event":"thread_started","cruby_event":"RUBY_INTERNAL_THREAD_EVENT_STARTED","source":"thread_hook_site","provenance":"observed"})" "\n"
      R"({"t_ns":400000,"ruby_thread":2,"native_tid":304135,"event":"line","source":"line_channel","provenance":"observed"})" "\n"
      R"({"t_ns":733000,"ruby_thread":2,"native_tid":304135,"event":"gvl_acquired","cruby_event":"RUBY_INTERNAL_THREAD_EVENT_RESUMED","source":"thread_hook_site","provenance":"observed","ractor":1})" "\n"
      R"({"t_ns":700000,"ruby_thread":null,"native_tid":null,"event":"gc_enter","source":"gc_hook_site","provenance":"derived"})" "\n"
      R"({"marker":"something new"})" "\n";
  Result<TraceFile> r = TraceReader::Parse(text, "inproc");
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(r->header.recorder, "in-process");
  EXPECT_EQ(r->header.pid, 304051);
  EXPECT_EQ(r->header.origin_ns, 777u);
  EXPECT_EQ(r->header.ruby_version, "3.4.8");
  ASSERT_EQ(r->events.size(), 4u);
  EXPECT_EQ(r->unknown_event_lines, 1u);
  EXPECT_EQ(r->unknown_lines, 1u);
  EXPECT_EQ(r->out_of_order_events, 1u);  // 700000 after 733000
  EXPECT_FALSE(r->events[1].probe_tid.has_value());
  EXPECT_EQ(r->events[3].provenance, Provenance::kDerived);
  EXPECT_FALSE(r->events[3].ruby_thread.has_value());
  EXPECT_FALSE(r->summary.has_value());
  EXPECT_TRUE(r->IsMain(1));
  EXPECT_FALSE(r->IsMain(2));
}

TEST(TraceReader, LabelsAndPathsPastTheBoundAreCutAndMarked) {
  // A crafted trace (or another recorder's) with a 64 KiB label and path: read as rvbpfd's symbolizer would have
  // cut them, so no export repeats 64 KiB per frame; a frame within the bound is read as written.
  const std::string big_label = "Deep#" + std::string(65536, 'r');
  const std::string big_path = "/app/" + std::string(65536, 'p') + ".rb";
  const std::string text =
      R"({"rvtrace":1,"recorder":"rvbpfd","recorder_version":"0.1.0","pid":1,"ruby_version":"3.4.5","clock":"monotonic","origin_ns":0,"started_at":"2025-01-01T00:00:00Z","channels":[]})" "\n"
      R"({"frame":{"id":1,"label":")" + big_label + R"(","path":")" + big_path + R"(","line":3,"kind":"ruby"}})" "\n"
      R"({"frame":{"id":2,"label":"Foo#bar","path":"/app/foo.rb","line":4,"kind":"ruby"}})" "\n"
      R"({"stack":{"id":1,"frames":[2,1,1]}})" "\n";
  Result<TraceFile> r = TraceReader::Parse(text, "big");
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  const FrameInfo* big = r->Frame(1);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(big->label, big_label.substr(0, kMaxLabelBytes - kTruncatedMark.size()) + std::string(kTruncatedMark));
  EXPECT_EQ(big->path, big_path.substr(0, kMaxLabelBytes - kTruncatedMark.size()) + std::string(kTruncatedMark));
  EXPECT_EQ(big->line, 3);
  const FrameInfo* small = r->Frame(2);
  ASSERT_NE(small, nullptr);
  EXPECT_EQ(small->label, "Foo#bar");
  EXPECT_EQ(small->path, "/app/foo.rb");
}

TEST(TraceReader, ForeignSummaryKeysAreToleratedAndNegativeTimesClamp) {
  // The reference recorder's own summary shape: "threads" is a count, counts under "counts", extra keys.
  const std::string text =
      R"({"rvtrace":1,"recorder":"in-process","recorder_version":"rvref-1","pid":7,"ruby_version":"3.3.8","clock":"monotonic","origin_ns":100,"channels":["thread_hook","gc_hook"]})" "\n"
      R"({"thread":{"ruby_thread":1,"main":true,"th":"0x55d0","vm_serial":1}})" "\n"
      R"({"t_ns":-20,"ruby_thread":1,"native_tid":11,"probe_tid":11,"event":"gvl_acquired","cruby_event":"RUBY_INTERNAL_THREAD_EVENT_RESUMED","source":"thread_hook","provenance":"observed","th":"0x55d0"})" "\n"
      R"({"t_ns":3000000,"ruby_thread":1,"native_tid":11,"probe_tid":11,"event":"gvl_released","cruby_event":"RUBY_INTERNAL_THREAD_EVENT_SUSPENDED","source":"thread_hook","provenance":"observed","th":"0x55d0"})" "\n"
      R"({"summary":{"events":2,"events_dropped":0,"unpublished":0,"capacity":1024,"threads":1,"stopped_t_ns":3000001,"counts":{"gvl_acquired":1,"gvl_released":1,"thread_started":0}}})" "\n";
  Result<TraceFile> r = TraceReader::Parse(text, "rvref");
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  ASSERT_EQ(r->events.size(), 2u);
  EXPECT_EQ(r->events[0].t_ns, 0u);
  EXPECT_EQ(r->events[0].source, "thread_hook");
  ASSERT_TRUE(r->summary.has_value());
  EXPECT_FALSE(r->summary_has_threads);
  EXPECT_EQ(r->summary->count(EventName::kGvlAcquired), 1u);
  EXPECT_EQ(r->summary->count(EventName::kGvlReleased), 1u);
  EXPECT_TRUE(r->IsMain(1));
}

TEST(TraceReader, MainThreadFromThreadLineWhenHeaderHasNone) {
  const std::string text =
      R"({"rvtrace":1,"recorder":"in-process"})" "\n"
      R"({"thread":{"ruby_thread":0,"main":true}})" "\n"
      R"({"t_ns":5,"ruby_thread":0,"native_tid":9,"event":"gvl_released","source":"thread_hook_site","provenance":"observed"})" "\n";
  Result<TraceFile> r = TraceReader::Parse(text, "t");
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_FALSE(r->header.main_thread.has_value());
  EXPECT_TRUE(r->IsMain(0));
  EXPECT_FALSE(r->IsMain(1));
}

TEST(TraceReader, MissingFileIsAnIoError) {
  Result<TraceFile> r = TraceReader::ReadFile("/nonexistent-dir/x.rvtrace");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kIo);
  EXPECT_NE(r.error().message().find("errno 2"), std::string::npos) << r.error().message();
}

}  // namespace
}  // namespace rvbpfd
