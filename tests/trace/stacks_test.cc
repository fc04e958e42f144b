// Frame/stack dictionaries (trace/stacks.h), their lines in the writer, and the reader's handling of them.
#include "trace/stacks.h"

#include <gtest/gtest.h>

#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trace/inspect.h"
#include "trace/reader.h"
#include "trace/writer.h"
#include "trace_test_util.h"

namespace rvbpfd {
namespace {

using ::rvbpfd::testing::ReadAll;
using ::rvbpfd::testing::ScratchDir;

FrameInfo Frame(std::string label, std::string path, int32_t line, FrameKind kind = FrameKind::kRuby) {
  return FrameInfo{std::move(label), std::move(path), line, kind};
}

TraceHeader Header() {
  TraceHeader h;
  h.pid = 4242;
  h.ruby_version = "3.4.5";
  h.started_at = "2025-01-31T12:00:00.000000Z";
  h.sample_hz = 99;
  h.stacks = "release";
  return h;
}

std::vector<nlohmann::json> JsonLines(const std::string& text) {
  std::vector<nlohmann::json> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) break;
    out.push_back(nlohmann::json::parse(text.substr(pos, nl - pos)));
    pos = nl + 1;
  }
  return out;
}

TEST(StackTable, InternsFramesAndStacksOnceWithDenseIds) {
  StackTable table;
  const InternResult a = table.InternFrame(Frame("Foo#bar", "/app/foo.rb", 10));
  const InternResult b = table.InternFrame(Frame("Integer#times", "<cfunc>", 0, FrameKind::kCfunc));
  const InternResult a2 = table.InternFrame(Frame("Foo#bar", "/app/foo.rb", 10));
  // Same label on another line is another frame: pprof locations and flame graphs key on (function, line).
  const InternResult a_line = table.InternFrame(Frame("Foo#bar", "/app/foo.rb", 11));
  const InternResult a_kind = table.InternFrame(Frame("Foo#bar", "/app/foo.rb", 10, FrameKind::kUnresolved));
  EXPECT_TRUE(a.is_new);
  EXPECT_TRUE(b.is_new);
  EXPECT_FALSE(a2.is_new);
  EXPECT_EQ(a.id, a2.id);
  EXPECT_TRUE(a_line.is_new);
  EXPECT_TRUE(a_kind.is_new);
  EXPECT_EQ(a.id, 1u);
  EXPECT_EQ(b.id, 2u);
  EXPECT_EQ(a_line.id, 3u);
  EXPECT_EQ(table.frame_count(), 4u);
  ASSERT_NE(table.frame(b.id), nullptr);
  EXPECT_EQ(table.frame(b.id)->label, "Integer#times");
  EXPECT_EQ(table.frame(0), nullptr);
  EXPECT_EQ(table.frame(99), nullptr);

  const std::vector<uint32_t> s1 = {a.id, b.id};
  const std::vector<uint32_t> s2 = {b.id, a.id};  // order matters: leaf first
  const InternResult x = table.InternStack(s1);
  const InternResult y = table.InternStack(s2);
  const InternResult x2 = table.InternStack(s1);
  const InternResult prefix = table.InternStack(std::vector<uint32_t>{a.id});
  const InternResult empty = table.InternStack({});
  EXPECT_TRUE(x.is_new);
  EXPECT_TRUE(y.is_new);
  EXPECT_NE(x.id, y.id);
  EXPECT_FALSE(x2.is_new);
  EXPECT_EQ(x2.id, x.id);
  EXPECT_TRUE(prefix.is_new);
  EXPECT_TRUE(empty.is_new);
  EXPECT_EQ(table.stack_count(), 4u);
  ASSERT_NE(table.stack(y.id), nullptr);
  EXPECT_EQ(*table.stack(y.id), s2);
}

TEST(StackTable, ManyDistinctStacksStayDistinct) {
  StackTable table;
  std::vector<uint32_t> ids;
  for (int i = 0; i < 200; ++i) ids.push_back(table.InternFrame(Frame("m" + std::to_string(i), "/x.rb", i)).id);
  // Every prefix of the 200-frame sequence is a different stack.
  for (size_t n = 1; n <= ids.size(); ++n) {
    EXPECT_EQ(table.InternStack(std::span<const uint32_t>(ids.data(), n)).id, n);
  }
  for (size_t n = 1; n <= ids.size(); ++n) {
    const InternResult again = table.InternStack(std::span<const uint32_t>(ids.data(), n));
    EXPECT_FALSE(again.is_new);
    EXPECT_EQ(again.id, n);
  }
}

