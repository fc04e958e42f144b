#include "ops/log.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <vector>

namespace rvbpfd {
namespace {

using ::testing::HasSubstr;

// 2026-11-30T12:34:56.789Z
std::chrono::system_clock::time_point FixedTime() {
  return std::chrono::system_clock::time_point(std::chrono::milliseconds(1796042096789));
}

TEST(LogTest, Rfc3339Millis) {
  EXPECT_EQ(FormatRfc3339Millis(FixedTime()), "2026-11-30T12:34:56.789Z");
  EXPECT_EQ(FormatRfc3339Millis(std::chrono::system_clock::time_point()), "1970-01-01T00:00:00.000Z");
  // Sub-millisecond parts are truncated, not rounded.
  EXPECT_EQ(FormatRfc3339Millis(std::chrono::system_clock::time_point(std::chrono::microseconds(1999))),
            "1970-01-01T00:00:00.001Z");
  // Before the epoch the millisecond part still counts forward within the second.
  EXPECT_EQ(FormatRfc3339Millis(std::chrono::system_clock::time_point(std::chrono::milliseconds(-1))),
            "1969-12-31T23:59:59.999Z");
}

TEST(LogTest, JsonRecord) {
  std::ostringstream out;
  Logger log(LogFormat::kJson, &out, FixedTime);
  log.Info("attached", {{"pid", 1234}, {"comm", "puma"}, {"rate", 0.5}, {"ok", true},
                        {"events", uint64_t{18446744073709551615u}}, {"delta", int64_t{-3}}});
  EXPECT_EQ(out.str(),
            "{\"ts\":\"2026-11-30T12:34:56.789Z\",\"level\":\"info\",\"msg\":\"attached\",\"pid\":1234,"
            "\"comm\":\"puma\",\"rate\":0.5,\"ok\":true,\"events\":18446744073709551615,\"delta\":-3}\n");
  nlohmann::json j = nlohmann::json::parse(out.str());
  EXPECT_EQ(j["events"].get<uint64_t>(), 18446744073709551615u);
}

TEST(LogTest, TextRecord) {
  std::ostringstream out;
  Logger log(LogFormat::kText, &out, FixedTime);
  log.Warn("push failed", {{"url", "http://p:4040"}, {"error", "connection refused"}, {"attempt", 3},
                           {"empty", ""}, {"eq", "a=b"}, {"q", "say \"hi\""}});
  EXPECT_EQ(out.str(),
            "2026-11-30T12:34:56.789Z warn push failed url=http://p:4040 error=\"connection refused\" attempt=3 "
            "empty=\"\" eq=\"a=b\" q=\"say \\\"hi\\\"\"\n");
}

TEST(LogTest, EveryRecordIsOneLine) {
  std::ostringstream out;
  Logger log(LogFormat::kText, &out, FixedTime);
  log.Error("bad\nthing\r", {{"comm", "evil\nname"}});
  EXPECT_EQ(out.str(), "2026-11-30T12:34:56.789Z error bad\\nthing\\r comm=\"evil\\nname\"\n");
  out.str("");
  log.SetFormat(LogFormat::kJson);
  log.Error("bad\nthing", {{"comm", "evil\nname"}});
  std::string s = out.str();
  EXPECT_EQ(s.find('\n'), s.size() - 1);
}

TEST(LogTest, JsonEscaping) {
  EXPECT_EQ(JsonEscape("plain"), "plain");
  EXPECT_EQ(JsonEscape("q\"b\\s/"), "q\\\"b\\\\s/");
  EXPECT_EQ(JsonEscape("\b\f\n\r\t"), "\\b\\f\\n\\r\\t");
  EXPECT_EQ(JsonEscape(std::string("\x01\x1f\x7f", 3)), "\\u0001\\u001f\\u007f");
  EXPECT_EQ(JsonEscape(std::string("a\0b", 3)), "a\\u0000b");
  // Valid UTF-8 passes through (2, 3 and 4 byte sequences).
  EXPECT_EQ(JsonEscape("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x92\x8e"), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x92\x8e");
  // Invalid bytes become U+FFFD each: lone continuation, truncated sequence, overlong, surrogate, > U+10FFFF.
  const std::string kFffd = "\xef\xbf\xbd";
  EXPECT_EQ(JsonEscape("a\x80z"), "a" + kFffd + "z");
  EXPECT_EQ(JsonEscape("a\xc3"), "a" + kFffd);
  EXPECT_EQ(JsonEscape("\xc0\xaf"), kFffd + kFffd);
  EXPECT_EQ(JsonEscape("\xed\xa0\x80"), kFffd + kFffd + kFffd);
  EXPECT_EQ(JsonEscape("\xf4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);
  EXPECT_EQ(JsonEscape("\xe2\x82z"), kFffd + kFffd + "z");
}

TEST(LogTest, JsonOutputParsesWithHostileStrings) {
  std::ostringstream out;
  Logger log(LogFormat::kJson, &out, FixedTime);
  std::string hostile;
  for (int c = 0; c < 256; ++c) hostile.push_back(static_cast<char>(c));
  log.Info(hostile, {{"comm", hostile}, {"nan", std::nan("")}, {"inf", 1.0 / 0.0}});
  nlohmann::json j = nlohmann::json::parse(out.str());  // throws (fails the test) if the line is not valid JSON
  std::string msg = j["msg"].get<std::string>();
  EXPECT_EQ(msg.substr(0, 128), hostile.substr(0, 128));  // ASCII survives exactly
  EXPECT_EQ(j["nan"], "NaN");
  EXPECT_EQ(j["inf"], "+Inf");
}

TEST(LogTest, Utf8Validation) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("ascii"));
  EXPECT_TRUE(IsValidUtf8("\xf4\x8f\xbf\xbf"));  // U+10FFFF
  EXPECT_TRUE(IsValidUtf8("\xe0\xa0\x80"));      // U+0800, smallest 3-byte
  EXPECT_FALSE(IsValidUtf8("\xe0\x9f\xbf"));     // overlong 3-byte
  EXPECT_FALSE(IsValidUtf8("\xf0\x8f\xbf\xbf")); // overlong 4-byte
  EXPECT_FALSE(IsValidUtf8("\xff"));
  EXPECT_FALSE(IsValidUtf8("\xc3"));
}

TEST(LogTest, MinLevelFilters) {
  std::ostringstream out;
  Logger log(LogFormat::kText, &out, FixedTime);
  log.Debug("hidden");
  EXPECT_EQ(out.str(), "");
  log.SetMinLevel(LogLevel::kDebug);
  log.Debug("shown");
  EXPECT_THAT(out.str(), HasSubstr(" debug shown\n"));
  out.str("");
  log.SetMinLevel(LogLevel::kError);
  log.Warn("hidden");
  log.Error("kept");
  EXPECT_EQ(out.str(), "2026-11-30T12:34:56.789Z error kept\n");
}

TEST(LogTest, ParseLogFormat) {
  EXPECT_EQ(ParseLogFormat("json").value(), LogFormat::kJson);
  EXPECT_EQ(ParseLogFormat("text").value(), LogFormat::kText);
  Result<LogFormat> bad = ParseLogFormat("yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code(), ErrorCode::kUsage);
  EXPECT_THAT(bad.error().message(), HasSubstr("--log-format"));
}

TEST(LogTest, ConcurrentRecordsNeverInterleave) {
  std::ostringstream out;
  Logger log(LogFormat::kJson, &out, FixedTime);
  constexpr int kThreads = 4, kRecords = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&log, t] {
      for (int i = 0; i < kRecords; ++i) log.Info("tick", {{"thread", t}, {"i", i}, {"pad", std::string(100, 'x')}});
    });
  }
  for (std::thread& t : threads) t.join();
  std::istringstream in(out.str());
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    EXPECT_EQ(j["msg"], "tick");
    ++lines;
  }
  EXPECT_EQ(lines, kThreads * kRecords);
}

TEST(LogTest, AgentLogIsSharedAndFormatSettable) {
  std::ostringstream out;
  Logger& log = AgentLog();
  EXPECT_EQ(&log, &AgentLog());
  log.SetOutput(&out);
  log.SetClock(FixedTime);
  SetLogFormat(LogFormat::kText);
  log.Info("hello", {{"k", 1}});
  EXPECT_TRUE(SetLogFormat("json").ok());
  log.Info("hello", {{"k", 1}});
  EXPECT_FALSE(SetLogFormat("yaml").ok());  // no change
  log.Info("again");
  SetLogFormat(LogFormat::kJson);
  log.SetOutput(nullptr);  // back to stderr before `out` goes away
  log.SetClock(nullptr);
  EXPECT_EQ(out.str(),
            "2026-11-30T12:34:56.789Z info hello k=1\n"
            "{\"ts\":\"2026-11-30T12:34:56.789Z\",\"level\":\"info\",\"msg\":\"hello\",\"k\":1}\n"
            "{\"ts\":\"2026-11-30T12:34:56.789Z\",\"level\":\"info\",\"msg\":\"again\"}\n");
}

}  // namespace
}  // namespace rvbpfd
