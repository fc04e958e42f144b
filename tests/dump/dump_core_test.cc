// `dump --core`'s own pieces: which mapped file of a core is the VM, and the thread facts taken from NT_PRSTATUS
// instead of /proc. (The core's own parsing and build-id reading: tests/stacks/memory_reader_test.cc.)
#include "dump/dump_core.h"

#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "stacks/fake_memory.h"

namespace rvbpfd {
namespace {

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

// A crashed CRuby maps its own binary whole to read DWARF for the [BUG] report: a mapping at offset 0 below the
// loaded image must not be taken for it.
TEST(ChooseCoreVmFileTest, TheLoadedImageNotAWholeFileMappingOfIt) {
  const std::string lib = "/usr/lib/libruby.so.3.3";
  const CoreNotes n = Mapped({{0x7e0000000, 0x7e1200000, 0, lib},  // addr2line's mmap of the whole file
                              {0x7f0000000, 0x7f004a000, 0, lib},
                              {0x7f004a000, 0x7f0400000, 0x4a000, lib},
                              {0x7f0400000, 0x7f0410000, 0x5c4000, lib}});
  Result<CoreVmFile> f = ChooseCoreVmFile(n, "", "");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->load_start, 0x7f0000000u);
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
