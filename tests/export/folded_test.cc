#include "export/folded.h"

#include <gtest/gtest.h>

#include <sstream>

#include "pprof_test_util.h"

namespace rvbpfd {
namespace {

using testing::SyntheticTrace;

std::string Folded(const TraceFile& trace, FoldedWeight weight = FoldedWeight::kCpuSamples) {
  std::ostringstream out;
  EXPECT_TRUE(ExportFolded(trace, out, weight).ok());
  return out.str();
}

TEST(FoldedExport, RootFirstStacksWithCountsSummedOverThreads) {
  SyntheticTrace t(99);
  const uint32_t hot = t.Stack({"<main>", "Foo.run", "Integer#times", "block in Foo.run", "Foo#hot"});
  const uint32_t cold = t.Stack({"<main>", "Foo#cold"});
  uint64_t now = 0;
  for (int i = 0; i < 7; ++i) t.Event(now += 10, EventName::kSample, 1, hot);
  for (int i = 0; i < 4; ++i) t.Event(now += 10, EventName::kSample, 2, hot);
  for (int i = 0; i < 3; ++i) t.Event(now += 10, EventName::kSample, 1, cold);
  t.Event(now += 10, EventName::kSample, 1);
  const std::string out = Folded(t.Finish(now + 10));
  EXPECT_EQ(out,
            "<main>;Foo#cold 3\n"
            "<main>;Foo.run;Integer#times;block in Foo.run;Foo#hot 11\n"
            "[no stack] 1\n");
}

TEST(FoldedExport, GvlWaitWeightIsNanoseconds) {
  SyntheticTrace t(99);
  const uint32_t sleeping = t.Stack({"<main>", "Kernel#sleep"});
  t.Event(100, EventName::kGvlReleased, 2, sleeping);
  t.Event(200, EventName::kWantsGvl, 2);
  t.Event(1234, EventName::kGvlAcquired, 2);
  t.Event(1300, EventName::kSample, 1, sleeping);
  const TraceFile trace = t.Finish(2000);
  EXPECT_EQ(Folded(trace, FoldedWeight::kGvlWaitNs), "<main>;Kernel#sleep 1034\n");
  EXPECT_EQ(Folded(trace), "<main>;Kernel#sleep 1\n");
}

TEST(FoldedExport, SeparatorsInLabelsCannotSplitFrames) {
  EXPECT_EQ(FoldedFrameName("a;b"), "a:b");
  EXPECT_EQ(FoldedFrameName("x\ny"), "x y");
  EXPECT_EQ(FoldedFrameName(""), "?");
  SyntheticTrace t(99);
  const uint32_t s = t.Stack({"<main>", "weird;name"});
  t.Event(10, EventName::kSample, 1, s);
  EXPECT_EQ(Folded(t.Finish(20)), "<main>;weird:name 1\n");
}

}  // namespace
}  // namespace rvbpfd
