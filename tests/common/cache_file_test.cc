// Cache files (src/common/cache_file.h): reads are bounded and never block, writes are atomic and never follow a
// planted link, and nothing is read from or written to a directory or entry another user could have written.
#include "common/cache_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace rvbpfd {
namespace {

struct stat StatOf(mode_t mode, uid_t uid) {
  struct stat st {};
  st.st_mode = mode;
  st.st_uid = uid;
  return st;
}

TEST(CacheStatProblemTest, OwnerMustBeRootOrTheEffectiveUser) {
  EXPECT_EQ(CacheStatProblem(StatOf(S_IFDIR | 0755, 0), 0, CachePathRole::kDirectory), std::nullopt);
  EXPECT_EQ(CacheStatProblem(StatOf(S_IFDIR | 0755, 1000), 1000, CachePathRole::kDirectory), std::nullopt);
  EXPECT_EQ(CacheStatProblem(StatOf(S_IFDIR | 0755, 0), 1000, CachePathRole::kDirectory), std::nullopt);
  const std::optional<std::string> p = CacheStatProblem(StatOf(S_IFDIR | 0755, 65534), 0, CachePathRole::kDirectory);
  ASSERT_TRUE(p.has_value());
  EXPECT_NE(p->find("owned by uid 65534"), std::string::npos) << *p;
  EXPECT_TRUE(CacheStatProblem(StatOf(S_IFREG | 0644, 65534), 0, CachePathRole::kEntry).has_value());
  EXPECT_TRUE(CacheStatProblem(StatOf(S_IFDIR | 0755, 65534), 0, CachePathRole::kAncestor).has_value());
}

TEST(CacheStatProblemTest, NoGroupOrOtherWritesExceptAStickyRootParent) {
  for (mode_t bad : {0775, 0757, 0777, 01777}) {
    const std::optional<std::string> p = CacheStatProblem(StatOf(S_IFDIR | bad, 0), 0, CachePathRole::kDirectory);
    ASSERT_TRUE(p.has_value()) << std::oct << bad;
    EXPECT_NE(p->find("writable by group or others"), std::string::npos) << *p;
    EXPECT_TRUE(CacheStatProblem(StatOf(S_IFREG | (bad & 0777), 0), 0, CachePathRole::kEntry).has_value());
  }
  // /tmp above the cache directory: sticky and root's.
  EXPECT_EQ(CacheStatProblem(StatOf(S_IFDIR | 01777, 0), 0, CachePathRole::kAncestor), std::nullopt);
  EXPECT_TRUE(CacheStatProblem(StatOf(S_IFDIR | 0777, 0), 0, CachePathRole::kAncestor).has_value());
  EXPECT_TRUE(CacheStatProblem(StatOf(S_IFDIR | 01777, 1000), 1000, CachePathRole::kAncestor).has_value());
}

TEST(CacheStatProblemTest, TypesAreChecked) {
  EXPECT_TRUE(CacheStatProblem(StatOf(S_IFLNK | 0777, 0), 0, CachePathRole::kEntry).has_value());
  EXPECT_TRUE(CacheStatProblem(StatOf(S_IFIFO | 0600, 0), 0, CachePathRole::kEntry).has_value());
  EXPECT_TRUE(CacheStatProblem(StatOf(S_IFDIR | 0755, 0), 0, CachePathRole::kEntry).has_value());
  EXPECT_TRUE(CacheStatProblem(StatOf(S_IFREG | 0755, 0), 0, CachePathRole::kDirectory).has_value());
  EXPECT_EQ(CacheStatProblem(StatOf(S_IFREG | 0644, 0), 0, CachePathRole::kEntry), std::nullopt);
}

class CacheFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/rvbpfd-cache-file-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  static std::string Slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::string dir_;
};

// Files and directories the tests make belong to the test's user; `Foreign` gives a uid that is neither root nor
// the effective uid the checks are told, and `Euid` that effective uid: as root the file is chowned to nobody, as
// another user the checks are told a different effective uid.
class CacheTrustTest : public CacheFileTest {
 protected:
  void SetUp() override {
    CacheFileTest::SetUp();
    SetCacheWarningSink([this](const std::string& line) { warnings_.push_back(line); });
  }
  void TearDown() override {
    SetCacheWarningSink(nullptr);
    CacheFileTest::TearDown();
  }
  // Makes `path` foreign-owned when running as root; returns false when the test cannot (not root).
  static bool MakeForeign(const std::string& path) { return geteuid() == 0 && chown(path.c_str(), 65534, 65534) == 0; }
  std::vector<std::string> warnings_;
};

