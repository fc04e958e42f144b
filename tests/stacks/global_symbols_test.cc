// Recovering ruby_global_symbols from rb_id2str's code (stripped binaries): against Debian's own stripped
// libruby-3.1 (always installed: tools/install-deps.sh's `ruby`) and the test Rubies, whose .symtab names the symbol,
// so the code-derived address can be compared with the real one.
#include "stacks/global_symbols.h"

#include <elf.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "stacks/memory_reader.h"
#include "stacks/ruby_offsets.h"
#include "stacks/symbolizer.h"

namespace rvbpfd {
namespace {

namespace fs = std::filesystem;

constexpr const char* kDebianLibruby31 = "/usr/lib/x86_64-linux-gnu/libruby-3.1.so.3.1";
constexpr const char* kTestRubies = "/var/cache/rvbpfd/rubies";

// The section holding vaddr, if any.
std::optional<ElfSection> SectionOf(const ElfFile& elf, uint64_t vaddr) {
  for (const ElfSection& s : elf.sections()) {
    if ((s.flags & SHF_ALLOC) && vaddr >= s.addr && vaddr - s.addr < s.size) return s;
  }
  return std::nullopt;
}

TEST(GlobalSymbolsFromCode, DebianStrippedLibruby31) {
  auto elf = ElfFile::Open(kDebianLibruby31);
  ASSERT_TRUE(elf.ok()) << elf.error().ToString() << " (tools/install-deps.sh installs Debian's ruby package)";
  // The point of the exercise: the distro library has no .symtab, so the symbol itself is unknown.
  ASSERT_FALSE(elf->has_symtab());
  ASSERT_FALSE(elf->FindSymbol("ruby_global_symbols").has_value());
  auto gsym = GlobalSymbolsFromCode(elf.value());
  ASSERT_TRUE(gsym.ok()) << gsym.error().ToString();
  std::optional<ElfSection> sec = SectionOf(elf.value(), gsym.value());
  ASSERT_TRUE(sec.has_value());
  EXPECT_TRUE(sec->name == ".data" || sec->name == ".bss") << sec->name;
  // rb_symbols_t is initialized with last_id = tNEXT_ID - 1 (> tLAST_OP_ID = 169), so it lives in .data and its
  // first word in the file is that initial serial.
  ASSERT_EQ(sec->name, ".data");
  std::span<const uint8_t> b = elf->BytesAt(gsym.value(), 4);
  ASSERT_EQ(b.size(), 4u);
  uint32_t last_id = 0;
  std::memcpy(&last_id, b.data(), 4);
  EXPECT_GT(last_id, 169u);
  EXPECT_LT(last_id, 1000u);
  // FindGlobalSymbolsVaddr falls back to the same address.
  auto found = FindGlobalSymbolsVaddr(elf.value());
  ASSERT_TRUE(found.ok()) << found.error().ToString();
  EXPECT_EQ(found.value(), gsym.value());
}

// In the Debian 3.1 coredump case, the address recovered from code (plus the recorded load bias) holds a real
// rb_symbols_t: the Symbolizer's check (last_id, ids chunks, ID '+' naming "+") passes there and fails next to it.
TEST(GlobalSymbolsFromCode, RecoveredAddressHoldsTheTableInTheDebianCore) {
  const fs::path dir = fs::path(RVBPFD_SOURCE_DIR) / "coredump-testdata" / "3.1-debian";
  std::ifstream in(dir / "scenarios.json");
  ASSERT_TRUE(in.good()) << "the 3.1-debian coredump case is part of the repository";
  const nlohmann::json c = nlohmann::json::parse(in);
  auto reader = CoreFileReader::Open((dir / "scenarios.core.gz").string(), CoreFileReader::Options{"", false});
  ASSERT_TRUE(reader.ok()) << reader.error().ToString();
  auto off = RubyOffsets::ForVersion(3, 1);
  ASSERT_TRUE(off.ok());
  const uint64_t recorded = std::stoull(c["vm"]["global_symbols"].get<std::string>(), nullptr, 16);
  EXPECT_TRUE(Symbolizer(reader->get(), off.value(), recorded).GlobalSymbolsUsable());
  EXPECT_FALSE(Symbolizer(reader->get(), off.value(), recorded + 16).GlobalSymbolsUsable());
  EXPECT_FALSE(Symbolizer(reader->get(), off.value(), recorded - 32).GlobalSymbolsUsable());
  // When the very library the case was recorded with is installed, the code gives the recorded address.
  auto elf = ElfFile::Open(kDebianLibruby31);
  if (elf.ok() && elf->build_id() == c["vm"]["build_id"].get<std::string>()) {
    auto gsym = GlobalSymbolsFromCode(elf.value());
    ASSERT_TRUE(gsym.ok()) << gsym.error().ToString();
    EXPECT_EQ(gsym.value() + std::stoull(c["vm"]["load_bias"].get<std::string>(), nullptr, 16), recorded);
  }
}

// Every test Ruby (3.3.8 shared, 3.4.5 static, ...): the code-derived address equals .symtab's.
TEST(GlobalSymbolsFromCode, EqualsSymtabOnTheTestRubies) {
  int checked = 0;
  for (const char* rel : {"3.3.8-shared/lib/libruby.so.3.3.8", "3.4.5-static/bin/ruby"}) {
    const std::string path = std::string(kTestRubies) + "/" + rel;
    auto elf = ElfFile::Open(path);
    if (!elf.ok()) continue;
    SCOPED_TRACE(path);
    std::optional<ElfSymbol> sym = elf->FindSymbol("ruby_global_symbols");
    ASSERT_TRUE(sym.has_value() && sym->from_symtab);
    auto gsym = GlobalSymbolsFromCode(elf.value());
    ASSERT_TRUE(gsym.ok()) << gsym.error().ToString();
    EXPECT_EQ(gsym.value(), sym->value);
    checked++;
  }
  if (checked == 0) GTEST_SKIP() << "no test Rubies under " << kTestRubies << " (tools/build-test-rubies.sh)";
}

}  // namespace
}  // namespace rvbpfd
