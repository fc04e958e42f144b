// CoreFileReader on synthetic cores: PT_LOAD bytes, bytes declared but not carried (from the NT_FILE original file or
// zeros for anonymous memory), gzip, rejection of malformed files, the notes a dump reads (threads, pid, entry
// point, mapped files; hostile ones refused) and a mapping's build-id as the core carries it.
#include "stacks/memory_reader.h"

#include <elf.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <gtest/gtest.h>

#include "stacks/core_builder.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace rvbpfd {
namespace {

using testing::BuildCoreFile;
using testing::CoreFileEntry;
using testing::CoreNoteSpec;
using testing::CoreSeg;
using testing::NoteBytes;
using testing::NtFileDesc;
using testing::PrpsinfoDesc;
using testing::PrstatusDesc;
using testing::PutWords;
using Seg = CoreSeg;

// One NT_FILE note naming one mapping (page size 4096), then the segments.
std::vector<uint8_t> BuildCore(const std::vector<Seg>& segs, uint64_t file_start, uint64_t file_end,
                               uint64_t file_pgoff, const std::string& file_path) {
  return BuildCoreFile(segs, NoteBytes({{"CORE", NT_FILE,
                                         NtFileDesc(4096, {{file_start, file_end, file_pgoff, file_path}})}}));
}

class CoreReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "core_reader_" + std::to_string(getpid());
    std::filesystem::create_directories(dir_);
    // The "original binary": 2 pages, the second one mapped at 0x20000 in the process.
    original_.resize(8192);
    for (size_t i = 0; i < original_.size(); i++) original_[i] = static_cast<uint8_t>(i * 7);
    std::ofstream(dir_ + "/lib.so", std::ios::binary).write(reinterpret_cast<char*>(original_.data()), 8192);
    std::vector<uint8_t> anon(4096, 0xab);
    core_ = BuildCore({{0x10000, 0x3000, anon},                     // 1 page carried, 2 declared zero pages
                       {0x20000, 0x1000, {}}},                      // file-backed, omitted from the core
                      0x20000, 0x21000, 1, dir_ + "/lib.so");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::vector<uint8_t>& bytes, bool gz) {
    std::string path = dir_ + "/" + name;
    if (gz) {
      gzFile f = gzopen(path.c_str(), "wb9");
      gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
      gzclose(f);
    } else {
      std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    }
    return path;
  }
  std::string dir_;
  std::vector<uint8_t> original_, core_;
};

TEST_F(CoreReaderTest, ReadsCarriedDeclaredAndFileBackedBytes) {
  for (bool gz : {false, true}) {
    auto r = CoreFileReader::Open(Write(gz ? "c.gz" : "c", core_, gz), {});
    ASSERT_TRUE(r.ok()) << r.error().ToString();
    uint8_t buf[16];
    ASSERT_TRUE((*r)->Read(0x10ff8, buf, 16));  // crosses from carried bytes into declared zeros
    for (int i = 0; i < 8; i++) EXPECT_EQ(buf[i], 0xab);
    for (int i = 8; i < 16; i++) EXPECT_EQ(buf[i], 0);
    ASSERT_TRUE((*r)->Read(0x20010, buf, 16));  // from lib.so at file offset 4096 + 0x10
    EXPECT_EQ(std::memcmp(buf, original_.data() + 4096 + 0x10, 16), 0);
    EXPECT_EQ((*r)->original_file_reads(), 1u);
    EXPECT_FALSE((*r)->Read(0x13000, buf, 1));  // past the declared segment
    EXPECT_FALSE((*r)->Read(0x12ff8, buf, 16));  // straddles the end
    EXPECT_FALSE((*r)->Read(0x10000, buf, 0));
    ASSERT_EQ((*r)->file_mappings().size(), 1u);
    EXPECT_EQ((*r)->file_mappings()[0].offset, 4096u);
  }
}

TEST_F(CoreReaderTest, SelfContainedModeNeverTouchesOriginalFiles) {
  CoreFileReader::Options o;
  o.use_original_files = false;
  auto r = CoreFileReader::Open(Write("c", core_, false), o);
  ASSERT_TRUE(r.ok());
  uint8_t b;
  EXPECT_FALSE((*r)->Read(0x20010, &b, 1));
  EXPECT_TRUE((*r)->Read(0x10010, &b, 1));
}

