// StringTablesName: whether an ELF file's symbol string tables name a symbol, read in bounded chunks. Real fixtures
// compiled at test time (exported, stripped, absent, as a tail of another name, as data only), chunk borders, and
// hostile files (not ELF, truncated, headers pointing out of the file). No root needed.
#include "elf/symbol_names.h"

#include <elf.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <string_view>

#include "common/target_file.h"
#include "elf/elf_file.h"
#include "elf/elf_fixtures.h"

namespace rvbpfd {
namespace {

using testing::CompileC;
using testing::TempDir;

constexpr std::string_view kVm[] = {"ruby_version", "ruby_vm_event_flags"};

// As a static ruby: the VM's symbols defined in the executable and exported (-rdynamic), so .dynsym has them too.
constexpr const char* kStaticRuby = R"(
const char ruby_version[] = "3.4.5";
unsigned int ruby_vm_event_flags;
int main(void) { return (int)ruby_version[0] + (int)ruby_vm_event_flags; }
)";
// Not a Ruby: the name only as data (a string literal), never as a symbol.
constexpr const char* kNotRuby = R"(
#include <stdio.h>
int helper_count;
int main(void) { puts("ruby_version"); return helper_count; }
)";
// A symbol whose name ends with the VM's: its string also contains "ruby_version\0" (linkers share such tails).
constexpr const char* kTail = R"(
int xruby_version;
int main(void) { return xruby_version; }
)";

Result<bool> Scan(const std::string& path, size_t chunk = kSymbolNamesChunkBytes) {
  Result<FileFd> fd = OpenRegularFile(path, "ELF file");
  if (!fd) return fd.error();
  return StringTablesName(fd->get(), kVm, chunk);
}

class SymbolNamesTest : public ::testing::Test {
 protected:
  std::string Build(const char* source, const std::string& name, const std::string& flags) {
    const std::string path = dir_.Join(name);
    EXPECT_TRUE(CompileC(source, path, flags));
    return path;
  }
  TempDir dir_;
};

TEST_F(SymbolNamesTest, AStaticRubyNamesItsVmSymbolsAndAnotherProgramDoesNot) {
  const std::string ruby = Build(kStaticRuby, "ruby", "-O2 -rdynamic");
  const std::string other = Build(kNotRuby, "other", "-O2");
  Result<bool> r = Scan(ruby);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_TRUE(*r);
  Result<bool> o = Scan(other);
  ASSERT_TRUE(o.ok()) << o.error().ToString();
  EXPECT_FALSE(*o) << "a string literal is not a symbol name";
  // The full parse agrees: the answer "no" is only given where no such symbol exists.
  Result<ElfFile> elf = ElfFile::Open(other);
  ASSERT_TRUE(elf.ok());
  for (std::string_view name : kVm) EXPECT_FALSE(elf->FindSymbol(name).has_value()) << name;
}

TEST_F(SymbolNamesTest, AStrippedExecutableStillNamesItsExportedSymbols) {
  // -s drops .symtab: only .dynsym (and .dynstr) remain, as in a distribution's binary.
  const std::string ruby = Build(kStaticRuby, "ruby-stripped", "-O2 -rdynamic -s");
  Result<ElfFile> elf = ElfFile::Open(ruby);
  ASSERT_TRUE(elf.ok());
  ASSERT_FALSE(elf->has_symtab());
  Result<bool> r = Scan(ruby);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_TRUE(*r);
  // Stripped and not exported: no table names it, and the full parse finds no symbol either.
  const std::string hidden = Build(kStaticRuby, "ruby-hidden", "-O2 -s");
  Result<bool> h = Scan(hidden);
  ASSERT_TRUE(h.ok()) << h.error().ToString();
  EXPECT_FALSE(*h);
  Result<ElfFile> hidden_elf = ElfFile::Open(hidden);
  ASSERT_TRUE(hidden_elf.ok());
  EXPECT_FALSE(hidden_elf->FindSymbol("ruby_version").has_value());
}

TEST_F(SymbolNamesTest, ANameThatEndsAnotherCountsAsNamed) {
  Result<bool> r = Scan(Build(kTail, "tail", "-O2"));
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_TRUE(*r) << "a symbol can point into the tail of a longer name: only "
                     "the full parse can say no";
}

TEST_F(SymbolNamesTest, ANameAcrossAChunkBorderIsFound) {
  // Every chunk size from just above the longest name to a few hundred bytes puts the border at another place in the
  // tables, across the names at some of them.
  const std::string ruby = Build(kStaticRuby, "ruby", "-O2 -rdynamic");
  const std::string other = Build(kNotRuby, "other", "-O2");
  for (size_t chunk = 21; chunk < 400; ++chunk) {
    Result<bool> r = Scan(ruby, chunk);
    ASSERT_TRUE(r.ok()) << chunk;
    EXPECT_TRUE(*r) << "chunk " << chunk;
    Result<bool> o = Scan(other, chunk);
    ASSERT_TRUE(o.ok()) << chunk;
    EXPECT_FALSE(*o) << "chunk " << chunk;
  }
  // A name as long as a chunk cannot be searched so.
  EXPECT_FALSE(Scan(ruby, 19).ok());
}

