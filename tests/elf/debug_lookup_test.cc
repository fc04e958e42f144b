#include "elf/debug_lookup.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "elf/elf_fixtures.h"

namespace rvbpfd {
namespace {

using testing::CompileC;
using testing::TempDir;

// A library with a static function (only in .symtab once stripped) and a global one (also in .dynsym).
constexpr const char* kLibSource = R"(
__attribute__((noinline, used)) static int hidden_worker(int x) { return x * 3 + 1; }
int exported_entry(int x) { return hidden_worker(x) + 2; }
)";
constexpr const char* kBuildId = "aabbccddeeff00112233445566778899aabbccdd";
constexpr const char* kOtherBuildId = "1111111111111111111111111111111111111111";

bool RunCommand(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0; }

class DebugLookupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    full_ = dir_.Join("libfx.so");
    ASSERT_TRUE(CompileC(kLibSource, full_, std::string("-shared -fPIC -O2 -g -Wl,--build-id=0x") + kBuildId));
    debug_ = dir_.Join("libfx.debug");
    stripped_ = dir_.Join("libfx-stripped.so");
    ASSERT_TRUE(RunCommand("objcopy --only-keep-debug '" + full_ + "' '" + debug_ + "'"));
    ASSERT_TRUE(RunCommand("strip -o '" + stripped_ + "' '" + full_ + "'"));
    config_.debug_dir = dir_.Join("usr/lib/debug");
    config_.debuginfod_timeout_s = 0;
  }
  // Installs `file` where a distribution's debug package would put the debug file of build-id `id`.
  void Install(const std::string& file, const std::string& id) {
    const std::string dest = BuildIdDebugPath("", config_.debug_dir, id);
    ASSERT_FALSE(dest.empty());
    ASSERT_TRUE(RunCommand("mkdir -p \"$(dirname '" + dest + "')\" && cp '" + file + "' '" + dest + "'"));
  }
  TempDir dir_;
  std::string full_, debug_, stripped_;
  DebugLookupConfig config_;
};

// The identity the agent keys its probe sets with: the debug file the lookup would read (the target's root first),
// by inode and timestamps, without reading it; "none" without one. Another file in its place is another identity.
TEST_F(DebugLookupTest, DebugFileIdentityNamesTheFileTheLookupWouldRead) {
  const std::string via_target_root = "/proc/" + std::to_string(getpid()) + "/root" + stripped_;
  EXPECT_EQ(DebugFileIdentity(stripped_, kBuildId, config_), "none");
  EXPECT_EQ(DebugFileIdentity(via_target_root, kBuildId, config_), "none");
  Install(debug_, kBuildId);
  const std::string host = DebugFileIdentity(stripped_, kBuildId, config_);
  const std::string target = DebugFileIdentity(via_target_root, kBuildId, config_);
  EXPECT_EQ(host.rfind("host:", 0), 0u) << host;
  EXPECT_EQ(target.rfind("target:", 0), 0u) << target;
  EXPECT_EQ(DebugFileIdentity(stripped_, kOtherBuildId, config_), "none");
  // Replaced by another file (a new inode, as a tenant's planted file is): another identity.
  const std::string dest = BuildIdDebugPath("", config_.debug_dir, kBuildId);
  ASSERT_TRUE(RunCommand("cp '" + full_ + "' '" + dest + ".new' && mv '" + dest + ".new' '" + dest + "'"));
  EXPECT_NE(DebugFileIdentity(stripped_, kBuildId, config_), host);
}

TEST(BuildIdDebugPathTest, DistributionLayout) {
  EXPECT_EQ(BuildIdDebugPath("", "/usr/lib/debug", "abcdef01"), "/usr/lib/debug/.build-id/ab/cdef01.debug");
  EXPECT_EQ(BuildIdDebugPath("/proc/7/root", "/usr/lib/debug", "abcdef01"),
            "/proc/7/root/usr/lib/debug/.build-id/ab/cdef01.debug");
  EXPECT_EQ(BuildIdDebugPath("", "/usr/lib/debug", "ab"), "");
  EXPECT_EQ(BuildIdDebugPath("", "/usr/lib/debug", "ab/../../etc"), "");
  EXPECT_EQ(BuildIdDebugPath("", "/usr/lib/debug", "ABCDEF"), "");
}

