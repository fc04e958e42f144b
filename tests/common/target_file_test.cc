// The one safe way to open a target's file: hostile file types and symlinks, and a sparse file that must not cost its
// size in memory.
#include "common/target_file.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "common/sha256.h"

namespace rvbpfd {
namespace {

namespace fs = std::filesystem;

class TargetFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/rvbpfd_target_file_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  void Write(const std::string& path, const std::string& text) {
    fs::create_directories(fs::path(path).parent_path());
    std::ofstream(path, std::ios::binary) << text;
  }
  // Resident set of this process in bytes (/proc/self/statm's second field, in pages).
  static uint64_t ResidentBytes() {
    std::ifstream in("/proc/self/statm");
    uint64_t size = 0, resident = 0;
    in >> size >> resident;
    return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  }
  std::string dir_;
};

TEST(SplitTargetPathTest, FindsTheProcRoot) {
  TargetPath a = SplitTargetPath("/proc/123/root/usr/lib/libruby.so.3.3");
  EXPECT_EQ(a.root_dir, "/proc/123/root");
  EXPECT_EQ(a.inside, "/usr/lib/libruby.so.3.3");
  TargetPath b = SplitTargetPath("/tmp/fake/proc/7/root");
  EXPECT_EQ(b.root_dir, "/tmp/fake/proc/7/root");
  EXPECT_EQ(b.inside, "/");
  // The first root wins: a path inside the target that looks like another proc root stays inside the first.
  TargetPath c = SplitTargetPath("/proc/1/root/srv/2/root/x");
  EXPECT_EQ(c.root_dir, "/proc/1/root");
  EXPECT_EQ(c.inside, "/srv/2/root/x");
  EXPECT_TRUE(SplitTargetPath("/usr/bin/ruby").root_dir.empty());
  EXPECT_TRUE(SplitTargetPath("/proc/123/rootfs/x").root_dir.empty());
  EXPECT_TRUE(SplitTargetPath("/proc/12a/root/x").root_dir.empty());
  EXPECT_TRUE(SplitTargetPath("/proc/123/exe").root_dir.empty());
}

TEST_F(TargetFileTest, MapsARegularFile) {
  Write(dir_ + "/f", "hello");
  Result<MappedFile> m = MappedFile::Map(dir_ + "/f", "test file", 1024);
  ASSERT_TRUE(m.ok()) << m.error().message();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m->data()), m->size()), "hello");
}

TEST_F(TargetFileTest, FifoIsRefusedWithoutBlocking) {
  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  // A blocking open of a FIFO with no writer would hang this test (and ctest's timeout would fail it).
  Result<MappedFile> m = MappedFile::Map(fifo, "ELF file", 1 << 20);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().code(), ErrorCode::kIo);
  EXPECT_NE(m.error().message().find("is a FIFO"), std::string::npos) << m.error().message();
  Result<FileFd> fd = OpenRegularFile(fifo, "trace file");
  ASSERT_FALSE(fd.ok());
  EXPECT_NE(fd.error().message().find("trace file " + fifo + " is a FIFO"), std::string::npos);
}

TEST_F(TargetFileTest, DirectoryAndDeviceAreRefused) {
  Result<MappedFile> d = MappedFile::Map(dir_, "trace file", 1 << 20);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().message().find("is a directory"), std::string::npos) << d.error().message();
  Result<MappedFile> z = MappedFile::Map("/dev/zero", "ELF file", 1 << 20);
  ASSERT_FALSE(z.ok());
  EXPECT_NE(z.error().message().find("is a character device"), std::string::npos) << z.error().message();
}

TEST_F(TargetFileTest, SizeCapAndEmptyFile) {
  Write(dir_ + "/big", std::string(4096, 'x'));
  Result<MappedFile> m = MappedFile::Map(dir_ + "/big", "ELF file", 4095);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message().find("larger than 4095 bytes"), std::string::npos) << m.error().message();
  Write(dir_ + "/empty", "");
  EXPECT_FALSE(MappedFile::Map(dir_ + "/empty", "ELF file", 4096).ok());
  Result<MappedFile> e = MappedFile::Map(dir_ + "/empty", "ELF file", 4096, {.allow_empty = true});
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->size(), 0u);
}

