// FindMainThreadRoute: rb_thread_main's fast path (a global, then two loads through it: the main ractor's main
// thread, then its self) read from compiled fixtures, with and without the endbr64 that -fcf-protection puts first
// (Debian's builds: without skipping it the route was never found, so the live layout check of Debian's ruby never
// had the main thread to compare), and on Debian trixie's real libruby-3.3.
#include <elf.h>
#include <gtest/gtest.h>

#include <string>

#include "elf/elf_fixtures.h"
#include "sites/stripped.h"

namespace rvbpfd {
namespace {

// A shared object whose rb_thread_main returns main_ractor->main->self (the main thread at +32 of the ractor).
std::optional<MainThreadRoute> FixtureRoute(const testing::TempDir& tmp, const std::string& flags,
                                            uint64_t* global_addr) {
  const std::string src =
      "struct th { char pad[16]; void *self; };\n"
      "struct ractor { char pad[32]; struct th *main; };\n"
      "__attribute__((visibility(\"hidden\"))) struct ractor *main_ractor;\n"
      "void *rb_thread_main(void) { return main_ractor->main->self; }\n";
  const std::string so = tmp.Join("route.so");
  if (!testing::CompileC(src, so, "-shared -fPIC -O2 " + flags)) return std::nullopt;
  Result<ElfFile> elf = ElfFile::Open(so);
  EXPECT_TRUE(elf.ok());
  if (!elf.ok()) return std::nullopt;
  std::optional<ElfSymbol> sym = elf->FindSymbol("main_ractor");
  EXPECT_TRUE(sym.has_value());
  *global_addr = sym ? sym->value : 0;
  Result<Disassembler> dis = Disassembler::Create();
  EXPECT_TRUE(dis.ok());
  if (!dis.ok()) return std::nullopt;
  return FindMainThreadRoute(*elf, *dis);
}

TEST(FindMainThreadRouteTest, FoundWithAndWithoutEndbr64) {
  testing::TempDir tmp;
  for (const char* flags : {"-fcf-protection=none", "-fcf-protection=full"}) {
    uint64_t global = 0;
    std::optional<MainThreadRoute> route = FixtureRoute(tmp, flags, &global);
    ASSERT_TRUE(route.has_value()) << flags;
    EXPECT_EQ(route->main_ractor_vaddr, global) << flags;
    EXPECT_EQ(route->ractor_main_thread, 32u) << flags;
  }
}

TEST(FindMainThreadRouteTest, DebianTrixiesLibrubyGivesOneRoute) {
  const std::string path = "/var/cache/rvbpfd/trixie-root/usr/lib/x86_64-linux-gnu/libruby-3.3.so.3.3";
  if (!testing::FileExists(path)) GTEST_SKIP() << path << " absent (tools/make-trixie-root.sh)";
  Result<ElfFile> elf = ElfFile::Open(path);
  ASSERT_TRUE(elf.ok()) << elf.error().ToString();
  Result<Disassembler> dis = Disassembler::Create();
  ASSERT_TRUE(dis.ok());
  std::optional<MainThreadRoute> route = FindMainThreadRoute(*elf, *dis);
  ASSERT_TRUE(route.has_value()) << "rb_thread_main of Debian's libruby (endbr64 first) gave no route";
  std::optional<ElfSection> bss = elf->FindSection(".bss");
  std::optional<ElfSection> data = elf->FindSection(".data");
  const auto in = [&](const std::optional<ElfSection>& s) {
    return s && route->main_ractor_vaddr >= s->addr && route->main_ractor_vaddr < s->addr + s->size;
  };
  EXPECT_TRUE(in(bss) || in(data));
  EXPECT_GT(route->ractor_main_thread, 0u);
}

}  // namespace
}  // namespace rvbpfd
