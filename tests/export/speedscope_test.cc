#include "export/speedscope.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "export/format_checks.h"
#include "model/model_test_util.h"

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