TEST_F(TargetFileTest, SparseFileCostsOnlyItsData) {
  const std::string path = dir_ + "/sparse";
  constexpr uint64_t kGiB = 1ull << 30;
  {
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(pwrite(fd, "\x7f" "ELF", 4, 0), 4);
    ASSERT_EQ(pwrite(fd, "tail", 4, static_cast<off_t>(kGiB - 4)), 4);
    ASSERT_EQ(ftruncate(fd, static_cast<off_t>(kGiB)), 0);
    close(fd);
  }
  const uint64_t before = ResidentBytes();
  Result<MappedFile> m = MappedFile::Map(path, "ELF file", kGiB);
  ASSERT_TRUE(m.ok()) << m.error().message();
  EXPECT_EQ(m->size(), kGiB);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m->data()), 4), "\x7f" "ELF");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m->data()) + kGiB - 4, 4), "tail");
  // Two pages of data were copied; the rest of the GiB is untouched anonymous memory.
  EXPECT_LE(m->copied_bytes(), 2u * 4096u);
  EXPECT_LT(ResidentBytes() - std::min(before, ResidentBytes()), 64ull << 20);
  // The written ranges are those pages, and the content hash over them never touches the holes (a kernel may back a
  // hole's page with memory when it is read: this VM's does).
  uint64_t written = 0;
  for (const auto& [b, e] : m->written_ranges()) {
    EXPECT_LT(b, e);
    written += e - b;
  }
  EXPECT_EQ(written, m->copied_bytes());
  ASSERT_FALSE(m->written_ranges().empty());
  EXPECT_EQ(m->written_ranges().front().first, 0u);
  EXPECT_EQ(m->written_ranges().back().second, kGiB);
  EXPECT_FALSE(SparseContentSha256Hex(m->bytes(), m->written_ranges()).empty());
  EXPECT_LT(ResidentBytes() - std::min(before, ResidentBytes()), 64ull << 20);
}

TEST_F(TargetFileTest, ZeroFilledDataIsNotCopied) {
  // A file system without holes (or a file written full of zeros) still costs only its non-zero pages.
  const std::string path = dir_ + "/zeros";
  std::string content(1 << 20, '\0');
  content[100] = 'a';
  Write(path, content);
  Result<MappedFile> m = MappedFile::Map(path, "ELF file", 1 << 20);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->size(), 1u << 20);
  EXPECT_EQ(m->data()[100], 'a');
  EXPECT_EQ(m->data()[5000], 0);
  EXPECT_LE(m->copied_bytes(), 4096u);
}

TEST_F(TargetFileTest, DeferredRangesAreCopiedOnlyWhenLoaded) {
  // Four pages of distinct bytes; [4096+100, 3*4096+7) deferred: only page 2 lies wholly inside (page 1 begins before
  // the range, page 3 ends after it), so page 2 reads as zeros until LoadDeferred copies it.
  const std::string path = dir_ + "/deferred";
  std::string content(4 * 4096, '\0');
  for (size_t i = 0; i < content.size(); ++i) content[i] = static_cast<char>('a' + i % 26);
  Write(path, content);
  Result<MappedFile> m = MappedFile::Map(path, "ELF file", 1 << 20, {.deferred = {{4096 + 100, 3 * 4096 + 7}}});
  ASSERT_TRUE(m.ok()) << m.error().message();
  ASSERT_TRUE(m->has_deferred());
  EXPECT_EQ(m->copied_bytes(), 3u * 4096u);
  using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;
  EXPECT_EQ(m->written_ranges(), (Ranges{{0, 2 * 4096}, {3 * 4096, 4 * 4096}}));
  EXPECT_EQ(m->data()[4096 + 200], content[4096 + 200]);
  EXPECT_EQ(m->data()[2 * 4096], 0);
  EXPECT_EQ(m->data()[3 * 4096 - 1], 0);
  EXPECT_EQ(m->data()[3 * 4096], content[3 * 4096]);
  ASSERT_TRUE(m->LoadDeferred().ok());
  EXPECT_FALSE(m->has_deferred());
  EXPECT_EQ(m->copied_bytes(), 4u * 4096u);
  EXPECT_EQ(m->written_ranges(), (Ranges{{0, 4 * 4096}}));  // the loaded page joins its neighbours
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m->data()), m->size()), content);
  EXPECT_TRUE(m->LoadDeferred().ok());  // once
}

TEST_F(TargetFileTest, DeferredRangesOfAFileChangedSinceAreNotLoaded) {
  const std::string path = dir_ + "/changed";
  Write(path, std::string(3 * 4096, 'x'));
  Result<MappedFile> m = MappedFile::Map(path, "ELF file", 1 << 20, {.deferred = {{4096, 2 * 4096}}});
  ASSERT_TRUE(m.ok()) << m.error().message();
  // Rewritten after the copy (same size): the deferred page would pair new bytes with old ones.
  struct stat before;
  ASSERT_EQ(stat(path.c_str(), &before), 0);
  do {
    int fd = open(path.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(pwrite(fd, "y", 1, 5000), 1);
    close(fd);
    struct stat after;
    ASSERT_EQ(stat(path.c_str(), &after), 0);
    if (after.st_ctim.tv_nsec != before.st_ctim.tv_nsec || after.st_ctim.tv_sec != before.st_ctim.tv_sec) break;
    usleep(1000);  // a file system whose timestamps did not tick yet
  } while (true);
  Status st = m->LoadDeferred();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kIo);
  EXPECT_NE(st.error().message().find("changed after it was first read"), std::string::npos) << st.error().message();
  EXPECT_EQ(m->data()[5000], 0);                 // never the new byte
  EXPECT_FALSE(m->LoadDeferred().ok());          // the same answer later
  EXPECT_EQ(m->data()[100], 'x');                // what was copied at once stays
}

