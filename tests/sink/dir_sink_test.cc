#include "sink/dir_sink.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "sink/sink_test_util.h"

namespace rvbpfd {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::TempDir;

ProfileUpload MakeUpload(std::string body, int64_t from, std::string type = "cpu", std::string pid = "4242",
                         std::string app = "shop-api") {
  ProfileUpload u;
  u.app_name = std::move(app);
  u.profile_type = std::move(type);
  u.labels = {{"host", "web-1"}, {"pid", std::move(pid)}};
  u.from_unix_s = from;
  u.until_unix_s = from + 15;
  u.pprof_gz = std::move(body);
  return u;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& content) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << content;
}

// Every regular file under `dir`, relative to it.
std::set<std::string> ListFiles(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) out.insert(fs::relative(e.path(), dir).string());
  }
  return out;
}

TEST(DirSinkTest, WritesOneCompleteFilePerProfile) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/out/nested";  // created, parents included
  auto sink = DirSink::Create(dir, 1 << 20);
  ASSERT_TRUE(sink.ok()) << sink.error().ToString();
  const std::string body("\x1f\x8b\x08\x00gzip\0data", 14);
  (*sink)->Submit(MakeUpload(body, 1700000000));
  (*sink)->Submit(MakeUpload("gvl", 1700000000, "gvl_wait"));
  ASSERT_TRUE((*sink)->Flush(60s));
  EXPECT_EQ(ListFiles(dir), (std::set<std::string>{"shop-api/cpu-4242-1700000000-1700000015.pb.gz",
                                                    "shop-api/gvl_wait-4242-1700000000-1700000015.pb.gz"}));
  const std::string path = dir + "/shop-api/cpu-4242-1700000000-1700000015.pb.gz";
  EXPECT_EQ((*sink)->PathFor(MakeUpload(body, 1700000000)), path);
  EXPECT_EQ(ReadFile(path), body);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  const SinkStats s = (*sink)->stats();
  EXPECT_EQ(s.delivered, 2u);
  EXPECT_EQ(s.bytes_delivered, body.size() + 3);
  EXPECT_EQ(s.delivery_failures, 0u);
  EXPECT_EQ((*sink)->total_bytes_for_test(), body.size() + 3);
}

TEST(DirSinkTest, NeverWritesThroughAPlantedServiceSymlink) {
  TempDir tmp, elsewhere;
  const std::string victim = elsewhere.path() + "/victim";
  WriteFile(victim, "precious");
  auto sink = DirSink::Create(tmp.path(), 1 << 20);
  ASSERT_TRUE(sink.ok());
  // Someone who can write the output directory plants <dir>/<service> -> a directory of root's choosing.
  ASSERT_EQ(::symlink(elsewhere.path().c_str(), (tmp.path() + "/shop-api").c_str()), 0);
  (*sink)->Submit(MakeUpload("profile", 1700000000));
  (*sink)->Submit(MakeUpload("other", 1700000000, "cpu", "1", "other-app"));
  (void)(*sink)->Flush(60s);  // waits for both; its result depends on whether the failure came before the call
  const SinkStats s = (*sink)->stats();
  EXPECT_EQ(s.delivered, 1u);  // the other service's profile still goes out
  EXPECT_EQ(s.delivery_failures, 1u);
  EXPECT_NE(s.last_error.find("shop-api is a symbolic link"), std::string::npos) << s.last_error;
  EXPECT_EQ(ListFiles(elsewhere.path()), (std::set<std::string>{"victim"}));
  EXPECT_EQ(ReadFile(victim), "precious");
}

TEST(DirSinkTest, SanitizesNamesIntoTheDirectory) {
  TempDir tmp;
  auto sink = DirSink::Create(tmp.path(), 1 << 20);
  ASSERT_TRUE(sink.ok());
  (*sink)->Submit(MakeUpload("x", 5, "gvl-wait", "12/3", "../../etc"));
  (*sink)->Submit(MakeUpload("y", 5, "", "", ".hidden app"));
  ASSERT_TRUE((*sink)->Flush(60s));
  EXPECT_EQ(ListFiles(tmp.path()), (std::set<std::string>{"_._.._etc/gvl_wait-12_3-5-20.pb.gz",
                                                           "_hidden_app/unknown-unknown-5-20.pb.gz"}));
  EXPECT_EQ(SanitizeFileComponent(std::string(300, 'a'), true).size(), 100u);
  EXPECT_EQ(SanitizeFileComponent("..", true), "_.");
}