TEST(FrameKind, RoundTrips) {
  for (FrameKind k : {FrameKind::kRuby, FrameKind::kCfunc, FrameKind::kGc, FrameKind::kUnresolved}) {
    ASSERT_TRUE(ParseFrameKind(FrameKindString(k)).has_value());
    EXPECT_EQ(*ParseFrameKind(FrameKindString(k)), k);
  }
  EXPECT_EQ(FrameKindString(FrameKind::kCfunc), "cfunc");
  EXPECT_FALSE(ParseFrameKind("jit").has_value());
}

// Writes: frames, a stack, a gvl_released with derived reason and stack, two samples reusing it.
struct Written {
  uint32_t leaf = 0, root = 0, stack = 0;
};

Written WriteSampleTrace(TraceWriter* w) {
  Written out;
  out.leaf = w->InternFrame(Frame("Foo#hot", "/app/foo.rb", 7));
  out.root = w->InternFrame(Frame("<main>", "/app/main.rb", 1));
  const uint32_t again = w->InternFrame(Frame("Foo#hot", "/app/foo.rb", 7));
  EXPECT_EQ(again, out.leaf);
  const std::vector<uint32_t> frames = {out.leaf, out.root};
  out.stack = w->InternStack(frames);
  EXPECT_EQ(w->InternStack(frames), out.stack);

  TraceEvent rel;
  rel.t_ns = 1000;
  rel.event = EventName::kGvlReleased;
  rel.ruby_thread = 1;
  rel.native_tid = 100;
  rel.source = kSourceThreadHookSite;
  rel.reason = "condition_variable";
  rel.reason_provenance = Provenance::kDerived;
  rel.stack = out.stack;
  EXPECT_TRUE(w->Write(rel).ok());
  for (uint64_t t : {2000, 3000}) {
    TraceEvent s;
    s.t_ns = t;
    s.event = EventName::kSample;
    s.ruby_thread = 1;
    s.native_tid = 100;
    s.source = kSourcePerfEvent;
    s.stack = out.stack;
    EXPECT_TRUE(w->Write(s).ok());
  }
  return out;
}

TEST(TraceWriterStacks, DictionaryLinesPrecedeFirstUseAndAreWrittenOnce) {
  ScratchDir dir;
  const std::string path = dir.File("s.rvtrace");
  auto w = TraceWriter::Create(path, Header());
  ASSERT_TRUE(w.ok()) << w.error().message();
  const Written ids = WriteSampleTrace(&*w);
  ASSERT_TRUE(w->Finish(FinishInfo{.end_t_ns = 4000}).ok());

  const std::vector<nlohmann::json> lines = JsonLines(ReadAll(path));
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines[0]["sample_hz"], 99);
  EXPECT_EQ(lines[0]["stacks"], "release");
  int frame_lines = 0, stack_lines = 0;
  std::set<uint64_t> frames_seen, stacks_seen;
  for (const nlohmann::json& l : lines) {
    if (l.contains("frame")) {
      ++frame_lines;
      frames_seen.insert(l["frame"]["id"].get<uint64_t>());
      EXPECT_TRUE(l["frame"].contains("label"));
      EXPECT_TRUE(l["frame"].contains("path"));
      EXPECT_TRUE(l["frame"].contains("line"));
      EXPECT_EQ(l["frame"]["kind"], "ruby");
    } else if (l.contains("stack") && l["stack"].is_object()) {
      ++stack_lines;
      for (const auto& f : l["stack"]["frames"]) EXPECT_TRUE(frames_seen.contains(f.get<uint64_t>())) << l;
      stacks_seen.insert(l["stack"]["id"].get<uint64_t>());
    } else if (l.contains("t_ns") && l.contains("stack")) {
      EXPECT_TRUE(stacks_seen.contains(l["stack"].get<uint64_t>())) << l;
    }
  }
  EXPECT_EQ(frame_lines, 2);
  EXPECT_EQ(stack_lines, 1);
  bool saw_release = false;
  for (const nlohmann::json& l : lines) {
    if (l.value("event", "") == "gvl_released") {
      saw_release = true;
      EXPECT_EQ(l["reason"], "condition_variable");
      EXPECT_EQ(l["reason_provenance"], "derived");
      EXPECT_EQ(l["stack"], ids.stack);
    }
    if (l.value("event", "") == "sample") {
      EXPECT_EQ(l["cruby_event"], nullptr);
      EXPECT_EQ(l["source"], "perf_event");
      EXPECT_EQ(l["stack"], ids.stack);
    }
    if (l.contains("summary")) {
      EXPECT_EQ(l["summary"]["event_counts"]["sample"], 2);
      EXPECT_EQ(l["summary"]["stacks"], 1);
      EXPECT_EQ(l["summary"]["frames"], 2);
    }
  }
  EXPECT_TRUE(saw_release);
}