TEST_F(CoreReaderTest, RejectsMalformedFiles) {
  std::vector<uint8_t> bad = core_;
  bad[16] = ET_EXEC;  // e_type
  EXPECT_FALSE(CoreFileReader::Open(Write("exec", bad, false), {}).ok());
  std::vector<uint8_t> truncated(core_.begin(), core_.begin() + 100);
  EXPECT_FALSE(CoreFileReader::Open(Write("short", truncated, false), {}).ok());
  bad = core_;
  Elf64_Phdr ph;
  std::memcpy(&ph, bad.data() + sizeof(Elf64_Ehdr) + sizeof(Elf64_Phdr), sizeof(ph));
  ph.p_filesz = 1ull << 40;  // beyond the file
  std::memcpy(bad.data() + sizeof(Elf64_Ehdr) + sizeof(Elf64_Phdr), &ph, sizeof(ph));
  EXPECT_FALSE(CoreFileReader::Open(Write("huge", bad, false), {}).ok());
  EXPECT_FALSE(CoreFileReader::Open(dir_ + "/missing", {}).ok());
}

// gdb writes no PT_LOAD at all for a read-only file mapping it leaves out; NT_FILE alone names it.
TEST_F(CoreReaderTest, MappingWithoutSegmentIsReadFromItsFile) {
  std::vector<uint8_t> core = BuildCore({{0x10000, 0x1000, std::vector<uint8_t>(4096, 0xab)}}, 0x30000, 0x32000, 0,
                                        dir_ + "/lib.so");
  auto r = CoreFileReader::Open(Write("gdb", core, false), {});
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  uint8_t buf[16];
  ASSERT_TRUE((*r)->Read(0x31008, buf, 16));
  EXPECT_EQ(std::memcmp(buf, original_.data() + 4096 + 8, 16), 0);
  EXPECT_FALSE((*r)->Read(0x31ff8, buf, 16));  // past the mapping's end
  EXPECT_FALSE((*r)->ReadCarried(0x31008, buf, 16));  // not in the core itself
  // The host file given for the recorded path is read instead (--libruby / --exe).
  std::vector<uint8_t> other(8192, 0x5a);
  std::ofstream(dir_ + "/other.so", std::ios::binary).write(reinterpret_cast<char*>(other.data()), 8192);
  (*r)->SetOriginalFile(dir_ + "/lib.so", dir_ + "/other.so");
  ASSERT_TRUE((*r)->Read(0x31008, buf, 16));
  EXPECT_EQ(buf[0], 0x5a);
  CoreFileReader::Options o;
  o.use_original_files = false;
  auto self = CoreFileReader::Open(Write("gdb2", core, false), o);
  ASSERT_TRUE(self.ok());
  EXPECT_FALSE((*self)->Read(0x31008, buf, 16));
}

TEST_F(CoreReaderTest, ReadCarriedReadsOnlyTheCoresOwnBytes) {
  auto r = CoreFileReader::Open(Write("c", core_, false), {});
  ASSERT_TRUE(r.ok());
  uint8_t buf[16];
  ASSERT_TRUE((*r)->ReadCarried(0x10ff0, buf, 16));
  EXPECT_EQ(buf[15], 0xab);
  EXPECT_FALSE((*r)->ReadCarried(0x10ff8, buf, 16));  // runs into declared zero pages
  EXPECT_FALSE((*r)->ReadCarried(0x20010, buf, 16));  // file-backed, not carried
  ASSERT_TRUE((*r)->Read(0x20010, buf, 16));
}

std::vector<uint8_t> CoreWithNotes(const std::vector<CoreNoteSpec>& notes) {
  return BuildCoreFile({{0x10000, 0x1000, std::vector<uint8_t>(4096, 1)}}, NoteBytes(notes));
}