TEST(FileSystemRootOfTest, TargetRootsOnlyUnderProcPid) {
  EXPECT_EQ(FileSystemRootOf("/proc/123/root/usr/lib/libruby.so.3.3"), "/proc/123/root");
  EXPECT_EQ(FileSystemRootOf("/proc/123/map_files/7f00-7f10"), "/proc/123/root");
  EXPECT_EQ(FileSystemRootOf("/proc/self/root/usr/lib/libruby.so"), "");
  EXPECT_EQ(FileSystemRootOf("/proc/123/exe"), "");
  EXPECT_EQ(FileSystemRootOf("/usr/lib/libruby.so"), "");
  EXPECT_EQ(FileSystemRootOf("/proc//root/x"), "");
}

TEST_F(DebugLookupTest, StrippedBinaryGetsSymbolsAndDwarfFromTheBuildIdDirectory) {
  Result<ElfFile> full = ElfFile::Open(full_);
  ASSERT_TRUE(full.ok());
  Result<ElfFile> elf = ElfFile::Open(stripped_);
  ASSERT_TRUE(elf.ok());
  ASSERT_FALSE(elf->has_symtab());
  ASSERT_FALSE(elf->FindSymbol("hidden_worker").has_value());
  Install(debug_, kBuildId);

  DebugLookupResult r = AttachDebugInfo(&elf.value(), config_);
  ASSERT_TRUE(r.attached) << r.Summary();
  EXPECT_TRUE(elf->has_symtab());
  const std::string path = BuildIdDebugPath("", config_.debug_dir, kBuildId);
  EXPECT_EQ(elf->symbols_source(), "build-id directory " + path);
  std::optional<ElfSymbol> want = full->FindSymbol("hidden_worker");
  std::optional<ElfSymbol> got = elf->FindSymbol("hidden_worker");
  ASSERT_TRUE(want && got);
  EXPECT_EQ(got->value, want->value);
  EXPECT_EQ(got->size, want->size);
  EXPECT_TRUE(got->from_symtab);
  std::optional<ElfSymbol> containing = elf->FunctionContaining(want->value + 1);
  ASSERT_TRUE(containing.has_value());
  EXPECT_EQ(containing->name, "hidden_worker");
  // DWARF comes from the debug file, code bytes from the binary itself (the debug file has none: NOBITS .text).
  EXPECT_EQ(elf->dwarf_file().path(), path);
  EXPECT_TRUE(elf->dwarf_file().FindSection(".debug_info").has_value());
  std::span<const uint8_t> code = elf->BytesAt(want->value, want->size);
  std::span<const uint8_t> ref = full->BytesAt(want->value, want->size);
  ASSERT_FALSE(code.empty());
  EXPECT_TRUE(std::equal(code.begin(), code.end(), ref.begin(), ref.end()));
  EXPECT_EQ(elf->path(), stripped_);
}

TEST_F(DebugLookupTest, UnstrippedBinaryIsLeftAlone) {
  Result<ElfFile> elf = ElfFile::Open(full_);
  ASSERT_TRUE(elf.ok());
  bool fetched = false;
  DebugLookupResult r = AttachDebugInfo(&elf.value(), config_, [&](const std::string&) -> Result<FetchedDebugFile> {
    fetched = true;
    return Error(ErrorCode::kIo, "not reached");
  });
  EXPECT_FALSE(r.attached);
  EXPECT_TRUE(r.tried.empty());
  EXPECT_FALSE(fetched);
  EXPECT_EQ(elf->symbols_source(), "binary");
}

TEST_F(DebugLookupTest, DebugFileOfAnotherBuildIsRefused) {
  const std::string other = dir_.Join("libother.so");
  ASSERT_TRUE(CompileC(kLibSource, other, std::string("-shared -fPIC -O2 -g -Wl,--build-id=0x") + kOtherBuildId));
  const std::string other_debug = dir_.Join("libother.debug");
  ASSERT_TRUE(RunCommand("objcopy --only-keep-debug '" + other + "' '" + other_debug + "'"));
  // Where the stripped binary's debug file would be, a debug file of another build.
  Install(other_debug, kBuildId);
  Result<ElfFile> elf = ElfFile::Open(stripped_);
  ASSERT_TRUE(elf.ok());
  DebugLookupResult r = AttachDebugInfo(&elf.value(), config_);
  EXPECT_FALSE(r.attached);
  EXPECT_FALSE(elf->has_symtab());
  EXPECT_NE(r.Summary().find(std::string("has build-id ") + kOtherBuildId), std::string::npos) << r.Summary();
  EXPECT_NE(r.Summary().find("debuginfod: disabled"), std::string::npos) << r.Summary();
  EXPECT_EQ(elf->symbols_source(), "binary");
}