TEST(TraceWriterStacks, RejectsAnEventWithAStackNeverInterned) {
  ScratchDir dir;
  auto w = TraceWriter::Create(dir.File("bad.rvtrace"), Header());
  ASSERT_TRUE(w.ok());
  TraceEvent s;
  s.event = EventName::kSample;
  s.ruby_thread = 1;
  s.stack = 5;
  const Status st = w->Write(s);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(w->events_written(), 1u);  // tracing_started only
}

TEST(TraceReaderStacks, RoundTripsFramesStacksSamplesAndReasons) {
  ScratchDir dir;
  const std::string path = dir.File("rt.rvtrace");
  auto w = TraceWriter::Create(path, Header());
  ASSERT_TRUE(w.ok());
  const Written ids = WriteSampleTrace(&*w);
  const uint32_t gc = w->InternFrame(Frame("(garbage collection)", "", 0, FrameKind::kGc));
  const uint32_t weird = w->InternFrame(Frame("<unresolved cme 0x1>", "\"quoted\"\\path", -1, FrameKind::kUnresolved));
  const uint32_t gc_stack = w->InternStack(std::vector<uint32_t>{gc, weird, ids.root});
  ASSERT_NE(gc_stack, ids.stack);
  ASSERT_TRUE(w->Finish(FinishInfo{.end_t_ns = 5000}).ok());

  auto file = TraceReader::ReadFile(path);
  ASSERT_TRUE(file.ok()) << file.error().message();
  EXPECT_EQ(file->header.sample_hz, 99u);
  EXPECT_EQ(file->header.stacks, "release");
  ASSERT_EQ(file->frames.size(), 4u);
  ASSERT_EQ(file->stacks.size(), 2u);
  EXPECT_EQ(*file->Frame(ids.leaf), Frame("Foo#hot", "/app/foo.rb", 7));
  EXPECT_EQ(*file->Frame(weird), Frame("<unresolved cme 0x1>", "\"quoted\"\\path", -1, FrameKind::kUnresolved));
  EXPECT_EQ(file->Frame(gc)->kind, FrameKind::kGc);
  EXPECT_EQ(*file->Stack(ids.stack), (std::vector<uint32_t>{ids.leaf, ids.root}));
  EXPECT_EQ(*file->Stack(gc_stack), (std::vector<uint32_t>{gc, weird, ids.root}));
  EXPECT_EQ(file->Stack(77), nullptr);

  int samples = 0;
  bool saw_release = false;
  for (const TraceEvent& e : file->events) {
    if (e.event == EventName::kSample) {
      ++samples;
      EXPECT_EQ(e.stack, ids.stack);
      EXPECT_EQ(e.source, kSourcePerfEvent);
    } else if (e.event == EventName::kGvlReleased) {
      saw_release = true;
      EXPECT_EQ(e.reason, "condition_variable");
      EXPECT_EQ(e.reason_provenance, Provenance::kDerived);
      EXPECT_EQ(e.stack, ids.stack);
    } else {
      EXPECT_FALSE(e.stack.has_value()) << EventNameString(e.event);
    }
  }
  EXPECT_EQ(samples, 2);
  EXPECT_TRUE(saw_release);
  ASSERT_TRUE(file->summary.has_value());
  EXPECT_EQ(file->summary->count(EventName::kSample), 2u);
  EXPECT_EQ(file->summary->stacks, 2u);
  EXPECT_EQ(file->summary->frames, 4u);
}

