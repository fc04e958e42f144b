#include "elf/elf_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "elf/elf_fixtures.h"

namespace rvbpfd {
namespace {

using testing::CompileC;
using testing::TempDir;

// A shared library with a known build-id, an exported version string, a .bss object and GCC-style clone names
// (assembler names with dots, as GCC gives its clones).
constexpr const char* kLibSource = R"(
const char ruby_version[] = "3.3.8";
char big_bss[4096];
__attribute__((noinline, used)) static int worker(int x) { return x * 3 + 1; }
__attribute__((noinline, used)) int worker_clone(int x) __asm__("do_mutex_lock.constprop.0");
int worker_clone(int x) { return x + 7; }
__attribute__((noinline, used)) int worker_cold(int x) __asm__("do_mutex_lock.constprop.0.cold");
int worker_cold(int x) { return x - 7; }
__attribute__((noinline, used)) int worker_main(int x) __asm__("do_mutex_lock");
int worker_main(int x) { return worker(x) + 2; }
__attribute__((noinline, used)) int worker_other(int x) __asm__("do_mutex_lock_other");
int worker_other(int x) { return x ^ 5; }
int exported_entry(int x) { return worker(x) + big_bss[x & 7]; }
)";
constexpr const char* kBuildId = "0123456789abcdef0123456789abcdef01234567";

class ElfFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    lib_ = dir_.Join("libfixture.so");
    ASSERT_TRUE(CompileC(kLibSource, lib_, std::string("-shared -fPIC -O2 -Wl,--build-id=0x") + kBuildId));
  }
  TempDir dir_;
  std::string lib_;
};

TEST(CloneSuffixTest, AcceptsGccCloneSuffixesOnly) {
  EXPECT_TRUE(MatchesWithCloneSuffix("do_mutex_lock", "do_mutex_lock"));
  EXPECT_TRUE(MatchesWithCloneSuffix("do_mutex_lock.constprop.0", "do_mutex_lock"));
  EXPECT_TRUE(MatchesWithCloneSuffix("do_mutex_lock.constprop.0.cold", "do_mutex_lock"));
  EXPECT_TRUE(MatchesWithCloneSuffix("gc_rest.part.0", "gc_rest"));
  EXPECT_TRUE(MatchesWithCloneSuffix("foo.isra.12", "foo"));
  EXPECT_TRUE(MatchesWithCloneSuffix("thread_start_func_2.cold", "thread_start_func_2"));
  EXPECT_FALSE(MatchesWithCloneSuffix("do_mutex_lock_other", "do_mutex_lock"));
  EXPECT_FALSE(MatchesWithCloneSuffix("do_mutex_locked", "do_mutex_lock"));
  EXPECT_FALSE(MatchesWithCloneSuffix("do_mutex_lock.constprop.", "do_mutex_lock"));
  EXPECT_FALSE(MatchesWithCloneSuffix("do_mutex_lock.constprop.x", "do_mutex_lock"));
  EXPECT_FALSE(MatchesWithCloneSuffix("do_mutex", "do_mutex_lock"));
}

TEST(ElfFileOpenTest, MissingFileIsAnIoErrorWithErrno) {
  Result<ElfFile> elf = ElfFile::Open("/nonexistent/rvbpfd/libruby.so");
  ASSERT_FALSE(elf.ok());
  EXPECT_EQ(elf.error().code(), ErrorCode::kIo);
  EXPECT_NE(elf.error().message().find("errno 2"), std::string::npos) << elf.error().message();
}

TEST(ElfFileOpenTest, NonElfFileIsRejected) {
  TempDir dir;
  testing::WriteFile(dir.Join("text"), "this is not an ELF file at all, just text\n");
  Result<ElfFile> elf = ElfFile::Open(dir.Join("text"));
  ASSERT_FALSE(elf.ok());
  EXPECT_EQ(elf.error().code(), ErrorCode::kIo);
  EXPECT_NE(elf.error().message().find("not an ELF"), std::string::npos) << elf.error().message();
}