TEST(DirSinkTest, RotationDeletesTheOldestByIntervalStart) {
  TempDir tmp;
  auto sink = DirSink::Create(tmp.path(), 250);
  ASSERT_TRUE(sink.ok());
  const std::string hundred(100, 'p');
  // Written out of order: from=30, then 10, then 20. The third write passes 250 bytes: from=10 goes.
  (*sink)->Submit(MakeUpload(hundred, 30));
  (*sink)->Submit(MakeUpload(hundred, 10));
  (*sink)->Submit(MakeUpload(hundred, 20));
  ASSERT_TRUE((*sink)->Flush(60s));
  EXPECT_EQ(ListFiles(tmp.path()), (std::set<std::string>{"shop-api/cpu-4242-20-35.pb.gz",
                                                           "shop-api/cpu-4242-30-45.pb.gz"}));
  EXPECT_EQ((*sink)->stats().rotated_files, 1u);
  EXPECT_EQ((*sink)->total_bytes_for_test(), 200u);
  // Across apps too: the oldest interval anywhere goes first.
  (*sink)->Submit(MakeUpload(hundred, 40, "gc", "7", "other-app"));
  ASSERT_TRUE((*sink)->Flush(60s));
  EXPECT_EQ(ListFiles(tmp.path()), (std::set<std::string>{"shop-api/cpu-4242-30-45.pb.gz",
                                                           "other-app/gc-7-40-55.pb.gz"}));
  EXPECT_EQ((*sink)->stats().rotated_files, 2u);
}

TEST(DirSinkTest, ANoisyServiceRotatesAwayOnlyItsOwnFiles) {
  TempDir tmp;
  auto sink = DirSink::Create(tmp.path(), 500);
  ASSERT_TRUE(sink.ok());
  const std::string hundred(100, 'p');
  // Two quiet services write one old profile each, then a noisy one writes ten newer ones: past 500 bytes the
  // service holding the most bytes loses its oldest file, so the quiet services' old files stay.
  (*sink)->Submit(MakeUpload(hundred, 10, "cpu", "1", "quiet-a"));
  (*sink)->Submit(MakeUpload(hundred, 11, "cpu", "2", "quiet-b"));
  for (int i = 0; i < 10; ++i) (*sink)->Submit(MakeUpload(hundred, 100 + i, "cpu", "3", "noisy"));
  ASSERT_TRUE((*sink)->Flush(60s));
  EXPECT_EQ(ListFiles(tmp.path()),
            (std::set<std::string>{"quiet-a/cpu-1-10-25.pb.gz", "quiet-b/cpu-2-11-26.pb.gz",
                                   "noisy/cpu-3-107-122.pb.gz", "noisy/cpu-3-108-123.pb.gz",
                                   "noisy/cpu-3-109-124.pb.gz"}));
  EXPECT_EQ((*sink)->stats().rotated_files, 7u);
  EXPECT_EQ((*sink)->total_bytes_for_test(), 500u);
  EXPECT_EQ((*sink)->service_bytes_for_test("noisy"), 300u);
}

TEST(DirSinkTest, EachServiceHasItsOwnCap) {
  TempDir tmp;
  auto sink = DirSink::Create(tmp.path(), 10000, 256, /*max_service_bytes=*/200);
  ASSERT_TRUE(sink.ok());
  const std::string hundred(100, 'p');
  for (int i = 0; i < 4; ++i) (*sink)->Submit(MakeUpload(hundred, 10 + i, "cpu", "1", "a"));
  (*sink)->Submit(MakeUpload(hundred, 5, "cpu", "2", "b"));
  ASSERT_TRUE((*sink)->Flush(60s));
  // Far under the total cap, "a" keeps its two newest files; "b", with the oldest file of all, keeps it.
  EXPECT_EQ(ListFiles(tmp.path()), (std::set<std::string>{"a/cpu-1-12-27.pb.gz", "a/cpu-1-13-28.pb.gz",
                                                           "b/cpu-2-5-20.pb.gz"}));
  EXPECT_EQ((*sink)->stats().rotated_files, 2u);
  // A profile larger than one service's cap is not written.
  (*sink)->Submit(MakeUpload(std::string(201, 'x'), 20, "cpu", "2", "b"));
  (void)(*sink)->Flush(60s);
  EXPECT_EQ((*sink)->stats().delivery_failures, 1u);
  EXPECT_NE((*sink)->stats().last_error.find("--output-service-max-mb"), std::string::npos);
}

