#include "export/folded.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

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

TEST(FoldedExport, LinesSortAsWholeStringsAndMergeWhenTheyRenderAlike) {
  // Lines are compared frame by frame without being built: the order must still be that of the joined strings
  // (';' sorts after '2', a prefix first, bytes unsigned), and stacks of different frames that render alike merge.
  SyntheticTrace t(99);
  const uint32_t a_b = t.Stack({"A", "B"});
  const uint32_t a2 = t.Stack({"A2"});
  const uint32_t a = t.Stack({"A"});
  const uint32_t a_e = t.Stack({"A", "\xc3\xa9"});
  const uint32_t semi = t.Stack({"x;y"});
  const uint32_t colon = t.Stack({"x:y"});
  uint64_t now = 0;
  for (uint32_t s : {a_b, a2, a, a_e, semi, colon, colon, a_b}) t.Event(now += 10, EventName::kSample, 1, s);
  EXPECT_EQ(Folded(t.Finish(now + 10)),
            "A 1\n"
            "A2 1\n"
            "A;B 2\n"
            "A;\xc3\xa9 1\n"
            "x:y 3\n");
}

TEST(FoldedExport, ADeepStackOfLongLabelsIsWrittenWhole) {
  // 2,000 frames of a 1,000-byte label: one line of 2 MB, written piece by piece, equal to the joined string.
  SyntheticTrace t(99);
  const std::string label(1000, 'r');
  std::vector<std::string> deep(2000, label);
  deep.push_back("leaf");
  const uint32_t s = t.Stack(deep);
  t.Event(10, EventName::kSample, 1, s);
  std::string want;
  for (const std::string& f : deep) want += (want.empty() ? "" : ";") + f;
  EXPECT_EQ(Folded(t.Finish(20)), want + " 1\n");
}

}  // namespace
}  // namespace rvbpfd
