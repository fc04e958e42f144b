// ElfFile's TLS view: the PT_TLS header, PT_INTERP (executable or library), and the dynamic relocations that TLS
// access leaves for ld.so (R_X86_64_TLSDESC, R_X86_64_DTPMOD64), on fixtures compiled at test time.
#include <elf.h>

#include <gtest/gtest.h>

#include <string>

#include "elf/elf_file.h"
#include "elf/elf_fixtures.h"

namespace rvbpfd {
namespace {

using testing::CompileC;
using testing::TempDir;

constexpr const char* kSource = R"(
__thread long tdata_var[3] = {1, 2, 3};
__attribute__((visibility("hidden"))) __thread void *tbss_var;
void *get(void) { return tbss_var; }
long sum(void) { return tdata_var[0] + tdata_var[2]; }
int main(void) { return (int)sum() + (get() != 0); }
)";

TEST(ElfTlsTest, SharedLibraryHasTlsSegmentNoInterpAndTlsRelocations) {
  TempDir dir;
  const std::string gd = dir.Join("libgd.so");
  const std::string desc = dir.Join("libdesc.so");
  ASSERT_TRUE(CompileC(kSource, gd, "-shared -fPIC -O2"));
  ASSERT_TRUE(CompileC(kSource, desc, "-shared -fPIC -O2 -mtls-dialect=gnu2"));
  Result<ElfFile> g = ElfFile::Open(gd);
  ASSERT_TRUE(g.ok());
  EXPECT_FALSE(g->has_interp());
  ASSERT_TRUE(g->tls_segment().has_value());
  EXPECT_EQ(g->tls_segment()->filesz, 24u);  // .tdata: tdata_var
  EXPECT_EQ(g->tls_segment()->memsz, 32u);   // + .tbss: tbss_var
  const uint64_t align = g->tls_segment()->align;  // gcc aligns the 24-byte array to 16
  EXPECT_TRUE(align >= 8 && (align & (align - 1)) == 0) << align;
  std::vector<ElfRelocation> mod = g->DynamicRelocations(R_X86_64_DTPMOD64);
  ASSERT_FALSE(mod.empty());
  bool named = false, local = false;
  for (const ElfRelocation& r : mod) {
    EXPECT_EQ(r.type, uint32_t{R_X86_64_DTPMOD64});
    named |= r.symbol_name == "tdata_var";  // exported: relocated against its .dynsym entry
    local |= r.symbol == 0 && r.symbol_name.empty();  // hidden: the object's own module
  }
  EXPECT_TRUE(named && local);
  EXPECT_TRUE(g->DynamicRelocations(R_X86_64_TLSDESC).empty());

  Result<ElfFile> d = ElfFile::Open(desc);
  ASSERT_TRUE(d.ok());
  std::vector<ElfRelocation> tlsdesc = d->DynamicRelocations(R_X86_64_TLSDESC);
  ASSERT_FALSE(tlsdesc.empty());
  std::optional<ElfSymbol> hidden = d->FindSymbol("tbss_var");
  ASSERT_TRUE(hidden.has_value());
  EXPECT_EQ(hidden->type, STT_TLS);
  bool found = false;
  for (const ElfRelocation& r : tlsdesc) {
    found |= r.symbol == 0 && r.addend == static_cast<int64_t>(hidden->value);
  }
  EXPECT_TRUE(found) << "the hidden variable's descriptor carries its TLS offset as the addend";
}

TEST(ElfTlsTest, ExecutableHasInterpAndNoTlsRelocations) {
  TempDir dir;
  const std::string exe = dir.Join("exe");
  ASSERT_TRUE(CompileC(kSource, exe, "-O2"));
  Result<ElfFile> e = ElfFile::Open(exe);
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE(e->has_interp());
  ASSERT_TRUE(e->tls_segment().has_value());
  EXPECT_EQ(e->tls_segment()->memsz, 32u);
  EXPECT_TRUE(e->DynamicRelocations(R_X86_64_DTPMOD64).empty()) << "local-exec needs no loader help";
  EXPECT_TRUE(e->DynamicRelocations(R_X86_64_TLSDESC).empty());
  // A moved ElfFile keeps its TLS view.
  ElfFile moved = std::move(e.value());
  EXPECT_TRUE(moved.has_interp());
  EXPECT_TRUE(moved.tls_segment().has_value());
}

TEST(ElfTlsTest, FileWithoutTlsHasNone) {
  TempDir dir;
  const std::string lib = dir.Join("libplain.so");
  ASSERT_TRUE(CompileC("int f(void) { return 1; }", lib, "-shared -fPIC"));
  Result<ElfFile> e = ElfFile::Open(lib);
  ASSERT_TRUE(e.ok());
  EXPECT_FALSE(e->tls_segment().has_value());
  EXPECT_TRUE(e->DynamicRelocations(R_X86_64_DTPMOD64).empty());
}

}  // namespace
}  // namespace rvbpfd