TEST(CoreNotes, ThreadsPidEntryAndFilesAreRead) {
  std::vector<uint8_t> auxv;
  PutWords(&auxv, 0, {AT_PHDR, 0x400040, AT_ENTRY, 0x401000, AT_NULL, 0});
  auto r = CoreFileReader::FromBytes(
      CoreWithNotes({{"CORE", NT_PRPSINFO, PrpsinfoDesc(100, "ruby")},
                     {"CORE", NT_PRSTATUS, PrstatusDesc(100, -1)},
                     {"CORE", NT_PRSTATUS, PrstatusDesc(101, 0, 5, 0x7f00, 11)},
                     {"LINUX", NT_PRSTATUS, PrstatusDesc(102, -1)},  // another owner's type 1: not a thread
                     {"CORE", NT_AUXV, auxv},
                     {"CORE", NT_FILE, NtFileDesc(1, {{0x400000, 0x402000, 0, "/usr/bin/ruby"},
                                                      {0x7f0000, 0x7f1000, 0x2000, "/lib/libruby.so.3.3"}})}}),
      {});
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  const CoreNotes& n = (*r)->notes();
  EXPECT_EQ(n.pid, 100);
  EXPECT_EQ(n.fname, "ruby");
  EXPECT_EQ(n.entry, 0x401000u);
  ASSERT_EQ(n.threads.size(), 2u);
  EXPECT_EQ(n.threads[0].tid, 100);
  EXPECT_FALSE(n.threads[0].in_syscall());
  EXPECT_EQ(n.threads[1].tid, 101);
  EXPECT_TRUE(n.threads[1].in_syscall());
  EXPECT_EQ(n.threads[1].orig_rax, 0u);
  EXPECT_EQ(n.threads[1].args[0], 5u);
  EXPECT_EQ(n.threads[1].args[1], 0x7f00u);
  EXPECT_EQ(n.threads[1].signal, 11);
  ASSERT_EQ(n.files.size(), 2u);
  EXPECT_EQ(n.files[1].path, "/lib/libruby.so.3.3");
  EXPECT_EQ(n.files[1].offset, 0x2000u);  // gdb's page size 1: offsets in bytes
}

// A core is untrusted input: each malformed note is an error naming it, never a crash or a huge allocation.
TEST(CoreNotes, HostileNotesAreRefused) {
  auto refused = [](const std::vector<uint8_t>& core, const std::string& why) {
    auto r = CoreFileReader::FromBytes(core, {});
    if (r.ok()) return ::testing::AssertionFailure() << "accepted (" << why << ")";
    if (r.error().message().find(why) == std::string::npos) {
      return ::testing::AssertionFailure() << r.error().message() << " does not say " << why;
    }
    return ::testing::AssertionSuccess();
  };
  std::vector<uint8_t> short_prstatus = PrstatusDesc(7, -1);
  short_prstatus.resize(200);
  EXPECT_TRUE(refused(CoreWithNotes({{"CORE", NT_PRSTATUS, short_prstatus}}), "NT_PRSTATUS"));
  EXPECT_TRUE(refused(CoreWithNotes({{"CORE", NT_PRSTATUS, PrstatusDesc(0, -1)}}), "tid 0"));
  EXPECT_TRUE(refused(CoreWithNotes({{"CORE", NT_PRPSINFO, std::vector<uint8_t>(40, 0)}}), "NT_PRPSINFO"));
  std::vector<uint8_t> huge = NtFileDesc(4096, {{0x1000, 0x2000, 0, "/x"}});
  PutWords(&huge, 0, {uint64_t{1} << 60});  // count
  EXPECT_TRUE(refused(CoreWithNotes({{"CORE", NT_FILE, huge}}), "count larger than the note"));
  std::vector<uint8_t> unterminated = NtFileDesc(4096, {{0x1000, 0x2000, 0, "/x"}});
  unterminated.back() = 'y';  // the last name's NUL
  EXPECT_TRUE(refused(CoreWithNotes({{"CORE", NT_FILE, unterminated}}), "names truncated"));
  std::vector<uint8_t> backwards = NtFileDesc(4096, {{0x2000, 0x1000, 0, "/x"}});
  EXPECT_TRUE(refused(CoreWithNotes({{"CORE", NT_FILE, backwards}}), "NT_FILE entry"));
  EXPECT_TRUE(refused(CoreWithNotes({{"CORE", NT_FILE, std::vector<uint8_t>(8, 0)}}), "shorter than its header"));
  // A note whose descsz runs past its segment.
  std::vector<uint8_t> note = NoteBytes({{"CORE", NT_PRSTATUS, PrstatusDesc(7, -1)}});
  const uint32_t big = 0x7fffffff;
  std::memcpy(note.data() + 4, &big, 4);
  EXPECT_TRUE(refused(BuildCoreFile({{0x10000, 0x1000, std::vector<uint8_t>(4096, 1)}}, note), "truncated note"));
  // Truncated in the middle of the notes.
  std::vector<uint8_t> cut = NoteBytes({{"CORE", NT_PRSTATUS, PrstatusDesc(7, -1)}});
  cut.resize(100);
  EXPECT_TRUE(refused(BuildCoreFile({{0x10000, 0x1000, std::vector<uint8_t>(4096, 1)}}, cut), "truncated note"));
}

