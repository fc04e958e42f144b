#include "export/speedscope.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "export/format_checks.h"
#include "model/model_test_util.h"
#include "pprof_test_util.h"

namespace rvbpfd {
namespace {

using nlohmann::json;
using testing::CheckSpeedscope;
using testing::EveryRuleSequence;

json ExportToJson(const Model& model) {
  std::ostringstream out;
  const Status status = ExportSpeedscope(model, out);
  EXPECT_TRUE(status.ok()) << status.error().ToString();
  return json::parse(out.str());
}

TEST(SpeedscopeExport, ConformsToTheSchema) {
  const Model model = EveryRuleSequence().Build("3.2.5", 0);
  const json doc = ExportToJson(model);
  const std::vector<std::string> errors = CheckSpeedscope(doc);
  EXPECT_TRUE(errors.empty()) << errors.front();
}

TEST(SpeedscopeExport, CheckerCatchesBrokenFiles) {
  const std::string head =
      R"({"$schema":"https://www.speedscope.app/file-format-schema.json","shared":{"frames":[{"name":"a"},{"name":"b"}]},"profiles":[{"type":"evented","name":"t","unit":"nanoseconds","startValue":0,"endValue":10,"events":)";
  EXPECT_TRUE(CheckSpeedscope(json::parse(head + R"([{"type":"O","at":0,"frame":0},{"type":"C","at":1,"frame":0}]}]})"))
                  .empty());
  // Crossed nesting, an unclosed frame, time going backwards, a frame index out of range, a wrong unit.
  EXPECT_FALSE(CheckSpeedscope(json::parse(head + R"([{"type":"O","at":0,"frame":0},{"type":"O","at":1,"frame":1},
      {"type":"C","at":2,"frame":0},{"type":"C","at":3,"frame":1}]}]})")).empty());
  EXPECT_FALSE(CheckSpeedscope(json::parse(head + R"([{"type":"O","at":0,"frame":0}]}]})")).empty());
  EXPECT_FALSE(CheckSpeedscope(json::parse(head + R"([{"type":"O","at":5,"frame":0},{"type":"C","at":4,"frame":0}]}]})"))
                   .empty());
  EXPECT_FALSE(CheckSpeedscope(json::parse(head + R"([{"type":"O","at":0,"frame":7},{"type":"C","at":1,"frame":7}]}]})"))
                   .empty());
  json bad_unit = json::parse(head + "[]}]}");
  bad_unit["profiles"][0]["unit"] = "ticks";
  EXPECT_FALSE(CheckSpeedscope(bad_unit).empty());
}

TEST(SpeedscopeExport, OneProfilePerThreadWhoseFramesAddUpToTheModel) {
  const Model model = EveryRuleSequence().Build("3.2.5", 0);
  const json doc = ExportToJson(model);
  ASSERT_EQ(doc["profiles"].size(), model.threads().size());
  const json& frames = doc["shared"]["frames"];
  std::set<std::string> distinct;
  for (const json& f : frames) EXPECT_TRUE(distinct.insert(f["name"].get<std::string>()).second) << f;
  for (size_t p = 0; p < model.threads().size(); ++p) {
    const RubyThread& thread = model.threads()[p];
    const json& prof = doc["profiles"][p];
    EXPECT_EQ(prof["name"], model.ThreadLabel(thread.ruby_thread));
    EXPECT_EQ(prof["unit"], "nanoseconds");
    EXPECT_EQ(prof["startValue"], model.start_ns());
    EXPECT_EQ(prof["endValue"], model.end_ns());
    // Time per frame label equals the model's time per block label (alive states only).
    std::map<std::string, uint64_t> from_file, from_model;
    uint64_t open_at = 0;
    for (const json& ev : prof["events"]) {
      if (ev["type"] == "O") {
        open_at = ev["at"];
      } else {
        from_file[frames[ev["frame"].get<size_t>()]["name"]] += ev["at"].get<uint64_t>() - open_at;
      }
    }
    for (const StateBlock& b : thread.blocks) {
      if (b.state == ThreadState::kNotStarted || b.state == ThreadState::kExited) continue;
      from_model[StateBlockLabel(b)] += b.duration_ns();
    }
    EXPECT_EQ(from_file, from_model) << prof["name"];
  }
  EXPECT_TRUE(distinct.count("released: sleeping"));
  EXPECT_TRUE(distinct.count("wants_gvl: preempted"));
  EXPECT_TRUE(distinct.count("unknown"));
}