TEST_F(DebugLookupTest, MissingDebugFileSaysWhereItLooked) {
  Result<ElfFile> elf = ElfFile::Open(stripped_);
  ASSERT_TRUE(elf.ok());
  DebugLookupResult r = AttachDebugInfo(&elf.value(), config_);
  EXPECT_FALSE(r.attached);
  EXPECT_NE(r.Summary().find(BuildIdDebugPath("", config_.debug_dir, kBuildId)), std::string::npos) << r.Summary();
  EXPECT_NE(r.Summary().find("No such file"), std::string::npos) << r.Summary();
}

TEST_F(DebugLookupTest, FetcherSuppliesTheDebugFileAndItsOrigin) {
  Result<ElfFile> elf = ElfFile::Open(stripped_);
  ASSERT_TRUE(elf.ok());
  std::string asked;
  DebugLookupResult r =
      AttachDebugInfo(&elf.value(), config_, [&](const std::string& id) -> Result<FetchedDebugFile> {
        asked = id;
        return FetchedDebugFile{debug_, "http://127.0.0.1:1/"};
      });
  ASSERT_TRUE(r.attached) << r.Summary();
  EXPECT_EQ(asked, kBuildId);
  EXPECT_EQ(elf->symbols_source(), "debuginfod http://127.0.0.1:1/ (cached at " + debug_ + ")");
  EXPECT_TRUE(elf->FindSymbol("hidden_worker").has_value());
}

TEST_F(DebugLookupTest, FetchedFileOfAnotherBuildIsRefused) {
  Result<ElfFile> elf = ElfFile::Open(stripped_);
  ASSERT_TRUE(elf.ok());
  // The binary itself is no debug file of its own (no .symtab, no .debug_info), and a text file is no ELF at all.
  const std::string junk = dir_.Join("junk.debug");
  testing::WriteFile(junk, "not an ELF file");
  for (const std::string& served : {stripped_, junk}) {
    DebugLookupResult r = AttachDebugInfo(&elf.value(), config_, [&](const std::string&) -> Result<FetchedDebugFile> {
      return FetchedDebugFile{served, "http://127.0.0.1:1/"};
    });
    EXPECT_FALSE(r.attached) << served;
    EXPECT_FALSE(elf->has_symtab());
  }
}

TEST_F(DebugLookupTest, DebuginfodWithoutUrlsSaysSo) {
  const char* saved = std::getenv("DEBUGINFOD_URLS");
  std::string keep = saved != nullptr ? saved : "";
  unsetenv("DEBUGINFOD_URLS");
  Result<FetchedDebugFile> f = FetchFromDebuginfod(kBuildId, 5);
  if (saved != nullptr) setenv("DEBUGINFOD_URLS", keep.c_str(), 1);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message().find("DEBUGINFOD_URLS is not set"), std::string::npos) << f.error().message();
}

// A server that accepts connections (the kernel completes them from the backlog) but never answers: the query must
// end at its deadline with an error that says so, not hang.
TEST_F(DebugLookupTest, DebuginfodQueryEndsAtItsDeadline) {
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(s, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(s, 16), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string url = "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  const char* saved_urls = std::getenv("DEBUGINFOD_URLS");
  const char* saved_cache = std::getenv("DEBUGINFOD_CACHE_PATH");
  std::string keep_urls = saved_urls ? saved_urls : "", keep_cache = saved_cache ? saved_cache : "";
  setenv("DEBUGINFOD_URLS", url.c_str(), 1);
  setenv("DEBUGINFOD_CACHE_PATH", dir_.Join("dcache").c_str(), 1);
  Result<FetchedDebugFile> f = FetchFromDebuginfod(kBuildId, 1);
  saved_urls ? setenv("DEBUGINFOD_URLS", keep_urls.c_str(), 1) : unsetenv("DEBUGINFOD_URLS");
  saved_cache ? setenv("DEBUGINFOD_CACHE_PATH", keep_cache.c_str(), 1) : unsetenv("DEBUGINFOD_CACHE_PATH");
  close(s);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message().find("within 1 s"), std::string::npos) << f.error().message();
}

}  // namespace
}  // namespace rvbpfd
