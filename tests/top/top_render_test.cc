// The screen of `rvbpfd top` (top/top_render.h) from hand-made snapshots: shares, order, the GVL holder's mark,
// truncation to the terminal's width and height, escaping, and the JSON object.
#include "top/top_render.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/utf8.h"

namespace rvbpfd {
namespace {

constexpr uint64_t kMs = 1'000'000;

TopThread Thread(uint32_t n, uint64_t run, uint64_t wait, uint64_t sleep, const std::string& where = "") {
  TopThread t;
  t.ruby_thread = n;
  t.native_tid = 100 + n;
  t.state = wait > 0 ? "gvl_wait" : "running";
  t.running_ns = run * kMs;
  t.gvl_wait_ns = wait * kMs;
  if (sleep > 0) t.blocked_ns = {{"sleep", sleep * kMs}};
  t.idle_ns = (1000 - run - wait - sleep) * kMs;
  t.where = where;
  return t;
}

TopSnapshot Snapshot() {
  TopSnapshot s;
  s.pid = 42;
  s.ruby_version = "3.4.5";
  s.number = 3;
  s.start_ns = 1000 * kMs;
  s.end_ns = 2000 * kMs;
  s.gvl_holder = 2;
  s.threads = {Thread(3, 20, 950, 0, "IO#read in Pipe#trip (a.rb:3)"), Thread(4, 0, 0, 900), Thread(2, 970, 0, 0)};
  s.threads[2].holds_gvl = true;
  s.blockers = {{"TopBusy.burn", 950 * kMs, {2}}};
  s.blocked_stacks = {{"gvl_wait", "IO#read in Pipe#trip (a.rb:3)", 950 * kMs, {3}}};
  return s;
}

std::vector<std::string> Fields(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string f; in >> f;) out.push_back(f);
  return out;
}

// The row of thread n (its first field after the holder mark).
const std::string* RowOf(const std::vector<std::string>& lines, uint32_t n) {
  for (const std::string& l : lines) {
    std::vector<std::string> f = Fields(l);
    if (!f.empty() && f[0] == "*") f.erase(f.begin());
    if (f.size() > 2 && f[0] == std::to_string(n) && f[1] == std::to_string(100 + n)) return &l;
  }
  return nullptr;
}

TEST(TopRenderTest, RowsShowEachStateShareOfTheInterval) {
  const std::vector<std::string> lines = RenderTop(Snapshot(), TopLayout{});
  const std::string* row = RowOf(lines, 3);
  ASSERT_NE(row, nullptr);
  std::vector<std::string> f = Fields(*row);
  // THREAD TID NAME STATE RUN% GC% WAIT% BLK% IDLE% ...
  ASSERT_GE(f.size(), 9u);
  EXPECT_EQ(f[2], "-") << "an unnamed thread";
  EXPECT_EQ(f[3], "gvl_wait");
  EXPECT_EQ(f[4], "2");
  EXPECT_EQ(f[5], "0");
  EXPECT_EQ(f[6], "95");
  EXPECT_EQ(f[7], "0");
  EXPECT_EQ(f[8], "3");
  EXPECT_NE(row->find("IO#read in Pipe#trip (a.rb:3)"), std::string::npos);
  const std::string* sleeper = RowOf(lines, 4);
  ASSERT_NE(sleeper, nullptr);
  EXPECT_EQ(Fields(*sleeper)[7], "90");
  EXPECT_NE(sleeper->find("sleep 90%"), std::string::npos);
}

TEST(TopRenderTest, HolderIsMarkedAndNamedInTheHeader) {
  const std::vector<std::string> lines = RenderTop(Snapshot(), TopLayout{});
  EXPECT_NE(lines[0].find("GVL holder: thread 2 (tid 102)"), std::string::npos);
  EXPECT_NE(lines[0].find("pid 42"), std::string::npos);
  const std::string* holder = RowOf(lines, 2);
  ASSERT_NE(holder, nullptr);
  EXPECT_EQ((*holder)[0], '*');
  EXPECT_EQ((*RowOf(lines, 3))[0], ' ');
}

TEST(TopRenderTest, RowsInTheSnapshotsOrderAndTablesAfter) {
  const std::vector<std::string> lines = RenderTop(Snapshot(), TopLayout{});
  auto index = [&](const std::string* p) { return p - lines.data(); };
  EXPECT_LT(index(RowOf(lines, 3)), index(RowOf(lines, 4)));
  EXPECT_LT(index(RowOf(lines, 4)), index(RowOf(lines, 2)));
  auto blockers = std::find_if(lines.begin(), lines.end(),
                               [](const std::string& l) { return l.find("TOP BLOCKERS") == 0; });
  ASSERT_NE(blockers, lines.end());
  EXPECT_NE((blockers + 2)->find("TopBusy.burn"), std::string::npos);
  EXPECT_NE((blockers + 2)->find("950.0"), std::string::npos);
}

TEST(TopRenderTest, ThreadOrderIsMostWaitingFirst) {
  std::vector<TopThread> rows = {Thread(2, 970, 0, 0), Thread(4, 0, 0, 900), Thread(5, 0, 10, 0),
                                 Thread(3, 20, 950, 0), Thread(6, 0, 0, 0)};
  std::sort(rows.begin(), rows.end(), TopThreadOrder);
  std::vector<uint32_t> order;
  for (const TopThread& t : rows) order.push_back(t.ruby_thread);
  EXPECT_EQ(order, (std::vector<uint32_t>{3, 5, 4, 2, 6}));
}

TEST(TopRenderTest, LinesCutToTheWidthOnCharacterBoundaries) {
  TopSnapshot s = Snapshot();
  s.threads[0].where = "Überweisung#ausführen in Zahlung#prüfen (/app/zahlung_überall.rb:123456)";
  for (size_t width : {20u, 57u, 58u, 59u, 80u}) {
    for (const std::string& line : RenderTop(s, TopLayout{.width = width})) {
      size_t cols = 0;
      for (size_t i = 0; i < line.size(); ++cols) {
        const size_t len = Utf8SequenceLength(line, i);
        ASSERT_NE(len, 0u) << "cut inside a character at width " << width << ": " << line;
        i += len;
      }
      EXPECT_LE(cols, width) << line;
    }
  }
  EXPECT_EQ(CutToWidth("aé b", 2), "aé");
  EXPECT_EQ(CutToWidth("abc", 0), "abc");
}

TEST(TopRenderTest, HeightKeepsTheThreadsAndSaysHowManyAreLeftOut) {
  TopSnapshot s = Snapshot();
  for (uint32_t n = 10; n < 30; ++n) s.threads.push_back(Thread(n, 0, 0, 0));
  const std::vector<std::string> lines = RenderTop(s, TopLayout{.height = 10});
  ASSERT_EQ(lines.size(), 10u);
  EXPECT_NE(lines.back().find("... 16 more threads"), std::string::npos) << lines.back();
  EXPECT_NE(RowOf(lines, 3), nullptr);  // the most waiting thread stays
  for (const std::string& l : lines) EXPECT_EQ(l.find("TOP BLOCKERS"), std::string::npos);
  // Room for everything: the tables are shown.
  const std::vector<std::string> tall = RenderTop(Snapshot(), TopLayout{.height = 40});
  EXPECT_NE(std::find_if(tall.begin(), tall.end(), [](const std::string& l) { return l.find("TOP BLOCKERS") == 0; }),
            tall.end());
}

TEST(TopRenderTest, TablesShrinkToKeepBothInTheHeight) {
  TopSnapshot s = Snapshot();
  for (int i = 0; i < 4; ++i) s.blockers.push_back({"M" + std::to_string(i), 10 * kMs, {}});
  // 2 header lines, 3 threads, each table a blank line, a title and a heading: room for 2 + 1 table rows.
  const std::vector<std::string> lines = RenderTop(s, TopLayout{.height = 14});
  ASSERT_LE(lines.size(), 14u);
  auto has = [&](const std::string& text) {
    return std::any_of(lines.begin(), lines.end(),
                       [&](const std::string& l) { return l.find(text) != std::string::npos; });
  };
  EXPECT_TRUE(has("TOP BLOCKED STACKS"));
  EXPECT_TRUE(has("  950.0  gvl_wait"));
  EXPECT_TRUE(has("M0"));
  EXPECT_FALSE(has("M1"));
}

TEST(TopRenderTest, NamesFillTheirColumnCutOnCharacterBoundaries) {
  TopSnapshot s = Snapshot();
  s.threads[0].name = "puma srv tp 001";
  s.threads[1].name = "\xc3\xa9t\xc3\xa9-worker-with-a-long-name";  // 30 characters, two of them two bytes long
  const std::vector<std::string> lines = RenderTop(s, TopLayout{});
  const std::string* named = RowOf(lines, s.threads[0].ruby_thread);
  ASSERT_NE(named, nullptr);
  EXPECT_NE(named->find(" puma srv tp 001   gvl_wait"), std::string::npos) << *named;
  const std::string* cut = RowOf(lines, s.threads[1].ruby_thread);
  ASSERT_NE(cut, nullptr);
  // 15 characters and a pad fill the 16 columns above; 16 characters of a longer name (18 bytes), then two spaces.
  EXPECT_NE(cut->find(" \xc3\xa9t\xc3\xa9-worker-with-  "), std::string::npos) << *cut;
  // The same columns whatever the name: the state starts at one offset in every row (counted in characters).
  auto state_col = [](const std::string& row, const std::string& state) {
    const size_t at = row.find(state);
    size_t cols = 0;
    for (size_t i = 0; i < at; ++cols) i += (static_cast<unsigned char>(row[i]) & 0xC0) == 0xC0 ? 2 : 1;
    return cols;
  };
  EXPECT_EQ(state_col(*named, "gvl_wait"), state_col(*cut, s.threads[1].state));
  const nlohmann::json j = nlohmann::json::parse(TopJson(s));
  EXPECT_EQ(j["threads"][0]["name"], "puma srv tp 001");
  EXPECT_TRUE(j["threads"][2]["name"].is_null());
}

TEST(TopRenderTest, TargetTextIsEscaped) {
  TopSnapshot s = Snapshot();
  s.threads[0].where = "evil\x1b[2J\x07";
  s.blockers[0].method = "m\x1b]0;x\x07";
  for (const std::string& line : RenderTop(s, TopLayout{})) {
    EXPECT_EQ(line.find('\x1b'), std::string::npos) << line;
    EXPECT_EQ(line.find('\x07'), std::string::npos) << line;
  }
}

TEST(TopRenderTest, JsonObject) {
  TopSnapshot s = Snapshot();
  s.threads[0].where = std::string("bad\xff utf8");
  const nlohmann::json j = nlohmann::json::parse(TopJson(s));
  EXPECT_EQ(j["pid"], 42);
  EXPECT_EQ(j["interval"], 3);
  EXPECT_EQ(j["gvl_holder"], 2);
  ASSERT_EQ(j["threads"].size(), 3u);
  EXPECT_EQ(j["threads"][0]["ruby_thread"], 3);
  EXPECT_EQ(j["threads"][0]["gvl_wait_ns"], 950 * kMs);
  EXPECT_EQ(j["threads"][1]["blocked_ns"]["sleep"], 900 * kMs);
  EXPECT_EQ(j["threads"][2]["holds_gvl"], true);
  EXPECT_EQ(j["blockers"][0]["method"], "TopBusy.burn");
  EXPECT_EQ(j["blockers"][0]["holders"], nlohmann::json::array({2}));
  EXPECT_EQ(j["blocked_stacks"][0]["threads"], nlohmann::json::array({3}));
  EXPECT_EQ(j["threads"][0]["endpoint"], "-");
  EXPECT_EQ(TopJson(s).find('\n'), std::string::npos);
}

TEST(TopRenderTest, ARowNamesItsEndpointAfterWhere) {
  TopSnapshot s = Snapshot();
  s.threads[0].endpoint = "LedgerController#cpu";
  const std::vector<std::string> lines = RenderTop(s, TopLayout{});
  const std::string* row = RowOf(lines, s.threads[0].ruby_thread);
  ASSERT_NE(row, nullptr);
  EXPECT_NE(row->find("@ LedgerController#cpu"), std::string::npos) << *row;
  const std::string* other = RowOf(lines, s.threads[1].ruby_thread);
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(other->find(" @ "), std::string::npos) << "no endpoint: nothing shown";
  EXPECT_EQ(nlohmann::json::parse(TopJson(s))["threads"][0]["endpoint"], "LedgerController#cpu");
}

}  // namespace
}  // namespace rvbpfd
