#include "common/json_dump.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace rvbpfd {
namespace {

TEST(DumpJsonTest, InvalidUtf8IsReplacedInsteadOfThrowing) {
  nlohmann::json j = {{"host", "bad\xffhost"}, {"sym", std::string("\xc0\xaf\xed\xa0\x80", 5)}};
  // What nlohmann does by default, and what aborted the agent: type_error.316.
  EXPECT_THROW((void)j.dump(), nlohmann::json::type_error);
  std::string out;
  ASSERT_NO_THROW(out = DumpJson(j));
  EXPECT_NE(out.find("\"bad\xef\xbf\xbdhost\""), std::string::npos) << out;
  // The result is valid JSON that parses back.
  nlohmann::json back = nlohmann::json::parse(out);
  EXPECT_EQ(back["host"].get<std::string>(), "bad\xef\xbf\xbdhost");
}

TEST(DumpJsonTest, OrderedJsonKeysAndIndentAsGiven) {
  nlohmann::ordered_json o = nlohmann::ordered_json::object();
  o["z"] = 1;
  o["a"] = "caf\xc3\xa9";
  EXPECT_EQ(DumpJson(o), "{\"z\":1,\"a\":\"caf\xc3\xa9\"}");
  EXPECT_EQ(DumpJson(o, 1), "{\n \"z\": 1,\n \"a\": \"caf\xc3\xa9\"\n}");
}

}  // namespace
}  // namespace rvbpfd
