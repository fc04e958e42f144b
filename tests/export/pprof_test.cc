#include "export/pprof.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "pprof_test_util.h"

namespace rvbpfd {
namespace {

using testing::DecodedProfile;
using testing::DecodedSample;
using testing::DecodeProfile;
using testing::Gunzip;
using testing::SyntheticTrace;

constexpr uint64_t kMs = 1'000'000;

// Sum of value `index` over samples whose leaf-first frames equal `frames`.
int64_t ValueFor(const DecodedProfile& p, const std::vector<std::string>& leaf_first, size_t index) {
  int64_t sum = 0;
  for (const DecodedSample& s : p.samples) {
    if (s.frames == leaf_first) sum += s.values.at(index);
  }
  return sum;
}

int64_t Total(const DecodedProfile& p, size_t index) {
  int64_t sum = 0;
  for (const DecodedSample& s : p.samples) sum += s.values.at(index);
  return sum;
}

// A CPU-bound thread 1 sampled in two stacks (hot 3x the cold one), thread 2 sampled once.
TraceFile CpuTrace(uint32_t hz, int hot, int cold) {
  SyntheticTrace t(hz);
  const uint32_t hot_stack = t.Stack({"<main>", "Foo.run", "Integer#times", "block in Foo.run", "Foo#hot"});
  const uint32_t cold_stack = t.Stack({"<main>", "Foo.run", "Foo#cold"});
  const uint32_t other = t.Stack({"<main>", "block in <main>", "Bar#work"});
  uint64_t now = kMs;
  t.Event(now, EventName::kGvlAcquired, 1);
  for (int i = 0; i < hot; ++i) t.Event(now += kMs, EventName::kSample, 1, hot_stack);
  for (int i = 0; i < cold; ++i) t.Event(now += kMs, EventName::kSample, 1, cold_stack);
  t.Event(now += kMs, EventName::kSample, 2, other);
  return t.Finish(now + kMs);
}

TEST(PprofExport, CpuSamplesCountAndNanosecondsAtThePeriod) {
  const TraceFile trace = CpuTrace(/*hz=*/250, /*hot=*/30, /*cold=*/10);
  const DecodedProfile p = DecodeProfile(BuildPprofProfile(trace));
  ASSERT_TRUE(p.errors.empty()) << p.errors.front();
  ASSERT_EQ(p.sample_types.size(), 5u);
  EXPECT_EQ(p.sample_types[0], std::make_pair(std::string("samples"), std::string("count")));
  EXPECT_EQ(p.sample_types[1], std::make_pair(std::string("cpu"), std::string("nanoseconds")));
  EXPECT_EQ(p.sample_types[2], std::make_pair(std::string("gvl_wait"), std::string("nanoseconds")));
  EXPECT_EQ(p.sample_types[3], std::make_pair(std::string("gvl_blame"), std::string("nanoseconds")));
  EXPECT_EQ(p.sample_types[4], std::make_pair(std::string("wall"), std::string("nanoseconds")));
  EXPECT_EQ(p.default_sample_type, "cpu");
  EXPECT_EQ(p.period_type, std::make_pair(std::string("cpu"), std::string("nanoseconds")));
  EXPECT_EQ(p.period, 4'000'000);  // 1e9 / 250 Hz

  const std::vector<std::string> hot = {"Foo#hot", "block in Foo.run", "Integer#times", "Foo.run", "<main>"};
  const std::vector<std::string> cold = {"Foo#cold", "Foo.run", "<main>"};
  EXPECT_EQ(ValueFor(p, hot, 0), 30);
  EXPECT_EQ(ValueFor(p, hot, 1), 30 * 4'000'000);
  EXPECT_EQ(ValueFor(p, cold, 0), 10);
  EXPECT_EQ(ValueFor(p, cold, 1), 10 * 4'000'000);
  EXPECT_EQ(Total(p, 0), 41);
  EXPECT_EQ(Total(p, 2), 0);  // no waits in this trace

  // Thread labels: thread 1 is main, thread 2 is "Thread #2".
  for (const DecodedSample& s : p.samples) {
    if (s.frames == hot) {
      EXPECT_EQ(s.str_labels.at("thread"), "main");
      EXPECT_EQ(s.num_labels.at("ruby_thread"), 1);
    } else if (s.frames.front() == "Bar#work") {
      EXPECT_EQ(s.str_labels.at("thread"), "Thread #2");
      EXPECT_EQ(s.num_labels.at("ruby_thread"), 2);
    }
  }
  // Wall time of the origin and the duration are carried over.
  EXPECT_EQ(p.time_nanos, 1738324800'250'000'000);  // 2025-01-31T12:00:00.25Z
  EXPECT_GT(p.duration_nanos, 40 * static_cast<int64_t>(kMs));
  // Functions keep their file; locations their line.
  bool found = false;
  for (const auto& [id, fn] : p.functions) {
    found |= fn == std::make_pair(std::string("Foo#hot"), std::string("/app/Foo#hot.rb"));
  }
  EXPECT_TRUE(found);
}

TEST(PprofExport, ImpossibleTimesInTheTraceSaturateInsteadOfOverflowing) {
  TraceFile trace = CpuTrace(/*hz=*/250, /*hot=*/3, /*cold=*/1);
  // Year 4052 is past what int64 nanoseconds hold (2262): no time is claimed rather than a wrapped one (1714).
  trace.header.started_at = "4052-01-31T12:00:00.250000Z";
  ASSERT_TRUE(trace.summary.has_value());
  trace.summary->duration_ms = 1e300;
  DecodedProfile p = DecodeProfile(BuildPprofProfile(trace));
  ASSERT_TRUE(p.errors.empty()) << p.errors.front();
  EXPECT_EQ(p.time_nanos, 0);
  EXPECT_EQ(p.duration_nanos, INT64_MAX);
  trace.header.started_at = "1500-01-01T00:00:00.0Z";
  trace.summary->duration_ms = -5;
  p = DecodeProfile(BuildPprofProfile(trace));
  EXPECT_EQ(p.time_nanos, 0);
  EXPECT_EQ(p.duration_nanos, 0);
  trace.header.started_at = "2262-04-11T23:47:16.854775807Z";  // the last instant int64 ns can hold
  p = DecodeProfile(BuildPprofProfile(trace));
  EXPECT_EQ(p.time_nanos, INT64_MAX);
  trace.summary->duration_ms = std::nan("");
  p = DecodeProfile(BuildPprofProfile(trace));
  EXPECT_EQ(p.duration_nanos, 0);
}

TEST(PprofExport, SampleHzMissingAssumesTheDefaultAndSaysSo) {
  SyntheticTrace t(std::nullopt);
  const uint32_t s = t.Stack({"<main>", "x"});
  t.Event(kMs, EventName::kSample, 1, s);
  const DecodedProfile p = DecodeProfile(BuildPprofProfile(t.Finish(2 * kMs)));
  ASSERT_TRUE(p.errors.empty()) << p.errors.front();
  EXPECT_EQ(p.period, static_cast<int64_t>(1'000'000'000 / kDefaultSampleHz));
  bool noted = false;
  for (const std::string& c : p.comments) noted |= c.find("no sample_hz") != std::string::npos;
  EXPECT_TRUE(noted);
}

TEST(PprofExport, GvlWaitIsAttributedToTheWaitersStack) {
  SyntheticTrace t(99);
  const uint32_t sleeping = t.Stack({"<main>", "Worker#run", "Kernel#sleep"});
  const uint32_t io = t.Stack({"<main>", "Reader#run", "IO#read"});
  const uint32_t sampled = t.Stack({"<main>", "Cruncher#run", "Cruncher#step"});
  const uint32_t own = t.Stack({"<main>", "Own#wait"});
  // Thread 2: releases in Kernel#sleep, later wants the GVL for 2.5 ms, then again for 1 ms after an IO release.
  t.Event(100, EventName::kGvlReleased, 2, sleeping);
  t.Event(1000, EventName::kWantsGvl, 2);
  t.Event(1000 + 2500, EventName::kGvlAcquired, 2);
  t.Event(4000, EventName::kGvlReleased, 2, io);
  t.Event(5000, EventName::kWantsGvl, 2);
  t.Event(5100, EventName::kWantsGvl, 2);  // a repeated READY does not restart the wait
  t.Event(6000, EventName::kGvlAcquired, 2);
  // Thread 3: no release stack, but a sample: its wait goes to the sampled stack.
  t.Event(7000, EventName::kSample, 3, sampled);
  t.Event(7100, EventName::kGvlReleased, 3);
  t.Event(7200, EventName::kWantsGvl, 3);
  t.Event(7900, EventName::kGvlAcquired, 3);
  // Thread 4: nothing known: "[no stack]".
  t.Event(8000, EventName::kWantsGvl, 4);
  t.Event(8400, EventName::kGvlAcquired, 4);
  // Thread 5: the wants_gvl carries its own stack, which wins over the release's.
  t.Event(8500, EventName::kGvlReleased, 5, sleeping);
  t.Event(8600, EventName::kWantsGvl, 5, own);
  t.Event(8650, EventName::kGvlAcquired, 5);
  // Thread 7 (3.2 timeslice: READY/RESUMED with no SUSPENDED): the release before it ran again is stale, its latest
  // sample is not.
  t.Event(8700, EventName::kGvlReleased, 7, io);
  t.Event(8710, EventName::kWantsGvl, 7);
  t.Event(8720, EventName::kGvlAcquired, 7);  // 10 ns on io
  t.Event(8730, EventName::kSample, 7, sleeping);
  t.Event(8740, EventName::kWantsGvl, 7);
  t.Event(8770, EventName::kGvlAcquired, 7);  // 30 ns on the sampled stack
  // Thread 6: lost events inside the wait: not counted.
  t.Event(9000, EventName::kGvlReleased, 6, io);
  t.Event(9100, EventName::kWantsGvl, 6);
  t.Event(9200, EventName::kEventsDropped, std::nullopt);
  t.Event(99000, EventName::kGvlAcquired, 6);
  const TraceFile trace = t.Finish(100000);

  const StackProfile agg = AggregateStacks(trace);
  EXPECT_EQ(agg.waits, 7u);
  EXPECT_EQ(agg.waits_skipped, 1u);
  EXPECT_EQ(agg.total_gvl_wait_ns, 2500u + 1000u + 700u + 400u + 50u + 10u + 30u);

  const DecodedProfile p = DecodeProfile(BuildPprofProfile(trace));
  ASSERT_TRUE(p.errors.empty()) << p.errors.front();
  EXPECT_EQ(ValueFor(p, {"Kernel#sleep", "Worker#run", "<main>"}, 2), 2500 + 30);
  EXPECT_EQ(ValueFor(p, {"IO#read", "Reader#run", "<main>"}, 2), 1000 + 10);
  EXPECT_EQ(ValueFor(p, {"Cruncher#step", "Cruncher#run", "<main>"}, 2), 700);
  EXPECT_EQ(ValueFor(p, {std::string(kNoStackFrame)}, 2), 400);
  EXPECT_EQ(ValueFor(p, {"Own#wait", "<main>"}, 2), 50);
  EXPECT_EQ(Total(p, 2), 2500 + 1000 + 700 + 400 + 50 + 10 + 30);
  EXPECT_EQ(Total(p, 0), 2);  // the samples of threads 3 and 7
  bool noted = false;
  for (const std::string& c : p.comments) noted |= c.find("1 GVL waits not counted") != std::string::npos;
  EXPECT_TRUE(noted);
}

TEST(PprofExport, WaitsEstimatedWhilePausedAreLabelledInferredApartFromTheObservedOnes) {
  SyntheticTrace t(100);  // 10 ms a sample
  constexpr uint64_t kMs = 1'000'000;
  const uint32_t spin = t.Stack({"<main>", "HogKlass.spin"});
  const uint32_t gc = t.GcStack({"<main>", "HogKlass.spin"});
  const uint32_t io = t.Stack({"<main>", "IO#write"});
  // An observed wait of thread 3 on hog 2 (blame derived), then a pause during which 3 and 4 wait on the hog.
  t.Event(0, EventName::kGvlAcquired, 2);
  t.Event(1 * kMs, EventName::kGvlReleased, 3, io);
  t.Event(1 * kMs, EventName::kGvlReleased, 4, io);
  t.Event(2 * kMs, EventName::kWantsGvl, 3);
  t.Event(5 * kMs, EventName::kSample, 2, spin);
  t.Event(12 * kMs, EventName::kGvlReleased, 2, spin);
  t.Event(12 * kMs, EventName::kGvlAcquired, 3);  // 10 ms observed
  t.Event(13 * kMs, EventName::kGvlReleased, 3, io);
  t.Event(13 * kMs, EventName::kGvlAcquired, 2);
  t.Event(20 * kMs, EventName::kTracingPaused, std::nullopt);
  t.Reading(30 * kMs, 2, spin, 2, {3, 4});
  t.Reading(40 * kMs, 2, gc, 2, {3, 4});
  t.Reading(50 * kMs, 2, spin, 2, {3, 4});
  t.Event(60 * kMs, EventName::kTracingResumed, std::nullopt);
  t.Event(70 * kMs, EventName::kGvlReleased, 2, spin);
  t.Event(70 * kMs, EventName::kGvlAcquired, 3);
  t.Event(71 * kMs, EventName::kGvlAcquired, 4);
  const TraceFile trace = t.Finish(80 * kMs);

  const StackProfile agg = AggregateStacks(trace);
  EXPECT_EQ(agg.total_gvl_wait_ns, 10 * kMs);
  // 3 and 4 were blocked at the pause: each joined the queue between 20 and 30 ms (half of it), then waited to its
  // gvl_acquired (70 and 71 ms).
  EXPECT_EQ(agg.total_estimated_gvl_wait_ns, (5 + 40) * kMs + (5 + 41) * kMs);
  const DecodedProfile p = DecodeProfile(BuildPprofProfile(trace));
  ASSERT_TRUE(p.errors.empty()) << p.errors.front();
  const size_t wait = 2, blame = 3;
  int64_t observed_wait = 0, inferred_wait = 0, derived_blame = 0, inferred_blame = 0, gc_blame = 0;
  for (const DecodedSample& s : p.samples) {
    const auto prov = s.str_labels.find("provenance");
    const std::string provenance = prov == s.str_labels.end() ? "" : prov->second;
    if (s.values[wait] > 0) (provenance == "inferred" ? inferred_wait : observed_wait) += s.values[wait];
    if (s.values[blame] > 0) {
      EXPECT_TRUE(provenance == "derived" || provenance == "inferred") << "blame without provenance";
      (provenance == "inferred" ? inferred_blame : derived_blame) += s.values[blame];
      if (provenance == "inferred") {
        EXPECT_EQ(s.str_labels.at("holder"), "Thread #2");
        ASSERT_FALSE(s.frames.empty());
        if (s.frames[0] == std::string(kGcFrame)) gc_blame += s.values[blame];
      }
    }
  }
  EXPECT_EQ(observed_wait, static_cast<int64_t>(10 * kMs));
  EXPECT_EQ(inferred_wait, static_cast<int64_t>(agg.total_estimated_gvl_wait_ns));
  EXPECT_EQ(derived_blame, static_cast<int64_t>(10 * kMs));
  EXPECT_EQ(inferred_blame, inferred_wait);
  EXPECT_EQ(gc_blame, static_cast<int64_t>(2 * 10 * kMs)) << "[35, 45) ms of both waiters lies next to the GC reading";
  bool noted = false;
  for (const std::string& c : p.comments) {
    noted |= c.find("estimated from the samples' GVL readings") != std::string::npos;
  }
  EXPECT_TRUE(noted);
}

TEST(PprofExport, GzipRoundTripsAndStartsWithTheGzipMagic) {
  const TraceFile trace = CpuTrace(99, 5, 2);
  std::ostringstream out;
  ASSERT_TRUE(ExportPprof(trace, out).ok());
  const std::string gz = out.str();
  ASSERT_GE(gz.size(), 18u);
  EXPECT_EQ(static_cast<uint8_t>(gz[0]), 0x1f);
  EXPECT_EQ(static_cast<uint8_t>(gz[1]), 0x8b);
  EXPECT_EQ(Gunzip(gz), BuildPprofProfile(trace));
}

TEST(PprofExport, GzipReusesItsStateWithoutCarryingAnythingOver) {
  // One state per thread, reset per call: every call must equal a fresh compression of its own input, whatever came
  // before (a large input that outgrew the scratch buffer, an empty one, a small one twice).
  std::string big;
  for (int i = 0; big.size() < (3u << 20); ++i) big += "frame " + std::to_string(i * 7919 % 100003) + ";";
  const std::string small = "abcabcabc";
  const std::vector<std::string> inputs = {small, big, "", small, big.substr(0, 1000), small};
  std::vector<std::string> first;
  for (const std::string& in : inputs) {
    Result<std::string> gz = Gzip(in);
    ASSERT_TRUE(gz.ok());
    EXPECT_EQ(Gunzip(*gz), in);
    first.push_back(*gz);
  }
  EXPECT_EQ(first[0], first[3]);
  EXPECT_EQ(first[0], first[5]);
  // The same inputs on a new thread (a fresh state) give the same bytes.
  std::vector<std::string> fresh;
  std::thread([&] {
    for (const std::string& in : inputs) fresh.push_back(Gzip(in).value());
  }).join();
  EXPECT_EQ(fresh, first);
}

// One gzip stream of `in` by a fresh zlib deflate state at `level` (windowBits 15, memLevel 8, as Gzip's).
std::string ReferenceGzip(const std::string& in, int level) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&zs, static_cast<uLong>(in.size())) + 32, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = static_cast<uInt>(in.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(out.size() - zs.avail_out);
  deflateEnd(&zs);
  return out;
}

TEST(PprofExport, GzipStoresSmallInputsAndCompressesTheOthersFast) {
  // Under kGzipStoreBelowBytes stored (level 0), from there on level 1; each decodes to its input.
  std::string text;
  for (int i = 0; text.size() < 2 * kGzipStoreBelowBytes; ++i) text += "frame " + std::to_string(i % 37) + ";";
  const std::string small = text.substr(0, kGzipStoreBelowBytes - 1);
  const std::string large = text.substr(0, kGzipStoreBelowBytes);
  ASSERT_NE(ReferenceGzip(small, 0), ReferenceGzip(small, Z_BEST_SPEED));
  EXPECT_EQ(Gzip(small).value(), ReferenceGzip(small, 0));
  EXPECT_GT(Gzip(small)->size(), small.size());  // stored: the input plus the gzip and block headers
  EXPECT_EQ(Gzip(large).value(), ReferenceGzip(large, Z_BEST_SPEED));
  EXPECT_LT(Gzip(large)->size(), large.size() / 4);
  EXPECT_EQ(Gunzip(Gzip(small).value()), small);
  EXPECT_EQ(Gunzip(Gzip(large).value()), large);
}

TEST(PprofExport, LargeValuesAndIdsEncodeAsMultiByteVarints) {
  // > 127 distinct frames and stacks and values past 2^32 exercise every varint length the encoder emits.
  SyntheticTrace t(1);  // 1 Hz: each sample is 1e9 ns, so 5000 samples is 5e12 ns (> 2^32)
  std::vector<uint32_t> stacks;
  for (int i = 0; i < 300; ++i) stacks.push_back(t.Stack({"<main>", "m" + std::to_string(i)}));
  uint64_t now = 0;
  for (int i = 0; i < 5000; ++i) t.Event(now += 10, EventName::kSample, 1, stacks[static_cast<size_t>(i) % 300]);
  for (int i = 0; i < 5000; ++i) t.Event(now += 10, EventName::kSample, 1, stacks[0]);
  const DecodedProfile p = DecodeProfile(BuildPprofProfile(t.Finish(now + 10)));
  ASSERT_TRUE(p.errors.empty()) << p.errors.front();
  EXPECT_EQ(Total(p, 0), 10000);
  EXPECT_EQ(Total(p, 1), 10000LL * 1'000'000'000LL);
  // 300 methods, <main>, and the wall profile's "[unknown]": the thread has samples but no scheduler event, so how
  // its time was spent between them is not known.
  EXPECT_EQ(p.functions.size(), 302u);
  // 5000 / 300 = 16 remainder 200: stack 0 got 17 in the first loop.
  EXPECT_EQ(ValueFor(p, {"m0", "<main>"}, 0), 5017);
}

TEST(PprofExport, EverySampleCarriesItsStacksEndpoint) {
  SyntheticTrace t(100);
  // Root first: a Rails action under its dispatch, and a thread outside any request.
  const uint32_t action = t.Stack({"Puma::Server#process_client", "AbstractController::Base#process_action",
                                   "ActionController::BasicImplicitRender#send_action", "LedgerController#cpu",
                                   "LedgerCruncher.reconcile"});
  const uint32_t waiting = t.Stack({"Puma::Server#process_client", "AbstractController::Base#process_action",
                                    "ActionController::BasicImplicitRender#send_action", "LedgerController#db"});
  const uint32_t idle = t.Stack({"Puma::ThreadPool#spawn_thread", "Thread::ConditionVariable#wait"});
  // Thread 1 holds the GVL in the action (sampled) while thread 2 waits for it from another action.
  t.Event(100, EventName::kGvlAcquired, 1);
  t.Event(200, EventName::kGvlReleased, 2, waiting);
  t.Event(300, EventName::kWantsGvl, 2);
  t.Event(400, EventName::kSample, 1, action);
  t.Event(900, EventName::kGvlReleased, 1, action);
  t.Event(900, EventName::kGvlAcquired, 2);
  t.Event(950, EventName::kSample, 3, idle);
  const DecodedProfile p = DecodeProfile(BuildPprofProfile(t.Finish(1000)));
  ASSERT_TRUE(p.errors.empty()) << p.errors.front();
  std::map<std::string, int64_t> cpu, wait, blame;
  for (const DecodedSample& s : p.samples) {
    ASSERT_TRUE(s.str_labels.contains("endpoint")) << s.frames.front();
    const std::string endpoint = s.str_labels.at("endpoint");
    // The rule travels with every named endpoint, and with none of the others.
    EXPECT_EQ(s.str_labels.contains("endpoint_rule"), endpoint != "-") << endpoint;
    if (endpoint != "-") EXPECT_EQ(s.str_labels.at("endpoint_rule"), "rails_action");
    cpu[endpoint] += s.values[0];
    wait[endpoint] += s.values[2];
    blame[endpoint] += s.values[3];
  }
  EXPECT_EQ(cpu, (std::map<std::string, int64_t>{{"-", 1}, {"LedgerController#cpu", 1}, {"LedgerController#db", 0}}));
  // The wait is the waiter's endpoint's; its blame the holder's (what the holder's endpoint caused to others).
  EXPECT_EQ(wait["LedgerController#db"], 600);
  EXPECT_EQ(wait["LedgerController#cpu"], 0);
  EXPECT_EQ(blame["LedgerController#cpu"], 600);
  EXPECT_EQ(blame["LedgerController#db"], 0);
}

TEST(PprofExport, SamplesWithoutStacksGoToTheNoStackFrame) {
  SyntheticTrace t(100);
  t.Event(10, EventName::kSample, 1);
  t.Event(20, EventName::kSample, std::nullopt);
  const DecodedProfile p = DecodeProfile(BuildPprofProfile(t.Finish(30)));
  ASSERT_TRUE(p.errors.empty()) << p.errors.front();
  EXPECT_EQ(ValueFor(p, {std::string(kNoStackFrame)}, 0), 2);
  for (const DecodedSample& s : p.samples) {
    // The sample about no known thread has no thread label rather than an invented one.
    if (s.str_labels.empty()) {
      EXPECT_TRUE(s.num_labels.empty());
    }
  }
}

// The acceptance check: the real pprof tool reads the file, and the hot method tops -top.
std::string RunCommand(const std::string& cmd, int* status) {
  std::string out;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) {
    *status = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  *status = ::pclose(pipe);
  return out;
}

// The function name on the first data row of `go tool pprof -top` (rows follow the "flat  flat%" header).
std::string TopFunction(const std::string& top_output) {
  std::istringstream in(top_output);
  std::string line;
  bool header_seen = false;
  while (std::getline(in, line)) {
    if (!header_seen) {
      header_seen = line.find("flat%") != std::string::npos;
      continue;
    }
    // Columns: flat flat% sum% cum cum% name...; the name may hold spaces ("block in Foo.run").
    std::istringstream row(line);
    std::string col;
    for (int i = 0; i < 5 && row >> col; ++i) {
    }
    std::string name;
    std::getline(row, name);
    const size_t start = name.find_first_not_of(' ');
    return start == std::string::npos ? "" : name.substr(start);
  }
  return "";
}

TEST(PprofExport, GoToolPprofReadsItAndTheHotMethodTopsTheList) {
  int status = 0;
  RunCommand("command -v go >/dev/null 2>&1", &status);
  if (status != 0) GTEST_SKIP() << "go is not installed (tools/install-deps.sh installs golang-go): cannot run pprof";

  SyntheticTrace t(99);
  // Ruby labels with '<', '>' and '(' must reach pprof's output unchanged (it has C++ name heuristics).
  const uint32_t hot = t.Stack({"<main>", "block in <main>", "Foo.run", "Integer#times", "block in Foo.run",
                                "Foo#hot"});
  const uint32_t warm = t.Stack({"<main>", "block in <main>", "Foo.run", "#<Class:0x000055d5c0ffee00>#warm"});
  const uint32_t cold = t.Stack({"<main>", "Bar#cold"});
  const uint32_t waiting = t.Stack({"<main>", "Waiter#run", "Kernel#sleep"});
  uint64_t now = 0;
  for (int i = 0; i < 60; ++i) t.Event(now += kMs, EventName::kSample, 1, hot);
  for (int i = 0; i < 25; ++i) t.Event(now += kMs, EventName::kSample, 1, warm);
  for (int i = 0; i < 10; ++i) t.Event(now += kMs, EventName::kSample, 2, cold);
  t.Event(now += kMs, EventName::kGvlReleased, 3, waiting);
  t.Event(now += kMs, EventName::kWantsGvl, 3);
  t.Event(now += 500 * kMs, EventName::kGvlAcquired, 3);
  const TraceFile trace = t.Finish(now + kMs);
  const std::string path = t.dir() + "/cpu.pb.gz";
  {
    std::ofstream out(path, std::ios::binary);
    ASSERT_TRUE(ExportPprof(trace, out).ok());
  }
  // HOME/GOCACHE are set so the tool runs the same under a bare test environment (ctest, root without HOME).
  const std::string env = "HOME=" + t.dir() + " GOCACHE=" + t.dir() + "/gocache GOFLAGS=-mod=mod ";
  const std::string cpu = RunCommand(env + "go tool pprof -top " + path + " 2>&1", &status);
  ASSERT_EQ(status, 0) << cpu;
  std::printf("go tool pprof -top:\n%s", cpu.c_str());  // kept in the test log as evidence
  EXPECT_EQ(TopFunction(cpu), "Foo#hot") << cpu;
  EXPECT_NE(cpu.find("Type: cpu"), std::string::npos) << cpu;
  for (const char* name : {"  #<Class:0x000055d5c0ffee00>#warm\n", "  block in <main>\n", "  <main>\n",
                           "  block in Foo.run\n", "  Integer#times\n"}) {
    EXPECT_NE(cpu.find(name), std::string::npos) << name << " not in:\n" << cpu;
  }
  EXPECT_EQ(cpu.find("[ruby"), std::string::npos) << "a frame lost its name:\n" << cpu;

  // The gvl_wait view: the sleeper's stack tops it.
  const std::string wait = RunCommand(env + "go tool pprof -top -sample_index=gvl_wait " + path + " 2>&1", &status);
  ASSERT_EQ(status, 0) << wait;
  EXPECT_EQ(TopFunction(wait), "Kernel#sleep") << wait;

  // Thread labels are usable for filtering: only thread 2's work remains.
  const std::string tagged =
      RunCommand(env + "go tool pprof -top -tagfocus=thread=Thread.#2 " + path + " 2>&1", &status);
  ASSERT_EQ(status, 0) << tagged;
  EXPECT_EQ(TopFunction(tagged), "Bar#cold") << tagged;
  EXPECT_EQ(tagged.find("Foo#hot"), std::string::npos) << tagged;
}

}  // namespace
}  // namespace rvbpfd
