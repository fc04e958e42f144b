#include "trace/event.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace rvbpfd {
namespace {

rv_record MakeRecord(uint64_t ts, uint16_t kind, uint32_t serial, uint32_t tid, uint32_t probe_tid, uint32_t flags) {
  rv_record r{};
  r.ts_ns = ts;
  r.th = 0x7f0000001000;
  r.serial = serial;
  r.tid = tid;
  r.probe_tid = probe_tid;
  r.pid = 4242;
  r.kind = kind;
  r.site = 3;
  r.flags = flags;
  return r;
}

TEST(EventNames, EveryNameRoundTripsAndIsDistinct) {
  std::set<std::string_view> seen;
  for (size_t i = 0; i < kEventNameCount; ++i) {
    const auto event = static_cast<EventName>(i);
    const std::string_view name = EventNameString(event);
    EXPECT_TRUE(seen.insert(name).second) << "duplicate name " << name;
    ASSERT_TRUE(ParseEventName(name).has_value()) << name;
    EXPECT_EQ(*ParseEventName(name), event) << name;
  }
  EXPECT_FALSE(ParseEventName("gvl_stolen").has_value());
  EXPECT_FALSE(ParseEventName("").has_value());
}

TEST(EventNames, DocumentedSpellings) {
  // The list, in the order of EventName, spelled out independently of the table under test.
  const char* expected[] = {"tracing_started", "thread_started", "wants_gvl",       "gvl_acquired", "gvl_released",
                            "thread_exited",   "gc_enter",       "gc_exit",         "sleep_enter",  "mutex_lock_enter",
                            "events_dropped",  "tracing_stopped", "tracing_paused", "tracing_resumed",
                            "sample"};
  ASSERT_EQ(std::size(expected), kEventNameCount);
  for (size_t i = 0; i < kEventNameCount; ++i) EXPECT_EQ(EventNameString(static_cast<EventName>(i)), expected[i]);
}

TEST(EventNames, CrubyConstants) {
  EXPECT_EQ(CrubyEventConstant(EventName::kThreadStarted), "RUBY_INTERNAL_THREAD_EVENT_STARTED");
  EXPECT_EQ(CrubyEventConstant(EventName::kWantsGvl), "RUBY_INTERNAL_THREAD_EVENT_READY");
  EXPECT_EQ(CrubyEventConstant(EventName::kGvlAcquired), "RUBY_INTERNAL_THREAD_EVENT_RESUMED");
  EXPECT_EQ(CrubyEventConstant(EventName::kGvlReleased), "RUBY_INTERNAL_THREAD_EVENT_SUSPENDED");
  EXPECT_EQ(CrubyEventConstant(EventName::kThreadExited), "RUBY_INTERNAL_THREAD_EVENT_EXITED");
  EXPECT_EQ(CrubyEventConstant(EventName::kGcEnter), "RUBY_INTERNAL_EVENT_GC_ENTER");
  EXPECT_EQ(CrubyEventConstant(EventName::kGcExit), "RUBY_INTERNAL_EVENT_GC_EXIT");
  for (EventName e : {EventName::kTracingStarted, EventName::kSleepEnter, EventName::kMutexLockEnter,
                      EventName::kEventsDropped, EventName::kTracingStopped, EventName::kTracingPaused,
                      EventName::kTracingResumed, EventName::kSample}) {
    EXPECT_TRUE(CrubyEventConstant(e).empty()) << EventNameString(e);
  }
}

TEST(EventNames, Provenance) {
  for (Provenance p : {Provenance::kObserved, Provenance::kDerived, Provenance::kInferred}) {
    ASSERT_TRUE(ParseProvenance(ProvenanceString(p)).has_value());
    EXPECT_EQ(*ParseProvenance(ProvenanceString(p)), p);
  }
  EXPECT_EQ(ProvenanceString(Provenance::kDerived), "derived");
  EXPECT_FALSE(ParseProvenance("guessed").has_value());
}

TEST(EventNames, InternSourceKeepsKnownAndCopiesOthers) {
  std::string probe = "probe";
  const std::string_view known = InternSource(probe);
  probe.assign("xxxxx");
  EXPECT_EQ(known, "probe");
  std::string foreign = "line_channel";
  const std::string_view a = InternSource(foreign);
  foreign.assign("overwritten!");  // the interned view must not depend on the caller's buffer
  EXPECT_EQ(a, "line_channel");
  EXPECT_EQ(InternSource("line_channel").data(), a.data());
}

TEST(FromRecord, MapsEveryKind) {
  struct Row {
    uint16_t kind;
    EventName event;
    std::string_view source;
  } rows[] = {
      {RV_EV_THREAD_STARTED, EventName::kThreadStarted, "thread_hook_site"},
      {RV_EV_THREAD_READY, EventName::kWantsGvl, "thread_hook_site"},
      {RV_EV_THREAD_RESUMED, EventName::kGvlAcquired, "thread_hook_site"},
      {RV_EV_THREAD_SUSPENDED, EventName::kGvlReleased, "thread_hook_site"},
      {RV_EV_THREAD_EXITED, EventName::kThreadExited, "thread_hook_site"},
      {RV_EV_GC_ENTER, EventName::kGcEnter, "gc_hook_site"},
      {RV_EV_GC_EXIT, EventName::kGcExit, "gc_hook_site"},
      {RV_EV_SLEEP_ENTER, EventName::kSleepEnter, "probe"},
      {RV_EV_MUTEX_LOCK_ENTER, EventName::kMutexLockEnter, "probe"},
  };
  for (const Row& row : rows) {
    const uint64_t origin = 1'000'000'000;
    const TraceEvent e = FromRecord(MakeRecord(origin + 12'345, row.kind, 2, 1001, 1002, 0), origin);
    EXPECT_TRUE(IsKnownRecordKind(row.kind));
    EXPECT_EQ(e.event, row.event) << row.kind;
    EXPECT_EQ(e.source, row.source) << row.kind;
    EXPECT_EQ(e.provenance, Provenance::kObserved);
    EXPECT_EQ(e.t_ns, 12'345u);
    EXPECT_FALSE(e.ruby_thread.has_value());  // numbered later by ThreadIds, in timestamp order
    EXPECT_EQ(e.th, 0x7f0000001000u);
    EXPECT_EQ(e.native_tid, std::optional<uint32_t>(1001));
    EXPECT_EQ(e.probe_tid, std::optional<uint32_t>(1002));
  }
}

TEST(FromRecord, FlagsMakeFieldsUnknown) {
  const TraceEvent no_th = FromRecord(MakeRecord(10, RV_EV_THREAD_RESUMED, 7, 55, 56, RV_REC_TH_UNKNOWN), 0);
  EXPECT_EQ(no_th.th, 0u);
  EXPECT_EQ(no_th.native_tid, std::optional<uint32_t>(55));  // runs on its own thread: the tid is known
  EXPECT_EQ(no_th.probe_tid, std::optional<uint32_t>(56));

  const TraceEvent no_tid = FromRecord(MakeRecord(10, RV_EV_THREAD_READY, 7, 0, 56, RV_REC_TID_UNKNOWN), 0);
  EXPECT_EQ(no_tid.th, 0x7f0000001000u);
  EXPECT_FALSE(no_tid.native_tid.has_value());
}

TEST(FromRecord, TimestampsBeforeOriginClampToZero) {
  const TraceEvent e = FromRecord(MakeRecord(999, RV_EV_GC_ENTER, 1, 1, 1, 0), 1000);
  EXPECT_EQ(e.t_ns, 0u);
  EXPECT_EQ(FromRecord(MakeRecord(1000, RV_EV_GC_ENTER, 1, 1, 1, 0), 1000).t_ns, 0u);
  EXPECT_EQ(FromRecord(MakeRecord(1001, RV_EV_GC_ENTER, 1, 1, 1, 0), 1000).t_ns, 1u);
}

TEST(FromRecord, UnknownKindBecomesOneDroppedEvent) {
  for (uint16_t kind : {uint16_t{RV_EV_NONE}, uint16_t{RV_EV_KIND_COUNT}, uint16_t{999}}) {
    EXPECT_FALSE(IsKnownRecordKind(kind));
    const TraceEvent e = FromRecord(MakeRecord(50, kind, 1, 1, 1, 0), 0);
    EXPECT_EQ(e.event, EventName::kEventsDropped);
    EXPECT_EQ(e.count, 1u);
    EXPECT_EQ(e.source, kSourceDaemon);
    EXPECT_FALSE(e.ruby_thread.has_value());
  }
}

}  // namespace
}  // namespace rvbpfd