// Thread 2 holds the GVL 0-9 ms sampled in Hog.spin while thread 3 waits 1-9 ms; thread 3 then blocks 10-15 ms in
// Kernel#sleep and exits at 16 ms.
TEST(SpeedscopeExport, BlameAndWallAreSampledProfilesBesideTheUnchangedThreadProfiles) {
  constexpr uint64_t kMs = 1'000'000;
  testing::SyntheticTrace t(99);
  const uint32_t hog = t.Stack({"<main>", "Hog.spin"});
  const uint32_t sleeping = t.Stack({"<main>", "Kernel#sleep"});
  t.Event(0, EventName::kGvlAcquired, 2);
  t.Event(1 * kMs, EventName::kWantsGvl, 3);
  for (int i = 2; i <= 8; ++i) t.Event(i * kMs, EventName::kSample, 2, hog);
  t.Event(9 * kMs, EventName::kGvlReleased, 2, hog);
  t.Event(9 * kMs, EventName::kGvlAcquired, 3);
  t.Event(10 * kMs, EventName::kGvlReleased, 3, sleeping);
  t.Event(15 * kMs, EventName::kWantsGvl, 3);
  t.Event(15 * kMs, EventName::kGvlAcquired, 3);
  t.Event(16 * kMs, EventName::kThreadExited, 3);
  const TraceFile trace = t.Finish(16 * kMs);
  Result<Model> model = Model::FromTrace(trace);
  ASSERT_TRUE(model.ok());
  std::ostringstream with, without;
  ASSERT_TRUE(ExportSpeedscope(*model, trace, with).ok());
  ASSERT_TRUE(ExportSpeedscope(*model, without).ok());
  const json doc = json::parse(with.str()), evented = json::parse(without.str());
  const std::vector<std::string> errors = CheckSpeedscope(doc);
  EXPECT_TRUE(errors.empty()) << errors.front();
  const size_t n = model->threads().size();
  ASSERT_EQ(doc["profiles"].size(), n + 2);
  const json& frames = doc["shared"]["frames"];
  for (size_t p = 0; p < n; ++p) {
    // Same events on frames of the same names.
    ASSERT_EQ(doc["profiles"][p]["events"].size(), evented["profiles"][p]["events"].size());
    for (size_t i = 0; i < doc["profiles"][p]["events"].size(); ++i) {
      const json& a = doc["profiles"][p]["events"][i];
      const json& b = evented["profiles"][p]["events"][i];
      EXPECT_EQ(a["at"], b["at"]);
      EXPECT_EQ(frames[a["frame"].get<size_t>()]["name"], evented["shared"]["frames"][b["frame"].get<size_t>()]["name"]);
    }
  }
  auto names = [&](const json& sample) {
    std::vector<std::string> out;
    for (const json& f : sample) out.push_back(frames[f.get<size_t>()]["name"]);
    return out;
  };
  const json& blame = doc["profiles"][n];
  EXPECT_EQ(blame["type"], "sampled");
  EXPECT_EQ(blame["endValue"], 8 * kMs);  // all of thread 3's wait
  std::map<std::vector<std::string>, uint64_t> blamed;
  for (size_t i = 0; i < blame["samples"].size(); ++i) blamed[names(blame["samples"][i])] += blame["weights"][i].get<uint64_t>();
  EXPECT_EQ(blamed, (std::map<std::vector<std::string>, uint64_t>{{{"holder: Thread #2", "<main>", "Hog.spin"}, 8 * kMs}}));
  const json& wall = doc["profiles"][n + 1];
  std::map<std::vector<std::string>, uint64_t> walls;
  for (size_t i = 0; i < wall["samples"].size(); ++i) walls[names(wall["samples"][i])] += wall["weights"][i].get<uint64_t>();
  EXPECT_EQ(walls[(std::vector<std::string>{"Thread #3", "<main>", "Kernel#sleep", "[blocked: unknown]"})], 5 * kMs);
  EXPECT_EQ(walls[(std::vector<std::string>{"Thread #3", "[gvl_wait]"})], 8 * kMs);
  uint64_t thread3 = 0;
  for (const auto& [stack, ns] : walls) thread3 += stack.front() == "Thread #3" ? ns : 0;
  EXPECT_EQ(thread3, 15 * kMs);  // its lifetime, 1-16 ms
  // Trace frames keep their file and line.
  bool located = false;
  for (const json& f : frames) located |= f["name"] == "Hog.spin" && f.contains("file") && f.contains("line");
  EXPECT_TRUE(located);
}

TEST(SpeedscopeExport, StreamFailureIsAnIoError) {
  const Model model = EveryRuleSequence().Build("3.2.5", 0);
  std::ostringstream out;
  out.setstate(std::ios::badbit);
  const Status status = ExportSpeedscope(model, out);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.error().code(), ErrorCode::kIo);
}

}  // namespace
}  // namespace rvbpfd
