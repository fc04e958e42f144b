#include "trace/json_format.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

namespace rvbpfd {
namespace {

// Parses what AppendJsonString produced with an independent JSON parser.
std::string RoundTrip(std::string_view s) {
  std::string out;
  AppendJsonString(&out, s);
  return nlohmann::json::parse(out).get<std::string>();
}

TEST(AppendJsonString, SpecialCharactersRoundTrip) {
  const std::string inputs[] = {
      "",
      "plain",
      "quote \" inside",
      "back\\slash",
      "new\nline\ttab\rcr\bbs\fff",
      std::string("nul\0byte", 8),
      "\x01\x1f\x7f",
      "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80",  // 2-, 3- and 4-byte UTF-8
      "/slash/ and </script>",
  };
  for (const std::string& in : inputs) EXPECT_EQ(RoundTrip(in), in) << in;
}

TEST(AppendJsonString, ControlCharactersAreEscaped) {
  std::string out;
  AppendJsonString(&out, std::string("a\x01\n\"", 4));
  EXPECT_EQ(out, "\"a\\u0001\\n\\\"\"");
  for (char c : out.substr(1, out.size() - 2)) EXPECT_GE(static_cast<unsigned char>(c), 0x20);
}

TEST(AppendJsonString, InvalidUtf8BecomesReplacementCharacter) {
  const std::string replacement = "\xEF\xBF\xBD";
  EXPECT_EQ(RoundTrip("a\xFF" "b"), "a" + replacement + "b");
  EXPECT_EQ(RoundTrip("\xC3"), replacement);                       // truncated 2-byte sequence
  EXPECT_EQ(RoundTrip("\xC0\xAF"), replacement + replacement);     // overlong '/'
  EXPECT_EQ(RoundTrip("\xED\xA0\x80"), replacement + replacement + replacement);  // UTF-16 surrogate
  EXPECT_EQ(RoundTrip("\xF4\x90\x80\x80"), replacement + replacement + replacement + replacement);  // > U+10FFFF
}

TEST(AppendNumbers, IntegersAndFixed) {
  std::string out;
  AppendUint(&out, 0);
  out += ' ';
  AppendUint(&out, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(out, "0 18446744073709551615");

  out.clear();
  AppendFixed(&out, 509.6054, 3);
  EXPECT_EQ(out, "509.605");
  out.clear();
  AppendFixed(&out, std::nan(""), 3);
  EXPECT_EQ(out, "null");
  out.clear();
  AppendDouble(&out, 12.5);
  EXPECT_EQ(nlohmann::json::parse(out).get<double>(), 12.5);
  out.clear();
  AppendDouble(&out, std::numeric_limits<double>::infinity());
  EXPECT_EQ(out, "null");
}

}  // namespace
}  // namespace rvbpfd
