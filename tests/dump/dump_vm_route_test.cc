// FindVmPointerInCode: the global ruby_vm_at_exit reads is ruby_current_vm_ptr. On the test Rubies (which export the
// symbol) the code gives the symbol's address; on Debian trixie's stripped libruby-3.3 (which hides it) it gives
// one .bss global; compiled fixtures of other shapes (two globals read, a global written) give nothing.
#include "dump/dump_vm_route.h"

#include <elf.h>
#include <gtest/gtest.h>

#include <string>

#include "elf/elf_fixtures.h"

namespace rvbpfd {
namespace {

Disassembler MakeDisassembler() {
  Result<Disassembler> dis = Disassembler::Create();
  EXPECT_TRUE(dis.ok());
  return std::move(dis.value());
}

TEST(FindVmPointerInCodeTest, TheTestRubiesGiveTheExportedSymbol) {
  int checked = 0;
  for (const char* ruby :
       {"3.3.8-shared/lib/libruby.so.3.3", "3.4.5-static/bin/ruby", "3.4.5-shared-yjit/lib/libruby.so.3.4"}) {
    const std::string name(ruby);
    const std::string dir = testing::TestRuby(name.substr(0, name.find('/')));
    if (dir.empty()) continue;
    Result<ElfFile> elf = ElfFile::Open(dir + name.substr(name.find('/')));
    ASSERT_TRUE(elf.ok()) << elf.error().ToString();
    std::optional<ElfSymbol> sym = elf->FindSymbol("ruby_current_vm_ptr");
    ASSERT_TRUE(sym.has_value()) << ruby;
    Disassembler dis = MakeDisassembler();
    std::optional<uint64_t> found = FindVmPointerInCode(*elf, dis);
    ASSERT_TRUE(found.has_value()) << ruby;
    EXPECT_EQ(*found, sym->value) << ruby;
    checked++;
  }
  if (checked == 0) GTEST_SKIP() << "no test Ruby built (tools/build-test-rubies.sh)";
}

TEST(FindVmPointerInCodeTest, DebianTrixiesLibrubyHidesItAndItsCodeGivesOneBssGlobal) {
  const std::string path = "/var/cache/rvbpfd/trixie-root/usr/lib/x86_64-linux-gnu/libruby-3.3.so.3.3";
  if (!testing::FileExists(path)) GTEST_SKIP() << path << " absent (tools/make-trixie-root.sh)";
  Result<ElfFile> elf = ElfFile::Open(path);
  ASSERT_TRUE(elf.ok()) << elf.error().ToString();
  std::optional<ElfSymbol> exported = elf->FindSymbol("ruby_current_vm_ptr");
  EXPECT_FALSE(exported && exported->shndx != SHN_UNDEF) << "the premise: Debian's build does not export it";
  Disassembler dis = MakeDisassembler();
  std::optional<uint64_t> found = FindVmPointerInCode(*elf, dis);
  ASSERT_TRUE(found.has_value());
  std::optional<ElfSection> bss = elf->FindSection(".bss");
  ASSERT_TRUE(bss.has_value());
  EXPECT_GE(*found, bss->addr);
  EXPECT_LT(*found, bss->addr + bss->size);
}

// A shared object whose ruby_vm_at_exit has the body `body` over the hidden globals vm_ptr and other_ptr.
std::optional<uint64_t> FixtureRoute(const testing::TempDir& tmp, const std::string& body, uint64_t* vm_ptr_addr) {
  const std::string src =
      "#include <stdlib.h>\n"
      "struct node { void (*fn)(void *); struct node *next; };\n"
      "struct vm { char pad[64]; struct node *at_exit; };\n"
      "__attribute__((visibility(\"hidden\"))) struct vm *vm_ptr;\n"
      "__attribute__((visibility(\"hidden\"))) struct vm *other_ptr;\n"
      "void ruby_vm_at_exit(void (*fn)(void *)) {\n" + body + "\n}\n";
  const std::string so = tmp.Join("route.so");
  if (!testing::CompileC(src, so, "-shared -fPIC -O2")) return std::nullopt;
  Result<ElfFile> elf = ElfFile::Open(so);
  EXPECT_TRUE(elf.ok());
  if (!elf.ok()) return std::nullopt;
  std::optional<ElfSymbol> sym = elf->FindSymbol("vm_ptr");
  EXPECT_TRUE(sym.has_value());
  *vm_ptr_addr = sym ? sym->value : 0;
  Disassembler dis = MakeDisassembler();
  return FindVmPointerInCode(*elf, dis);
}

constexpr const char* kPush =
    "struct node *n = malloc(sizeof *n); n->fn = fn; n->next = vm->at_exit; vm->at_exit = n;";

TEST(FindVmPointerInCodeTest, TheOneGlobalReadIsFound) {
  testing::TempDir tmp;
  uint64_t vm_ptr = 0;
  std::optional<uint64_t> found = FixtureRoute(tmp, std::string("struct vm *vm = vm_ptr; ") + kPush, &vm_ptr);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(*found, vm_ptr);
}

TEST(FindVmPointerInCodeTest, TwoGlobalsReadOrAGlobalWrittenGiveNothing) {
  testing::TempDir tmp;
  uint64_t vm_ptr = 0;
  EXPECT_FALSE(FixtureRoute(tmp, std::string("struct vm *vm = fn ? vm_ptr : other_ptr; ") + kPush, &vm_ptr));
  EXPECT_FALSE(FixtureRoute(tmp, std::string("struct vm *vm = vm_ptr; other_ptr = vm; ") + kPush, &vm_ptr));
  EXPECT_FALSE(FixtureRoute(tmp, "(void)fn;", &vm_ptr));
}

}  // namespace
}  // namespace rvbpfd
