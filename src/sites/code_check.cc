#include "sites/code_check.h"

#include <algorithm>
#include <map>
#include <string>

#include "common/hex.h"
#include "elf/eh_frame.h"

namespace rvbpfd {
namespace {

// The binary's own function extents: .eh_frame, else its own .symtab (never an attached debug file's).
std::vector<CodeRange> OwnFunctions(const ElfFile& vm, std::string* source) {
  if (Result<std::vector<CodeRange>> eh = FunctionRangesFromEhFrame(vm); eh.ok() && !eh->empty()) {
    *source = ".eh_frame";
    return std::move(eh.value());
  }
  *source = ".symtab";
  std::vector<CodeRange> out;
  for (const ElfSymbol& s : vm.symbols()) {
    if (s.from_symtab && !s.from_debug_file && s.type == STT_FUNC && s.shndx != SHN_UNDEF && s.size > 0 &&
        s.value + s.size > s.value) {
      out.push_back({s.value, s.value + s.size});
    }
  }
  std::sort(out.begin(), out.end(), [](const CodeRange& a, const CodeRange& b) {
    return a.start != b.start ? a.start < b.start : a.end > b.end;
  });
  out.erase(std::unique(out.begin(), out.end(), [](const CodeRange& a, const CodeRange& b) { return a.start == b.start; }),
            out.end());
  return out;
}

bool StandsForFunctionStart(const ProbeSite& s) {
  return s.method == "function-entry" || s.method == "gc-function-entry" || s.method == "gc-function-return";
}

}  // namespace

Status CheckSitesAgainstCode(const ElfFile& vm, Disassembler& dis, const std::vector<ProbeSite>& sites) {
  if (sites.empty()) return Status::Ok();
  std::string source;
  const std::vector<CodeRange> functions = OwnFunctions(vm, &source);
  auto refuse = [&](const ProbeSite& s, const std::string& why) {
    return Error(ErrorCode::kNoSymbols,
                 "probe site " + EventKindName(s.event) + " in " + s.function + " at " + Hex(s.vaddr) + " of " +
                     vm.path() + " refused: " + why + " (the symbols, debug file or cache entry that placed it " +
                     "do not describe this binary's code)");
  };
  // Function start -> (its extent, the sites with the addresses to check there).
  struct Wanted {
    CodeRange range;
    std::vector<std::pair<uint64_t, const ProbeSite*>> addrs;
  };
  std::map<uint64_t, Wanted> by_function;
  for (const ProbeSite& s : sites) {
    const std::optional<CodeRange> r = RangeContaining(functions, s.check());
    if (!r) return refuse(s, "no function of the binary's own " + source + " contains it");
    if (s.vaddr < r->start || s.vaddr >= r->end) return refuse(s, "the probe lies outside its check's function");
    if (StandsForFunctionStart(s) && s.check() != r->start) {
      return refuse(s, "a function entry that is not the start of its function (" + Hex(r->start) + " in the " +
                           "binary's own " + source + ")");
    }
    if (s.return_probe && s.vaddr != r->start) return refuse(s, "a return probe away from its function's start");
    Wanted& w = by_function[r->start];
    w.range = *r;
    w.addrs.emplace_back(s.check(), &s);
    w.addrs.emplace_back(s.vaddr, &s);
  }
  for (auto& entry : by_function) {
    Wanted& w = entry.second;  // a plain reference: clang 14 cannot capture a structured binding in a lambda
    std::sort(w.addrs.begin(), w.addrs.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    size_t next = 0;
    const ProbeSite* misaligned = nullptr;
    dis.DecodeRange(vm.BytesAt(w.range.start, w.range.end - w.range.start), w.range.start, [&](const cs_insn& insn) {
      if (next < w.addrs.size() && w.addrs[next].first < insn.address) {
        misaligned = w.addrs[next].second;  // skipped over: inside the previous instruction
        return false;
      }
      while (next < w.addrs.size() && w.addrs[next].first == insn.address) ++next;
      return next < w.addrs.size();
    });
    if (misaligned != nullptr) {
      return refuse(*misaligned, "not an instruction boundary of the code decoded from its function's start " +
                                     Hex(w.range.start) + " (binary's own " + source + ")");
    }
    if (next < w.addrs.size()) {
      if (dis.deadline_passed()) return Error(ErrorCode::kUnsupportedVersion, SiteAnalysisTimeoutMessage(vm));
      return refuse(*w.addrs[next].second, "decoding from its function's start " + Hex(w.range.start) +
                                               " does not reach it (undecodable bytes before it)");
    }
  }
  return Status::Ok();
}

}  // namespace rvbpfd
