// Cache files (src/common/cache_file.h): reads are bounded and never block, writes are atomic and never follow a
// planted link.
#include "common/cache_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace rvbpfd {
namespace {

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