TEST(TraceReaderStacks, EveryCrashCutPrefixReadsWithoutUndefinedIds) {
  ScratchDir dir;
  const std::string path = dir.File("cut.rvtrace");
  auto w = TraceWriter::Create(path, Header());
  ASSERT_TRUE(w.ok());
  WriteSampleTrace(&*w);
  ASSERT_TRUE(w->Finish(FinishInfo{.end_t_ns = 4000}).ok());
  const std::string full = ReadAll(path);
  const size_t header_end = full.find('\n') + 1;
  for (size_t cut = header_end; cut <= full.size(); ++cut) {
    auto file = TraceReader::Parse(std::string_view(full).substr(0, cut), "cut");
    ASSERT_TRUE(file.ok()) << "cut at " << cut << ": " << file.error().message();
    for (const TraceEvent& e : file->events) {
      if (e.stack) {
        ASSERT_NE(file->Stack(*e.stack), nullptr);
      }
    }
  }
}

std::string HeaderLine() {
  return R"({"rvtrace":1,"recorder":"rvbpfd","pid":1,"ruby_version":"3.4.5","origin_ns":0})"
         "\n";
}

TEST(TraceReaderStacks, RejectsUseBeforeDefinition) {
  const std::string event_first = HeaderLine() +
                                  R"({"t_ns":1,"ruby_thread":1,"event":"sample","source":"perf_event","stack":3})"
                                  "\n";
  auto r1 = TraceReader::Parse(event_first, "t");
  ASSERT_FALSE(r1.ok());
  EXPECT_NE(r1.error().message().find("line 2"), std::string::npos) << r1.error().message();
  EXPECT_NE(r1.error().message().find("stack 3"), std::string::npos) << r1.error().message();

  const std::string stack_first = HeaderLine() + R"({"stack":{"id":1,"frames":[1]}})" "\n";
  auto r2 = TraceReader::Parse(stack_first, "t");
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.error().message().find("frame 1"), std::string::npos) << r2.error().message();

  const std::string redefined = HeaderLine() +
                                R"({"frame":{"id":1,"label":"a","path":"x","line":1,"kind":"ruby"}})"
                                "\n"
                                R"({"frame":{"id":1,"label":"b","path":"x","line":1,"kind":"ruby"}})"
                                "\n";
  EXPECT_FALSE(TraceReader::Parse(redefined, "t").ok());

  const std::string bad_frames = HeaderLine() + R"({"stack":{"id":1,"frames":"1"}})" "\n";
  EXPECT_FALSE(TraceReader::Parse(bad_frames, "t").ok());
  const std::string bad_reason = HeaderLine() +
                                 R"({"t_ns":1,"event":"gvl_released","reason":"io","reason_provenance":"guess"})"
                                 "\n";
  EXPECT_FALSE(TraceReader::Parse(bad_reason, "t").ok());
}

TEST(TraceReaderStacks, TracesWithoutStacksStillRead) {
  const std::string text = HeaderLine() + R"({"t_ns":1,"ruby_thread":1,"event":"gvl_acquired"})" "\n";
  auto file = TraceReader::Parse(text, "t");
  ASSERT_TRUE(file.ok());
  EXPECT_TRUE(file->frames.empty());
  EXPECT_TRUE(file->stacks.empty());
  EXPECT_FALSE(file->header.sample_hz.has_value());
  ASSERT_EQ(file->events.size(), 1u);
  EXPECT_FALSE(file->events[0].stack.has_value());
  EXPECT_EQ(file->events[0].reason_provenance, Provenance::kObserved);
}

TEST(InspectStacks, StatsCountSamplesAndStacksAndInspectShowsLeaf) {
  ScratchDir dir;
  const std::string path = dir.File("i.rvtrace");
  auto w = TraceWriter::Create(path, Header());
  ASSERT_TRUE(w.ok());
  WriteSampleTrace(&*w);
  ASSERT_TRUE(w->Finish(FinishInfo{.end_t_ns = 4000}).ok());
  auto file = TraceReader::ReadFile(path);
  ASSERT_TRUE(file.ok());
  std::ostringstream stats;
  PrintStats(*file, stats);
  EXPECT_NE(stats.str().find("samples: 2\n"), std::string::npos) << stats.str();
  EXPECT_NE(stats.str().find("stacks: 1 distinct (2 frames), on 3 events"), std::string::npos) << stats.str();
  std::ostringstream inspect;
  PrintInspect(*file, inspect);
  EXPECT_NE(inspect.str().find("reason=condition_variable (derived)"), std::string::npos) << inspect.str();
  EXPECT_NE(inspect.str().find("at Foo#hot"), std::string::npos) << inspect.str();
}

}  // namespace
}  // namespace rvbpfd