TEST_F(SymbolNamesTest, HostileFilesAreErrorsNeverReadsOutOfTheFile) {
  const std::string ruby = Build(kStaticRuby, "ruby", "-O2 -rdynamic");
  const std::string full = testing::ReadFile(ruby);
  ASSERT_GT(full.size(), sizeof(Elf64_Ehdr));
  Elf64_Ehdr eh;
  std::memcpy(&eh, full.data(), sizeof(eh));
  auto scan_bytes = [&](const std::string& name, const std::string& bytes) {
    const std::string path = dir_.Join(name);
    testing::WriteFile(path, bytes);
    return Scan(path);
  };
  EXPECT_FALSE(scan_bytes("text", "#!/bin/sh\necho ruby_version\n").ok());
  EXPECT_FALSE(scan_bytes("empty", "").ok());
  // Cut inside the header, before the section headers, inside them.
  for (size_t cut : {size_t{20}, size_t{200}, static_cast<size_t>(eh.e_shoff) + 10}) {
    EXPECT_FALSE(scan_bytes("cut-" + std::to_string(cut), full.substr(0, cut)).ok()) << cut;
  }
  // Section headers said to lie past the end of the file.
  std::string far = full;
  Elf64_Ehdr bad = eh;
  bad.e_shoff = full.size() + 4096;
  std::memcpy(far.data(), &bad, sizeof(bad));
  EXPECT_FALSE(scan_bytes("far-sections", far).ok());
  // A string table said to be larger than the file: every symbol table's linked table is stretched.
  std::string stretched = full;
  for (size_t i = 0; i < eh.e_shnum; ++i) {
    Elf64_Shdr s;
    const size_t at = eh.e_shoff + i * sizeof(Elf64_Shdr);
    std::memcpy(&s, stretched.data() + at, sizeof(s));
    if (s.sh_type != SHT_SYMTAB && s.sh_type != SHT_DYNSYM) continue;
    Elf64_Shdr t;
    const size_t link_at = eh.e_shoff + s.sh_link * sizeof(Elf64_Shdr);
    std::memcpy(&t, stretched.data() + link_at, sizeof(t));
    t.sh_size = UINT64_MAX - 8;
    std::memcpy(stretched.data() + link_at, &t, sizeof(t));
  }
  EXPECT_FALSE(scan_bytes("stretched", stretched).ok());
  // Every symbol table's string table said to be the whole file: each fits, but together they would read the file
  // once per table.
  std::string overlapping = full;
  int linked = 0;
  for (size_t i = 0; i < eh.e_shnum; ++i) {
    Elf64_Shdr s;
    std::memcpy(&s, overlapping.data() + eh.e_shoff + i * sizeof(Elf64_Shdr), sizeof(s));
    if (s.sh_type != SHT_SYMTAB && s.sh_type != SHT_DYNSYM) continue;
    Elf64_Shdr t;
    const size_t link_at = eh.e_shoff + s.sh_link * sizeof(Elf64_Shdr);
    std::memcpy(&t, overlapping.data() + link_at, sizeof(t));
    t.sh_offset = 0;
    t.sh_size = full.size();
    std::memcpy(overlapping.data() + link_at, &t, sizeof(t));
    ++linked;
  }
  ASSERT_GE(linked, 2) << "the fixture needs .symtab and .dynsym";
  EXPECT_FALSE(scan_bytes("overlapping", overlapping).ok());
  // A directory is not a regular file.
  const int dir_fd = open(dir_.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dir_fd, 0);
  EXPECT_FALSE(StringTablesName(dir_fd, kVm).ok());
  close(dir_fd);
}

TEST(SymbolNamesRealTest, TheStaticTestRubyNamesItsVmAndTheSharedOnesExecutableDoesNot) {
  const std::string static_dir = testing::TestRuby("3.4.5-static");
  const std::string shared_dir = testing::TestRuby("3.3.8-shared");
  if (static_dir.empty() || shared_dir.empty()) GTEST_SKIP() << "test Rubies not built (tools/build-test-rubies.sh)";
  Result<bool> s = Scan(static_dir + "/bin/ruby");
  ASSERT_TRUE(s.ok()) << s.error().ToString();
  EXPECT_TRUE(*s);
  // The VM lives in libruby: its executable neither defines nor names ruby_version, so it is never parsed whole.
  Result<bool> e = Scan(shared_dir + "/bin/ruby");
  ASSERT_TRUE(e.ok()) << e.error().ToString();
  EXPECT_FALSE(*e);
  Result<bool> lib = Scan(shared_dir + "/lib/libruby.so.3.3.8");
  ASSERT_TRUE(lib.ok()) << lib.error().ToString();
  EXPECT_TRUE(*lib);
}

}  // namespace
}  // namespace rvbpfd