TEST(CoreNotes, CountsAreBounded) {
  CoreNotes n;
  n.threads.resize(kMaxCoreThreads);
  std::vector<uint8_t> one = PrstatusDesc(7, -1);
  EXPECT_FALSE(ParseCoreNote("CORE", NT_PRSTATUS, one, &n).ok());
  EXPECT_EQ(n.threads.size(), kMaxCoreThreads);
  n.files.resize(kMaxCoreFileMappings);
  std::vector<uint8_t> file = NtFileDesc(4096, {{0x1000, 0x2000, 0, "/x"}});
  EXPECT_FALSE(ParseCoreNote("CORE", NT_FILE, file, &n).ok());
  EXPECT_EQ(n.files.size(), kMaxCoreFileMappings);
}

// A core carrying the first page of an ELF mapped at 0x400000: header, a PT_LOAD and a PT_NOTE with a GNU build-id.
std::vector<uint8_t> ElfFirstPage(const std::vector<uint8_t>& id, uint16_t phnum = 2) {
  std::vector<uint8_t> page(4096, 0);
  const Elf64_Ehdr eh = testing::ElfHeader(ET_DYN, phnum);
  std::memcpy(page.data(), &eh, sizeof(eh));
  std::vector<uint8_t> note = NoteBytes({{"GNU", NT_GNU_BUILD_ID, id}});
  const uint64_t note_at = 0x200;
  Elf64_Phdr ph[2] = {{PT_LOAD, PF_R, 0, 0, 0, 0x1000, 0x1000, 0x1000},
                      {PT_NOTE, PF_R, note_at, note_at, note_at, note.size(), note.size(), 4}};
  std::memcpy(page.data() + sizeof(eh), ph, sizeof(ph));
  std::memcpy(page.data() + note_at, note.data(), note.size());
  return page;
}

std::unique_ptr<CoreFileReader> CoreOf(std::vector<CoreSeg> segs) {
  auto r = CoreFileReader::FromBytes(BuildCoreFile(segs, {}), {});
  EXPECT_TRUE(r.ok()) << r.error().ToString();
  return r.ok() ? std::move(r.value()) : nullptr;
}

TEST(CoreBuildIdAtTest, ReadsTheBuildIdFromTheCarriedFirstPage) {
  auto core = CoreOf({{0x400000, 0x1000, ElfFirstPage({0xde, 0xad, 0xbe, 0xef, 0x01})}});
  ASSERT_NE(core, nullptr);
  EXPECT_EQ(CoreBuildIdAt(*core, 0x400000), "deadbeef01");
  EXPECT_EQ(CoreBuildIdAt(*core, 0x500000), std::nullopt);  // nothing there
}

TEST(CoreBuildIdAtTest, PagesNotCarriedOrMalformedGiveNone) {
  // Declared but not carried (p_filesz 0): a build-id must never be taken from zeros or another file.
  auto absent = CoreOf({{0x400000, 0x1000, {}}});
  ASSERT_NE(absent, nullptr);
  EXPECT_EQ(CoreBuildIdAt(*absent, 0x400000), std::nullopt);
  // Absurd program header count.
  auto many = CoreOf({{0x400000, 0x1000, ElfFirstPage({1, 2}, 0xffff)}});
  ASSERT_NE(many, nullptr);
  EXPECT_EQ(CoreBuildIdAt(*many, 0x400000), std::nullopt);
  // The note segment's descsz runs past it.
  std::vector<uint8_t> page = ElfFirstPage({1, 2});
  const uint32_t big = 4000;
  std::memcpy(page.data() + 0x200 + 4, &big, 4);
  auto cut = CoreOf({{0x400000, 0x1000, page}});
  ASSERT_NE(cut, nullptr);
  EXPECT_EQ(CoreBuildIdAt(*cut, 0x400000), std::nullopt);
  // A build-id that would end just past its note segment (still a plausible length).
  page = ElfFirstPage({1, 2, 3, 4, 5});
  const uint32_t past = 12;
  std::memcpy(page.data() + 0x200 + 4, &past, 4);
  auto past_end = CoreOf({{0x400000, 0x1000, page}});
  ASSERT_NE(past_end, nullptr);
  EXPECT_EQ(CoreBuildIdAt(*past_end, 0x400000), std::nullopt);
}