TEST_F(CacheTrustTest, AnEntryWritableByOthersIsNotReadAndWarnedOnce) {
  const std::string cache = dir_ + "/sites";
  const std::string path = cache + "/entry.json";
  WriteCacheFile(cache, path, "trusted");
  ASSERT_EQ(ReadCacheFile(path, 1024), "trusted");
  ASSERT_EQ(chmod(path.c_str(), 0666), 0);
  EXPECT_EQ(ReadCacheFile(path, 1024), std::nullopt);
  EXPECT_EQ(ReadCacheFile(path, 1024), std::nullopt);
  ASSERT_EQ(warnings_.size(), 1u);
  EXPECT_NE(warnings_[0].find(path), std::string::npos) << warnings_[0];
  EXPECT_NE(warnings_[0].find("writable by group or others"), std::string::npos) << warnings_[0];
  // Rewritten by rvbpfd (rename over it): trusted again.
  WriteCacheFile(cache, path, "again");
  EXPECT_EQ(ReadCacheFile(path, 1024), "again");
}

TEST_F(CacheTrustTest, AnEntryOfAnotherUserIsNotRead) {
  const std::string cache = dir_ + "/sites";
  const std::string path = cache + "/entry.json";
  WriteCacheFile(cache, path, "planted");
  if (!MakeForeign(path)) GTEST_SKIP() << "needs root to chown";
  EXPECT_EQ(ReadCacheFile(path, 1024), std::nullopt);
  ASSERT_EQ(warnings_.size(), 1u);
  EXPECT_NE(warnings_[0].find("owned by uid 65534"), std::string::npos) << warnings_[0];
}

TEST_F(CacheTrustTest, ASymlinkedEntryIsNotFollowed) {
  const std::string cache = dir_ + "/sites";
  WriteCacheFile(cache, cache + "/real.json", "real");
  ASSERT_EQ(symlink((cache + "/real.json").c_str(), (cache + "/link.json").c_str()), 0);
  EXPECT_EQ(ReadCacheFile(cache + "/link.json", 1024), std::nullopt);
  EXPECT_EQ(ReadCacheFile(cache + "/real.json", 1024), "real");
}

TEST_F(CacheTrustTest, ADirectoryWritableByOthersIsNeitherReadNorWritten) {
  const std::string cache = dir_ + "/sites";
  const std::string path = cache + "/entry.json";
  WriteCacheFile(cache, path, "trusted");
  ASSERT_EQ(chmod(cache.c_str(), 0777), 0);
  EXPECT_EQ(ReadCacheFile(path, 1024), std::nullopt);
  WriteCacheFile(cache, cache + "/new.json", "x");
  EXPECT_FALSE(std::filesystem::exists(cache + "/new.json"));
  Status st = CheckCacheDir(cache);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kUntrustedPath);
  EXPECT_NE(st.error().message().find(cache), std::string::npos) << st.error().message();
  EXPECT_NE(st.error().message().find("mode 0777"), std::string::npos) << st.error().message();
  ASSERT_EQ(warnings_.size(), 1u);  // one warning for the directory, whatever was tried in it
  ASSERT_EQ(chmod(cache.c_str(), 0755), 0);
  EXPECT_TRUE(CheckCacheDir(cache).ok());
}

TEST_F(CacheTrustTest, ADirectoryOfAnotherUserIsRefused) {
  const std::string cache = dir_ + "/sites";
  ASSERT_EQ(mkdir(cache.c_str(), 0755), 0);
  uid_t euid = geteuid();
  if (!MakeForeign(cache)) euid = geteuid() + 1;  // not root: the dir's owner is then neither root nor euid
  Status st = CheckCacheDir(cache, euid);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kUntrustedPath);
  EXPECT_NE(st.error().message().find("owned by uid"), std::string::npos) << st.error().message();
}