// A file mapped under a VM's name may be hundreds of MB of anything: its ELF header is judged (one 64-byte read)
// before any of it is copied. Copying it would fault in one fresh page of the copy per 4 KiB; the bound here is an
// eighth of that.
TEST(ElfFileOpenTest, NonElfFileIsRejectedBeforeItIsCopied) {
  TempDir dir;
  constexpr size_t kBytes = 32u << 20;
  testing::WriteFile(dir.Join("libruby.so.3.4"), std::string(kBytes, 'x'));
  struct rusage before {}, after {};
  ASSERT_EQ(getrusage(RUSAGE_THREAD, &before), 0);
  Result<ElfFile> elf = ElfFile::Open(dir.Join("libruby.so.3.4"));
  ASSERT_EQ(getrusage(RUSAGE_THREAD, &after), 0);
  ASSERT_FALSE(elf.ok());
  EXPECT_NE(elf.error().message().find("not an ELF"), std::string::npos) << elf.error().message();
  const long faults = after.ru_minflt - before.ru_minflt;
  EXPECT_LT(faults, static_cast<long>(kBytes / 4096 / 8)) << "pages faulted in while refusing a non-ELF file";
}

TEST(ElfFileOpenTest, AnElfHeaderWhoseProgramHeadersLieOutsideTheFileIsRejected) {
  TempDir dir;
  Elf64_Ehdr eh{};
  std::memcpy(eh.e_ident, ELFMAG, SELFMAG);
  eh.e_ident[EI_CLASS] = ELFCLASS64;
  eh.e_ident[EI_DATA] = ELFDATA2LSB;
  eh.e_ident[EI_VERSION] = EV_CURRENT;
  eh.e_type = ET_DYN;
  eh.e_machine = EM_X86_64;
  eh.e_version = EV_CURRENT;
  eh.e_phoff = 1u << 30;  // far past the end of this 4 KiB file
  eh.e_phnum = 12;
  eh.e_phentsize = sizeof(Elf64_Phdr);
  std::string bytes(reinterpret_cast<const char*>(&eh), sizeof(eh));
  bytes.resize(4096, 'x');
  testing::WriteFile(dir.Join("crafted.so"), bytes);
  Result<ElfFile> elf = ElfFile::Open(dir.Join("crafted.so"));
  ASSERT_FALSE(elf.ok());
  EXPECT_EQ(elf.error().code(), ErrorCode::kIo);
  EXPECT_NE(elf.error().message().find("outside the file"), std::string::npos) << elf.error().message();
}

TEST_F(ElfFileTest, ReadsBuildIdSymbolsAndVersionString) {
  Result<ElfFile> elf = ElfFile::Open(lib_);
  ASSERT_TRUE(elf.ok()) << elf.error().ToString();
  EXPECT_EQ(elf->build_id(), kBuildId);
  EXPECT_TRUE(elf->has_symtab());
  EXPECT_EQ(elf->elf_type(), ET_DYN);

  std::optional<ElfSymbol> version = elf->FindSymbol("ruby_version");
  ASSERT_TRUE(version.has_value());
  EXPECT_EQ(version->type, STT_OBJECT);
  EXPECT_EQ(version->binding, STB_GLOBAL);
  EXPECT_EQ(version->size, 6u);
  EXPECT_EQ(elf->CStringAt(version->value, 32), "3.3.8");
  // A bound shorter than the string means "unterminated": no partial string.
  EXPECT_FALSE(elf->CStringAt(version->value, 3).has_value());

  std::optional<ElfSymbol> worker = elf->FindSymbol("worker");  // static: .symtab only
  ASSERT_TRUE(worker.has_value());
  EXPECT_TRUE(worker->from_symtab);
  EXPECT_EQ(worker->binding, STB_LOCAL);
  EXPECT_EQ(worker->type, STT_FUNC);
  EXPECT_FALSE(elf->FindSymbol("no_such_symbol").has_value());
}

// kLibSource and `functions` more: debug sections (and code) of several pages each, so whole pages of them count.
std::string LargeDwarfSource(int functions = 400) {
  std::string src = kLibSource;
  for (int i = 0; i < functions; ++i) {
    src += "int filler_" + std::to_string(i) + "(int a, int b) { int c = a * " + std::to_string(i) +
           " + b; return c ^ (a >> 3); }\n";
  }
  return src;
}