// The check compares the host file with what the process had: bytes the core lacks must never come from the host
// file being checked (it would always agree with itself).
TEST(CoreBuildIdAtTest, NeverReadsTheMappedFileItself) {
  const std::string path = ::testing::TempDir() + "dump_core_elf_" + std::to_string(getpid());
  const std::vector<uint8_t> page = ElfFirstPage({0xaa, 0xbb});
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(page.data()), page.size());
  auto r = CoreFileReader::FromBytes(
      BuildCoreFile({{0x10000, 0x1000, std::vector<uint8_t>(4096, 1)}},
                    NoteBytes({{"CORE", NT_FILE, NtFileDesc(4096, {{0x400000, 0x401000, 0, path}})}})),
      {});
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  uint8_t magic[4];
  ASSERT_TRUE((*r)->Read(0x400000, magic, 4));  // the reader does reach the file
  EXPECT_EQ(CoreBuildIdAt(**r, 0x400000), std::nullopt);
  std::remove(path.c_str());
}

TEST(ProcessMemoryReader, ReadsItsOwnMemoryAndFailsOnUnmapped) {
  ProcessMemoryReader r(getpid());
  const uint64_t value = 0x1122334455667788;
  uint64_t out = 0;
  ASSERT_TRUE(r.ReadValue(reinterpret_cast<uint64_t>(&value), &out));
  EXPECT_EQ(out, value);
  EXPECT_FALSE(r.ReadValue(uint64_t{8}, &out));
  EXPECT_FALSE(r.Read(reinterpret_cast<uint64_t>(&value), &out, MemoryReader::kMaxReadBytes + 1));
}

TEST(ProcessMemoryReader, ReadManyBatchesAndFailsEachBadRequestAlone) {
  const long page = sysconf(_SC_PAGESIZE);
  // Two pages, the second unmapped: a read crossing the boundary is partial, which is a failure.
  auto* pages = static_cast<uint8_t*>(mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                                           -1, 0));
  ASSERT_NE(pages, MAP_FAILED);
  ASSERT_EQ(munmap(pages + page, page), 0);
  std::memset(pages, 0xab, page);
  const uint64_t words[4] = {1, 2, 3, 4};
  uint64_t out[7] = {};
  auto at = [](const void* p) { return reinterpret_cast<uint64_t>(p); };
  MemoryReader::Request req[7] = {
      {at(&words[0]), &out[0], 8},
      {at(&words[1]), &out[1], 8},
      {8, &out[2], 8},                        // unmapped
      {at(pages + page - 4), &out[3], 8},     // 4 readable bytes, then the unmapped page
      {at(&words[2]), &out[4], 8},
      {at(&words[3]), &out[5], 0},            // empty: fails without a syscall
      {at(&words[3]), &out[6], 8},
  };
  ProcessMemoryReader r(getpid());
  EXPECT_EQ(r.ReadMany(req), 4u);
  const bool want_ok[7] = {true, true, false, false, true, false, true};
  for (int i = 0; i < 7; ++i) EXPECT_EQ(req[i].ok, want_ok[i]) << "request " << i;
  EXPECT_EQ(out[0], 1u);
  EXPECT_EQ(out[1], 2u);
  EXPECT_EQ(out[4], 3u);
  EXPECT_EQ(out[6], 4u);
  // [0..4] in one call (stops at 2), [3, 4] (stops at 3), [4], then [6] after the empty one.
  EXPECT_EQ(r.syscalls(), 4u);
  munmap(pages, page);

  // A clean batch is one syscall, however many requests (up to kMaxBatch).
  uint64_t many[100], copy[100] = {};
  std::vector<MemoryReader::Request> batch;
  for (int i = 0; i < 100; ++i) {
    many[i] = 1000 + i;
    batch.push_back({at(&many[i]), &copy[i], 8});
  }
  ProcessMemoryReader r2(getpid());
  EXPECT_EQ(r2.ReadMany(batch), 100u);
  EXPECT_EQ(r2.syscalls(), 1u);
  EXPECT_EQ(copy[99], 1099u);
}

TEST(ProcessMemoryReader, ReadManyOfAnExitedProcessFailsEverythingInOneSyscall) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  uint64_t word = 7, out[3];
  const uint64_t addr = reinterpret_cast<uint64_t>(&word);
  MemoryReader::Request req[3] = {{addr, &out[0], 8}, {addr, &out[1], 8}, {addr, &out[2], 8}};
  ProcessMemoryReader r(child);
  EXPECT_EQ(r.ReadMany(req), 0u);
  for (const auto& q : req) EXPECT_FALSE(q.ok);
  EXPECT_EQ(r.syscalls(), 1u);
}

}  // namespace
}  // namespace rvbpfd
