#include "agent/process_profile.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <tuple>

#include "export/pprof.h"
#include "export/pprof_test_util.h"
#include "model/rails_stacks.h"
#include "rvbpfd/abi.h"

namespace rvbpfd {
namespace {

using testing::DecodedProfile;
using testing::DecodedSample;

constexpr uint64_t kPeriod = 1'000'000'000 / 19;  // 19 Hz
const std::string kGc(kGcFrameLabel);
const std::string kNoStack(kNoStackFrame);
const std::string kFull(kStackTableFullFrame);

// A Ruby stack from labels given leaf first.
std::vector<FrameInfo> Stack(std::vector<std::string> leaf_first) {
  std::vector<FrameInfo> out;
  for (std::string& l : leaf_first) {
    out.push_back(FrameInfo{l, "/app/" + l + ".rb", static_cast<int32_t>(10 + l.size()), FrameKind::kRuby});
  }
  return out;
}
const std::vector<FrameInfo> kNone;

// Decodes the gzipped profile of `type` among `built`; nullopt when that profile was not produced.
std::optional<DecodedProfile> Get(const std::vector<BuiltProfile>& built, std::string_view type) {
  for (const BuiltProfile& b : built) {
    if (b.profile_type != type) continue;
    const std::string raw = testing::Gunzip(b.pprof_gz);
    EXPECT_FALSE(raw.empty()) << type << " does not gunzip";
    DecodedProfile p = testing::DecodeProfile(raw);
    EXPECT_TRUE(p.errors.empty()) << type << ": " << p.errors.front();
    return p;
  }
  return std::nullopt;
}

uint64_t TotalOf(const std::vector<BuiltProfile>& built, std::string_view type) {
  for (const BuiltProfile& b : built) {
    if (b.profile_type == type) return b.total;
  }
  return 0;
}

// Value `index` of the sample whose frames (leaf first) are `frames`; 0 when absent. Each stack appears once.
int64_t ValueFor(const DecodedProfile& p, const std::vector<std::string>& frames, size_t index = 0) {
  int64_t v = 0;
  int seen = 0;
  for (const DecodedSample& s : p.samples) {
    if (s.frames == frames) {
      v += s.values.at(index);
      ++seen;
    }
  }
  EXPECT_LE(seen, 1) << "a stack appears in more than one sample";
  return v;
}

int64_t Sum(const DecodedProfile& p, size_t index = 0) {
  int64_t v = 0;
  for (const DecodedSample& s : p.samples) v += s.values.at(index);
  return v;
}

std::vector<std::string> Types(const std::vector<BuiltProfile>& built) {
  std::vector<std::string> out;
  for (const BuiltProfile& b : built) out.push_back(b.profile_type);
  return out;
}

bool HasComment(const DecodedProfile& p, std::string_view needle) {
  for (const std::string& c : p.comments) {
    if (c.find(needle) != std::string::npos) return true;
  }
  return false;
}

TEST(ProcessProfile, CpuSamplesCountOnceAndOnePeriodWithTheGcFrameOnTop) {
  ProcessProfile pp(kPeriod);
  const auto hot = Stack({"Foo#hot", "Foo.run", "<main>"});
  const auto cold = Stack({"Foo#cold", "<main>"});
  for (int i = 0; i < 5; ++i) pp.OnSample(100 + i, 1, false, hot);
  pp.OnSample(200, 2, false, cold);
  pp.OnSample(210, 2, true, cold);     // during GC: the GC frame on top of the Ruby stack
  pp.OnSample(220, 2, true, kNone);    // during GC with no Ruby stack: the GC frame alone
  pp.OnSample(230, 0, false, kNone);   // no thread, no stack: still CPU time
  const auto built = pp.Cut(1000, 1'700'000'000'000'000'000, 15'000'000'000);
  EXPECT_EQ(Types(built), std::vector<std::string>{"cpu"});
  EXPECT_EQ(TotalOf(built, "cpu"), 9u);
  auto p = Get(built, "cpu");
  ASSERT_TRUE(p);
  ASSERT_EQ(p->sample_types.size(), 2u);
  EXPECT_EQ(p->sample_types[0], std::make_pair(std::string("samples"), std::string("count")));
  EXPECT_EQ(p->sample_types[1], std::make_pair(std::string("cpu"), std::string("nanoseconds")));
  EXPECT_EQ(p->period_type, std::make_pair(std::string("cpu"), std::string("nanoseconds")));
  EXPECT_EQ(p->period, static_cast<int64_t>(kPeriod));
  EXPECT_EQ(p->default_sample_type, "cpu");
  EXPECT_EQ(p->time_nanos, 1'700'000'000'000'000'000);
  EXPECT_EQ(p->duration_nanos, 15'000'000'000);

  EXPECT_EQ(ValueFor(*p, {"Foo#hot", "Foo.run", "<main>"}, 0), 5);
  EXPECT_EQ(ValueFor(*p, {"Foo#hot", "Foo.run", "<main>"}, 1), static_cast<int64_t>(5 * kPeriod));
  EXPECT_EQ(ValueFor(*p, {"Foo#cold", "<main>"}), 1);
  EXPECT_EQ(ValueFor(*p, {kGc, "Foo#cold", "<main>"}), 1);
  EXPECT_EQ(ValueFor(*p, {kGc}), 1);
  EXPECT_EQ(ValueFor(*p, {kNoStack}), 1);
  EXPECT_EQ(Sum(*p, 0), 9);
  EXPECT_EQ(Sum(*p, 1), static_cast<int64_t>(9 * kPeriod));
  // No labels but the endpoint ("-": none of these stacks is in a request or job): process labels travel with the
  // upload, threads are not split out.
  for (const DecodedSample& s : p->samples) {
    EXPECT_EQ(s.str_labels, (std::map<std::string, std::string>{{"endpoint", "-"}}));
    EXPECT_TRUE(s.num_labels.empty());
  }
  // The GC frame is the recorder's: label, no path, no line.
  bool gc_function = false;
  for (const auto& [id, fn] : p->functions) gc_function |= fn == std::make_pair(kGc, std::string());
  EXPECT_TRUE(gc_function);

  // The interval's weights are gone after the cut.
  EXPECT_TRUE(pp.Cut(2000, 0, 1).empty());
}

TEST(ProcessProfile, GvlWaitGoesToTheWaitersStackByTheExportsRule) {
  ProcessProfile pp(kPeriod);
  const auto sleeping = Stack({"Kernel#sleep", "Worker#run", "<main>"});
  const auto io = Stack({"IO#read", "Reader#run", "<main>"});
  const auto sampled = Stack({"Cruncher#step", "Cruncher#run", "<main>"});
  const auto sampled_during = Stack({"Late#learned", "<main>"});
  const auto own = Stack({"Own#wait", "<main>"});
  // th 2: released in Kernel#sleep, waits 2.5 us; then released in IO#read, waits 1 us (a repeated READY does not
  // restart the wait).
  pp.OnEvent(100, 2, RV_EV_THREAD_SUSPENDED, sleeping);
  pp.OnEvent(1000, 2, RV_EV_THREAD_READY, kNone);
  pp.OnEvent(3500, 2, RV_EV_THREAD_RESUMED, kNone);
  pp.OnEvent(4000, 2, RV_EV_THREAD_SUSPENDED, io);
  pp.OnEvent(5000, 2, RV_EV_THREAD_READY, kNone);
  pp.OnEvent(5100, 2, RV_EV_THREAD_READY, kNone);
  pp.OnEvent(6000, 2, RV_EV_THREAD_RESUMED, kNone);
  // th 3: its release carried no stack; its latest sample's stack is used.
  pp.OnSample(7000, 3, false, sampled);
  pp.OnEvent(7100, 3, RV_EV_THREAD_SUSPENDED, kNone);
  pp.OnEvent(7200, 3, RV_EV_THREAD_READY, kNone);
  pp.OnEvent(7900, 3, RV_EV_THREAD_RESUMED, kNone);
  // th 4: nothing known.
  pp.OnEvent(8000, 4, RV_EV_THREAD_READY, kNone);
  pp.OnEvent(8400, 4, RV_EV_THREAD_RESUMED, kNone);
  // th 5: the wants_gvl's own stack wins over the release's.
  pp.OnEvent(8500, 5, RV_EV_THREAD_SUSPENDED, sleeping);
  pp.OnEvent(8600, 5, RV_EV_THREAD_READY, own);
  pp.OnEvent(8650, 5, RV_EV_THREAD_RESUMED, kNone);
  // th 7: a timeslice (READY/RESUMED with no SUSPENDED): the release before it ran again is stale, its sample is not.
  pp.OnEvent(8700, 7, RV_EV_THREAD_SUSPENDED, io);
  pp.OnEvent(8710, 7, RV_EV_THREAD_READY, kNone);
  pp.OnEvent(8720, 7, RV_EV_THREAD_RESUMED, kNone);  // 10 on io
  pp.OnSample(8730, 7, false, sleeping);
  pp.OnEvent(8740, 7, RV_EV_THREAD_READY, kNone);
  pp.OnEvent(8770, 7, RV_EV_THREAD_RESUMED, kNone);  // 30 on the sampled stack
  // th 8: no stack when the wait began; a sample during the wait names it.
  pp.OnEvent(9000, 8, RV_EV_THREAD_READY, kNone);
  pp.OnSample(9100, 8, false, sampled_during);
  pp.OnEvent(9300, 8, RV_EV_THREAD_RESUMED, kNone);

  const auto built = pp.Cut(9300, 0, 9300);
  auto p = Get(built, "gvl_wait");
  ASSERT_TRUE(p);
  ASSERT_EQ(p->sample_types.size(), 1u);
  EXPECT_EQ(p->sample_types[0], std::make_pair(std::string("gvl_wait"), std::string("nanoseconds")));
  EXPECT_EQ(p->default_sample_type, "gvl_wait");
  EXPECT_EQ(ValueFor(*p, {"Kernel#sleep", "Worker#run", "<main>"}), 2500 + 30);
  EXPECT_EQ(ValueFor(*p, {"IO#read", "Reader#run", "<main>"}), 1000 + 10);
  EXPECT_EQ(ValueFor(*p, {"Cruncher#step", "Cruncher#run", "<main>"}), 700);
  EXPECT_EQ(ValueFor(*p, {kNoStack}), 400);
  EXPECT_EQ(ValueFor(*p, {"Own#wait", "<main>"}), 50);
  EXPECT_EQ(ValueFor(*p, {"Late#learned", "<main>"}), 300);
  EXPECT_EQ(Sum(*p), 2500 + 1000 + 700 + 400 + 50 + 10 + 30 + 300);
  EXPECT_EQ(TotalOf(built, "gvl_wait"), static_cast<uint64_t>(Sum(*p)));
}

TEST(ProcessProfile, GvlHeldGoesToTheReleasesStackElseTheLatestSample) {
  ProcessProfile pp(kPeriod);
  const auto a = Stack({"A#run", "<main>"});
  const auto released = Stack({"IO#write", "A#run", "<main>"});
  // th 1 first seen mid-run by a RESUMED: a hold opens, no wait.
  pp.OnEvent(0, 1, RV_EV_THREAD_RESUMED, kNone);
  pp.OnSample(100, 1, false, a);
  pp.OnEvent(1000, 1, RV_EV_THREAD_SUSPENDED, released);  // 1000 on the release's stack
  pp.OnEvent(2000, 1, RV_EV_THREAD_RESUMED, kNone);
  pp.OnEvent(2500, 1, RV_EV_THREAD_SUSPENDED, kNone);  // 500 on the latest sample
  pp.OnEvent(3000, 9, RV_EV_THREAD_RESUMED, kNone);
  pp.OnEvent(3200, 9, RV_EV_THREAD_SUSPENDED, kNone);  // 200 on "[no stack]"
  pp.OnEvent(3300, 10, RV_EV_THREAD_SUSPENDED, released);  // first seen releasing: no hold to close
  pp.OnEvent(3400, 0, RV_EV_THREAD_RESUMED, kNone);        // no thread: ignored
  const auto built = pp.Cut(4000, 0, 4000);
  EXPECT_EQ(Types(built), (std::vector<std::string>{"cpu", "gvl_held"}));
  auto p = Get(built, "gvl_held");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->sample_types[0], std::make_pair(std::string("gvl_held"), std::string("nanoseconds")));
  EXPECT_EQ(ValueFor(*p, {"IO#write", "A#run", "<main>"}), 1000);
  EXPECT_EQ(ValueFor(*p, {"A#run", "<main>"}), 500);
  EXPECT_EQ(ValueFor(*p, {kNoStack}), 200);
  EXPECT_EQ(Sum(*p), 1700);
  EXPECT_EQ(TotalOf(built, "gvl_held"), 1700u);
}

TEST(ProcessProfile, GcTimeGoesToTheGcFrameOverTheCollectingThreadsStack) {
  ProcessProfile pp(kPeriod);
  const auto a = Stack({"Alloc#many", "<main>"});
  const auto b = Stack({"Other#alloc", "<main>"});
  pp.OnEvent(0, 1, RV_EV_THREAD_RESUMED, kNone);  // th 1 owns the GVL
  pp.OnSample(10, 1, false, a);
  pp.OnEvent(100, 1, RV_EV_GC_ENTER, kNone);  // the event names th 1
  pp.OnEvent(300, 1, RV_EV_GC_EXIT, kNone);   // 200 on GC over a
  pp.OnEvent(400, 0, RV_EV_GC_ENTER, kNone);  // no th: the GVL owner (th 1) ran it
  pp.OnEvent(450, 0, RV_EV_GC_ENTER, kNone);  // a repeated enter does not restart it
  pp.OnEvent(600, 0, RV_EV_GC_EXIT, kNone);   // 200 more on GC over a
  pp.OnEvent(700, 1, RV_EV_THREAD_SUSPENDED, kNone);
  pp.OnEvent(800, 0, RV_EV_GC_ENTER, kNone);  // nobody known: the GC frame alone
  pp.OnEvent(850, 0, RV_EV_GC_EXIT, kNone);   // 50
  pp.OnEvent(900, 0, RV_EV_GC_ENTER, kNone);
  pp.OnSample(910, 4, true, b);              // a sample inside this GC says where it was triggered
  pp.OnEvent(1000, 0, RV_EV_GC_EXIT, kNone);  // 100 on GC over b
  pp.OnEvent(1100, 0, RV_EV_GC_EXIT, kNone);  // an exit without an enter counts nothing
  pp.OnEvent(1200, 5, RV_EV_GC_ENTER, kNone);  // a thread never seen: GC frame alone
  pp.OnEvent(1210, 5, RV_EV_GC_EXIT, kNone);   // 10
  pp.OnEvent(1300, 1, RV_EV_SLEEP_ENTER, kNone);  // probes carry nothing these profiles count
  pp.OnEvent(1300, 1, RV_EV_MUTEX_LOCK_ENTER, kNone);
  const auto built = pp.Cut(2000, 0, 2000);
  EXPECT_EQ(Types(built), (std::vector<std::string>{"cpu", "gvl_held", "gc"}));
  auto p = Get(built, "gc");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->sample_types[0], std::make_pair(std::string("gc"), std::string("nanoseconds")));
  EXPECT_EQ(ValueFor(*p, {kGc, "Alloc#many", "<main>"}), 400);
  EXPECT_EQ(ValueFor(*p, {kGc}), 60);
  EXPECT_EQ(ValueFor(*p, {kGc, "Other#alloc", "<main>"}), 100);
  EXPECT_EQ(Sum(*p), 560);
  EXPECT_EQ(TotalOf(built, "gc"), 560u);
  auto cpu = Get(built, "cpu");
  ASSERT_TRUE(cpu);
  EXPECT_EQ(ValueFor(*cpu, {kGc, "Other#alloc", "<main>"}), 1);
  auto held = Get(built, "gvl_held");
  ASSERT_TRUE(held);
  EXPECT_EQ(ValueFor(*held, {"Alloc#many", "<main>"}), 700);
}

TEST(ProcessProfile, SpansOpenAtACutSplitBetweenIntervals) {
  ProcessProfile pp(kPeriod);
  const auto s1 = Stack({"First#sample", "<main>"});
  const auto s2 = Stack({"Second#sample", "<main>"});
  const auto r = Stack({"IO#select", "<main>"});
  const auto r2 = Stack({"Queue#pop", "<main>"});
  pp.OnSample(0, 1, false, s1);
  pp.OnEvent(100, 1, RV_EV_THREAD_SUSPENDED, r);
  pp.OnEvent(1000, 1, RV_EV_THREAD_READY, kNone);
  auto first = pp.Cut(3000, 1'000'000'000'000, 3000);
  EXPECT_EQ(Types(first), (std::vector<std::string>{"cpu", "gvl_wait", "gvl_blame"}));
  // Nobody was seen acquiring the GVL: the wait is blamed on no one, and says so.
  auto b1 = Get(first, "gvl_blame");
  ASSERT_TRUE(b1);
  EXPECT_EQ(ValueFor(*b1, {std::string(kHolderUnknownFrame)}), 2000);
  auto w1 = Get(first, "gvl_wait");
  ASSERT_TRUE(w1);
  EXPECT_EQ(ValueFor(*w1, {"IO#select", "<main>"}), 2000);
  EXPECT_EQ(w1->time_nanos, 1'000'000'000'000);
  EXPECT_EQ(w1->duration_nanos, 3000);

  pp.OnEvent(5000, 1, RV_EV_THREAD_RESUMED, kNone);  // the wait's second part: 3000 -> 5000
  pp.OnSample(5500, 1, false, s2);
  pp.OnEvent(5800, 1, RV_EV_GC_ENTER, kNone);
  auto second = pp.Cut(6000, 1'000'000'003'000, 3000);
  EXPECT_EQ(Types(second), (std::vector<std::string>{"cpu", "gvl_wait", "gvl_held", "gc", "gvl_blame"}));
  auto w2 = Get(second, "gvl_wait");
  ASSERT_TRUE(w2);
  EXPECT_EQ(ValueFor(*w2, {"IO#select", "<main>"}), 2000);
  auto h2 = Get(second, "gvl_held");
  ASSERT_TRUE(h2);
  // The release is still to come: the part before the cut goes to what the thread was last seen running.
  EXPECT_EQ(ValueFor(*h2, {"Second#sample", "<main>"}), 1000);
  auto g2 = Get(second, "gc");
  ASSERT_TRUE(g2);
  EXPECT_EQ(ValueFor(*g2, {kGc, "Second#sample", "<main>"}), 200);
  EXPECT_EQ(g2->time_nanos, 1'000'000'003'000);

  pp.OnEvent(6100, 1, RV_EV_GC_EXIT, kNone);
  pp.OnEvent(6500, 1, RV_EV_THREAD_SUSPENDED, r2);
  auto third = pp.Cut(9000, 1'000'000'006'000, 3000);
  EXPECT_EQ(Types(third), (std::vector<std::string>{"gvl_held", "gc"}));
  auto h3 = Get(third, "gvl_held");
  ASSERT_TRUE(h3);
  EXPECT_EQ(ValueFor(*h3, {"Queue#pop", "<main>"}), 500);
  EXPECT_EQ(Sum(*h3), 500);
  auto g3 = Get(third, "gc");
  ASSERT_TRUE(g3);
  EXPECT_EQ(ValueFor(*g3, {kGc, "Second#sample", "<main>"}), 100);

  EXPECT_TRUE(pp.Cut(12000, 0, 3000).empty());
}

// The labels of the gvl_blame samples whose frames are `frames`, ns summed per (holder, waiter, blame_source).
std::map<std::tuple<std::string, std::string, std::string>, int64_t> BlameBy(const DecodedProfile& p,
                                                                             const std::vector<std::string>& frames) {
  std::map<std::tuple<std::string, std::string, std::string>, int64_t> out;
  for (const DecodedSample& s : p.samples) {
    if (s.frames != frames) continue;
    out[{s.str_labels.at("holder"), s.str_labels.at("waiter"), s.str_labels.at("blame_source")}] += s.values.at(0);
  }
  return out;
}

TEST(ProcessProfile, GvlBlameGoesToWhatTheHolderRanLabelledByHolderAndWaiter) {
  ProcessProfile pp(kPeriod);
  const auto hog = Stack({"Hog.spin", "<main>"});
  const auto io = Stack({"IO#read", "Io#loop", "<main>"});
  pp.SetMainThread(1);
  // Main holds the GVL and runs Hog.spin; thread 2 (released in IO#read) waits 0.1-5 us, thread 3 waits 2-6 us.
  pp.OnEvent(0, 1, RV_EV_THREAD_RESUMED, kNone);
  pp.OnEvent(50, 2, RV_EV_THREAD_SUSPENDED, io);
  pp.OnEvent(60, 3, RV_EV_THREAD_SUSPENDED, io);
  pp.OnEvent(100, 2, RV_EV_THREAD_READY, kNone);
  pp.OnSample(1000, 1, false, hog);
  pp.OnEvent(2000, 3, RV_EV_THREAD_READY, kNone);
  pp.OnSample(3000, 1, false, hog);
  pp.OnEvent(4000, 1, RV_EV_THREAD_SUSPENDED, hog);
  pp.OnEvent(5000, 2, RV_EV_THREAD_RESUMED, kNone);  // 1000 ns nobody held it
  pp.OnEvent(5500, 2, RV_EV_THREAD_SUSPENDED, io);   // no sample: its release stack
  pp.OnEvent(6000, 3, RV_EV_THREAD_RESUMED, kNone);
  const auto built = pp.Cut(7000, 1'700'000'000'000'000'000, 7000);
  EXPECT_EQ(Types(built), (std::vector<std::string>{"cpu", "gvl_wait", "gvl_held", "gvl_blame"}));
  auto p = Get(built, "gvl_blame");
  ASSERT_TRUE(p);
  ASSERT_EQ(p->sample_types.size(), 1u);
  EXPECT_EQ(p->sample_types[0], std::make_pair(std::string("gvl_blame"), std::string("nanoseconds")));
  EXPECT_EQ(p->default_sample_type, "gvl_blame");
  EXPECT_EQ(p->period_type, std::make_pair(std::string("gvl_blame"), std::string("nanoseconds")));
  EXPECT_EQ(p->time_nanos, 1'700'000'000'000'000'000);
  // Thread 2 waited 3900 ns while main ran Hog.spin (two samples), 1000 ns for nobody; thread 3 waited 2000 ns on
  // main (its sample at 3000), 1500 for nobody and 500 while thread 2 ran (no sample: its release in IO#read).
  using Key = std::tuple<std::string, std::string, std::string>;
  EXPECT_EQ(BlameBy(*p, {"Hog.spin", "<main>"}),
            (std::map<Key, int64_t>{{{"main", "Thread #2", "sampled"}, 3900},
                                    {{"main", "Thread #3", "sampled"}, 2000}}));
  EXPECT_EQ(BlameBy(*p, {std::string(kGvlFreeFrame)}),
            (std::map<Key, int64_t>{{{"-", "Thread #2", "gvl_free"}, 1000}, {{"-", "Thread #3", "gvl_free"}, 1500}}));
  EXPECT_EQ(BlameBy(*p, {"IO#read", "Io#loop", "<main>"}),
            (std::map<Key, int64_t>{{{"Thread #2", "Thread #3", "release_stack"}, 500}}));
  // Every nanosecond waited is blamed: the same total as gvl_wait's.
  EXPECT_EQ(Sum(*p), 3900 + 1000 + 2000 + 1500 + 500);
  EXPECT_EQ(TotalOf(built, "gvl_blame"), TotalOf(built, "gvl_wait"));
  for (const BuiltProfile& b : built) {
    EXPECT_EQ(b.sample_label_names.size(), b.profile_type != "gvl_blame" ? 1u : 5u) << b.profile_type;
    EXPECT_EQ(b.sample_label_names.back(), "endpoint") << b.profile_type;
  }
}

// Every profile's samples carry their stack's endpoint (model/endpoint.h): a Rails action's, "-" outside requests;
// gvl_blame the holder's, gvl_wait the waiter's.
TEST(ProcessProfile, EverySampleCarriesItsStacksEndpoint) {
  ProcessProfile pp(kPeriod);
  const auto cpu = rails_stacks::kRailsCpu, nap = rails_stacks::kRailsNap, idle = rails_stacks::kPumaIdle;
  pp.OnEvent(0, 1, RV_EV_THREAD_RESUMED, kNone);
  pp.OnEvent(50, 2, RV_EV_THREAD_SUSPENDED, nap);
  pp.OnEvent(100, 2, RV_EV_THREAD_READY, kNone);
  pp.OnSample(1000, 1, false, cpu);
  pp.OnSample(1100, 3, false, idle);
  pp.OnEvent(4000, 1, RV_EV_THREAD_SUSPENDED, cpu);
  pp.OnEvent(4000, 2, RV_EV_THREAD_RESUMED, kNone);
  const auto built = pp.Cut(5000, 1'700'000'000'000'000'000, 5000);
  auto by_endpoint = [&](std::string_view type) {
    std::map<std::string, int64_t> out;
    auto p = Get(built, type);
    if (!p) return out;
    for (const DecodedSample& s : p->samples) {
      const auto e = s.str_labels.find("endpoint");
      out[e == s.str_labels.end() ? "(none)" : e->second] += s.values.back();
    }
    return out;
  };
  EXPECT_EQ(by_endpoint("cpu"),
            (std::map<std::string, int64_t>{{"-", static_cast<int64_t>(kPeriod)},
                                            {"LedgerController#cpu", static_cast<int64_t>(kPeriod)}}));
  EXPECT_EQ(by_endpoint("gvl_wait"), (std::map<std::string, int64_t>{{"LedgerController#nap", 3900}}));
  EXPECT_EQ(by_endpoint("gvl_blame"), (std::map<std::string, int64_t>{{"LedgerController#cpu", 3900}}));
}

// The endpoint label's values per interval are bounded: past kMaxEndpoints distinct ones, "(other endpoints)"; the
// next interval names its own again.
TEST(ProcessProfile, EndpointsPastTheCapShareOneLabel) {
  ProcessProfile pp(kPeriod);
  const size_t n = ProcessProfile::kMaxEndpoints + 10;
  auto action_stack = [](size_t k) {
    return Stack({"Api" + std::to_string(k) + "Controller#show", "AbstractController::Base#process_action"});
  };
  for (size_t k = 0; k < n; ++k) pp.OnSample(100 + k, 1, false, action_stack(k));
  auto endpoints = [&](uint64_t cut) {
    std::map<std::string, int64_t> out;
    const auto p = Get(pp.Cut(cut, 1'700'000'000'000'000'000, 1000), "cpu");
    if (!p) return out;
    for (const DecodedSample& s : p->samples) out[s.str_labels.at("endpoint")] += s.values[0];
    return out;
  };
  const auto first = endpoints(10'000);
  EXPECT_EQ(first.size(), ProcessProfile::kMaxEndpoints + 1);
  EXPECT_EQ(first.at(std::string(ProcessProfile::kOtherEndpoints)), 10);
  EXPECT_EQ(first.at("Api0Controller#show"), 1);
  // The next interval starts over: its first endpoints are named.
  for (size_t k = n - 5; k < n; ++k) pp.OnSample(20'000 + k, 1, false, action_stack(k));
  const auto second = endpoints(30'000);
  EXPECT_EQ(second.size(), 5u);
  EXPECT_EQ(second.count(std::string(ProcessProfile::kOtherEndpoints)), 0u);
}

// A contended READY's holder stack (Agent::Dispatch feeds it to OnContention): the wait goes to it up to the
// holder's next sample, not to where the holder later released the GVL.
TEST(ProcessProfile, GvlBlameGoesToTheHolderStackAContendedReadyFound) {
  ProcessProfile pp(kPeriod);
  const auto work = Stack({"Ledger.crunch", "<main>"});
  const auto rest = Stack({"Kernel#sleep", "Pause.rest", "<main>"});
  const auto io = Stack({"IO#read", "Io#loop", "<main>"});
  auto shared = [](const std::vector<FrameInfo>& frames) {
    auto out = std::make_shared<std::vector<SharedFrame>>();
    for (const FrameInfo& f : frames) out->push_back(std::make_shared<const FrameInfo>(f));
    return SharedStack(std::move(out));
  };
  pp.SetMainThread(1);
  pp.OnEvent(0, 1, RV_EV_THREAD_RESUMED, kNone);
  pp.OnEvent(50, 2, RV_EV_THREAD_SUSPENDED, io);
  pp.OnEvent(100, 2, RV_EV_THREAD_READY, SharedStack());
  pp.OnContention(100, 1, shared(work));
  pp.OnContention(200, 0, shared(work));  // no holder: nothing to observe
  pp.OnSample(3000, 1, false, rest);      // from here the sample stands for the rest
  pp.OnEvent(4000, 1, RV_EV_THREAD_SUSPENDED, rest);
  pp.OnEvent(4000, 2, RV_EV_THREAD_RESUMED, kNone);
  auto p = Get(pp.Cut(5000, 0, 5000), "gvl_blame");
  ASSERT_TRUE(p);
  using Key = std::tuple<std::string, std::string, std::string>;
  EXPECT_EQ(BlameBy(*p, {"Ledger.crunch", "<main>"}), (std::map<Key, int64_t>{{{"main", "Thread #2", "contention"}, 2900}}));
  EXPECT_EQ(BlameBy(*p, {"Kernel#sleep", "Pause.rest", "<main>"}),
            (std::map<Key, int64_t>{{{"main", "Thread #2", "sampled"}, 1000}}));
  EXPECT_EQ(Sum(*p), 3900);
}

TEST(ProcessProfile, GvlBlameOfAWaitAcrossCutsSumsToTheWholeWait) {
  ProcessProfile pp(kPeriod);
  const auto hog = Stack({"Hog.spin", "<main>"});
  const auto other = Stack({"Other#run", "<main>"});
  // Thread 2 waits 1000-9000 while thread 1 holds the lock until 6000 and thread 3 from 6000 on; cuts at 3000 and 7000.
  pp.OnEvent(0, 1, RV_EV_THREAD_RESUMED, kNone);
  pp.OnEvent(10, 2, RV_EV_THREAD_SUSPENDED, kNone);
  pp.OnEvent(20, 3, RV_EV_THREAD_SUSPENDED, kNone);
  pp.OnEvent(1000, 2, RV_EV_THREAD_READY, kNone);
  pp.OnSample(2000, 1, false, hog);
  pp.OnEvent(2500, 3, RV_EV_THREAD_READY, kNone);
  std::vector<std::vector<BuiltProfile>> cuts;
  cuts.push_back(pp.Cut(3000, 0, 3000));
  pp.OnSample(4000, 1, false, hog);
  pp.OnEvent(6000, 1, RV_EV_THREAD_SUSPENDED, hog);
  pp.OnEvent(6000, 3, RV_EV_THREAD_RESUMED, kNone);
  pp.OnSample(6500, 3, false, other);
  cuts.push_back(pp.Cut(7000, 3000, 4000));
  pp.OnEvent(9000, 3, RV_EV_THREAD_SUSPENDED, other);
  pp.OnEvent(9000, 2, RV_EV_THREAD_RESUMED, kNone);
  cuts.push_back(pp.Cut(10000, 7000, 3000));
  // Per interval: blame == wait. Over the intervals, per (holder, waiter): thread 2 waited 5000 on 1 and 3000 on 3,
  // thread 3 waited 3500 on 1. Names by first use: 1 is "Thread #2", 2 "Thread #3", 3 "Thread #4".
  std::map<std::pair<std::string, std::string>, int64_t> pairs;
  for (const auto& built : cuts) {
    EXPECT_EQ(TotalOf(built, "gvl_blame"), TotalOf(built, "gvl_wait"));
    auto p = Get(built, "gvl_blame");
    ASSERT_TRUE(p);
    for (const DecodedSample& s : p->samples) {
      EXPECT_NE(s.str_labels.at("blame_source"), "holder_unknown") << "the holder's span was not cut with the wait";
      pairs[{s.str_labels.at("holder"), s.str_labels.at("waiter")}] += s.values.at(0);
    }
  }
  EXPECT_EQ(pairs, (std::map<std::pair<std::string, std::string>, int64_t>{{{"Thread #2", "Thread #3"}, 5000},
                                                                            {{"Thread #2", "Thread #4"}, 3500},
                                                                            {{"Thread #4", "Thread #3"}, 3000}}));
}

TEST(ProcessProfile, BlameLabelsNameThreadsByTheirNames) {
  ProcessProfile pp(kPeriod);
  const auto hog = Stack({"Hog.spin", "<main>"});
  ThreadInfo main_info, worker, unnamed;
  main_info.native_name = "ruby";
  worker.name = "puma srv tp 001";
  worker.native_name = "puma srv tp 001";
  unnamed.native_name = "ruby";  // inherited from the process: no name of its own
  pp.SetMainThread(1);
  pp.SetThreadInfo(1, main_info);
  pp.SetThreadInfo(2, worker);
  pp.SetThreadInfo(3, unnamed);
  // Thread 1 (main) holds the lock while 2 and 3 wait; then 2 holds it while 3 waits.
  pp.OnEvent(0, 1, RV_EV_THREAD_RESUMED, kNone);
  pp.OnEvent(10, 2, RV_EV_THREAD_SUSPENDED, kNone);
  pp.OnEvent(20, 3, RV_EV_THREAD_SUSPENDED, kNone);
  pp.OnEvent(1000, 2, RV_EV_THREAD_READY, kNone);
  pp.OnEvent(1000, 3, RV_EV_THREAD_READY, kNone);
  pp.OnEvent(3000, 1, RV_EV_THREAD_SUSPENDED, hog);
  pp.OnEvent(3000, 2, RV_EV_THREAD_RESUMED, kNone);
  pp.OnEvent(5000, 2, RV_EV_THREAD_SUSPENDED, hog);
  pp.OnEvent(5000, 3, RV_EV_THREAD_RESUMED, kNone);
  std::map<std::pair<std::string, std::string>, int64_t> pairs;
  auto p = Get(pp.Cut(6000, 0, 6000), "gvl_blame");
  ASSERT_TRUE(p);
  for (const DecodedSample& s : p->samples) pairs[{s.str_labels.at("holder"), s.str_labels.at("waiter")}] += s.values.at(0);
  EXPECT_EQ(pairs, (std::map<std::pair<std::string, std::string>, int64_t>{
                       {{"main", "Thread #2 (puma srv tp 001)"}, 2000},
                       {{"main", "Thread #3"}, 2000},
                       {{"Thread #2 (puma srv tp 001)", "Thread #3"}, 2000}}));
}

// A GVL reading as the agent hands it over: `holder` holds it, `queued` wait for it (th keys).
GvlReading Reading(uint64_t holder, std::vector<uint64_t> queued) {
  GvlReading g;
  g.held = holder != 0;
  g.holder_th = holder;
  g.waiting = static_cast<uint32_t>(queued.size());
  g.queued_th = std::move(queued);
  return g;
}

// Main (th 1) holds the GVL in Hog.spin; thread 2, last sampled in IO#read, wants it at 100; the budget pauses the
// scheduler sites from 200 to 3500, while main's samples read the GVL at 1000, 2000 and 3000 (thread 2 queued);
// thread 2 gets the lock at 4000. `cut_at`: an interval cut inside the pause (0: none). Returns every interval.
std::vector<std::vector<BuiltProfile>> PausedWait(ProcessProfile& pp, uint64_t cut_at) {
  const auto hog = Stack({"Hog.spin", "<main>"});
  const auto io = Stack({"IO#read", "Io#loop", "<main>"});
  std::vector<std::vector<BuiltProfile>> out;
  pp.SetMainThread(1);
  pp.OnEvent(0, 1, RV_EV_THREAD_RESUMED, kNone);
  pp.OnSample(40, 2, false, io);
  pp.OnEvent(50, 2, RV_EV_THREAD_SUSPENDED, io);
  pp.OnEvent(100, 2, RV_EV_THREAD_READY, kNone);
  pp.OnTracingPaused(200);
  uint64_t start = 0;
  for (uint64_t t : {1000, 2000, 3000}) {
    const GvlReading g = Reading(1, {2});
    pp.OnSample(t, 1, false, hog, &g);
    if (cut_at != 0 && t < cut_at && cut_at < t + 1000) {
      out.push_back(pp.Cut(cut_at, 0, static_cast<int64_t>(cut_at - start)));
      start = cut_at;
    }
  }
  pp.OnTracingResumed(3500);
  pp.OnEvent(4000, 1, RV_EV_THREAD_SUSPENDED, hog);
  pp.OnEvent(4000, 2, RV_EV_THREAD_RESUMED, kNone);
  out.push_back(pp.Cut(5000, 0, static_cast<int64_t>(5000 - start)));
  return out;
}

TEST(ProcessProfile, WaitsInAPausedWindowAreEstimatedFromGvlReadingsAndLabelledInferred) {
  ProcessProfile pp(kPeriod);
  const auto built = PausedWait(pp, 0).at(0);
  // The observed wait was cut by the pause (not counted); the readings tell thread 2 waited from its wants_gvl (100)
  // to its gvl_acquired (4000), 3900 ns, every one of them while main ran Hog.spin.
  auto wait = Get(built, "gvl_wait");
  ASSERT_TRUE(wait);
  ASSERT_EQ(wait->samples.size(), 1u);
  EXPECT_EQ(wait->samples[0].frames, (std::vector<std::string>{"IO#read", "Io#loop", "<main>"}));
  EXPECT_EQ(wait->samples[0].values.at(0), 3900);
  EXPECT_EQ(wait->samples[0].str_labels,
            (std::map<std::string, std::string>{{"provenance", "inferred"}, {"endpoint", "-"}}));
  auto blame = Get(built, "gvl_blame");
  ASSERT_TRUE(blame);
  ASSERT_EQ(blame->samples.size(), 1u);
  EXPECT_EQ(blame->samples[0].frames, (std::vector<std::string>{"Hog.spin", "<main>"}));
  EXPECT_EQ(blame->samples[0].values.at(0), 3900);
  EXPECT_EQ(blame->samples[0].str_labels,
            (std::map<std::string, std::string>{
                {"holder", "main"},
                {"waiter", "Thread #2"},
                {"blame_source", "sampled"},
                {"provenance", "inferred"},
                {"endpoint", "-"}}));
  EXPECT_EQ(TotalOf(built, "gvl_blame"), 3900u);
  EXPECT_EQ(TotalOf(built, "gvl_wait"), 3900u);
  for (const auto* p : {&*wait, &*blame}) {
    bool said = false;
    for (const std::string& c : p->comments) {
      said = said || c.find("estimated from the samples' GVL readings") != std::string::npos;
    }
    EXPECT_TRUE(said) << "the profile does not say it holds an estimate";
  }
  for (const BuiltProfile& b : built) {
    if (b.profile_type == "gvl_wait") {
      EXPECT_EQ(b.sample_label_names, (std::vector<std::string>{"provenance", "endpoint"}));
    }
  }
}

TEST(ProcessProfile, AnEstimateAcrossAnIntervalCutSumsToTheUncutOne) {
  ProcessProfile whole(kPeriod), cut(kPeriod);
  const auto one = PausedWait(whole, 0);
  const auto two = PausedWait(cut, 2500);
  ASSERT_EQ(one.size(), 1u);
  ASSERT_EQ(two.size(), 2u);
  // Up to the reading before the cut in the first interval ([100, 2000)), the rest in the second.
  EXPECT_EQ(TotalOf(two[0], "gvl_blame"), 1900u);
  EXPECT_EQ(TotalOf(two[0], "gvl_wait"), 1900u);
  EXPECT_EQ(TotalOf(two[1], "gvl_blame"), 2000u);
  EXPECT_EQ(TotalOf(two[0], "gvl_blame") + TotalOf(two[1], "gvl_blame"), TotalOf(one[0], "gvl_blame"));
}

TEST(ProcessProfile, WithoutPausesReadingsChangeNothingAndBlameIsDerived) {
  auto run = [](bool readings) {
    ProcessProfile pp(kPeriod);
    const auto hog = Stack({"Hog.spin", "<main>"});
    pp.OnEvent(0, 1, RV_EV_THREAD_RESUMED, kNone);
    pp.OnEvent(50, 2, RV_EV_THREAD_SUSPENDED, kNone);
    pp.OnEvent(100, 2, RV_EV_THREAD_READY, kNone);
    const GvlReading g = Reading(1, {2});
    pp.OnSample(1000, 1, false, hog, readings ? &g : nullptr);
    pp.OnEvent(2000, 1, RV_EV_THREAD_SUSPENDED, hog);
    pp.OnEvent(2000, 2, RV_EV_THREAD_RESUMED, kNone);
    return pp.Cut(3000, 0, 3000);
  };
  const auto with = run(true), without = run(false);
  ASSERT_EQ(with.size(), without.size());
  for (size_t i = 0; i < with.size(); ++i) EXPECT_EQ(with[i].pprof_gz, without[i].pprof_gz) << with[i].profile_type;
  auto blame = Get(with, "gvl_blame");
  ASSERT_TRUE(blame);
  for (const DecodedSample& smp : blame->samples) EXPECT_EQ(smp.str_labels.at("provenance"), "derived");
  auto wait = Get(with, "gvl_wait");
  ASSERT_TRUE(wait);
  for (const DecodedSample& smp : wait->samples) EXPECT_FALSE(smp.str_labels.contains("provenance"));
}

TEST(ProcessProfile, BlameThreadNamesStayWhileTheThreadLivesAndAReusedPointerGetsANewOne) {
  ProcessProfile pp(kPeriod);
  const auto a = Stack({"A#run", "<main>"});
  auto contend = [&](uint64_t t0, uint64_t holder, uint64_t waiter) {
    pp.OnEvent(t0, holder, RV_EV_THREAD_RESUMED, kNone);
    pp.OnEvent(t0 + 10, waiter, RV_EV_THREAD_READY, kNone);
    pp.OnSample(t0 + 20, holder, false, a);
    pp.OnEvent(t0 + 100, holder, RV_EV_THREAD_SUSPENDED, a);
    pp.OnEvent(t0 + 100, waiter, RV_EV_THREAD_RESUMED, kNone);
    pp.OnEvent(t0 + 110, waiter, RV_EV_THREAD_SUSPENDED, a);
  };
  auto holders = [&](const std::vector<BuiltProfile>& built) {
    std::set<std::pair<std::string, std::string>> out;
    auto p = Get(built, "gvl_blame");
    if (p) {
      for (const DecodedSample& s : p->samples) {
        if (s.str_labels.at("holder") != "-") out.insert({s.str_labels.at("holder"), s.str_labels.at("waiter")});
      }
    }
    return out;
  };
  using Pairs = std::set<std::pair<std::string, std::string>>;
  contend(1000, 0xa0, 0xb0);
  EXPECT_EQ(holders(pp.Cut(2000, 0, 1)), (Pairs{{"Thread #2", "Thread #3"}}));
  contend(3000, 0xb0, 0xa0);  // the same two threads, the next interval: the same names
  pp.OnEvent(3500, 0xa0, RV_EV_THREAD_EXITED, kNone);
  EXPECT_EQ(holders(pp.Cut(4000, 0, 1)), (Pairs{{"Thread #3", "Thread #2"}}));
  // A new thread at 0xa0's address is another thread; main is named as the agent says.
  pp.OnEvent(5000, 0xa0, RV_EV_THREAD_STARTED, kNone);
  pp.SetMainThread(0xb0);
  contend(6000, 0xa0, 0xb0);
  EXPECT_EQ(holders(pp.Cut(7000, 0, 1)), (Pairs{{"Thread #4", "main"}}));
}

TEST(ProcessProfile, BlameKeepsOnlyWhatOpenWaitsNeedBetweenCuts) {
  ProcessProfile pp(kPeriod);
  const auto a = Stack({"A#run", "<main>"});
  const auto c = Stack({"C#run", "<main>"});
  // Two threads hand the GVL to each other 20000 times in one interval, a sample in every hold.
  pp.OnEvent(0, 1, RV_EV_THREAD_RESUMED, kNone);
  pp.OnEvent(1, 2, RV_EV_THREAD_READY, kNone);
  uint64_t t = 10;
  const size_t empty = pp.approx_memory_bytes();
  size_t most = 0;
  for (int i = 0; i < 20000; ++i, t += 10) {
    const uint64_t holder = i % 2 == 0 ? 1 : 2, next = 3 - holder;
    pp.OnSample(t + 5, holder, false, holder == 1 ? a : c);
    pp.OnEvent(t + 10, holder, RV_EV_THREAD_SUSPENDED, holder == 1 ? a : c);
    pp.OnEvent(t + 10, holder, RV_EV_THREAD_READY, kNone);
    pp.OnEvent(t + 10, next, RV_EV_THREAD_RESUMED, kNone);
    most = std::max(most, pp.approx_memory_bytes());
  }
  EXPECT_GT(pp.stats().blame_drains, 10u);
  // Kept: about kBlameDrainMin spans and samples (~60 B each) at most, not 80000.
  EXPECT_LT(most, empty + ProcessProfile::kBlameDrainMin * 200);
  pp.OnSample(t + 50, 1, false, a);  // thread 1 holds the lock at the cut
  const auto built = pp.Cut(t + 100, 0, 1);
  EXPECT_EQ(TotalOf(built, "gvl_blame"), TotalOf(built, "gvl_wait"));
  auto p = Get(built, "gvl_blame");
  ASSERT_TRUE(p);
  // Each waited for the other's hold, which always has a sample in it: all of it is sampled blame.
  int64_t sampled = 0;
  for (const DecodedSample& smp : p->samples) {
    if (smp.str_labels.at("blame_source") == "sampled") sampled += smp.values.at(0);
  }
  EXPECT_EQ(sampled, Sum(*p));
}

TEST(ProcessProfile, LostEventsAndPausesDiscardOpenSpansButNotSamples) {
  ProcessProfile pp(kPeriod);
  const auto a = Stack({"A#run", "<main>"});
  const auto r = Stack({"IO#read", "<main>"});
  pp.OnEvent(0, 1, RV_EV_THREAD_RESUMED, kNone);    // hold opens
  pp.OnEvent(0, 2, RV_EV_THREAD_SUSPENDED, r);
  pp.OnEvent(10, 2, RV_EV_THREAD_READY, kNone);     // wait opens
  pp.OnEvent(20, 1, RV_EV_GC_ENTER, kNone);         // GC opens
  pp.OnSample(30, 1, false, a);
  pp.OnEventsLost();
  pp.OnEvent(100, 1, RV_EV_THREAD_SUSPENDED, r);   // its hold was discarded: nothing
  pp.OnEvent(110, 2, RV_EV_THREAD_RESUMED, kNone);  // its wait was discarded: nothing; a new hold opens
  pp.OnEvent(120, 1, RV_EV_GC_EXIT, kNone);         // the GC was discarded: nothing
  pp.OnEvent(200, 2, RV_EV_THREAD_SUSPENDED, kNone);  // the new hold counts: 90, no stack known
  EXPECT_EQ(pp.stats().spans_discarded, 3u);
  auto built = pp.Cut(300, 0, 300);
  EXPECT_EQ(Types(built), (std::vector<std::string>{"cpu", "gvl_held"}));
  auto cpu = Get(built, "cpu");
  ASSERT_TRUE(cpu);
  EXPECT_EQ(ValueFor(*cpu, {"A#run", "<main>"}), 1);
  auto held = Get(built, "gvl_held");
  ASSERT_TRUE(held);
  EXPECT_EQ(Sum(*held), 90);
  EXPECT_EQ(ValueFor(*held, {kNoStack}), 90);
  EXPECT_TRUE(HasComment(*held, "1 GVL holds not counted"));

  // A pause discards what is open then; a span opened during the pause is discarded at the resume.
  pp.OnEvent(400, 3, RV_EV_THREAD_READY, kNone);
  pp.OnTracingPaused(410);
  pp.OnEvent(500, 3, RV_EV_THREAD_RESUMED, kNone);
  pp.OnSample(550, 3, false, a);
  pp.OnTracingResumed(600);
  pp.OnEvent(700, 3, RV_EV_THREAD_SUSPENDED, kNone);
  EXPECT_EQ(pp.stats().spans_discarded, 5u);
  built = pp.Cut(800, 0, 500);
  EXPECT_EQ(Types(built), std::vector<std::string>{"cpu"});
  // The next interval's comments start over.
  pp.OnEvent(900, 3, RV_EV_THREAD_RESUMED, kNone);
  pp.OnEvent(950, 3, RV_EV_THREAD_SUSPENDED, kNone);
  built = pp.Cut(1000, 0, 200);
  auto held2 = Get(built, "gvl_held");
  ASSERT_TRUE(held2);
  EXPECT_FALSE(HasComment(*held2, "not counted"));
}

TEST(ProcessProfile, ThreadLifecycle) {
  ProcessProfile pp(kPeriod);
  const auto a = Stack({"A#run", "<main>"});
  pp.OnEvent(0, 1, RV_EV_THREAD_STARTED, kNone);
  pp.OnEvent(10, 1, RV_EV_THREAD_RESUMED, kNone);
  pp.OnSample(20, 1, false, a);
  pp.OnEvent(100, 1, RV_EV_THREAD_EXITED, kNone);  // a hold open at the exit ends there: 90 on a
  pp.OnEvent(0, 2, RV_EV_THREAD_READY, kNone);
  pp.OnEvent(50, 2, RV_EV_THREAD_EXITED, kNone);   // a wait open at the exit has no end: not counted
  pp.OnEvent(0, 3, RV_EV_THREAD_RESUMED, kNone);
  pp.OnEvent(40, 3, RV_EV_THREAD_READY, kNone);    // wanting the lock while holding it ends the hold: 40
  pp.OnEvent(70, 3, RV_EV_THREAD_RESUMED, kNone);  // wait 30
  pp.OnEvent(100, 3, RV_EV_THREAD_SUSPENDED, kNone);  // hold 30
  pp.OnEvent(0, 4, RV_EV_THREAD_RESUMED, kNone);
  pp.OnEvent(60, 4, RV_EV_THREAD_STARTED, kNone);     // th reused: the old hold has no end
  pp.OnEvent(80, 4, RV_EV_THREAD_SUSPENDED, kNone);   // nothing open
  EXPECT_EQ(pp.thread_count(), 2u);  // th 3 and th 4; th 1 and 2 exited
  EXPECT_EQ(pp.stats().spans_discarded, 2u);
  const auto built = pp.Cut(200, 0, 200);
  auto held = Get(built, "gvl_held");
  ASSERT_TRUE(held);
  EXPECT_EQ(ValueFor(*held, {"A#run", "<main>"}), 90);
  EXPECT_EQ(ValueFor(*held, {kNoStack}), 70);
  EXPECT_EQ(Sum(*held), 160);
  auto wait = Get(built, "gvl_wait");
  ASSERT_TRUE(wait);
  EXPECT_EQ(Sum(*wait), 30);
  EXPECT_EQ(ValueFor(*wait, {kNoStack}), 30);
}

TEST(ProcessProfile, StackTableCapSendsNewStacksToTheFullFrameUntilTheResetAtTheCut) {
  ProcessProfileLimits limits;
  // The six stand-ins ("[no stack]", GC, full, GC over full, "[GVL not held]", "[holder unknown]") plus four.
  limits.max_stacks = 10;
  limits.reset_above_bytes = 0;  // rebuild at every cut
  ProcessProfile pp(kPeriod, limits);
  const auto kept = Stack({"Kept#stack", "<main>"});
  pp.OnSample(0, 2, false, kept);  // th 2's latest sample: must survive the rebuild
  for (int i = 0; i < 10; ++i) pp.OnSample(10 + i, 1, false, Stack({"m" + std::to_string(i), "<main>"}));
  pp.OnSample(30, 1, false, kept);  // known stacks are still found
  EXPECT_EQ(pp.stack_table().stack_count(), 10u);
  EXPECT_EQ(pp.stats().stacks_over_cap, 7u);  // m3..m9
  auto built = pp.Cut(100, 0, 100);
  auto cpu = Get(built, "cpu");
  ASSERT_TRUE(cpu);
  EXPECT_EQ(ValueFor(*cpu, {kFull}), 7);
  EXPECT_EQ(ValueFor(*cpu, {"Kept#stack", "<main>"}), 2);
  EXPECT_EQ(ValueFor(*cpu, {"m2", "<main>"}), 1);
  EXPECT_EQ(Sum(*cpu), 12);
  EXPECT_TRUE(HasComment(*cpu, "7 new stacks attributed to [stack table full]"));
  EXPECT_EQ(pp.stats().table_resets, 1u);
  // After the rebuild: the stand-ins, th 2's stack (th 1's latest is the full stand-in).
  EXPECT_EQ(pp.stack_table().stack_count(), 7u);

  pp.OnEvent(200, 2, RV_EV_THREAD_READY, kNone);
  pp.OnEvent(250, 2, RV_EV_THREAD_RESUMED, kNone);
  pp.OnSample(260, 1, false, Stack({"m9", "<main>"}));  // room again
  built = pp.Cut(300, 0, 200);
  auto wait = Get(built, "gvl_wait");
  ASSERT_TRUE(wait);
  EXPECT_EQ(ValueFor(*wait, {"Kept#stack", "<main>"}), 50);
  cpu = Get(built, "cpu");
  ASSERT_TRUE(cpu);
  EXPECT_EQ(ValueFor(*cpu, {"m9", "<main>"}), 1);
  EXPECT_EQ(pp.stats().stacks_over_cap, 7u);
}

TEST(ProcessProfile, ByteCapAlsoLimitsTheTable) {
  ProcessProfileLimits limits;
  limits.max_table_bytes = 64 << 10;
  ProcessProfile pp(kPeriod, limits);
  const std::string pad(100, 'x');  // heap-allocated labels
  for (int i = 0; i < 2000; ++i) pp.OnSample(i, 1, false, Stack({"m" + std::to_string(i) + pad, "<main>"}));
  EXPECT_GT(pp.stats().stacks_over_cap, 0u);
  EXPECT_LT(pp.stack_table().stack_count(), 2000u);
  // The cap is passed by at most one stack.
  EXPECT_LT(pp.stack_table().approx_memory_bytes(), (64u << 10) + 4096);
}

TEST(ProcessProfile, OneDeepStackOfLongLabelsDoesNotPassTheByteCap) {
  // A hostile recursion: one stack of 2,000 distinct frames with 1 KiB labels (what the symbolizer's bound leaves of
  // 60 KB names) is ~2 MB; a table capped at 64 KiB must refuse it frame by frame, not finish it.
  ProcessProfileLimits limits;
  limits.max_table_bytes = 64 << 10;
  ProcessProfile pp(kPeriod, limits);
  std::vector<std::string> labels;
  for (int i = 0; i < 2000; ++i) labels.push_back("m" + std::to_string(i) + std::string(1000, 'x'));
  pp.OnSample(1, 1, false, Stack(labels));
  EXPECT_EQ(pp.stats().stacks_over_cap, 1u);
  EXPECT_LT(pp.stack_table().approx_memory_bytes(), (64u << 10) + 4096);
  std::vector<BuiltProfile> built = pp.Cut(10, 0, 10);
  auto cpu = Get(built, "cpu");
  ASSERT_TRUE(cpu);
  EXPECT_EQ(ValueFor(*cpu, {std::string(kStackTableFullFrame)}), 1);
}

TEST(ProcessProfile, MemoryEstimateFollowsTheHeapAndFallsAfterTheCut) {
  ProcessProfileLimits limits;
  limits.max_table_bytes = 256u << 20;  // no cap in this test
  const size_t kStacks = 3000;
  const size_t kDepth = 12;
  // Inputs are built first so the heap measured below is the profile's alone.
  std::vector<std::vector<FrameInfo>> stacks;
  size_t payload = 0;  // bytes of distinct strings and frame ids
  for (size_t i = 0; i < kStacks; ++i) {
    std::vector<std::string> labels;
    for (size_t d = 0; d < kDepth; ++d) {
      labels.push_back("Module" + std::to_string(d) + "::Klass#method_" + std::to_string(i * kDepth + d));
    }
    stacks.push_back(Stack(labels));
    for (const FrameInfo& f : stacks.back()) payload += f.label.size() + f.path.size();
    payload += kDepth * sizeof(uint32_t);
  }
#if !defined(__SANITIZE_ADDRESS__)
  // Small blocks (uordblks) and blocks glibc maps on their own (hblkhd, large arrays).
  auto heap = [] {
    const struct mallinfo2 m = mallinfo2();
    return m.uordblks + m.hblkhd;
  };
  const size_t heap_before = heap();
#endif
  auto pp = std::make_unique<ProcessProfile>(kPeriod, limits);
  const size_t empty = pp->approx_memory_bytes();
  EXPECT_LT(empty, 16u << 10);
  for (size_t i = 0; i < kStacks; ++i) pp->OnSample(i, 1 + i % 8, false, stacks[i]);
  const size_t full = pp->approx_memory_bytes();
  EXPECT_GE(full, payload);
  EXPECT_LE(full, 4 * payload);
#if !defined(__SANITIZE_ADDRESS__)
  // The estimate is within 25% of what the heap really grew by (glibc malloc; ASan replaces the allocator).
  const double grown = static_cast<double>(heap() - heap_before);
  std::printf("estimate %zu heap %.0f payload %zu\n", full, grown, payload);
  EXPECT_GT(static_cast<double>(full), 0.75 * grown) << "estimate " << full << " heap " << grown;
  EXPECT_LT(static_cast<double>(full), 1.25 * grown) << "estimate " << full << " heap " << grown;
#endif
  EXPECT_FALSE(pp->Cut(kStacks, 0, 1).empty());
  // Above reset_above_bytes: rebuilt with only the 8 threads' latest stacks.
  EXPECT_EQ(pp->stats().table_resets, 1u);
  EXPECT_LT(pp->approx_memory_bytes(), empty + (32u << 10));
}

TEST(ProcessProfile, IdleThreadStatesArePrunedButNotOpenOnes) {
  ProcessProfileLimits limits;
  limits.idle_cuts_before_prune = 2;
  ProcessProfile pp(kPeriod, limits);
  const auto r = Stack({"IO#read", "<main>"});
  pp.OnEvent(0, 1, RV_EV_THREAD_SUSPENDED, r);  // th 1 blocks
  pp.OnEvent(0, 2, RV_EV_THREAD_READY, kNone);  // th 2 waits through every cut
  pp.Cut(100, 0, 100);
  pp.Cut(200, 0, 100);
  EXPECT_EQ(pp.thread_count(), 2u);
  auto built = pp.Cut(300, 0, 100);
  EXPECT_EQ(pp.thread_count(), 1u);  // th 1 idle for 2 cuts: dropped
  EXPECT_EQ(pp.stats().threads_pruned, 1u);
  auto wait = Get(built, "gvl_wait");
  ASSERT_TRUE(wait);
  EXPECT_EQ(Sum(*wait), 100);  // th 2's wait, one interval's part
  // th 1 comes back: its release stack was forgotten with its state.
  pp.OnEvent(400, 1, RV_EV_THREAD_READY, kNone);
  pp.OnEvent(450, 1, RV_EV_THREAD_RESUMED, kNone);
  built = pp.Cut(500, 0, 200);
  wait = Get(built, "gvl_wait");
  ASSERT_TRUE(wait);
  EXPECT_EQ(ValueFor(*wait, {kNoStack}), 200 + 50);  // th 2's open wait (no stack) and th 1's
}

TEST(ProcessProfile, AThreadErasedWhileItIsTheLastOneSeenStartsAfreshWhenItComesBack) {
  // Thread() remembers the last thread it returned; erasing that thread (exit, pruning) must forget it, or its next
  // event would write into freed state (ASan) or inherit the old spans.
  ProcessProfileLimits limits;
  limits.idle_cuts_before_prune = 1;
  ProcessProfile pp(kPeriod, limits);
  pp.OnEvent(0, 7, RV_EV_THREAD_RESUMED, kNone);
  pp.OnEvent(10, 7, RV_EV_THREAD_EXITED, kNone);  // th 7 is the remembered one when it is erased
  pp.OnEvent(20, 7, RV_EV_THREAD_READY, kNone);   // a new thread at the same address: a fresh wait
  pp.OnEvent(50, 7, RV_EV_THREAD_RESUMED, kNone);
  pp.OnEvent(60, 7, RV_EV_THREAD_SUSPENDED, kNone);
  EXPECT_EQ(pp.thread_count(), 1u);
  auto built = pp.Cut(100, 0, 100);
  auto wait = Get(built, "gvl_wait");
  ASSERT_TRUE(wait);
  EXPECT_EQ(Sum(*wait), 30);
  auto held = Get(built, "gvl_held");
  ASSERT_TRUE(held);
  EXPECT_EQ(Sum(*held), 10 + 10);  // the first thread's hold up to its exit, the new one's
  // Pruned while remembered: idle through a cut, dropped at the next, then seen again.
  pp.Cut(200, 0, 100);
  EXPECT_EQ(pp.thread_count(), 0u);
  pp.OnEvent(210, 7, RV_EV_THREAD_READY, kNone);
  pp.OnEvent(240, 7, RV_EV_THREAD_RESUMED, kNone);
  EXPECT_EQ(pp.thread_count(), 1u);
  built = pp.Cut(300, 0, 100);
  wait = Get(built, "gvl_wait");
  ASSERT_TRUE(wait);
  EXPECT_EQ(Sum(*wait), 30);
}

TEST(ProcessProfile, SameInputSameBytes) {
  auto run = [] {
    ProcessProfile pp(kPeriod);
    for (int i = 0; i < 300; ++i) {
      const auto s = Stack({"m" + std::to_string(i % 17), "n" + std::to_string(i % 5), "<main>"});
      pp.OnSample(i * 10, 1 + i % 3, i % 7 == 0, s);
      pp.OnEvent(i * 10 + 1, 1 + i % 3, RV_EV_THREAD_SUSPENDED, s);
      pp.OnEvent(i * 10 + 2, 1 + i % 3, RV_EV_THREAD_READY, kNone);
      pp.OnEvent(i * 10 + 5, 1 + i % 3, RV_EV_THREAD_RESUMED, kNone);
    }
    return pp.Cut(4000, 5, 6);
  };
  const auto a = run();
  const auto b = run();
  ASSERT_EQ(a.size(), 4u);  // cpu, gvl_wait, gvl_held, gvl_blame (with its thread labels)
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].profile_type, b[i].profile_type);
    EXPECT_EQ(a[i].pprof_gz, b[i].pprof_gz);
    EXPECT_EQ(a[i].total, b[i].total);
  }
}

// The shared-stack API (the agent's) must give the same bytes as the value API, whatever mix of reused stack objects
// (the resolver's memo hits), new stack objects of reused frames, fresh copies of equal frames (its misses), null
// stacks and table caps and rebuilds it sees.
TEST(ProcessProfile, SharedStacksGiveTheSameBytesAsValues) {
  ProcessProfileLimits limits;
  limits.max_stacks = 40;        // some stacks go over the cap
  limits.reset_above_bytes = 0;  // the table (and its memos) is rebuilt at every cut
  std::map<std::string, SharedFrame> cached;  // label -> the one shared object, as a resolver cache hands out
  std::map<std::string, SharedStack> stacks;  // labels -> the one stack object, as the resolver's memo hands out
  auto shared = [&](const std::vector<FrameInfo>& values, int i) -> SharedStack {
    if (values.empty()) return nullptr;
    std::string key;
    for (const FrameInfo& f : values) key += f.label + ";";
    SharedStack& st = stacks[key];
    if (st && i % 11 != 0 && i % 4 != 0) return st;
    auto out = std::make_shared<std::vector<SharedFrame>>();
    for (const FrameInfo& f : values) {
      SharedFrame& c = cached[f.label];
      if (!c || i % 11 == 0) c = std::make_shared<const FrameInfo>(f);  // a miss: an equal frame in a new object
      out->push_back(c);
    }
    st = out;
    return st;
  };
  auto run = [&](bool use_shared) {
    ProcessProfile pp(kPeriod, limits);
    std::vector<std::string> out;
    for (int cut = 1; cut <= 3; ++cut) {
      for (int i = 0; i < 200; ++i) {
        const int t = cut * 1000 + i;
        const auto s = Stack({"m" + std::to_string(i % (13 * cut)), "n" + std::to_string(i % 5), "<main>"});
        const uint64_t th = 1 + static_cast<uint64_t>(i % 3);
        if (use_shared) {
          const SharedStack f = shared(s, i);
          pp.OnSample(t * 10, th, i % 7 == 0, f);
          pp.OnEvent(t * 10 + 1, th, RV_EV_THREAD_SUSPENDED, f);
          pp.OnEvent(t * 10 + 2, th, RV_EV_THREAD_READY, shared(std::vector<FrameInfo>(s.begin(), s.begin() + (i % 2 ? 3 : 0)), i));
        } else {
          pp.OnSample(t * 10, th, i % 7 == 0, s);
          pp.OnEvent(t * 10 + 1, th, RV_EV_THREAD_SUSPENDED, s);
          pp.OnEvent(t * 10 + 2, th, RV_EV_THREAD_READY, std::span<const FrameInfo>(s).first(i % 2 ? 3 : 0));
        }
        pp.OnEvent(t * 10 + 5, th, RV_EV_THREAD_RESUMED, kNone);
      }
      for (const BuiltProfile& b : pp.Cut(cut * 10000 + 9000, cut, 6)) out.push_back(b.profile_type + b.pprof_gz);
    }
    EXPECT_GT(pp.stats().stacks_over_cap, 0u);
    return out;
  };
  const auto values = run(false);
  const auto shared_run = run(true);
  ASSERT_EQ(values.size(), 12u);
  EXPECT_EQ(values, shared_run);
}

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

TEST(ProcessProfile, GoToolPprofReadsEveryProfile) {
  int status = 0;
  RunCommand("command -v go >/dev/null 2>&1", &status);
  if (status != 0) GTEST_SKIP() << "go is not installed (tools/install-deps.sh installs golang-go): cannot run pprof";
  ProcessProfile pp(kPeriod);
  const auto hot = Stack({"Foo#hot", "block in <main>", "<main>"});
  const auto sleeping = Stack({"Kernel#sleep", "Waiter#run", "<main>"});
  pp.OnEvent(0, 1, RV_EV_THREAD_RESUMED, kNone);
  for (int i = 0; i < 20; ++i) pp.OnSample(i * 1000, 1, false, hot);
  pp.OnEvent(100, 2, RV_EV_THREAD_SUSPENDED, sleeping);
  pp.OnEvent(200, 2, RV_EV_THREAD_READY, kNone);
  pp.OnEvent(30'000'000, 1, RV_EV_THREAD_SUSPENDED, hot);
  pp.OnEvent(30'000'000, 2, RV_EV_THREAD_RESUMED, kNone);
  pp.OnEvent(30'100'000, 2, RV_EV_GC_ENTER, kNone);
  pp.OnEvent(31'000'000, 2, RV_EV_GC_EXIT, kNone);
  const auto built = pp.Cut(40'000'000, 1'700'000'000'000'000'000, 40'000'000);
  ASSERT_EQ(built.size(), 5u);
  char tmpl[] = "/tmp/rvagg-test-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string env = "HOME=" + dir + " GOCACHE=" + dir + "/gocache GOFLAGS=-mod=mod ";
  const std::map<std::string, std::string> top_of = {
      {"cpu", "Foo#hot"}, {"gvl_wait", "Kernel#sleep"}, {"gvl_held", "Foo#hot"}, {"gc", kGc}, {"gvl_blame", "Foo#hot"}};
  for (const BuiltProfile& b : built) {
    const std::string path = dir + "/" + b.profile_type + ".pb.gz";
    std::ofstream(path, std::ios::binary) << b.pprof_gz;
    const std::string out = RunCommand(env + "go tool pprof -top " + path + " 2>&1", &status);
    EXPECT_EQ(status, 0) << out;
    EXPECT_NE(out.find("Type: " + b.profile_type), std::string::npos) << out;
    EXPECT_NE(out.find(" " + top_of.at(b.profile_type) + "\n"), std::string::npos) << out;
    std::printf("%s", out.c_str());  // evidence in the test log
  }
  RunCommand("rm -rf " + dir, &status);
}

}  // namespace
}  // namespace rvbpfd
