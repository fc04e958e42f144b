// `dump --core`'s own pieces on crafted cores: which mapped file is the VM, the build-id of a mapping as the core
// carries it, and the thread facts taken from NT_PRSTATUS instead of /proc.
#include "dump/dump_core.h"

#include <elf.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "stacks/core_builder.h"
#include "stacks/fake_memory.h"

namespace rvbpfd {
namespace {

using testing::BuildCoreFile;
using testing::CoreSeg;
using testing::NoteBytes;
using testing::PrstatusDesc;

CoreNotes Mapped(std::vector<CoreFileMapping> files, uint64_t entry = 0) {
  CoreNotes n;
  n.files = std::move(files);
  n.entry = entry;
  return n;
}

TEST(ChooseCoreVmFileTest, TheMappedLibrubyAtItsLowestAddress) {
  const CoreNotes n = Mapped({{0x400000, 0x401000, 0, "/usr/bin/ruby"},
                              {0x7f0001000, 0x7f0002000, 0x1000, "/usr/lib/libruby.so.3.3"},
                              {0x7f0000000, 0x7f0001000, 0, "/usr/lib/libruby.so.3.3"}},
                             0x400100);
  Result<CoreVmFile> f = ChooseCoreVmFile(n, "", "");
  ASSERT_TRUE(f.ok()) << f.error().ToString();
  EXPECT_TRUE(f->libruby);
  EXPECT_EQ(f->recorded_path, "/usr/lib/libruby.so.3.3");
  EXPECT_EQ(f->host_path, "/usr/lib/libruby.so.3.3");
  EXPECT_EQ(f->load_start, 0x7f0000000u);
  f = ChooseCoreVmFile(n, "/elsewhere/ruby", "/copy/libruby.so");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->recorded_path, "/usr/lib/libruby.so.3.3");
  EXPECT_EQ(f->host_path, "/copy/libruby.so");
}

TEST(ChooseCoreVmFileTest, WithoutLibrubyTheExecutableHoldingTheEntryPoint) {
  // A static ruby: the executable is the mapping holding AT_ENTRY, not the lowest one.
  const CoreNotes n = Mapped({{0x10000, 0x11000, 0, "/opt/loader.so"},
                              {0x400000, 0x401000, 0, "/opt/ruby/bin/ruby"},
                              {0x401000, 0x480000, 0x1000, "/opt/ruby/bin/ruby"}},
                             0x401230);
  Result<CoreVmFile> f = ChooseCoreVmFile(n, "", "");
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE(f->libruby);
  EXPECT_EQ(f->recorded_path, "/opt/ruby/bin/ruby");
  EXPECT_EQ(f->load_start, 0x400000u);
  EXPECT_EQ(ChooseCoreVmFile(n, "/tmp/ruby", "")->host_path, "/tmp/ruby");
  // --libruby for a core that maps none is a usage error, not a guess.
  Result<CoreVmFile> bad = ChooseCoreVmFile(n, "", "/tmp/libruby.so");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code(), ErrorCode::kUsage);
  EXPECT_EQ(ChooseCoreVmFile(CoreNotes{}, "", "").error().code(), ErrorCode::kNotRuby);
}

// A core carrying the first page of an ELF mapped at 0x400000: header, a PT_LOAD and a PT_NOTE with a GNU build-id.
std::vector<uint8_t> ElfFirstPage(const std::vector<uint8_t>& id, uint16_t phnum = 2) {
  std::vector<uint8_t> page(4096, 0);
  Elf64_Ehdr eh{};
  std::memcpy(eh.e_ident, ELFMAG, SELFMAG);
  eh.e_ident[EI_CLASS] = ELFCLASS64;
  eh.e_ident[EI_DATA] = ELFDATA2LSB;
  eh.e_type = ET_DYN;
  eh.e_phoff = sizeof(Elf64_Ehdr);
  eh.e_phentsize = sizeof(Elf64_Phdr);
  eh.e_phnum = phnum;
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
                    NoteBytes({{"CORE", NT_FILE, testing::NtFileDesc(4096, {{0x400000, 0x401000, 0, path}})}})),
      {});
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  uint8_t magic[4];
  ASSERT_TRUE((*r)->Read(0x400000, magic, 4));  // the reader does reach the file
  EXPECT_EQ(CoreBuildIdAt(**r, 0x400000), std::nullopt);
  std::remove(path.c_str());
}

FrameInfo C(const char* label) { return FrameInfo{label, "<cfunc>", 0, FrameKind::kCfunc}; }
FrameInfo R(const char* label) { return FrameInfo{label, "/app/x.rb", 3, FrameKind::kRuby}; }

DumpedThread Thread(int ns_tid, std::vector<FrameInfo> frames, RubyThreadStatus status, bool gvl) {
  DumpedThread t;
  t.th = 0x1000u * static_cast<uint64_t>(ns_tid);
  t.ns_tid = ns_tid;
  t.native_tid = ns_tid;
  t.frames = std::move(frames);
  t.status = status;
  t.holds_gvl = gvl;
  return t;
}

TEST(AddCoreFactsTest, StatesAndIoDescriptorsFromTheRegisters) {
  DumpSnapshot s;
  s.threads.push_back(Thread(100, {R("Object#spin")}, RubyThreadStatus::kRunnable, true));
  s.threads.push_back(Thread(101, {C("IO#read"), R("Object#pull")}, RubyThreadStatus::kStoppedForever, false));
  s.threads.push_back(Thread(102, {C("IO#read"), R("Object#poll")}, RubyThreadStatus::kStoppedForever, false));
  s.threads.push_back(Thread(103, {C("Kernel#sleep")}, RubyThreadStatus::kStopped, false));
  CoreNotes n;
  for (const auto& [tid, nr, a0, a1] : std::vector<std::tuple<int, int64_t, uint64_t, uint64_t>>{
           {100, -1, 0, 0},          // in user space
           {101, 0, 9, 0x7000},      // read(9, ...)
           {102, 271, 0x5000, 1}}) {  // ppoll(fds = 0x5000, 1)
    CoreThread t;
    t.tid = tid;
    t.orig_rax = static_cast<uint64_t>(nr);
    t.args[0] = a0;
    t.args[1] = a1;
    n.threads.push_back(t);
  }
  testing::FakeMemory mem;
  mem.Map(0x5000, 8);
  mem.Put32(0x5000, 12);  // pollfd.fd
  AddCoreFacts(n, mem, &s);
  EXPECT_EQ(s.threads[0].state, "running");
  EXPECT_EQ(s.threads[1].state, "blocked");
  ASSERT_TRUE(s.threads[1].waiting_for);
  EXPECT_EQ(s.threads[1].waiting_for->kind, "io");
  EXPECT_EQ(s.threads[1].waiting_for->fd, 9);
  EXPECT_EQ(s.threads[1].waiting_for->fd_target, std::nullopt);
  EXPECT_EQ(s.threads[2].waiting_for->fd, 12);
  // No NT_PRSTATUS for tid 103: named in the notes.
  ASSERT_EQ(s.notes.size(), 2u);
  EXPECT_NE(s.notes[0].find("core file"), std::string::npos);
  EXPECT_NE(s.notes[1].find("103"), std::string::npos);

  // The GVL holder inside a system call holds it off the CPU.
  DumpSnapshot h;
  h.threads.push_back(Thread(100, {R("Object#spin")}, RubyThreadStatus::kRunnable, true));
  n.threads[0].orig_rax = 35;  // nanosleep
  AddCoreFacts(n, mem, &h);
  EXPECT_EQ(h.threads[0].state, "holding_gvl");
}

}  // namespace
}  // namespace rvbpfd
