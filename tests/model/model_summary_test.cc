#include "model/model_summary.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "model/model_test_util.h"

namespace rvbpfd {
namespace {

using testing::EventSeq;
using testing::EveryRuleSequence;
using testing::kMs;

std::string LineFor(const std::string& text, const std::string& label) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(label, 0) == 0) return line;
  }
  return "";
}

TEST(ModelSummary, PrintsStatesContentionAndTopReasonsPerThread) {
  EventSeq s;
  s.Add(0, EventName::kWantsGvl, 2, 11);
  s.Add(3 * kMs, EventName::kGvlAcquired, 2, 11);
  s.Add(4 * kMs, EventName::kSleepEnter, 2, 11);
  s.Add(5 * kMs, EventName::kGvlReleased, 2, 11);
  s.Add(15 * kMs, EventName::kWantsGvl, 2, 11);
  s.Add(20 * kMs, EventName::kGvlAcquired, 2, 11);
  s.Add(21 * kMs, EventName::kGvlReleased, 2, 11);
  s.Add(25 * kMs, EventName::kTracingStopped);
  const Model model = s.Build();
  std::ostringstream out;
  PrintModelSummary(model, out);
  const std::string line = LineFor(out.str(), "Thread #2");
  ASSERT_FALSE(line.empty()) << out.str();
  // running 2+1, wants 3+5, released 10+4, 2 waits, longest 5; sleeping first (10 ms), then unknown (4 ms).
  EXPECT_NE(line.find("3.000"), std::string::npos) << line;
  EXPECT_NE(line.find("8.000"), std::string::npos) << line;
  EXPECT_NE(line.find("14.000"), std::string::npos) << line;
  EXPECT_NE(line.find(" 2 "), std::string::npos) << line;
  EXPECT_NE(line.find("5.000"), std::string::npos) << line;
  const size_t sleeping = line.find("sleeping* 10.000 ms (1x)");
  const size_t unknown = line.find("unknown 4.000 ms (1x)");
  ASSERT_NE(sleeping, std::string::npos) << line;
  ASSERT_NE(unknown, std::string::npos) << line;
  EXPECT_LT(sleeping, unknown);
}

TEST(ModelSummary, ReportsUnknownSpansAndIdleGvl) {
  const Model model = EveryRuleSequence().Build("3.2.5", 0);
  std::ostringstream out;
  PrintModelSummary(model, out);
  const std::string text = out.str();
  EXPECT_NE(text.find("1 with dropped events (12 events lost), 1 tracing pauses (30.000 ms)"), std::string::npos)
      << text;
  EXPECT_FALSE(LineFor(text, "main").empty()) << text;
  EXPECT_FALSE(LineFor(text, "Thread #3").empty()) << text;
  EXPECT_NE(text.find("gvl: idle "), std::string::npos);
}

}  // namespace
}  // namespace rvbpfd

namespace rvbpfd {
namespace {

TEST(ContentionSummary, TotalsWaitsOverThreadsAndSplitsTheGvlTime) {
  using testing::EventSeq;
  using testing::kMs;
  EventSeq s;
  s.Add(0, EventName::kGvlAcquired, 1, 100);
  s.Add(1 * kMs, EventName::kWantsGvl, 2, 101);       // T2 waits 4 ms
  s.Add(5 * kMs, EventName::kGvlReleased, 1, 100);
  s.Add(5 * kMs, EventName::kGvlAcquired, 2, 101);
  s.Add(6 * kMs, EventName::kWantsGvl, 1, 100);       // main waits 1 ms
  s.Add(7 * kMs, EventName::kGvlReleased, 2, 101);
  s.Add(7 * kMs, EventName::kGvlAcquired, 1, 100);
  s.Add(8 * kMs, EventName::kGvlReleased, 1, 100);    // then idle 2 ms
  s.Add(10 * kMs, EventName::kTracingStopped);
  const Model model = s.Build("3.4.5", 1);
  std::ostringstream out;
  PrintContentionSummary(model, out);
  const std::string text = out.str();
  EXPECT_NE(text.find("gvl contention: 5.000 ms waiting in 2 waits, longest 4.000 ms (Thread #2)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("gvl: held 8.000 ms, idle 2.000 ms, unknown 0.000 ms"), std::string::npos) << text;
}

}  // namespace
}  // namespace rvbpfd