TEST(DirSinkTest, RewritingTheSamePathIsCountedOnce) {
  TempDir tmp;
  auto sink = DirSink::Create(tmp.path(), 150);
  ASSERT_TRUE(sink.ok());
  (*sink)->Submit(MakeUpload(std::string(100, 'a'), 10));
  (*sink)->Submit(MakeUpload(std::string(100, 'b'), 10));  // same name: replaces, total stays 100
  ASSERT_TRUE((*sink)->Flush(60s));
  EXPECT_EQ(ReadFile(tmp.path() + "/shop-api/cpu-4242-10-25.pb.gz"), std::string(100, 'b'));
  EXPECT_EQ((*sink)->stats().rotated_files, 0u);
  EXPECT_EQ((*sink)->total_bytes_for_test(), 100u);
}

TEST(DirSinkTest, CreateCleansTempFilesAndIndexesExistingProfiles) {
  TempDir tmp;
  const std::string d = tmp.path();
  WriteFile(d + "/app/.cpu-1-10-25.pb.gz.999.1.tmp", "half");   // a crash mid-write
  WriteFile(d + "/app/cpu-1-10-25.pb.gz", std::string(100, 'x'));
  WriteFile(d + "/app/cpu-1-20-35.pb.gz", std::string(100, 'x'));
  WriteFile(d + "/app/gc-1-30-45.pb.gz", std::string(100, 'x'));
  WriteFile(d + "/app/notes.txt", std::string(1000, 'n'));      // not ours: kept, not counted
  WriteFile(d + "/app/other.tmp", "x");                           // not our temp pattern: kept
  WriteFile(d + "/README", "x");
  auto sink = DirSink::Create(d, 250);
  ASSERT_TRUE(sink.ok());
  EXPECT_EQ(ListFiles(d), (std::set<std::string>{"README", "app/cpu-1-20-35.pb.gz", "app/gc-1-30-45.pb.gz",
                                                  "app/notes.txt", "app/other.tmp"}));
  EXPECT_EQ((*sink)->stats().rotated_files, 1u);
  EXPECT_EQ((*sink)->total_bytes_for_test(), 200u);
}

TEST(DirSinkTest, ProfileLargerThanTheCapIsNotWritten) {
  TempDir tmp;
  auto sink = DirSink::Create(tmp.path(), 50);
  ASSERT_TRUE(sink.ok());
  (*sink)->Submit(MakeUpload(std::string(51, 'x'), 10));
  // Flush's result says whether something failed while it waited; the worker may have refused the upload before
  // Flush was called (about one run in a few hundred), so only the counters tell.
  (void)(*sink)->Flush(60s);
  EXPECT_TRUE(ListFiles(tmp.path()).empty());
  EXPECT_EQ((*sink)->stats().delivery_failures, 1u);
  EXPECT_NE((*sink)->stats().last_error.find("--output-max-mb"), std::string::npos);
}

TEST(DirSinkTest, FailedWriteLeavesNoFileBehind) {
  TempDir tmp;
  auto sink = DirSink::Create(tmp.path(), 1 << 20);
  ASSERT_TRUE(sink.ok());
  // The final name is taken by a non-empty directory: nothing is written (safe_file's tests cover failures after
  // the data was written: the temporary file is removed).
  WriteFile(tmp.path() + "/shop-api/cpu-4242-10-25.pb.gz/blocker", "x");
  (*sink)->Submit(MakeUpload("profile", 10));
  // Flush's result says whether something was lost while it waited; the worker may have failed the write before
  // Flush was called, so only the counters tell.
  (*sink)->Flush(60s);
  EXPECT_EQ(ListFiles(tmp.path()), (std::set<std::string>{"shop-api/cpu-4242-10-25.pb.gz/blocker"}));
  const SinkStats s = (*sink)->stats();
  EXPECT_EQ(s.delivery_failures, 1u);
  EXPECT_EQ(s.delivered, 0u);
  EXPECT_NE(s.last_error.find("a directory is there"), std::string::npos) << s.last_error;
}

TEST(DirSinkTest, CreateFailsWithAnActionableError) {
  TempDir tmp;
  WriteFile(tmp.path() + "/file", "x");
  auto r = DirSink::Create(tmp.path() + "/file/sub", 1 << 20);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kOutputUnwritable);
  EXPECT_NE(r.error().message().find("--output-dir " + tmp.path() + "/file/sub"), std::string::npos);
  EXPECT_NE(r.error().message().find("Not a directory"), std::string::npos) << r.error().message();
  EXPECT_EQ(DirSink::Create(tmp.path(), 0).error().code(), ErrorCode::kUsage);
  EXPECT_EQ(DirSink::Create("", 1).error().code(), ErrorCode::kUsage);
}

}  // namespace
}  // namespace rvbpfd