TEST_F(TargetFileTest, DeferredRangesBeyondTheFileAreIgnored) {
  const std::string path = dir_ + "/short";
  Write(path, std::string(4096 + 10, 'z'));
  Result<MappedFile> m =
      MappedFile::Map(path, "ELF file", 1 << 20, {.deferred = {{4096, 1 << 30}, {1 << 29, 1 << 30}}});
  ASSERT_TRUE(m.ok()) << m.error().message();
  EXPECT_FALSE(m->has_deferred());  // no whole page of the file inside either range
  EXPECT_EQ(m->data()[4096 + 5], 'z');
}

TEST_F(TargetFileTest, AbsoluteSymlinkResolvesInsideTheRoot) {
  // A chroot-like tree shaped as /proc/PID/root: an absolute symlink there names the root's own file, never the
  // host's.
  const std::string root = dir_ + "/proc/42/root";
  Write(root + "/etc/hostname", "inside");
  fs::create_directories(root + "/usr/lib");
  fs::create_symlink("/etc/hostname", root + "/usr/lib/libruby.so");
  Result<MappedFile> m = MappedFile::Map(root + "/usr/lib/libruby.so", "ELF file", 1024);
  ASSERT_TRUE(m.ok()) << m.error().message();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m->data()), m->size()), "inside");
  struct stat inside_st, st;
  ASSERT_EQ(stat((root + "/etc/hostname").c_str(), &inside_st), 0);
  ASSERT_EQ(StatInRoot(root + "/usr/lib/libruby.so", &st), 0);
  EXPECT_EQ(st.st_ino, inside_st.st_ino);
}

TEST_F(TargetFileTest, SymlinkEscapingTheRootStaysInside) {
  // A file outside the root, reached by a relative link that climbs above it and by an absolute one.
  Write(dir_ + "/host_secret", "host");
  const std::string root = dir_ + "/proc/43/root";
  fs::create_directories(root + "/lib");
  fs::create_symlink("../../../../host_secret", root + "/lib/up");
  fs::create_symlink(dir_ + "/host_secret", root + "/lib/abs");
  for (const char* leaf : {"/lib/up", "/lib/abs"}) {
    Result<MappedFile> m = MappedFile::Map(root + leaf, "ELF file", 1024);
    ASSERT_FALSE(m.ok()) << leaf << " read the host's file";
    EXPECT_NE(m.error().message().find("No such file"), std::string::npos) << m.error().message();
  }
}

TEST_F(TargetFileTest, MagicLinkInsideTheRootIsRefused) {
  const std::string root = dir_ + "/proc/44/root";
  fs::create_directories(root);
  Write(dir_ + "/host_file", "host");
  int fd = open((dir_ + "/host_file").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  // /proc/self/fd/N would reach whatever the daemon has open; inside the root it names the root's own (absent) /proc.
  fs::create_symlink("/proc/self/fd/" + std::to_string(fd), root + "/magic");
  Result<MappedFile> m = MappedFile::Map(root + "/magic", "ELF file", 1024);
  EXPECT_FALSE(m.ok());
  close(fd);
}

TEST_F(TargetFileTest, RealProcRootOfThisProcess) {
  // /proc/self/root is this process's own root: the path resolves as usual through it.
  Write(dir_ + "/f", "x");
  const std::string via = "/proc/" + std::to_string(getpid()) + "/root" + dir_ + "/f";
  Result<MappedFile> m = MappedFile::Map(via, "ELF file", 16);
  ASSERT_TRUE(m.ok()) << m.error().message();
  EXPECT_EQ(m->size(), 1u);
}

TEST_F(TargetFileTest, OperatorPathSymlinkIsFollowed) {
  Write(dir_ + "/target", "t");
  fs::create_symlink(dir_ + "/target", dir_ + "/link");
  EXPECT_TRUE(MappedFile::Map(dir_ + "/link", "trace file", 16).ok());
}

}  // namespace
}  // namespace rvbpfd
