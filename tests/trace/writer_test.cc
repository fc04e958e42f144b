#include "trace/writer.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "trace/reader.h"
#include "trace_test_util.h"

namespace rvbpfd {
namespace {

using ::rvbpfd::testing::Ev;
using ::rvbpfd::testing::ReadAll;
using ::rvbpfd::testing::ScratchDir;

TraceHeader TestHeader() {
  TraceHeader h;
  h.pid = 31337;
  h.ruby_version = "3.4.5";
  h.origin_ns = 123'456'789'000;
  h.started_at = "2025-01-31T12:00:00.000000Z";
  h.main_thread = 1;
  return h;
}

std::vector<std::string> Lines(const std::string& content) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < content.size()) {
    size_t nl = content.find('\n', pos);
    if (nl == std::string::npos) nl = content.size();
    out.push_back(content.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return out;
}

TEST(TraceWriter, CreateWritesHeaderAndTracingStartedImmediately) {
  ScratchDir dir;
  const std::string path = dir.File("a.rvtrace");
  TraceHeader header = TestHeader();
  header.command = {"ruby", "-e", "puts \"hi\""};
  header.build_id = "abcdef0123";
  Result<TraceWriter> writer = TraceWriter::Create(path, header);
  ASSERT_TRUE(writer.ok()) << writer.error().ToString();

  // Read while the writer is still open: a follower of the file sees the header at once.
  const std::vector<std::string> lines = Lines(ReadAll(path));
  ASSERT_EQ(lines.size(), 2u);
  const auto h = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(h["rvtrace"], 1);
  EXPECT_EQ(h["recorder"], "rvbpfd");
  EXPECT_EQ(h["recorder_version"], "0.1.0");
  EXPECT_EQ(h["pid"], 31337);
  EXPECT_EQ(h["ruby_version"], "3.4.5");
  EXPECT_EQ(h["clock"], "monotonic");
  EXPECT_EQ(h["origin_ns"], header.origin_ns);
  EXPECT_EQ(h["started_at"], header.started_at);
  EXPECT_EQ(h["channels"], nlohmann::json({"thread_hook_site", "gc_hook_site", "probe"}));
  EXPECT_EQ(h["main_thread"], 1);
  EXPECT_EQ(h["command"], nlohmann::json(header.command));
  EXPECT_EQ(h["build_id"], "abcdef0123");

  const auto started = nlohmann::json::parse(lines[1]);
  EXPECT_EQ(started["event"], "tracing_started");
  EXPECT_EQ(started["t_ns"], 0);
  EXPECT_EQ(started["source"], "daemon");
  EXPECT_EQ(started["provenance"], "observed");
  EXPECT_TRUE(started["cruby_event"].is_null());
  EXPECT_TRUE(started["ruby_thread"].is_null());
}

TEST(TraceWriter, OptionalHeaderKeysAreOmittedAndStartedAtIsFilledIn) {
  ScratchDir dir;
  const std::string path = dir.File("b.rvtrace");
  TraceHeader header = TestHeader();
  header.started_at.clear();
  ASSERT_TRUE(TraceWriter::Create(path, header).ok());
  const auto h = nlohmann::json::parse(Lines(ReadAll(path))[0]);
  EXPECT_FALSE(h.contains("command"));
  EXPECT_FALSE(h.contains("build_id"));
  const std::string started_at = h["started_at"];
  // YYYY-MM-DDTHH:MM:SS.ffffffZ
  ASSERT_EQ(started_at.size(), 27u) << started_at;
  EXPECT_EQ(started_at[4], '-');
  EXPECT_EQ(started_at[10], 'T');
  EXPECT_EQ(started_at.back(), 'Z');
}

TEST(FormatIso8601Utc, KnownInstant) {
  // 2001-09-09T01:46:40Z is 1e9 seconds after the epoch.
  const auto t = std::chrono::system_clock::time_point(std::chrono::seconds(1'000'000'000) +
                                                       std::chrono::microseconds(250));
  EXPECT_EQ(FormatIso8601Utc(t), "2001-09-09T01:46:40.000250Z");
}

TEST(TraceWriter, RoundTripThroughReader) {
  ScratchDir dir;
  const std::string path = dir.File("rt.rvtrace");
  std::vector<TraceEvent> events = {
      Ev(100, EventName::kThreadStarted, 2, std::nullopt),
      Ev(200, EventName::kWantsGvl, 2, 5002),
      Ev(300, EventName::kGvlReleased, 1, 5001),
      Ev(400, EventName::kGvlAcquired, 2, 5002),
      Ev(450, EventName::kGcEnter, 2, 5002),
      Ev(460, EventName::kGcExit, 2, 5002),
      Ev(500, EventName::kSleepEnter, 2, 5002),
      Ev(600, EventName::kGvlReleased, 2, 5002),
      Ev(700, EventName::kThreadExited, 2, 5002),
  };
  events[1].probe_tid = 5001;  // READY delivered by the waker
  events[6].source = kSourceProbe;
  TraceEvent dropped = Ev(650, EventName::kEventsDropped, std::nullopt, std::nullopt);
  dropped.count = 17;
  dropped.source = kSourceDaemon;
  dropped.probe_tid.reset();
  events.insert(events.begin() + 8, dropped);
  TraceEvent paused = Ev(660, EventName::kTracingPaused, std::nullopt, std::nullopt);
  paused.source = kSourceDaemon;
  paused.reason = "overhead budget \"5%\" exceeded";
  paused.overhead_pct = 12.25;
  paused.provenance = Provenance::kDerived;
  events.insert(events.begin() + 9, paused);
  {
    Result<TraceWriter> writer = TraceWriter::Create(path, TestHeader());
    ASSERT_TRUE(writer.ok());
    for (const TraceEvent& e : events) ASSERT_TRUE(writer->Write(e).ok());
    ASSERT_TRUE(writer->Finish(FinishInfo{.end_t_ns = 800, .ring_high_water_bytes = 4096, .late_events = 3,
                                          .stop_reason = "signal"})
                    .ok());
  }
  Result<TraceFile> read = TraceReader::ReadFile(path);
  ASSERT_TRUE(read.ok()) << read.error().ToString();
  const TraceFile& trace = *read;
  EXPECT_EQ(trace.header.recorder, "rvbpfd");
  EXPECT_EQ(trace.header.pid, 31337);
  EXPECT_EQ(trace.header.origin_ns, TestHeader().origin_ns);
  EXPECT_FALSE(trace.truncated_last_line);
  EXPECT_EQ(trace.out_of_order_events, 0u);

  // tracing_started + the events + tracing_stopped.
  ASSERT_EQ(trace.events.size(), events.size() + 2);
  EXPECT_EQ(trace.events.front().event, EventName::kTracingStarted);
  EXPECT_EQ(trace.events.back().event, EventName::kTracingStopped);
  EXPECT_EQ(trace.events.back().t_ns, 800u);
  EXPECT_EQ(trace.events.back().reason, "signal");
  for (size_t i = 0; i < events.size(); ++i) {
    const TraceEvent& want = events[i];
    const TraceEvent& got = trace.events[i + 1];
    EXPECT_EQ(got.t_ns, want.t_ns) << i;
    EXPECT_EQ(got.event, want.event) << i;
    EXPECT_EQ(got.ruby_thread, want.ruby_thread) << i;
    EXPECT_EQ(got.native_tid, want.native_tid) << i;
    EXPECT_EQ(got.probe_tid, want.probe_tid) << i;
    EXPECT_EQ(got.source, want.source) << i;
    EXPECT_EQ(got.provenance, want.provenance) << i;
    EXPECT_EQ(got.count, want.count) << i;
    EXPECT_EQ(got.reason, want.reason) << i;
    EXPECT_EQ(got.overhead_pct, want.overhead_pct) << i;
  }

  // One thread line per Ruby thread, before its first event, main marked.
  ASSERT_EQ(trace.threads.size(), 2u);
  EXPECT_EQ(trace.threads[0].ruby_thread, 2u);
  EXPECT_FALSE(trace.threads[0].main);
  EXPECT_EQ(trace.threads[1].ruby_thread, 1u);
  EXPECT_TRUE(trace.threads[1].main);

  ASSERT_TRUE(trace.summary.has_value());
  const TraceSummary& s = *trace.summary;
  std::map<EventName, uint64_t> expected_counts;
  for (const TraceEvent& e : trace.events) expected_counts[e.event]++;
  for (size_t i = 0; i < kEventNameCount; ++i) {
    EXPECT_EQ(s.event_counts[i], expected_counts[static_cast<EventName>(i)]) << EventNameString(EventName(i));
  }
  EXPECT_EQ(s.events_dropped, 17u);
  EXPECT_EQ(s.drop_records, 1u);
  EXPECT_EQ(s.ring_high_water_bytes, 4096u);
  EXPECT_EQ(s.late_events, 3u);
  EXPECT_DOUBLE_EQ(s.duration_ms, 800 / 1e6);
}

TEST(TraceWriter, ProbeHitsAreWrittenAndReadBackOnlyWhenTheRecorderGivesThem) {
  ScratchDir dir;
  for (bool with_hits : {true, false}) {
    const std::string path = dir.File(with_hits ? "hits.rvtrace" : "nohits.rvtrace");
    {
      Result<TraceWriter> writer = TraceWriter::Create(path, TestHeader());
      ASSERT_TRUE(writer.ok());
      ASSERT_TRUE(writer->Write(Ev(1, EventName::kGvlReleased, 1, 10)).ok());
      FinishInfo fin{.end_t_ns = 5};
      if (with_hits) {
        fin.probe_hits = 700;
        fin.hits_discarded = 100;
        fin.cold_hits = 40;
        fin.stepped_hits = 3;
      }
      ASSERT_TRUE(writer->Finish(fin).ok());
    }
    const std::string text = ReadAll(path);
    EXPECT_EQ(text.find("\"probe_hits\":700,\"hits_discarded\":100,\"cold_hits\":40,\"stepped_hits\":3") !=
                  std::string::npos,
              with_hits)
        << text;
    EXPECT_EQ(text.find("probe_hits") != std::string::npos, with_hits) << "absent unless the recorder counted";
    Result<TraceFile> read = TraceReader::ReadFile(path);
    ASSERT_TRUE(read.ok() && read->summary.has_value());
    EXPECT_EQ(read->summary->probe_hits, with_hits ? std::optional<uint64_t>(700) : std::nullopt);
    EXPECT_EQ(read->summary->hits_discarded, with_hits ? std::optional<uint64_t>(100) : std::nullopt);
    EXPECT_EQ(read->summary->cold_hits, with_hits ? std::optional<uint64_t>(40) : std::nullopt);
    EXPECT_EQ(read->summary->stepped_hits, with_hits ? std::optional<uint64_t>(3) : std::nullopt);
  }
}

TEST(TraceWriter, GvlReadingsOfSamplesRoundTripAndOtherEventsHaveNone) {
  ScratchDir dir;
  const std::string path = dir.File("gvl.rvtrace");
  TraceEvent held = Ev(10, EventName::kSample, 2, 5002);
  held.source = kSourcePerfEvent;
  held.gvl = std::make_shared<GvlReading>();
  held.gvl->held = true;
  held.gvl->holder = 2;
  held.gvl->waiting = 5;  // three named, two the recorder could not name
  held.gvl->queued = {3, 1, 4};
  TraceEvent unnamed = Ev(20, EventName::kSample, 3, 5003);
  unnamed.source = kSourcePerfEvent;
  unnamed.gvl = std::make_shared<GvlReading>();
  unnamed.gvl->held = true;  // by a thread the trace does not name
  unnamed.gvl->waiting = 0;
  TraceEvent free_lock = Ev(30, EventName::kSample, 3, 5003);
  free_lock.source = kSourcePerfEvent;
  free_lock.gvl = std::make_shared<GvlReading>();
  free_lock.gvl->waiting = 1;
  free_lock.gvl->queued = {2};
  TraceEvent plain = Ev(40, EventName::kSample, 3, 5003);
  plain.source = kSourcePerfEvent;
  {
    Result<TraceWriter> writer = TraceWriter::Create(path, TestHeader());
    ASSERT_TRUE(writer.ok());
    for (const TraceEvent* e : {&held, &unnamed, &free_lock, &plain}) ASSERT_TRUE(writer->Write(*e).ok());
    FinishInfo fin{.end_t_ns = 50};
    fin.gvl_readings = 3;
    fin.gvl_queue_truncated = 1;
    ASSERT_TRUE(writer->Finish(fin).ok());
  }
  const std::string text = ReadAll(path);
  EXPECT_NE(text.find(R"("gvl":{"held":true,"holder":2,"waiting":5,"queued":[3,1,4]})"), std::string::npos) << text;
  EXPECT_NE(text.find(R"("gvl":{"held":true,"holder":null,"waiting":0,"queued":[]})"), std::string::npos) << text;
  EXPECT_NE(text.find(R"("gvl":{"held":false,"holder":null,"waiting":1,"queued":[2]})"), std::string::npos) << text;
  EXPECT_NE(text.find(R"("gvl_readings":3,"gvl_queue_truncated":1)"), std::string::npos) << text;
  Result<TraceFile> read = TraceReader::ReadFile(path);
  ASSERT_TRUE(read.ok()) << read.error().ToString();
  std::vector<const TraceEvent*> samples;
  for (const TraceEvent& e : read->events) {
    if (e.event == EventName::kSample) samples.push_back(&e);
    if (e.event != EventName::kSample) {
      EXPECT_EQ(e.gvl, nullptr) << EventNameString(e.event);
    }
  }
  ASSERT_EQ(samples.size(), 4u);
  ASSERT_NE(samples[0]->gvl, nullptr);
  EXPECT_TRUE(samples[0]->gvl->held);
  EXPECT_EQ(samples[0]->gvl->holder, std::optional<uint32_t>(2));
  EXPECT_EQ(samples[0]->gvl->waiting, 5u);
  EXPECT_EQ(samples[0]->gvl->queued, (std::vector<uint32_t>{3, 1, 4}));
  ASSERT_NE(samples[1]->gvl, nullptr);
  EXPECT_TRUE(samples[1]->gvl->held);
  EXPECT_FALSE(samples[1]->gvl->holder.has_value());
  ASSERT_NE(samples[2]->gvl, nullptr);
  EXPECT_FALSE(samples[2]->gvl->held);
  EXPECT_EQ(samples[2]->gvl->queued, (std::vector<uint32_t>{2}));
  EXPECT_EQ(samples[3]->gvl, nullptr) << "a sample without a reading reads back without one";
  ASSERT_TRUE(read->summary.has_value());
  EXPECT_EQ(read->summary->gvl_readings, std::optional<uint64_t>(3));
  EXPECT_EQ(read->summary->gvl_queue_truncated, std::optional<uint64_t>(1));
}

// A contended wants_gvl carries its holder and the holder's stack (docs/rvtrace.md), read back as the event's `gvl`
// holder and holder_stack; an uncontended one has neither, and a holder stack that was never interned is refused.
TEST(TraceWriter, AWantsGvlsHolderAndHolderStackRoundTrip) {
  ScratchDir dir;
  const std::string path = dir.File("holder.rvtrace");
  TraceEvent contended = Ev(10, EventName::kWantsGvl, 2, 5002);
  contended.gvl = std::make_shared<GvlReading>();
  contended.gvl->held = true;
  contended.gvl->holder = 3;
  TraceEvent unnamed = Ev(20, EventName::kWantsGvl, 2, 5002);
  unnamed.gvl = std::make_shared<GvlReading>();
  unnamed.gvl->held = true;  // a holder the trace does not name
  TraceEvent free_lock = Ev(30, EventName::kWantsGvl, 2, 5002);
  {
    Result<TraceWriter> writer = TraceWriter::Create(path, TestHeader());
    ASSERT_TRUE(writer.ok());
    const uint32_t frame = writer->InternFrame(FrameInfo{"Object#crunch", "/app.rb", 3, FrameKind::kRuby});
    const uint32_t stack = writer->InternStack(std::vector<uint32_t>{frame});
    contended.holder_stack = stack;
    unnamed.holder_stack = stack;
    TraceEvent never = contended;
    never.holder_stack = stack + 100;
    EXPECT_FALSE(writer->Write(never).ok());
    for (const TraceEvent* e : {&contended, &unnamed, &free_lock}) ASSERT_TRUE(writer->Write(*e).ok());
  }
  const std::string text = ReadAll(path);
  EXPECT_NE(text.find(R"("holder":3,"holder_stack":)"), std::string::npos) << text;
  EXPECT_NE(text.find(R"("holder":null,"holder_stack":)"), std::string::npos) << text;
  EXPECT_EQ(text.find(R"("gvl":)"), std::string::npos) << "a wants_gvl carries no sample reading: " << text;
  Result<TraceFile> read = TraceReader::ReadFile(path);
  ASSERT_TRUE(read.ok()) << read.error().ToString();
  std::vector<const TraceEvent*> waits;
  for (const TraceEvent& e : read->events) {
    if (e.event == EventName::kWantsGvl) waits.push_back(&e);
  }
  ASSERT_EQ(waits.size(), 3u);
  ASSERT_NE(waits[0]->gvl, nullptr);
  EXPECT_TRUE(waits[0]->gvl->held);
  EXPECT_EQ(waits[0]->gvl->holder, std::optional<uint32_t>(3));
  EXPECT_EQ(waits[0]->holder_stack, contended.holder_stack);
  const std::vector<uint32_t>* frames = read->Stack(*waits[0]->holder_stack);
  ASSERT_NE(frames, nullptr);
  EXPECT_EQ(read->frames.at(frames->at(0)).label, "Object#crunch");
  ASSERT_NE(waits[1]->gvl, nullptr);
  EXPECT_FALSE(waits[1]->gvl->holder.has_value());
  EXPECT_EQ(waits[1]->holder_stack, contended.holder_stack);
  EXPECT_EQ(waits[2]->gvl, nullptr);
  EXPECT_FALSE(waits[2]->holder_stack.has_value());
}

TEST(TraceWriter, ThreadLineAppearsBeforeFirstEventOfEachThread) {
  ScratchDir dir;
  const std::string path = dir.File("threads.rvtrace");
  {
    Result<TraceWriter> writer = TraceWriter::Create(path, TestHeader());
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE(writer->Write(Ev(1, EventName::kGvlReleased, 1, 10)).ok());
    ASSERT_TRUE(writer->Write(Ev(2, EventName::kWantsGvl, 3, std::nullopt)).ok());
    ASSERT_TRUE(writer->Write(Ev(3, EventName::kGvlAcquired, 3, 11)).ok());
    ASSERT_TRUE(writer->Write(Ev(4, EventName::kGcEnter, std::nullopt, std::nullopt)).ok());
    ASSERT_TRUE(writer->Finish(FinishInfo{.end_t_ns = 5}).ok());
  }
  std::set<uint64_t> defined;
  for (const std::string& line : Lines(ReadAll(path))) {
    const auto obj = nlohmann::json::parse(line);
    if (obj.contains("thread")) {
      EXPECT_TRUE(defined.insert(obj["thread"]["ruby_thread"].get<uint64_t>()).second) << "defined twice";
      EXPECT_EQ(obj["thread"]["main"].get<bool>(), obj["thread"]["ruby_thread"] == 1);
    } else if (obj.contains("t_ns") && !obj["ruby_thread"].is_null()) {
      EXPECT_TRUE(defined.count(obj["ruby_thread"].get<uint64_t>())) << line;
    }
  }
  EXPECT_EQ(defined, (std::set<uint64_t>{1, 3}));
}

TEST(TraceWriter, EveryLineIsOneJsonObjectAndSummaryIsLast) {
  ScratchDir dir;
  const std::string path = dir.File("lines.rvtrace");
  {
    Result<TraceWriter> writer = TraceWriter::Create(path, TestHeader());
    ASSERT_TRUE(writer.ok());
    TraceEvent weird = Ev(5, EventName::kTracingResumed, std::nullopt, std::nullopt);
    weird.reason = "line\nbreak \"quoted\" \\ \x01 tab\t";
    weird.overhead_pct = 3.5;
    ASSERT_TRUE(writer->Write(weird).ok());
    ASSERT_TRUE(writer->Finish(FinishInfo{.end_t_ns = 10}).ok());
  }
  const std::string content = ReadAll(path);
  ASSERT_FALSE(content.empty());
  EXPECT_EQ(content.back(), '\n');
  const std::vector<std::string> lines = Lines(content);
  std::string reason;
  for (const std::string& line : lines) {
    const auto obj = nlohmann::json::parse(line);  // throws (fails the test) on an invalid line
    ASSERT_TRUE(obj.is_object());
    if (obj.value("event", "") == "tracing_resumed") reason = obj["reason"];
  }
  EXPECT_EQ(reason, "line\nbreak \"quoted\" \\ \x01 tab\t");
  EXPECT_TRUE(nlohmann::json::parse(lines.back()).contains("summary"));
  EXPECT_EQ(nlohmann::json::parse(lines[lines.size() - 2])["event"], "tracing_stopped");
}

// Running time as the summary must report it, computed here from the event list with its own simple loop.
std::map<uint32_t, double> ExpectedRunningMs(const std::vector<TraceEvent>& events, uint64_t end_ns) {
  std::map<uint32_t, std::optional<uint64_t>> open;
  std::map<uint32_t, uint64_t> total;
  for (const TraceEvent& e : events) {
    if (!e.ruby_thread) continue;
    const uint32_t t = *e.ruby_thread;
    total[t] += 0;
    if (e.event == EventName::kGvlAcquired && !open[t]) open[t] = e.t_ns;
    if ((e.event == EventName::kGvlReleased || e.event == EventName::kThreadExited) && open[t]) {
      total[t] += e.t_ns - *open[t];
      open[t].reset();
    }
  }
  std::map<uint32_t, double> out;
  for (auto& [t, ns] : total) {
    uint64_t sum = ns;
    if (open[t]) sum += end_ns - *open[t];
    out[t] = static_cast<double>(sum) / 1e6;
  }
  return out;
}

TEST(TraceWriter, SummaryRunningTime) {
  ScratchDir dir;
  const std::string path = dir.File("running.rvtrace");
  const std::vector<TraceEvent> events = {
      Ev(1'000'000, EventName::kGvlReleased, 1, 100),    // main held the GVL before tracing: not counted
      Ev(2'000'000, EventName::kGvlAcquired, 2, 200),
      Ev(2'500'000, EventName::kGvlAcquired, 2, 200),    // repeated: does not restart the interval
      Ev(7'000'000, EventName::kGvlReleased, 2, 200),    // thread 2: 5 ms
      Ev(7'100'000, EventName::kGvlAcquired, 1, 100),
      Ev(9'100'000, EventName::kGvlReleased, 1, 100),    // main: 2 ms
      Ev(9'200'000, EventName::kGvlAcquired, 3, 300),    // thread 3 never releases: runs to the end
      Ev(9'300'000, EventName::kGvlAcquired, 2, 201),    // thread 2 again, on another native thread (M:N)
      Ev(9'400'000, EventName::kGvlReleased, 2, 201),    // thread 2: +0.1 ms
      Ev(9'500'000, EventName::kGvlReleased, 2, 201),    // repeated release: nothing open, nothing added
  };
  const uint64_t end_ns = 20'000'000;
  {
    Result<TraceWriter> writer = TraceWriter::Create(path, TestHeader());
    ASSERT_TRUE(writer.ok());
    for (const TraceEvent& e : events) ASSERT_TRUE(writer->Write(e).ok());
    ASSERT_TRUE(writer->Finish(FinishInfo{.end_t_ns = end_ns}).ok());
  }
  Result<TraceFile> trace = TraceReader::ReadFile(path);
  ASSERT_TRUE(trace.ok()) << trace.error().ToString();
  ASSERT_TRUE(trace->summary.has_value());
  const std::map<uint32_t, double> expected = ExpectedRunningMs(events, end_ns);
  ASSERT_EQ(trace->summary->threads.size(), expected.size());
  for (const ThreadSummary& t : trace->summary->threads) {
    ASSERT_TRUE(expected.count(t.ruby_thread)) << t.ruby_thread;
    EXPECT_NEAR(t.running_ms, expected.at(t.ruby_thread), 1e-6) << "thread " << t.ruby_thread;
    EXPECT_EQ(t.main, t.ruby_thread == 1);
  }
  // Sanity of the independent computation itself against the hand-derived figures in the comments above.
  EXPECT_NEAR(expected.at(2), 5.1, 1e-9);
  EXPECT_NEAR(expected.at(1), 2.0, 1e-9);
  EXPECT_NEAR(expected.at(3), 10.8, 1e-9);
  const auto thread2 = std::find_if(trace->summary->threads.begin(), trace->summary->threads.end(),
                                    [](const ThreadSummary& t) { return t.ruby_thread == 2; });
  EXPECT_EQ(thread2->native_tids, (std::vector<uint32_t>{200, 201}));
  EXPECT_DOUBLE_EQ(trace->summary->duration_ms, end_ns / 1e6);
}

TEST(TraceWriter, StoppedIsNeverBeforeTheLastEvent) {
  ScratchDir dir;
  const std::string path = dir.File("stop.rvtrace");
  {
    Result<TraceWriter> writer = TraceWriter::Create(path, TestHeader());
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE(writer->Write(Ev(5000, EventName::kGcEnter, 1, 1)).ok());
    ASSERT_TRUE(writer->Finish(FinishInfo{.end_t_ns = 10}).ok());
  }
  Result<TraceFile> trace = TraceReader::ReadFile(path);
  ASSERT_TRUE(trace.ok());
  EXPECT_EQ(trace->events.back().t_ns, 5000u);
  EXPECT_EQ(trace->out_of_order_events, 0u);
}

TEST(TraceWriter, BuffersUntilFlushAndWritesOnlyWholeLines) {
  ScratchDir dir;
  const std::string path = dir.File("flush.rvtrace");
  Result<TraceWriter> writer = TraceWriter::Create(path, TestHeader());
  ASSERT_TRUE(writer.ok());
  const size_t after_create = ReadAll(path).size();
  ASSERT_TRUE(writer->Write(Ev(1, EventName::kGcEnter, 1, 1)).ok());
  EXPECT_EQ(ReadAll(path).size(), after_create) << "small writes stay in memory";

  // The first events are written by the first MaybeFlush that sees them, though 100 ms have not passed...
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(writer->MaybeFlush(t0).ok());
  const size_t after_first = ReadAll(path).size();
  EXPECT_GT(after_first, after_create) << "the first events reach the file at once";
  // ... the later ones only 100 ms after the previous timed flush.
  ASSERT_TRUE(writer->Write(Ev(2, EventName::kGcExit, 1, 1)).ok());
  ASSERT_TRUE(writer->MaybeFlush(t0 + std::chrono::milliseconds(50)).ok());
  EXPECT_EQ(ReadAll(path).size(), after_first);
  ASSERT_TRUE(writer->MaybeFlush(t0 + std::chrono::milliseconds(150)).ok());
  const size_t after_timed = ReadAll(path).size();
  EXPECT_GT(after_timed, after_first);

  // Past kFlushBytes the writer flushes by itself; whatever reached the file ends at a line boundary.
  uint64_t t = 3;
  while (ReadAll(path).size() == after_timed) {
    ASSERT_TRUE(writer->Write(Ev(t++, EventName::kGcExit, 1, 1)).ok());
    ASSERT_LT(t, 100'000u) << "never flushed";
  }
  const std::string content = ReadAll(path);
  EXPECT_GE(content.size() - after_timed, TraceWriter::kFlushBytes);
  EXPECT_EQ(content.back(), '\n');
}

TEST(TraceWriter, DestructorWithoutFinishLeavesAReadableTraceWithoutSummary) {
  ScratchDir dir;
  const std::string path = dir.File("nofinish.rvtrace");
  {
    Result<TraceWriter> writer = TraceWriter::Create(path, TestHeader());
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE(writer->Write(Ev(10, EventName::kGvlAcquired, 1, 1)).ok());
  }
  Result<TraceFile> trace = TraceReader::ReadFile(path);
  ASSERT_TRUE(trace.ok()) << trace.error().ToString();
  EXPECT_FALSE(trace->summary.has_value());
  ASSERT_EQ(trace->events.size(), 2u);
  EXPECT_EQ(trace->events[1].event, EventName::kGvlAcquired);
}

TEST(TraceWriter, MovedWriterOwnsTheFile) {
  ScratchDir dir;
  const std::string path = dir.File("moved.rvtrace");
  Result<TraceWriter> created = TraceWriter::Create(path, TestHeader());
  ASSERT_TRUE(created.ok());
  TraceWriter writer = std::move(created).value();
  ASSERT_TRUE(writer.Write(Ev(10, EventName::kGcEnter, 1, 1)).ok());
  ASSERT_TRUE(writer.Finish(FinishInfo{.end_t_ns = 20}).ok());
  EXPECT_FALSE(writer.Write(Ev(30, EventName::kGcExit, 1, 1)).ok()) << "a finished writer accepts nothing";
  Result<TraceFile> trace = TraceReader::ReadFile(path);
  ASSERT_TRUE(trace.ok());
  EXPECT_TRUE(trace->summary.has_value());
}

TEST(TraceWriter, AbandonRemovesTheFile) {
  ScratchDir dir;
  const std::string path = dir.File("abandon.rvtrace");
  Result<TraceWriter> writer = TraceWriter::Create(path, TestHeader());
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE(std::filesystem::exists(path));
  ASSERT_TRUE(writer->Write(Ev(10, EventName::kGcEnter, 1, 1)).ok());
  writer->Abandon();
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(TraceWriter, UnwritablePathFailsWithCodeAndMessage) {
  ScratchDir dir;
  // A missing directory fails for root too (chmod-based permission tests do not).
  const std::string missing = dir.File("no-such-dir/out.rvtrace");
  Result<TraceWriter> writer = TraceWriter::Create(missing, TestHeader());
  ASSERT_FALSE(writer.ok());
  EXPECT_EQ(writer.error().code(), ErrorCode::kOutputUnwritable);
  EXPECT_EQ(ExitStatus(writer.error().code()), 8);
  const std::string& msg = writer.error().message();
  EXPECT_NE(msg.find("cannot create output file " + missing), std::string::npos) << msg;
  EXPECT_NE(msg.find("No such file or directory (errno 2)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("-o"), std::string::npos) << msg;
  EXPECT_FALSE(std::filesystem::exists(missing));

  // A directory in the way: EISDIR.
  Result<TraceWriter> on_dir = TraceWriter::Create(dir.path(), TestHeader());
  ASSERT_FALSE(on_dir.ok());
  EXPECT_EQ(on_dir.error().code(), ErrorCode::kOutputUnwritable);
  EXPECT_NE(on_dir.error().message().find("(errno 21)"), std::string::npos) << on_dir.error().message();
}

TEST(TraceWriter, PermissionDeniedWhenNotRoot) {
  if (geteuid() == 0) GTEST_SKIP() << "root bypasses file permissions";
  ScratchDir dir;
  const std::string ro = dir.File("ro");
  ASSERT_EQ(mkdir(ro.c_str(), 0555), 0);
  Result<TraceWriter> writer = TraceWriter::Create(ro + "/out.rvtrace", TestHeader());
  ASSERT_FALSE(writer.ok());
  EXPECT_EQ(writer.error().code(), ErrorCode::kOutputUnwritable);
  EXPECT_NE(writer.error().message().find("Permission denied (errno 13)"), std::string::npos);
}

TEST(TraceWriter, WriteErrorsAreReportedAndDevicesAreNotDeleted) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  // /dev/full accepts open() and fails every write with ENOSPC, like a full disk. A device named with -o is written
  // in place: never created, replaced or removed.
  Result<TraceWriter> writer = TraceWriter::Create("/dev/full", TestHeader());
  ASSERT_FALSE(writer.ok());
  EXPECT_EQ(writer.error().code(), ErrorCode::kOutputUnwritable);
  EXPECT_NE(writer.error().message().find("errno 28"), std::string::npos) << writer.error().message();
  struct stat st {};
  ASSERT_EQ(stat("/dev/full", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
}

TEST(TraceWriter, PlantedSymlinkIsRefusedAndItsTargetUntouched) {
  ScratchDir dir;
  const std::string victim = dir.File("victim");
  { std::ofstream(victim) << "precious\n"; }
  const std::string link = dir.File("planted.rvtrace");
  ASSERT_EQ(symlink(victim.c_str(), link.c_str()), 0);
  Result<TraceWriter> writer = TraceWriter::Create(link, TestHeader());
  ASSERT_FALSE(writer.ok());
  EXPECT_EQ(writer.error().code(), ErrorCode::kOutputUnwritable);
  EXPECT_NE(writer.error().message().find("symbolic link"), std::string::npos) << writer.error().message();
  std::ifstream in(victim);
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "precious\n");
  EXPECT_TRUE(std::filesystem::is_symlink(link));
}

TEST(TraceWriter, TraceFileIsMode0600AndReplacesAnOldOne) {
  ScratchDir dir;
  const std::string path = dir.File("t.rvtrace");
  { std::ofstream(path) << "an older recording\n"; }
  ASSERT_EQ(chmod(path.c_str(), 0644), 0);
  Result<TraceWriter> writer = TraceWriter::Create(path, TestHeader());
  ASSERT_TRUE(writer.ok()) << writer.error().ToString();
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);  // traces hold command lines and paths
  ASSERT_TRUE(writer->Finish(FinishInfo{}).ok());
  std::ifstream in(path);
  std::string first;
  std::getline(in, first);
  EXPECT_EQ(first.find("an older"), std::string::npos) << first;
}

}  // namespace
}  // namespace rvbpfd

namespace rvbpfd {
namespace {

// Issue 46: the lines of a trace that follows a process tree, in the exact format its reader parses.
TEST(TraceWriterProcesses, WritesProcessLinesThreadProcessAndEnds) {
  ScratchDir dir;
  const std::string path = dir.File("p.rvtrace");
  Result<TraceWriter> writer = TraceWriter::Create(path, TestHeader());
  ASSERT_TRUE(writer.ok()) << writer.error().ToString();
  ProcessInfo root;
  root.pid = 31337;
  root.command = {"ruby", "app.rb"};
  root.ruby_version = "3.4.5";
  root.build_id = "ab12";
  writer->WriteProcess(root, 1);
  ASSERT_TRUE(writer->Write(Ev(10, EventName::kGvlAcquired, 1, 31337)).ok());
  ProcessInfo child;
  child.id = 2;
  child.pid = 4242;
  child.parent = 1;
  child.cause = "fork";
  child.t_ns = 123;
  child.command = {"ruby", "app.rb"};
  child.ruby_version = "3.4.5";
  writer->WriteProcess(child, 2);
  TraceEvent e = Ev(130, EventName::kGvlAcquired, 2, 4242);
  e.process = 2;
  ASSERT_TRUE(writer->Write(e).ok());
  TraceEvent w = Ev(140, EventName::kThreadStarted, 3, 4243);
  w.process = 2;
  ASSERT_TRUE(writer->Write(w).ok());
  ProcessInfo skipped;
  skipped.id = 3;
  skipped.pid = 4242;
  skipped.parent = 2;
  skipped.cause = "exec";
  skipped.t_ns = 200;
  skipped.ruby_version = "3.4.5";  // never written for a skipped process
  skipped.skipped = "not Ruby: /bin/sh";
  writer->WriteProcessEnd(ProcessEnd{.id = 2, .t_ns = 200, .how = "exec"});
  writer->WriteProcess(skipped);
  writer->WriteProcessEnd(ProcessEnd{.id = 3, .t_ns = 300, .how = "exit", .exit_code = 3});
  ASSERT_TRUE(writer->Finish(FinishInfo{.end_t_ns = 400}).ok());

  std::vector<std::string> lines = Lines(ReadAll(path));
  std::vector<std::string> want = {
      R"({"process":{"id":1,"pid":31337,"t_ns":0,"command":["ruby","app.rb"],"ruby_version":"3.4.5","build_id":"ab12"}})",
      R"({"thread":{"ruby_thread":1,"main":true}})",
      "",  // the event line
      R"({"process":{"id":2,"pid":4242,"parent":1,"cause":"fork","t_ns":123,"command":["ruby","app.rb"],"ruby_version":"3.4.5"}})",
      R"({"thread":{"ruby_thread":2,"main":true,"process":2}})",
      "",
      R"({"thread":{"ruby_thread":3,"main":false,"process":2}})",
      "",
      R"({"process_end":{"id":2,"t_ns":200,"how":"exec"}})",
      R"({"process":{"id":3,"pid":4242,"parent":2,"cause":"exec","t_ns":200,"skipped":"not Ruby: /bin/sh"}})",
      R"({"process_end":{"id":3,"t_ns":300,"how":"exit","exit_code":3}})",
  };
  ASSERT_GE(lines.size(), 2 + want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i].empty()) {
      EXPECT_NE(lines[2 + i].find("\"t_ns\""), std::string::npos) << lines[2 + i];
      EXPECT_EQ(lines[2 + i].find("\"process"), std::string::npos) << "events do not repeat the process";
      continue;
    }
    EXPECT_EQ(lines[2 + i], want[i]) << "line " << 2 + i;
  }
}

TEST(TraceWriterProcesses, OneProcessTraceHasNoProcessKeys) {
  ScratchDir dir;
  const std::string path = dir.File("one.rvtrace");
  Result<TraceWriter> writer = TraceWriter::Create(path, TestHeader());
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE(writer->Write(Ev(10, EventName::kGvlAcquired, 1, 31337)).ok());
  ASSERT_TRUE(writer->Write(Ev(20, EventName::kThreadStarted, 2, 31338)).ok());
  ASSERT_TRUE(writer->Finish(FinishInfo{.end_t_ns = 30}).ok());
  const std::string content = ReadAll(path);
  EXPECT_EQ(content.find("\"process"), std::string::npos) << content;
  EXPECT_NE(content.find(R"({"thread":{"ruby_thread":2,"main":false}})"), std::string::npos) << content;
}

}  // namespace
}  // namespace rvbpfd