TEST_F(CacheTrustTest, EveryDirectoryAboveIsChecked) {
  // dir_/open (0777, not sticky) / a / sites: the cache dir is fine, one above is not.
  const std::string open_dir = dir_ + "/open";
  const std::string cache = open_dir + "/a/sites";
  std::filesystem::create_directories(cache);
  ASSERT_EQ(chmod(open_dir.c_str(), 0777), 0);
  Status st = CheckCacheDir(cache);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kUntrustedPath);
  EXPECT_NE(st.error().message().find("directory " + open_dir + " above cache directory"), std::string::npos)
      << st.error().message();
  WriteCacheFile(cache, cache + "/e.json", "x");
  EXPECT_FALSE(std::filesystem::exists(cache + "/e.json"));
  // Sticky and root's (as /tmp): accepted above the cache directory.
  if (geteuid() == 0) {
    ASSERT_EQ(chmod(open_dir.c_str(), 01777), 0);
    EXPECT_TRUE(CheckCacheDir(cache).ok()) << CheckCacheDir(cache).error().message();
  }
  // Reached through a symlink: the real chain is what is judged.
  const std::string link = dir_ + "/link";
  ASSERT_EQ(symlink(cache.c_str(), link.c_str()), 0);
  ASSERT_EQ(chmod(open_dir.c_str(), 0777), 0);
  EXPECT_FALSE(CheckCacheDir(link).ok());
}

TEST_F(CacheTrustTest, AMissingDirectoryIsJudgedByItsParent) {
  EXPECT_TRUE(CheckCacheDir(dir_ + "/not-yet").ok());
  const std::string open_dir = dir_ + "/open";
  ASSERT_EQ(mkdir(open_dir.c_str(), 0777), 0);
  ASSERT_EQ(chmod(open_dir.c_str(), 0777), 0);
  Status st = CheckCacheDir(open_dir + "/not-yet");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message().find(open_dir), std::string::npos) << st.error().message();
}

TEST_F(CacheFileTest, WritesAtomicallyIntoANewDirectoryAndReadsBack) {
  const std::string cache = dir_ + "/sites";
  const std::string path = cache + "/entry.json";
  WriteCacheFile(cache, path, "{\"a\": 1}\n");
  EXPECT_EQ(ReadCacheFile(path, 1024), "{\"a\": 1}\n");
  struct stat st{};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);
  // Only the entry is left (no temporary).
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(cache), std::filesystem::directory_iterator()), 1);
  WriteCacheFile(cache, path, "second");
  EXPECT_EQ(ReadCacheFile(path, 1024), "second");
}

TEST_F(CacheFileTest, ASymlinkAtTheNameIsReplacedNotWrittenThrough) {
  const std::string victim = dir_ + "/victim";
  std::ofstream(victim) << "keep";
  const std::string path = dir_ + "/entry.json";
  ASSERT_EQ(symlink(victim.c_str(), path.c_str()), 0);
  WriteCacheFile(dir_, path, "new");
  EXPECT_EQ(Slurp(victim), "keep");
  EXPECT_FALSE(std::filesystem::is_symlink(path));
  EXPECT_EQ(ReadCacheFile(path, 1024), "new");
}

TEST_F(CacheFileTest, APlantedTemporaryIsNeitherFollowedNorReused) {
  const std::string victim = dir_ + "/victim";
  std::ofstream(victim) << "keep";
  const std::string path = dir_ + "/entry.json";
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  ASSERT_EQ(symlink(victim.c_str(), tmp.c_str()), 0);
  WriteCacheFile(dir_, path, "new");
  EXPECT_EQ(Slurp(victim), "keep");
  EXPECT_FALSE(std::filesystem::exists(path)) << "written although its temporary name was taken";
  EXPECT_TRUE(std::filesystem::is_symlink(tmp)) << "someone else's file was removed";
}

TEST_F(CacheFileTest, ReadsOnlySmallRegularFiles) {
  const std::string big = dir_ + "/big";
  std::ofstream(big) << std::string(2048, 'x');
  EXPECT_EQ(ReadCacheFile(big, 1024), std::nullopt);
  EXPECT_EQ(ReadCacheFile(big, 4096)->size(), 2048u);
  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(ReadCacheFile(fifo, 1024), std::nullopt);  // a FIFO without a writer: returns, does not block
  EXPECT_EQ(ReadCacheFile(dir_, 1024), std::nullopt);
  EXPECT_EQ(ReadCacheFile(dir_ + "/missing", 1024), std::nullopt);
}

}  // namespace
}  // namespace rvbpfd
