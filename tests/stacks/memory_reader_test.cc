// CoreFileReader on synthetic cores: PT_LOAD bytes, bytes declared but not carried (from the NT_FILE original file or
// zeros for anonymous memory), gzip, and rejection of malformed files.
#include "stacks/memory_reader.h"

#include <elf.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace rvbpfd {
namespace {

struct Seg {
  uint64_t vaddr, memsz;
  std::vector<uint8_t> data;  // filesz = data.size()
};

std::vector<uint8_t> BuildCore(const std::vector<Seg>& segs, uint64_t file_start, uint64_t file_end,
                               uint64_t file_pgoff, const std::string& file_path) {
  std::vector<uint8_t> desc(16 + 24);
  uint64_t words[5] = {1, 4096, file_start, file_end, file_pgoff};
  std::memcpy(desc.data(), words, sizeof(words));
  for (char c : file_path) desc.push_back(static_cast<uint8_t>(c));
  desc.push_back(0);
  while (desc.size() % 4) desc.push_back(0);
  std::vector<uint8_t> note(20, 0);  // header (12) + "CORE\0" padded to 8
  uint32_t nh[3] = {5, static_cast<uint32_t>(desc.size()), NT_FILE};
  std::memcpy(note.data(), nh, 12);
  std::memcpy(note.data() + 12, "CORE", 4);
  note.insert(note.end(), desc.begin(), desc.end());

  const size_t phnum = 1 + segs.size();
  uint64_t off = sizeof(Elf64_Ehdr) + phnum * sizeof(Elf64_Phdr);
  std::vector<Elf64_Phdr> ph(phnum);
  ph[0] = {PT_NOTE, 0, off, 0, 0, note.size(), 0, 4};
  off += note.size();
  for (size_t i = 0; i < segs.size(); i++) {
    ph[i + 1] = {PT_LOAD, PF_R, off, segs[i].vaddr, 0, segs[i].data.size(), segs[i].memsz, 4096};
    off += segs[i].data.size();
  }
  Elf64_Ehdr eh{};
  std::memcpy(eh.e_ident, ELFMAG, SELFMAG);
  eh.e_ident[EI_CLASS] = ELFCLASS64;
  eh.e_ident[EI_DATA] = ELFDATA2LSB;
  eh.e_ident[EI_VERSION] = EV_CURRENT;
  eh.e_type = ET_CORE;
  eh.e_machine = EM_X86_64;
  eh.e_phoff = sizeof(Elf64_Ehdr);
  eh.e_ehsize = sizeof(Elf64_Ehdr);
  eh.e_phentsize = sizeof(Elf64_Phdr);
  eh.e_phnum = static_cast<uint16_t>(phnum);
  std::vector<uint8_t> out(sizeof(eh) + phnum * sizeof(Elf64_Phdr));
  std::memcpy(out.data(), &eh, sizeof(eh));
  std::memcpy(out.data() + sizeof(eh), ph.data(), phnum * sizeof(Elf64_Phdr));
  out.insert(out.end(), note.begin(), note.end());
  for (const Seg& s : segs) out.insert(out.end(), s.data.begin(), s.data.end());
  return out;
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
