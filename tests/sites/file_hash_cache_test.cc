// The content hash by file identity (ContentSha256Of, src/sites/sites.h): a settled file's hash is kept and used
// again for that identity only; a change of the file, an unsettled file or an entry that is not the writer's gives
// the hash of what was read; a file changed before its deferred debug sections were copied gives none.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "common/sha256.h"
#include "elf/elf_fixtures.h"
#include "sites/sites.h"

namespace rvbpfd {
namespace {

using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;

class FileHashCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    bin_ = dir_.Join("libfx-hash.so");
    ASSERT_TRUE(testing::CompileC("int fx(void) { return 1; }\n", bin_, "-shared -fPIC"));
    cache_ = dir_.Join("cache");
    usleep(20'000);  // past the clock tick the file's ctime was taken from, so Settled(0) holds
  }
  ElfFile Open() {
    Result<ElfFile> elf = ElfFile::Open(bin_);
    EXPECT_TRUE(elf.ok());
    return std::move(elf.value());
  }
  std::string Truth() { return SparseContentSha256Hex(Open().content()); }
  std::string EntryPath() { return FileHashEntryPath(cache_, Open().identity()); }
  // Replaces the entry's hash with `mark`.
  void Mark(const std::string& mark) {
    nlohmann::json doc = nlohmann::json::parse(ReadFile(EntryPath()));
    doc["content_sha256"] = mark;
    WriteFile(EntryPath(), doc.dump());
  }

  TempDir dir_;
  std::string bin_, cache_;
};

const std::string kMark(64, 'a');

TEST_F(FileHashCacheTest, AFileChangedBeforeItsDebugSectionsWereCopiedHasNoHash) {
  // With DWARF of several pages, ElfFile defers its debug sections; the hash needs them, and a file whose identity
  // changed since it was opened must not be hashed from two contents.
  std::string src;
  for (int i = 0; i < 400; ++i) {
    src += "int fx" + std::to_string(i) + "(int a) { return a * " + std::to_string(i) + "; }\n";
  }
  const std::string bin = dir_.Join("libfx-dwarf.so");
  ASSERT_TRUE(testing::CompileC(src, bin, "-shared -fPIC -g"));
  Result<ElfFile> elf = ElfFile::Open(bin);
  ASSERT_TRUE(elf.ok()) << elf.error().message();
  const struct stat before = [&] {
    struct stat st{};
    stat(bin.c_str(), &st);
    return st;
  }();
  struct stat now{};
  do {
    ASSERT_EQ(chmod(bin.c_str(), before.st_mode & 07777), 0);  // a new ctime, as any write gives
    ASSERT_EQ(stat(bin.c_str(), &now), 0);
    if (now.st_ctim.tv_sec != before.st_ctim.tv_sec || now.st_ctim.tv_nsec != before.st_ctim.tv_nsec) break;
    usleep(1000);
  } while (true);
  EXPECT_EQ(ContentSha256Of(*elf, "", 0), "");
  Result<SiteSet> sites = LoadOrFindSites(*elf, "3.3.8", cache_);
  ASSERT_FALSE(sites.ok());
  EXPECT_EQ(sites.error().code(), ErrorCode::kIo);
  EXPECT_NE(sites.error().message().find("changed after it was first read"), std::string::npos)
      << sites.error().message();
}

TEST_F(FileHashCacheTest, ASettledFilesHashIsKeptAndUsedForItsIdentity) {
  const std::string truth = Truth();
  EXPECT_EQ(ContentSha256Of(Open(), cache_, 0), truth);
  ASSERT_TRUE(testing::FileExists(EntryPath()));
  Mark(kMark);
  EXPECT_EQ(ContentSha256Of(Open(), cache_, 0), kMark) << "the entry was not used";
  EXPECT_EQ(ContentSha256Of(Open(), "", 0), truth) << "no cache dir: always hashed";
}

TEST_F(FileHashCacheTest, AChangedFileIsHashedAgain) {
  EXPECT_EQ(ContentSha256Of(Open(), cache_, 0), Truth());
  Mark(kMark);
  // The same size, the mtime set back: only the ctime (which no user can set) says the file changed.
  std::filesystem::file_time_type mtime = std::filesystem::last_write_time(bin_);
  std::string content = ReadFile(bin_);
  content[content.size() - 1] ^= 0x5a;
  {
    std::fstream f(bin_, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(0);
    f.write(content.data(), static_cast<std::streamsize>(content.size()));
  }
  std::filesystem::last_write_time(bin_, mtime);
  EXPECT_EQ(ContentSha256Of(Open(), cache_, 0), Truth()) << "a changed file was served its old hash";
}

TEST_F(FileHashCacheTest, AnUnsettledFileIsNotEntered) {
  EXPECT_EQ(ContentSha256Of(Open(), cache_, /*settle_ns=*/int64_t{1} << 62), Truth());
  EXPECT_FALSE(testing::FileExists(EntryPath()));
  EXPECT_EQ(ContentSha256Of(Open(), cache_, kFileSettleNs), Truth());  // compiled moments ago: not settled either
  EXPECT_FALSE(testing::FileExists(EntryPath()));
}

TEST_F(FileHashCacheTest, AnEntryThatIsNotTheWritersIsIgnoredAndRewritten) {
  const std::string truth = Truth();
  ASSERT_EQ(ContentSha256Of(Open(), cache_, 0), truth);
  const std::string good = ReadFile(EntryPath());
  auto with = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json doc = nlohmann::json::parse(good);
    edit(doc);
    return doc.dump();
  };
  const std::vector<std::pair<std::string, std::string>> hostile = {
      {"not JSON", "{"},
      {"other format", with([](nlohmann::json& d) { d["format"] = 2; })},
      {"a hash that is not hex", with([](nlohmann::json& d) { d["content_sha256"] = std::string(64, 'z'); })},
      {"a short hash", with([](nlohmann::json& d) { d["content_sha256"] = "abc"; })},
      {"upper-case hex", with([](nlohmann::json& d) { d["content_sha256"] = std::string(64, 'A'); })},
      {"another size", with([](nlohmann::json& d) {
         d["size"] = d["size"].get<uint64_t>() + 1;
         d["content_sha256"] = std::string(64, 'a');
       })},
      {"another ctime", with([](nlohmann::json& d) {
         d["ctime_ns"] = d["ctime_ns"].get<int64_t>() - 1;
         d["content_sha256"] = std::string(64, 'a');
       })},
      {"a missing field", with([](nlohmann::json& d) {
         d.erase("mtime_ns");
         d["content_sha256"] = std::string(64, 'a');
       })},
      {"a negative inode", with([](nlohmann::json& d) {
         d["ino"] = -1;
         d["content_sha256"] = std::string(64, 'a');
       })},
  };
  for (const auto& [what, text] : hostile) {
    WriteFile(EntryPath(), text);
    EXPECT_EQ(ContentSha256Of(Open(), cache_, 0), truth) << what;
    EXPECT_EQ(ReadFile(EntryPath()), good) << what << ": not rewritten";
  }
}

}  // namespace
}  // namespace rvbpfd
