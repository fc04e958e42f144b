// rvbpfd_coredump_tool: the host side of tools/record-coredump-case.
//
//   rvbpfd_coredump_tool walk CASE.json
//       Walks and symbolizes every thread of a stored coredump case from its core alone, exactly as the coredump suite
//       does (table offsets for the recorded version, the recorded ruby_global_symbols address), and prints
//       {"threads": [{"index", "name", "main", "native_tid", "th", "ec_readable", "complete", "status",
//       "frames": [...]}]}
//       with frames in rvgolden's schema. `--rebase` diffs this against the case's expectation.
//   rvbpfd_coredump_tool global-symbols ELF
//       Prints {"vaddr": "0x...", "source": "symtab" | "code"}: where ruby_global_symbols is in the VM binary, from
//       .symtab or, for a stripped binary, from rb_id2str's code. The recorder uses it for Debian's libruby-3.1.
//
// Exit status: 0 on success, 1 on an error (message on stderr), 2 on bad usage.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "elf/elf_file.h"
#include "stacks/case_frames.h"
#include "stacks/global_symbols.h"
#include "stacks/memory_reader.h"
#include "stacks/ruby_offsets.h"

namespace {

namespace fs = std::filesystem;

int Fail(const std::string& msg) {
  std::cerr << "rvbpfd_coredump_tool: " << msg << "\n";
  return 1;
}

std::string Hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

int Walk(const std::string& case_path) {
  std::ifstream in(case_path);
  if (!in) return Fail("cannot open " + case_path);
  nlohmann::json c;
  try {
    c = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    return Fail(case_path + ": " + e.what());
  }
  const fs::path core = fs::path(case_path).parent_path() / c["core"].get<std::string>();
  // Self-contained, as in the suite: bytes missing from the core are never fetched from files on this machine.
  rvbpfd::CoreFileReader::Options opts;
  opts.use_original_files = false;
  auto reader = rvbpfd::CoreFileReader::Open(core.string(), opts);
  if (!reader.ok()) return Fail(reader.error().ToString());
  int major = 0, minor = 0;
  if (std::sscanf(c["ruby_version"].get<std::string>().c_str(), "%d.%d", &major, &minor) != 2) {
    return Fail(case_path + ": cannot parse ruby_version");
  }
  auto off = rvbpfd::RubyOffsets::ForVersion(major, minor);
  if (!off.ok()) return Fail(off.error().ToString());
  const nlohmann::json& g = c["vm"]["global_symbols"];
  const uint64_t gsym = g.is_string() ? std::stoull(g.get<std::string>(), nullptr, 16) : 0;
  nlohmann::json out = {{"case", c["case"]}, {"threads", nlohmann::json::array()}};
  size_t index = 0;
  for (const nlohmann::json& t : c["golden"]["threads"]) {
    const uint64_t th = std::stoull(t["th"].get<std::string>(), nullptr, 16);
    rvbpfd::testing::ThreadFrames w = rvbpfd::testing::WalkThreadFrames(**reader, off.value(), gsym, th);
    out["threads"].push_back({{"index", index++},
                              {"name", t["name"]},
                              {"main", t.value("main", false)},
                              {"native_tid", t["native_tid"]},
                              {"th", t["th"]},
                              {"ec_readable", w.ec_readable},
                              {"complete", w.complete},
                              {"status", w.status},
                              {"frames", std::move(w.frames)}});
  }
  std::cout << out.dump() << "\n";
  return 0;
}

int GlobalSymbols(const std::string& elf_path) {
  auto elf = rvbpfd::ElfFile::Open(elf_path);
  if (!elf.ok()) return Fail(elf.error().ToString());
  std::optional<rvbpfd::ElfSymbol> sym = elf->FindSymbol("ruby_global_symbols");
  if (sym && sym->shndx != 0) {
    std::cout << nlohmann::json{{"vaddr", Hex(sym->value)}, {"source", "symtab"}}.dump() << "\n";
    return 0;
  }
  auto from_code = rvbpfd::GlobalSymbolsFromCode(elf.value());
  if (!from_code.ok()) return Fail(from_code.error().ToString());
  std::cout << nlohmann::json{{"vaddr", Hex(from_code.value())}, {"source", "code"}}.dump() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "walk") return Walk(argv[2]);
  if (argc == 3 && std::string(argv[1]) == "global-symbols") return GlobalSymbols(argv[2]);
  std::cerr << "usage: rvbpfd_coredump_tool walk CASE.json | global-symbols ELF\n";
  return 2;
}