TEST_F(ElfFileTest, DebugSectionsAreCopiedWhenFirstRead) {
  // Built with DWARF: its .debug_* sections are deferred until read, and then hold the file's own bytes.
  const std::string lib = dir_.Join("libdwarf.so");
  ASSERT_TRUE(CompileC(LargeDwarfSource(), lib, "-shared -fPIC -O2 -g"));
  std::ifstream in(lib, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Result<ElfFile> elf = ElfFile::Open(lib);
  ASSERT_TRUE(elf.ok()) << elf.error().message();
  std::optional<ElfSection> info = elf->FindSection(".debug_info");
  ASSERT_TRUE(info.has_value());
  std::span<const uint8_t> data = elf->SectionData(*info);
  ASSERT_EQ(data.size(), info->size);
  EXPECT_TRUE(std::string(reinterpret_cast<const char*>(data.data()), data.size()) ==
              bytes.substr(info->offset, info->size))
      << ".debug_info differs from the file's bytes";
  std::span<const uint8_t> all = elf->content();
  ASSERT_EQ(all.size(), bytes.size());
  EXPECT_TRUE(std::equal(all.begin(), all.end(), reinterpret_cast<const uint8_t*>(bytes.data())));
  EXPECT_TRUE(elf->LoadDeferredSections().ok());
}

TEST_F(ElfFileTest, ContentOfAFileChangedBeforeItsDebugSectionsWereReadIsRefused) {
  const std::string lib = dir_.Join("libdwarf2.so");
  ASSERT_TRUE(CompileC(LargeDwarfSource(), lib, "-shared -fPIC -O2 -g"));
  Result<ElfFile> elf = ElfFile::Open(lib);
  ASSERT_TRUE(elf.ok()) << elf.error().message();
  struct stat st;
  ASSERT_EQ(stat(lib.c_str(), &st), 0);
  // Another content in place (a newer ctime): what was copied and what would be read no longer belong together.
  do {
    ASSERT_EQ(chmod(lib.c_str(), st.st_mode & 07777), 0);  // sets ctime, as any write does
    struct stat now;
    ASSERT_EQ(stat(lib.c_str(), &now), 0);
    if (now.st_ctim.tv_sec != st.st_ctim.tv_sec || now.st_ctim.tv_nsec != st.st_ctim.tv_nsec) break;
    usleep(1000);
  } while (true);
  EXPECT_FALSE(elf->LoadDeferredSections().ok());
  EXPECT_TRUE(elf->content().empty());
  std::optional<ElfSection> info = elf->FindSection(".debug_info");
  ASSERT_TRUE(info.has_value());
  EXPECT_TRUE(elf->SectionData(*info).empty());
  // Symbols and code came with the first copy.
  EXPECT_TRUE(elf->FindSymbol("exported_entry").has_value());
}

TEST_F(ElfFileTest, ADebugSectionHeaderOverCodeDefersNothingThere) {
  // A hostile file whose .debug_info header claims .text's bytes: those bytes are code first, copied at once, so a
  // reader of .text never sees the zeros of a deferred page.
  const std::string lib = dir_.Join("libhostile.so");
  ASSERT_TRUE(CompileC(LargeDwarfSource(1500), lib, "-shared -fPIC -O2 -g"));
  std::string bytes;
  {
    std::ifstream in(lib, std::ios::binary);
    bytes.assign((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  Result<ElfFile> original = ElfFile::Open(lib);
  ASSERT_TRUE(original.ok()) << original.error().message();
  std::optional<ElfSection> text = original->FindSection(".text");
  std::optional<ElfSection> info = original->FindSection(".debug_info");
  ASSERT_TRUE(text.has_value() && info.has_value());
  ASSERT_GE(text->size, 3u * 4096u) << "the fixture's code no longer spans whole pages";
  Elf64_Ehdr eh;
  std::memcpy(&eh, bytes.data(), sizeof(eh));
  bool patched = false;
  for (size_t i = 0; i < eh.e_shnum; ++i) {
    Elf64_Shdr sh;
    std::memcpy(&sh, bytes.data() + eh.e_shoff + i * sizeof(sh), sizeof(sh));
    if (sh.sh_offset != info->offset || sh.sh_size != info->size || sh.sh_type != info->type) continue;
    sh.sh_offset = text->offset;
    sh.sh_size = text->size;
    std::memcpy(bytes.data() + eh.e_shoff + i * sizeof(sh), &sh, sizeof(sh));
    patched = true;
  }
  ASSERT_TRUE(patched);
  const std::string hostile = dir_.Join("libhostile-patched.so");
  std::ofstream(hostile, std::ios::binary) << bytes;
  Result<ElfFile> elf = ElfFile::Open(hostile);
  ASSERT_TRUE(elf.ok()) << elf.error().message();
  std::optional<ElfSection> code = elf->FindSection(".text");
  ASSERT_TRUE(code.has_value());
  // Read the code without going through anything that would copy the deferred sections in.
  std::span<const uint8_t> got(elf->SectionData(*code));
  ASSERT_EQ(got.size(), code->size);
  EXPECT_TRUE(std::string(reinterpret_cast<const char*>(got.data()), got.size()) ==
              bytes.substr(code->offset, code->size))
      << ".text differs from the file's bytes (a deferred page read as zeros?)";
}

TEST_F(ElfFileTest, PrefixLookupFindsClonesButNotOtherNames) {
  Result<ElfFile> elf = ElfFile::Open(lib_);
  ASSERT_TRUE(elf.ok());
  std::vector<ElfSymbol> syms = elf->FindSymbolsWithPrefix("do_mutex_lock");
  std::vector<std::string> names;
  for (const ElfSymbol& s : syms) names.push_back(s.name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"do_mutex_lock", "do_mutex_lock.constprop.0",
                                             "do_mutex_lock.constprop.0.cold"}));
}

TEST_F(ElfFileTest, VaddrToFileOffsetAgreesWithSectionHeaders) {
  Result<ElfFile> elf = ElfFile::Open(lib_);
  ASSERT_TRUE(elf.ok());
  std::optional<ElfSection> text = elf->FindSection(".text");
  ASSERT_TRUE(text.has_value());
  std::optional<ElfSymbol> fn = elf->FindSymbol("exported_entry");
  ASSERT_TRUE(fn.has_value());
  ASSERT_GE(fn->value, text->addr);
  std::optional<uint64_t> off = elf->VaddrToFileOffset(fn->value);
  ASSERT_TRUE(off.has_value());
  EXPECT_EQ(*off, text->offset + (fn->value - text->addr));

  // The bytes at the function's address are the bytes of .text at the same place.
  std::span<const uint8_t> via_vaddr = elf->BytesAt(fn->value, fn->size);
  std::span<const uint8_t> section = elf->SectionData(*text);
  ASSERT_EQ(via_vaddr.size(), fn->size);
  ASSERT_LE(fn->value - text->addr + fn->size, section.size());
  EXPECT_EQ(std::memcmp(via_vaddr.data(), section.data() + (fn->value - text->addr), fn->size), 0);

  std::optional<ElfSymbol> containing = elf->FunctionContaining(fn->value + fn->size / 2);
  ASSERT_TRUE(containing.has_value());
  EXPECT_EQ(containing->name, "exported_entry");
}

TEST_F(ElfFileTest, ReadsOutsideTheFileFailCleanly) {
  Result<ElfFile> elf = ElfFile::Open(lib_);
  ASSERT_TRUE(elf.ok());
  std::optional<ElfSymbol> bss = elf->FindSymbol("big_bss");
  ASSERT_TRUE(bss.has_value());
  EXPECT_FALSE(elf->VaddrToFileOffset(bss->value).has_value()) << ".bss has no file bytes";
  EXPECT_TRUE(elf->BytesAt(bss->value, 4).empty());
  EXPECT_TRUE(elf->BytesAt(0xffffffffffff0000ull, 16).empty());
  EXPECT_TRUE(elf->BytesAt(UINT64_MAX - 2, 8).empty()) << "address overflow must not wrap";
  std::optional<ElfSymbol> fn = elf->FindSymbol("exported_entry");
  ASSERT_TRUE(fn.has_value());
  EXPECT_TRUE(elf->BytesAt(fn->value, 1ull << 40).empty()) << "length beyond the segment";
  EXPECT_FALSE(elf->CStringAt(0xdeadbeef000ull, 16).has_value());
}

TEST_F(ElfFileTest, StrippedFileHasNoSymtabButKeepsDynsym) {
  std::string stripped = dir_.Join("libstripped.so");
  ASSERT_TRUE(CompileC(kLibSource, stripped, "-shared -fPIC -O2 -s"));
  Result<ElfFile> elf = ElfFile::Open(stripped);
  ASSERT_TRUE(elf.ok());
  EXPECT_FALSE(elf->has_symtab());
  EXPECT_FALSE(elf->FindSymbol("worker").has_value()) << "static functions live only in .symtab";
  std::optional<ElfSymbol> version = elf->FindSymbol("ruby_version");
  ASSERT_TRUE(version.has_value());
  EXPECT_FALSE(version->from_symtab);
  EXPECT_EQ(elf->CStringAt(version->value, 32), "3.3.8");
}

TEST_F(ElfFileTest, TruncatedFilesNeverReadOutOfBounds) {
  std::string full = testing::ReadFile(lib_);
  ASSERT_GT(full.size(), 4096u);
  // Cut at several points: inside the ELF header, the program headers, the middle, and just before the section
  // header table. Each must either fail to open or answer every query without touching bytes past the end.
  int opened = 0;
  for (size_t cut : {size_t{20}, size_t{100}, size_t{1000}, full.size() / 2, full.size() - 64}) {
    std::string path = dir_.Join("cut-" + std::to_string(cut));
    testing::WriteFile(path, full.substr(0, cut));
    Result<ElfFile> elf = ElfFile::Open(path);
    if (!elf.ok()) {
      EXPECT_EQ(elf.error().code(), ErrorCode::kIo) << cut;
      continue;
    }
    ++opened;
    for (const ElfSection& s : elf->sections()) {
      std::span<const uint8_t> data = elf->SectionData(s);
      if (!data.empty()) {
        EXPECT_LE(s.offset + s.size, cut) << s.name;
      }
    }
    for (const ElfSymbol& s : elf->symbols()) {
      std::span<const uint8_t> bytes = elf->BytesAt(s.value, s.size);
      if (!bytes.empty()) {
        std::optional<uint64_t> off = elf->VaddrToFileOffset(s.value);
        ASSERT_TRUE(off.has_value());
        EXPECT_LE(*off + s.size, cut) << s.name;
      }
    }
  }
  EXPECT_GT(opened, 0) << "no truncated copy parsed: the bounds checks were not exercised";
  std::printf("truncated copies that still parsed: %d of 5\n", opened);
}

// A crafted program header whose executable segment claims far more file bytes than exist: reads must be limited
// by the real file size, not by what the header says.
TEST_F(ElfFileTest, LyingProgramHeaderIsBoundedByTheFileSize) {
  std::string bytes = testing::ReadFile(lib_);
  Elf64_Ehdr ehdr;
  ASSERT_GE(bytes.size(), sizeof(ehdr));
  std::memcpy(&ehdr, bytes.data(), sizeof(ehdr));
  bool patched = false;
  for (int i = 0; i < ehdr.e_phnum; ++i) {
    size_t at = ehdr.e_phoff + static_cast<size_t>(i) * ehdr.e_phentsize;
    ASSERT_LE(at + sizeof(Elf64_Phdr), bytes.size());
    Elf64_Phdr ph;
    std::memcpy(&ph, bytes.data() + at, sizeof(ph));
    if (ph.p_type != PT_LOAD || (ph.p_flags & PF_X) == 0) continue;
    ph.p_filesz = ph.p_memsz = 1ull << 40;
    std::memcpy(bytes.data() + at, &ph, sizeof(ph));
    patched = true;
  }
  ASSERT_TRUE(patched);
  std::string path = dir_.Join("liar.so");
  testing::WriteFile(path, bytes);
  Result<ElfFile> elf = ElfFile::Open(path);
  ASSERT_TRUE(elf.ok()) << elf.error().ToString();
  std::optional<ElfSymbol> fn = elf->FindSymbol("exported_entry");
  ASSERT_TRUE(fn.has_value());
  EXPECT_FALSE(elf->BytesAt(fn->value, 16).empty()) << "bytes inside the file are still readable";
  EXPECT_TRUE(elf->BytesAt(fn->value, bytes.size()).empty()) << "a read past the end of the file must fail";
  std::optional<uint64_t> off = elf->VaddrToFileOffset(fn->value + bytes.size());
  EXPECT_FALSE(off.has_value()) << "an address mapped by the lie but beyond the file has no file offset";
}

// Crafted symbol tables that would make the parse copy far more than the file: refused, while the same file with its
// real tables parses.
TEST_F(ElfFileTest, SymbolsThatWouldCostMoreThanTheFileAreRefused) {
  const std::string full = testing::ReadFile(lib_);
  Elf64_Ehdr eh;
  std::memcpy(&eh, full.data(), sizeof(eh));
  auto header = [&](const std::string& bytes, size_t i) {
    Elf64_Shdr s;
    std::memcpy(&s, bytes.data() + eh.e_shoff + i * sizeof(Elf64_Shdr), sizeof(s));
    return s;
  };
  auto put = [&](std::string* bytes, size_t i, const Elf64_Shdr& s) {
    std::memcpy(bytes->data() + eh.e_shoff + i * sizeof(Elf64_Shdr), &s, sizeof(s));
  };
  auto open_bytes = [&](const std::string& name, const std::string& bytes) {
    const std::string path = dir_.Join(name);
    testing::WriteFile(path, bytes);
    return ElfFile::Open(path);
  };
  ASSERT_TRUE(open_bytes("plain.so", full).ok());

  // .symtab and .dynsym both said to span the whole file: each fits, together they are twice its size.
  std::string overlapping = full;
  int tables = 0;
  for (size_t i = 0; i < eh.e_shnum; ++i) {
    Elf64_Shdr s = header(overlapping, i);
    if (s.sh_type != SHT_SYMTAB && s.sh_type != SHT_DYNSYM) continue;
    s.sh_offset = 0;
    s.sh_size = full.size() / sizeof(Elf64_Sym) * sizeof(Elf64_Sym);
    put(&overlapping, i, s);
    ++tables;
  }
  ASSERT_EQ(tables, 2) << "the fixture needs .symtab and .dynsym";
  Result<ElfFile> both = open_bytes("overlapping.so", overlapping);
  ASSERT_FALSE(both.ok());
  EXPECT_EQ(both.error().code(), ErrorCode::kIo);
  EXPECT_THAT(both.error().message(), ::testing::HasSubstr("symbol tables together are larger than the file"));

  // Every .symtab symbol naming one string as long as the file, appended to it: the names would total the file's
  // size once per symbol.
  std::string repeated = full;
  const size_t long_at = repeated.size();
  repeated.append(full.size(), 'A');
  repeated.push_back('\0');
  int symtabs = 0;
  for (size_t i = 0; i < eh.e_shnum; ++i) {
    const Elf64_Shdr s = header(repeated, i);
    if (s.sh_type != SHT_SYMTAB) continue;
    ++symtabs;
    ASSERT_GT(s.sh_size / sizeof(Elf64_Sym), 2 * ElfFile::kMaxNameBytesPerFileByte);
    Elf64_Shdr names = header(repeated, s.sh_link);
    names.sh_offset = long_at;
    names.sh_size = full.size() + 1;
    put(&repeated, s.sh_link, names);
    for (size_t k = 1; k < s.sh_size / sizeof(Elf64_Sym); ++k) {  // entry 0 is the null symbol
      Elf64_Sym sym;
      const size_t at = s.sh_offset + k * sizeof(Elf64_Sym);
      std::memcpy(&sym, repeated.data() + at, sizeof(sym));
      sym.st_name = 0;
      std::memcpy(repeated.data() + at, &sym, sizeof(sym));
    }
  }
  ASSERT_EQ(symtabs, 1);
  Result<ElfFile> many = open_bytes("repeated.so", repeated);
  ASSERT_FALSE(many.ok());
  EXPECT_THAT(many.error().message(), ::testing::HasSubstr("symbol names total more than 4 times the file's size"));
}

TEST_F(ElfFileTest, MovedFileStaysUsable) {
  Result<ElfFile> elf = ElfFile::Open(lib_);
  ASSERT_TRUE(elf.ok());
  ElfFile moved = std::move(elf.value());
  ElfFile again = std::move(moved);
  EXPECT_EQ(again.build_id(), kBuildId);
  ASSERT_NE(again.handle(), nullptr);
  std::optional<ElfSymbol> version = again.FindSymbol("ruby_version");
  ASSERT_TRUE(version.has_value());
  EXPECT_EQ(again.CStringAt(version->value, 32), "3.3.8");
}

TEST(ElfFileRealTest, DebianLibruby31IsStrippedWithKnownBuildId) {
  const std::string path = "/usr/lib/x86_64-linux-gnu/libruby-3.1.so.3.1";
  if (!testing::FileExists(path)) GTEST_SKIP() << path << " absent (Debian's ruby3.1 package not installed)";
  Result<ElfFile> elf = ElfFile::Open(path);
  ASSERT_TRUE(elf.ok()) << elf.error().ToString();
  EXPECT_FALSE(elf->has_symtab());
  EXPECT_EQ(elf->build_id().substr(0, 8), "862794fb");  // reference §0
  std::optional<ElfSymbol> version = elf->FindSymbol("ruby_version");
  ASSERT_TRUE(version.has_value());
  EXPECT_EQ(elf->CStringAt(version->value, 32).value_or("").substr(0, 4), "3.1.");
}

}  // namespace
}  // namespace rvbpfd
