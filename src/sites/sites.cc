#include "sites/sites.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>

#include "common/hex.h"
#include "sites/code_check.h"
#include "sites/disasm.h"
#include "sites/dwarf_info.h"
#include "sites/gc_hook_calls.h"
#include "sites/placement.h"
#include "sites/ruby32_th.h"
#include "sites/stripped.h"

namespace rvbpfd {
namespace {

// RUBY_INTERNAL_THREAD_EVENT_* bits passed as rb_thread_execute_hooks' first argument (include/ruby/thread.h).
constexpr int64_t kThreadEventStarted = 1 << 0;
constexpr int64_t kThreadEventReady = 1 << 1;
constexpr int64_t kThreadEventResumed = 1 << 2;
constexpr int64_t kThreadEventSuspended = 1 << 3;
constexpr int64_t kThreadEventExited = 1 << 4;

// RUBY_INTERNAL_EVENT_GC_ENTER (0x2000000) and GC_EXIT (0x4000000) are bits 1 and 2 of the flag word's byte 3.
constexpr int64_t kGcEnterByteBit = 0x2;
constexpr int64_t kGcExitByteBit = 0x4;
constexpr uint64_t kGcFlagsByte = 3;

// Bounds of the forward scans from a hook site: the jcc right after the `cmpq` is within a few instructions, and the
// non-NULL path reaches `call rb_thread_execute_hooks` within a few dozen (it only loads two arguments).
constexpr int kMaxInsnsToBranch = 8;
constexpr int kMaxInsnsToCall = 64;
// A GC hook check sits within this many instructions of the `during_gc` bit access it pairs with (§4).
constexpr int kGcDuringGcWindow = 8;

constexpr const char* kHooksSymbol = "rb_internal_thread_event_hooks";

uint8_t EventFromThreadEventBit(int64_t bit) {
  switch (bit) {
    case kThreadEventStarted: return RV_EV_THREAD_STARTED;
    case kThreadEventReady: return RV_EV_THREAD_READY;
    case kThreadEventResumed: return RV_EV_THREAD_RESUMED;
    case kThreadEventSuspended: return RV_EV_THREAD_SUSPENDED;
    case kThreadEventExited: return RV_EV_THREAD_EXITED;
    default: return RV_EV_NONE;
  }
}

bool IsColdOrPart(const std::string& name) {
  return name.find(".cold") != std::string::npos || name.find(".part.") != std::string::npos;
}

// Cheap superset filter: could some instruction in `code` (loaded at `vaddr`) hold a RIP-relative disp32 pointing at
// `target`? The displacement is followed by an immediate of 0, 1, 2 or 4 bytes before the instruction ends.
bool MayReference(std::span<const uint8_t> code, uint64_t vaddr, uint64_t target) {
  if (code.size() < 4) return false;
  for (size_t i = 0; i + 4 <= code.size(); ++i) {
    int32_t disp;
    std::memcpy(&disp, code.data() + i, sizeof(disp));
    uint64_t end_of_disp = vaddr + i + 4;
    uint64_t rest = target - end_of_disp - static_cast<uint64_t>(static_cast<int64_t>(disp));
    if (rest == 0 || rest == 1 || rest == 2 || rest == 4) return true;
  }
  return false;
}

// The defined, sized .symtab functions as pieces of code that do not overlap, in address order: one per distinct start
// (the first symbol there names it), each ending at its own end or at the next function's start, whichever comes
// first. Sorted once, so every scan over them is O(text + symbols): a crafted binary whose symbols each span the rest
// of .text would otherwise have that extent scanned again for each of them. A real binary's functions do not
// overlap, so its pieces are its functions.
struct FunctionUnit {
  uint64_t start = 0, end = 0;
  const ElfSymbol* sym = nullptr;
};
std::vector<FunctionUnit> FunctionUnits(const ElfFile& vm) {
  std::vector<FunctionUnit> units;
  for (const ElfSymbol& sym : vm.symbols()) {
    if (!sym.from_symtab || sym.type != STT_FUNC || sym.shndx == SHN_UNDEF || sym.size == 0) continue;
    const uint64_t end = sym.value + sym.size < sym.value ? UINT64_MAX : sym.value + sym.size;
    units.push_back({sym.value, end, &sym});
  }
  std::stable_sort(units.begin(), units.end(),
                   [](const FunctionUnit& a, const FunctionUnit& b) { return a.start < b.start; });
  units.erase(std::unique(units.begin(), units.end(),
                          [](const FunctionUnit& a, const FunctionUnit& b) { return a.start == b.start; }),
              units.end());
  for (size_t i = 0; i + 1 < units.size(); ++i) units[i].end = std::min(units[i].end, units[i + 1].start);
  return units;
}

std::vector<CodeRange> UnitRanges(const std::vector<FunctionUnit>& units) {
  std::vector<CodeRange> out;
  out.reserve(units.size());
  for (const FunctionUnit& u : units) out.push_back({u.start, u.end});
  return out;
}

struct HookAnalysis {
  uint8_t event = RV_EV_NONE;
  std::optional<ThLocation> rsi_th;
  uint64_t test_jump = 0;  // the je/jne of the hook-list test after the site
  std::string why;  // when event == RV_EV_NONE
};

struct Finder {
  const ElfFile& vm;
  Disassembler& dis;
  DwarfInfo* dwarf;  // may be null
  int major, minor;
  std::set<uint64_t> execute_hooks;  // addresses of rb_thread_execute_hooks and its clones (.symtab)
  StrippedCode* stripped;            // without .symtab: rb_thread_execute_hooks is recognised by its code
  std::set<uint64_t> execute_hooks_called;  // the entries the hook sites' taken paths call

  bool IsExecuteHooks(uint64_t target) {
    bool yes = stripped != nullptr ? LooksLikeExecuteHooks(vm, dis, *stripped, target) : execute_hooks.count(target) != 0;
    if (yes) execute_hooks_called.insert(target);
    return yes;
  }

  bool ThreadHookTakesTh() const { return major > 3 || minor >= 3; }

  // Follows the non-NULL branch of the hook-list test at `site` to `call rb_thread_execute_hooks`.
  HookAnalysis AnalyzeHookSite(uint64_t site) {
    HookAnalysis out;
    const cs_insn* insn = dis.DecodeAt(vm, site);
    if (insn == nullptr) {
      out.why = "cannot decode the site instruction";
      return out;
    }
    uint64_t pc = site + insn->size;
    uint32_t written = dis.WrittenRegs(*insn);
    uint64_t path = 0;
    for (int i = 0; i < kMaxInsnsToBranch && path == 0; ++i) {
      insn = dis.DecodeAt(vm, pc);
      if (insn == nullptr) break;
      if (IsConditionalJump(*insn)) {
        std::optional<uint64_t> target = DirectBranchTarget(*insn);
        if (!target) break;
        if (insn->id == X86_INS_JNE) path = *target;                      // jne: taken when the list is non-NULL
        else if (insn->id == X86_INS_JE) path = insn->address + insn->size;  // je: falls through when non-NULL
        out.test_jump = insn->address;
        break;
      }
      written |= dis.WrittenRegs(*insn);
      pc = insn->address + insn->size;
    }
    if (path == 0) {
      out.why = "no je/jne after the hook-list test";
      return out;
    }
    int64_t edi_imm = -1;  // the last immediate moved into edi; -1: unknown
    std::optional<ThLocation> rsi;
    pc = path;
    for (int i = 0; i < kMaxInsnsToCall; ++i) {
      insn = dis.DecodeAt(vm, pc);
      if (insn == nullptr) break;
      const cs_x86& x86 = insn->detail->x86;
      uint64_t next = insn->address + insn->size;
      if (insn->id == X86_INS_CALL || insn->id == X86_INS_JMP) {
        std::optional<uint64_t> target = DirectBranchTarget(*insn);
        if (target && IsExecuteHooks(*target)) {
          out.event = EventFromThreadEventBit(edi_imm);
          if (out.event == RV_EV_NONE) {
            out.why = "the event argument (edi) is not a single RUBY_INTERNAL_THREAD_EVENT_* bit";
          }
          // rsi never written since the site: it already held th there (e.g. th is the caller's 2nd argument).
          if (!rsi && ThreadHookTakesTh() && (written & (1u << RV_REG_RSI)) == 0) {
            rsi = ThLocation{RV_LOC_REG, RV_REG_RSI, 0};
          }
          out.rsi_th = rsi;
          return out;
        }
        if (insn->id == X86_INS_JMP) {
          if (!target) break;
          pc = *target;
          continue;
        }
        // Another call clobbers the argument registers.
        edi_imm = -1;
        rsi.reset();
        written = ~0u;
        pc = next;
        continue;
      }
      if (insn->id == X86_INS_RET) break;
      uint32_t w = dis.WrittenRegs(*insn);
      if ((w & (1u << RV_REG_RDI)) != 0) {
        edi_imm = -1;
        if (insn->id == X86_INS_MOV && x86.op_count == 2 && x86.operands[0].type == X86_OP_REG &&
            CapstoneRegToDwarf(x86.operands[0].reg) == RV_REG_RDI && x86.operands[1].type == X86_OP_IMM) {
          edi_imm = x86.operands[1].imm;
        }
      }
      if ((w & (1u << RV_REG_RSI)) != 0) {
        rsi.reset();
        // Only loads whose source was untouched since the site describe `th` at the site itself.
        if (ThreadHookTakesTh() && x86.op_count == 2 && x86.operands[0].type == X86_OP_REG &&
            x86.operands[0].reg == X86_REG_RSI) {
          const cs_x86_op& src = x86.operands[1];
          if (insn->id == X86_INS_MOV && src.type == X86_OP_REG) {
            int r = CapstoneRegToDwarf(src.reg);
            if (r >= 0 && r < RV_REG_COUNT && (written & (1u << r)) == 0) {
              rsi = ThLocation{RV_LOC_REG, static_cast<uint8_t>(r), 0};
            }
          } else if ((insn->id == X86_INS_MOV || insn->id == X86_INS_LEA) && src.type == X86_OP_MEM &&
                     src.mem.index == X86_REG_INVALID && src.mem.segment == X86_REG_INVALID) {
            int r = CapstoneRegToDwarf(src.mem.base);
            if (r >= 0 && r < RV_REG_COUNT && (written & (1u << r)) == 0 && src.mem.disp >= INT32_MIN &&
                src.mem.disp <= INT32_MAX) {
              rsi = ThLocation{static_cast<uint8_t>(insn->id == X86_INS_LEA ? RV_LOC_REG : RV_LOC_MEM),
                               static_cast<uint8_t>(r), static_cast<int32_t>(src.mem.disp)};
            }
          }
        }
      }
      written |= w;
      pc = next;
    }
    out.why = "no call to rb_thread_execute_hooks within " + std::to_string(kMaxInsnsToCall) + " instructions";
    return out;
  }
};

std::string FunctionName(const ElfFile& vm, const StrippedCode* stripped, uint64_t vaddr) {
  if (stripped != nullptr) return StrippedFunctionName(vm, *stripped, vaddr);
  std::optional<ElfSymbol> f = vm.FunctionContaining(vaddr);
  return f ? f->name : Hex(vaddr);
}

// Probe offsets in the file, then the order the cache and the tables use (an entry before the return probe at the
// same function).
Status AssignFileOffsetsAndSort(const ElfFile& vm, std::vector<ProbeSite>* sites) {
  for (ProbeSite& s : *sites) {
    std::optional<uint64_t> off = vm.VaddrToFileOffset(s.vaddr);
    if (!off) {
      return Error(ErrorCode::kInternal, "probe site " + Hex(s.vaddr) + " of " + vm.path() + " is outside the file");
    }
    s.file_offset = *off;
  }
  std::sort(sites->begin(), sites->end(), [](const ProbeSite& a, const ProbeSite& b) {
    return a.file_offset != b.file_offset ? a.file_offset < b.file_offset : a.return_probe < b.return_probe;
  });
  return Status::Ok();
}

// Without .symtab, the two scheduler functions whose names the release-reason rules read
// (record/release_reason.h) are recognised by what they do. thread_start_func_2's SUSPENDED checks are the thread's
// last release: on 3.3+ it is the function of the EXITED checks; on 3.2 those are in its caller thread_start_func_1
// (the pthread start routine), which calls it once between its STARTED and EXITED checks. rb_thread_schedule_limits
// is the first function the exported rb_thread_schedule calls. Sites elsewhere keep their exported or fn@ names.
// `execute_hooks`: the entries of rb_thread_execute_hooks (the hook calls, not thread_start_func_2).
void NameStrippedSchedulerFunctions(const ElfFile& vm, Disassembler& dis, const StrippedCode& code, bool ruby32,
                                    const std::set<uint64_t>& execute_hooks, SiteSet* set) {
  std::set<uint64_t> exit_fns;
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> started_exited;  // 3.2: function -> (STARTED, EXITED check)
  for (const ProbeSite& s : set->sites) {
    if (s.method != "hook-site") continue;
    std::optional<CodeRange> r = RangeContaining(code.functions, s.vaddr);
    if (!r) continue;
    if (s.event == RV_EV_THREAD_EXITED) {
      exit_fns.insert(r->start);
      started_exited[r->start].second = s.vaddr;
    } else if (s.event == RV_EV_THREAD_STARTED) {
      started_exited[r->start].first = s.vaddr;
    }
  }
  uint64_t start_func_2 = 0;  // 3.2: the one function thread_start_func_1 calls between its two checks
  if (ruby32 && exit_fns.size() == 1) {
    const auto [started, exited] = started_exited[*exit_fns.begin()];
    std::set<uint64_t> callees;
    if (started != 0 && exited > started) {
      dis.DecodeRange(vm.BytesAt(started, exited - started), started, [&](const cs_insn& insn) {
        std::optional<uint64_t> t = insn.id == X86_INS_CALL ? DirectBranchTarget(insn) : std::nullopt;
        std::optional<CodeRange> callee = t ? RangeContaining(code.functions, *t) : std::nullopt;
        if (callee && callee->start == *t && execute_hooks.count(*t) == 0) callees.insert(*t);
        return true;
      });
    }
    if (callees.size() == 1) start_func_2 = *callees.begin();
  }
  uint64_t limits = 0;
  if (std::optional<ElfSymbol> sched = vm.FindSymbol("rb_thread_schedule");
      sched && sched->shndx != SHN_UNDEF && sched->size > 0) {
    dis.DecodeRange(vm.BytesAt(sched->value, sched->size), sched->value, [&](const cs_insn& insn) {
      if (insn.id != X86_INS_CALL) return true;
      std::optional<uint64_t> t = DirectBranchTarget(insn);
      if (t && RangeContaining(code.functions, *t) && RangeContaining(code.functions, *t)->start == *t) limits = *t;
      return false;
    });
  }
  int named = 0;
  for (ProbeSite& s : set->sites) {
    if (s.method != "hook-site") continue;
    std::optional<CodeRange> r = RangeContaining(code.functions, s.vaddr);
    if (!r || vm.FunctionContaining(s.vaddr)) continue;  // an exported function keeps its own name
    const char* name = nullptr;
    if (exit_fns.count(r->start) != 0) {
      name = ruby32 ? "thread_start_func_1" : "thread_start_func_2";
    } else if (ruby32 && r->start == start_func_2) {
      name = "thread_start_func_2";
    } else if (r->start == limits) {
      name = "rb_thread_schedule_limits";
    }
    if (name != nullptr) {
      s.function = name;
      ++named;
    }
  }
  set->provenance.push_back(
      {"function names", std::string("exports where a site lies in an exported function; ") +
                             (ruby32 ? "thread_start_func_1 = the function of the EXITED checks, thread_start_func_2 "
                                       "= the one function it calls between its STARTED and EXITED checks"
                                     : "thread_start_func_2 = the function of the EXITED checks") +
                             ", rb_thread_schedule_limits = rb_thread_schedule's first callee (disassembly, " +
                             std::to_string(named) + " sites); others fn@<entry>"});
}

bool IsGcEvent(uint8_t event) { return event == RV_EV_GC_ENTER || event == RV_EV_GC_EXIT; }

}  // namespace

bool ParseRubyVersion(const std::string& version, int* major, int* minor, int* teeny) {
  int a = 0, b = 0, c = 0, n = 0;
  if (std::sscanf(version.c_str(), "%d.%d.%d%n", &a, &b, &c, &n) != 3 || static_cast<size_t>(n) != version.size() ||
      a < 0 || b < 0 || c < 0) {
    return false;
  }
  *major = a;
  *minor = b;
  *teeny = c;
  return true;
}

bool TableOffsets(int major, int minor, rv_offsets* offsets, uint32_t* main_thread_serial) {
  // §6 of the reference: th->serial moved as fields were added before it; nt stayed at 40; nt->tid moved in 3.3.
  struct Row {
    int major, minor;
    uint32_t serial, nt, tid, main_serial;
  };
  static constexpr Row kRows[] = {
      {3, 2, 72, 40, 16, 0}, {3, 3, 200, 40, 24, 1}, {3, 4, 204, 40, 24, 1}, {4, 0, 212, 40, 24, 1}};
  for (const Row& r : kRows) {
    if (r.major == major && r.minor == minor) {
      // th->serial exists in every layout but is assigned only in USE_RUBY_DEBUG_LOG builds (vm.c th_init): the
      // daemon numbers threads itself, so BPF is told not to read it.
      *offsets = rv_offsets{r.serial, r.nt, r.tid, 0};
      *main_thread_serial = r.main_serial;
      return true;
    }
  }
  return false;
}

std::string EventKindName(uint8_t event) {
  switch (event) {
    case RV_EV_THREAD_STARTED: return "STARTED";
    case RV_EV_THREAD_READY: return "READY";
    case RV_EV_THREAD_RESUMED: return "RESUMED";
    case RV_EV_THREAD_SUSPENDED: return "SUSPENDED";
    case RV_EV_THREAD_EXITED: return "EXITED";
    case RV_EV_GC_ENTER: return "GC_ENTER";
    case RV_EV_GC_EXIT: return "GC_EXIT";
    case RV_EV_SLEEP_ENTER: return "SLEEP";
    case RV_EV_MUTEX_LOCK_ENTER: return "MUTEX_LOCK";
    default: return "NONE";
  }
}

std::string FormatProvenance(const SiteSet& set) {
  std::string out;
  for (const auto& [fact, source] : set.provenance) out += "# " + fact + ": " + source + "\n";
  return out;
}

std::string FormatThLocation(const ThLocation& loc) {
  static constexpr const char* kRegs[] = {"rax", "rdx", "rcx", "rbx", "rsi", "rdi", "rbp", "rsp",
                                          "r8",  "r9",  "r10", "r11", "r12", "r13", "r14", "r15"};
  const char* reg = loc.reg < RV_REG_COUNT ? kRegs[loc.reg] : "?";
  std::string off;
  if (loc.offset != 0) off = (loc.offset > 0 ? "+" : "") + std::to_string(loc.offset);
  switch (loc.kind) {
    case RV_LOC_REG: return std::string("$") + reg + off;
    case RV_LOC_MEM: return std::string("[$") + reg + off + "]";
    case RV_LOC_CURRENT: return "current";
    default: return "none";
  }
}

std::string FormatSites(const SiteSet& set) {
  std::string out;
  char line[512];
  for (const ProbeSite& s : set.sites) {
    // The check's offset (the reference tables' column); where the probe sits after it, if elsewhere.
    char moved[48] = "";
    if (s.vaddr != s.check()) std::snprintf(moved, sizeof(moved), "; probe at +%" PRIu64, s.vaddr - s.check());
    if (s.single_step) std::snprintf(moved, sizeof(moved), "; single-stepped");
    std::snprintf(line, sizeof(line), "0x%-8" PRIx64 " %-9s %-30s th: %-12s (%s, %s%s)\n", s.check_file_offset(),
                  EventKindName(s.event).c_str(), s.function.c_str(), FormatThLocation(s.th).c_str(),
                  s.method.c_str(), s.th_source.c_str(), moved);
    out += line;
  }
  return out;
}

namespace {

// The probe sits at most this far after the instruction it stands for (PlaceOnEmulatedInstructions moves it by a few
// instructions), in bytes.
constexpr uint64_t kMaxProbeAfterCheck = 64;
// Bytes; see CheckSiteSet.
constexpr uint32_t kMaxStructOffset = 4096;

// Empty when `s` is a site the finder can produce, else the rule it breaks.
std::string SiteProblem(const ProbeSite& s) {
  const bool thread_event = s.event >= RV_EV_THREAD_STARTED && s.event <= RV_EV_THREAD_EXITED;
  const bool entry_event = s.event == RV_EV_SLEEP_ENTER || s.event == RV_EV_MUTEX_LOCK_ENTER;
  if (!((s.method == "hook-site" && thread_event) || (s.method == "gc-hook-site" && IsGcEvent(s.event)) ||
        (s.method == "function-entry" && entry_event) ||
        (s.method == "gc-function-entry" && s.event == RV_EV_GC_ENTER) ||
        (s.method == "gc-function-return" && s.event == RV_EV_GC_EXIT))) {
    return "method and event do not match";
  }
  // Return probes only where the site finder puts them (GC functions: they never switch native threads).
  if (s.return_probe != (s.method == "gc-function-return")) return "return probe on a site that is not a return";
  auto valid_loc = [](const ThLocation& l) {
    return (l.kind == RV_LOC_CURRENT || l.kind == RV_LOC_REG || l.kind == RV_LOC_MEM) && l.reg < RV_REG_COUNT;
  };
  if (!valid_loc(s.th) || (s.th_disasm && !valid_loc(*s.th_disasm))) return "unknown location of th";
  if (s.check() > s.vaddr || s.vaddr - s.check() > kMaxProbeAfterCheck || s.file_offset < s.vaddr - s.check()) {
    return "probe too far from its check";
  }
  if ((s.exclude_caller_start != 0 || s.exclude_caller_end != 0) && s.exclude_caller_end <= s.exclude_caller_start) {
    return "empty exclude_caller range";
  }
  if (s.th_source != "dwarf" && s.th_source != "disasm" && s.th_source != "current") return "unknown th_source";
  return {};
}

}  // namespace

Status CheckSiteSet(const SiteSet& set) {
  auto bad = [](const std::string& why) { return Error(ErrorCode::kNoSymbols, "implausible site set: " + why); };
  if (set.hooks_vaddr == 0) return bad("the hook list is at address 0");
  if (set.ractor_main_thread >= kMaxStructOffset || set.offsets.th_serial >= kMaxStructOffset ||
      set.offsets.th_nt >= kMaxStructOffset || set.offsets.nt_tid >= kMaxStructOffset) {
    return bad("a struct offset is 4 KiB or more");
  }
  if (set.main_thread_serial > 1) return bad("main thread serial is not 0 or 1");
  if (set.offsets_source != "dwarf" && set.offsets_source != "table") return bad("unknown offsets source");
  if (set.sites.size() > RV_MAX_SITES) return bad("more than " + std::to_string(RV_MAX_SITES) + " sites");
  if (set.provenance.size() > kMaxSiteProvenance) return bad("too many provenance lines");
  for (const auto& [fact, source] : set.provenance) {
    if (fact.size() > kMaxSiteProvenanceText || source.size() > kMaxSiteProvenanceText) {
      return bad("a provenance line is too long");
    }
  }
  for (const ProbeSite& s : set.sites) {
    if (std::string why = SiteProblem(s); !why.empty()) {
      return bad(why + " (site at file offset " + std::to_string(s.file_offset) + ")");
    }
  }
  return {};
}

std::string SiteSet::AnalysisKey() const {
  return debug_sha256.empty() || debug_sha256 == "none" ? content_sha256 : content_sha256 + ".debug-" + debug_sha256;
}

namespace {
constexpr const char* kTimeoutPhrase = "site analysis time cap";
}  // namespace

std::string SiteAnalysisTimeoutMessage(const ElfFile& vm) {
  return "analysing " + vm.path() + " took longer than the " + kTimeoutPhrase + " (" +
         std::to_string(kSiteAnalysisTimeout.count() / 1000) + " s for a binary; real CRuby binaries take a few): " +
         "not probing it (a crafted binary, or one far larger than any CRuby)";
}

bool IsSiteAnalysisTimeout(const Error& e) { return e.message().find(kTimeoutPhrase) != std::string::npos; }

namespace {

// What the passes of FindSites share: the binary and its version, the decoder (which carries the time cap), what the
// earlier passes found, and the set being built. Each pass appends to set.sites and set.provenance in the order
// FindSites runs them, which is the order `rvbpfd sites` prints the provenance in.
struct SiteSearch {
  SiteSearch(const ElfFile& vm_in, const std::string& ruby_version_in, int major_in, int minor_in,
             Disassembler& dis_in)
      : vm(vm_in),
        ruby_version(ruby_version_in),
        major(major_in),
        minor(minor_in),
        dis(dis_in),
        timed_out(ErrorCode::kUnsupportedVersion, SiteAnalysisTimeoutMessage(vm_in)) {}

  const ElfFile& vm;
  const std::string& ruby_version;
  const int major, minor;
  Disassembler& dis;
  const Error timed_out;  // what every pass returns once the decoder's deadline has passed

  // GC flags (FindGcFlagsGlobal): 3.4+ GC hooks test byte 3 of ruby_vm_event_flags; its address (0: not found).
  bool gc_flags_global = false;
  uint64_t gc_flags_target = 0;
  std::string gc_flags_source;
  // The hook list (FindHookList): from .symtab when it has the list, else from the code (sites/stripped.h).
  bool use_symtab = false;
  std::optional<StrippedCode> stripped;
  uint64_t hooks_addr = 0;
  std::unique_ptr<DwarfInfo> dwarf;  // null without DWARF
  // The .symtab functions as non-overlapping pieces (empty without .symtab).
  std::vector<FunctionUnit> units;
  // References found by the scan (CollectSymtabRefs / CollectStrippedRefs).
  std::vector<std::pair<uint64_t, std::string>> hook_refs;    // (vaddr, function)
  std::vector<std::pair<uint64_t, uint8_t>> gc_global_refs;  // (vaddr, event)
  // 3.4+ calls of rb_gc_event_hook (AddGcGlobalSites).
  GcHookCalls gc_calls;
  SiteSet set;

  StrippedCode* stripped_ptr() { return stripped ? &*stripped : nullptr; }
};

// Version gate: major and minor of `ruby_version`. kUnsupportedVersion when it does not parse or is before 3.2, which
// has no thread scheduler events.
Status CheckSupportedVersion(const ElfFile& vm, const std::string& ruby_version, int* major, int* minor) {
  int teeny = 0;
  if (!ParseRubyVersion(ruby_version, major, minor, &teeny)) {
    return Error(ErrorCode::kUnsupportedVersion, "cannot parse Ruby version \"" + ruby_version + "\" of " + vm.path());
  }
  if (*major < 3 || (*major == 3 && *minor < 2)) {
    return Error(ErrorCode::kUnsupportedVersion, "CRuby " + ruby_version +
                                                     " has no thread scheduler events (they were added in 3.2); "
                                                     "use Ruby >= 3.2");
  }
  return Status::Ok();
}

// GC flags (3.4+, §4): the address of the byte of ruby_vm_event_flags the GC hook checks test, from its symbol
// (.symtab, or .dynsym where it is exported) or, where it is hidden, from the one global the exported GC event entry
// points read first. Leaves gc_flags_target 0 before 3.4 or when neither finds it.
void FindGcFlagsGlobal(SiteSearch& s) {
  s.gc_flags_global = s.major >= 4 || s.minor >= 4;  // 3.4+: GC hooks test ruby_vm_event_flags (§4)
  if (!s.gc_flags_global) return;
  // Exported for extensions (vm_trace.c), so .dynsym has it when .symtab is gone.
  std::optional<ElfSymbol> flags = s.vm.FindSymbol("ruby_vm_event_flags");
  if (flags && flags->shndx != SHN_UNDEF) {
    s.gc_flags_target = flags->value + kGcFlagsByte;
    s.gc_flags_source = flags->from_symtab ? "symtab" : "exports";
  } else if (Result<Disassembler> d = Disassembler::Create(); d.ok()) {
    // Hidden since 3.3. The exported GC event entry points test it first (`ruby_vm_event_flags & event`):
    // rb_gc_event_hook (3.4), rb_gc_event_hook_required_p (where a build exports it).
    for (const char* fn : {"rb_gc_event_hook", "rb_gc_event_hook_required_p"}) {
      if (std::optional<uint64_t> v = SoleGlobalReadBy(s.vm, *d, fn)) {
        s.gc_flags_target = *v + kGcFlagsByte;
        s.gc_flags_source = std::string("exports + disassembly of ") + fn;
        break;
      }
    }
  }
}

// The hook list (rb_internal_thread_event_hooks): its .symtab symbol, or without one the code facts that stand in for
// the symbols (AnalyzeStrippedCode: the list from the registry functions, function extents from .eh_frame, every
// reference to the list and to the GC flag byte). Also the main thread's route from the code (for the live check).
// Errors: the stripped analysis failed or passed the time cap.
Status FindHookList(SiteSearch& s) {
  std::optional<ElfSymbol> hooks = s.vm.FindSymbol(kHooksSymbol);
  s.use_symtab = s.vm.has_symtab() && hooks && hooks->shndx != SHN_UNDEF;
  // Without .symtab: the hook list, the function extents and rb_thread_execute_hooks come from .dynsym, .eh_frame
  // and the code (sites/stripped.h).
  if (!s.use_symtab) {
    Result<StrippedCode> code = AnalyzeStrippedCode(s.vm, s.dis, s.gc_flags_target);
    if (s.dis.deadline_passed()) return s.timed_out;
    if (!code.ok()) {
      return Error(code.error().code(),
                   s.vm.path() + " (build-id " + (s.vm.build_id().empty() ? "none" : s.vm.build_id()) +
                       ") has no symbol table and its hook sites cannot be recovered from its exports and code: " +
                       code.error().message() +
                       "; install the matching debug symbols (e.g. the -dbgsym package) or use a Ruby built with "
                       "symbols");
    }
    s.stripped = std::move(code.value());
  }
  s.hooks_addr = s.stripped ? s.stripped->hooks : hooks->value;
  s.set.hooks_vaddr = s.hooks_addr;
  if (std::optional<MainThreadRoute> mt = FindMainThreadRoute(s.vm, s.dis)) {
    s.set.main_ractor_vaddr = mt->main_ractor_vaddr;
    s.set.ractor_main_thread = mt->ractor_main_thread;
  }
  return Status::Ok();
}

// rb_thread_execute_hooks, the callee that tells a hook check's event: with .symtab, its symbol and clones (kNoSymbols
// when there are none); without, Finder recognises it by its code. Records where the hook list and the function
// extents came from.
Status FindExecuteHooks(SiteSearch& s, Finder& finder) {
  if (s.stripped) {
    s.set.provenance.push_back({"hook list", Hex(s.hooks_addr) + " from exports + disassembly (the one global both "
                                                                 "rb_internal_thread_add_event_hook and "
                                                                 "rb_internal_thread_remove_event_hook access)"});
    s.set.provenance.push_back({"function extents", ".eh_frame (" + std::to_string(s.stripped->functions.size()) +
                                                        " FDEs)"});
    return Status::Ok();
  }
  for (const ElfSymbol& sym : s.vm.FindSymbolsWithPrefix("rb_thread_execute_hooks")) {
    finder.execute_hooks.insert(sym.value);
  }
  if (finder.execute_hooks.empty()) {
    return Error(ErrorCode::kNoSymbols, s.vm.path() + " has no rb_thread_execute_hooks in its symbol table; install "
                                                      "the matching debug symbols or use a Ruby built with symbols");
  }
  s.set.provenance.push_back({"hook list", Hex(s.hooks_addr) + " from symtab (" + kHooksSymbol + ")"});
  s.set.provenance.push_back({"function extents", "symtab"});
  return Status::Ok();
}

// Hook-list and GC-flag references without .symtab: those AnalyzeStrippedCode collected from every FDE, less the
// registry functions' and rb_thread_execute_hooks' reads of the list (they are not hook checks); the GC flag tests
// are the extra references whose immediate is the GC_ENTER or GC_EXIT bit.
void CollectStrippedRefs(SiteSearch& s) {
  const StrippedCode& code = *s.stripped;
  for (uint64_t ref : code.hook_refs) {
    std::optional<CodeRange> fn = RangeContaining(code.functions, ref);
    if (!fn) continue;
    // The registry functions and rb_thread_execute_hooks read the list too; they are not hook checks.
    const bool registry = std::find(code.registry.begin(), code.registry.end(), fn->start) != code.registry.end();
    if (registry || LooksLikeExecuteHooks(s.vm, s.dis, *s.stripped, fn->start)) continue;
    s.hook_refs.emplace_back(ref, StrippedFunctionName(s.vm, code, ref));
  }
  for (const auto& [vaddr, imm] : code.extra_refs) {
    if (imm == kGcEnterByteBit) s.gc_global_refs.emplace_back(vaddr, RV_EV_GC_ENTER);
    if (imm == kGcExitByteBit) s.gc_global_refs.emplace_back(vaddr, RV_EV_GC_EXIT);
  }
}

// Hook-list and GC-flag references with .symtab: every RIP-relative reference to the hook list in a symtab function
// other than the registry and rb_thread_execute_hooks, and every `test` of the GC flag byte with the GC_ENTER or
// GC_EXIT bit. Decodes function by function, so data in .text never desynchronises the decoder, and only the
// functions whose bytes may hold such a reference (MayReference). Stops early past RV_MAX_SITES or the time cap.
void CollectSymtabRefs(SiteSearch& s) {
  static const std::set<std::string> kExcluded = {"rb_internal_thread_add_event_hook",
                                                  "rb_internal_thread_remove_event_hook", "rb_thread_execute_hooks"};
  for (const FunctionUnit& unit : s.units) {
    const ElfSymbol& sym = *unit.sym;
    std::span<const uint8_t> code = s.vm.BytesAt(unit.start, unit.end - unit.start);
    if (code.empty()) continue;
    if (s.hook_refs.size() > RV_MAX_SITES || s.dis.expired()) break;
    bool want_hooks = MayReference(code, sym.value, s.hooks_addr);
    bool want_gc = s.gc_flags_target != 0 && MayReference(code, sym.value, s.gc_flags_target);
    if (!want_hooks && !want_gc) continue;
    bool excluded = std::any_of(kExcluded.begin(), kExcluded.end(),
                                [&](const std::string& base) { return MatchesWithCloneSuffix(sym.name, base); });
    s.dis.DecodeRange(code, sym.value, [&](const cs_insn& insn) {
      std::optional<uint64_t> target = RipRelativeTarget(insn);
      if (!target) return true;
      if (*target == s.hooks_addr && !excluded) s.hook_refs.emplace_back(insn.address, sym.name);
      if (s.gc_flags_target != 0 && *target == s.gc_flags_target && insn.id == X86_INS_TEST) {
        const cs_x86& x86 = insn.detail->x86;
        for (uint8_t i = 0; i < x86.op_count; ++i) {
          if (x86.operands[i].type != X86_OP_IMM) continue;
          if (x86.operands[i].imm == kGcEnterByteBit) s.gc_global_refs.emplace_back(insn.address, RV_EV_GC_ENTER);
          if (x86.operands[i].imm == kGcExitByteBit) s.gc_global_refs.emplace_back(insn.address, RV_EV_GC_EXIT);
        }
      }
      return true;
    });
  }
}

// Hook sites: the references to the hook list (with .symtab or without), checked for count (the BPF side holds
// RV_MAX_SITES) and, without .symtab, for presence. Also collects the 3.4+ GC flag tests.
Status CollectHookRefs(SiteSearch& s) {
  // The .symtab functions are sorted once (FunctionUnits); every scan of them walks them in one pass.
  if (!s.stripped) s.units = FunctionUnits(s.vm);
  if (s.stripped) {
    CollectStrippedRefs(s);
  } else {
    CollectSymtabRefs(s);
  }
  if (s.dis.deadline_passed()) return s.timed_out;
  if (s.hook_refs.size() > RV_MAX_SITES) {
    return Error(ErrorCode::kUnsupportedVersion, s.vm.path() + " tests the hook list at more than " +
                                                     std::to_string(RV_MAX_SITES) + " places, more probe sites than "
                                                     "the BPF side holds");
  }
  if (s.stripped && s.hook_refs.empty()) {
    return Error(ErrorCode::kNoSymbols, s.vm.path() + ": no instruction outside the hook registry tests the hook "
                                                      "list " +
                                            Hex(s.hooks_addr) + " (an unknown build shape); install the matching "
                                                                "debug symbols (-dbgsym)");
  }
  s.set.provenance.push_back({"hook sites", std::to_string(s.hook_refs.size()) +
                                                " RIP-relative references to the hook list (disassembly of every " +
                                                (s.stripped ? "FDE" : "symtab function") + ")"});
  s.set.provenance.push_back({"events", "disassembly (the RUBY_INTERNAL_THREAD_EVENT_* immediate in edi before the "
                                        "hook call on each check's taken path)"});
  return Status::Ok();
}

// `th` at a hook site from DWARF: its location there, or "current" where DWARF says it is optimized out and the event
// may use the native thread's current th. False (with a note why) when DWARF does not decide.
bool ThFromDwarf(DwarfInfo& dwarf, uint64_t vaddr, bool needs_explicit_th, ProbeSite* site, std::string* note) {
  DwarfInfo::VarResult v = dwarf.LocateVariable(vaddr, "th");
  if (v.status == DwarfInfo::VarStatus::kFound) {
    site->th = v.loc;
    site->th_source = "dwarf";
    return true;
  }
  if (v.status == DwarfInfo::VarStatus::kOptimizedOut && !needs_explicit_th) {
    site->th = ThLocation{RV_LOC_CURRENT, 0, 0};
    site->th_source = "current";
    return true;
  }
  if (v.status == DwarfInfo::VarStatus::kOptimizedOut) {
    *note = "DWARF says optimized out";
  } else if (v.status == DwarfInfo::VarStatus::kUnsupported) {
    *note = "DWARF location unsupported: " + v.detail;
  } else {
    *note = "no DWARF variable th";
  }
  return false;
}

// The 3.2 thread layout: `th` at a stripped 3.2 STARTED or RESUMED site, from the statement before the hook
// (sites/ruby32_th.h). False (with a note why) when the code has not that shape.
bool ThFromRuby32Shape(SiteSearch& s, const HookAnalysis& a, uint64_t vaddr, const Ruby32ThLayout& layout,
                       ProbeSite* site, std::string* note) {
  std::optional<CodeRange> fn = RangeContaining(s.stripped->functions, vaddr);
  const uint64_t start = StraightLineStart(s.stripped->branch_targets, fn ? fn->start : vaddr, vaddr);
  std::string why;
  std::optional<ThLocation> th = a.event == RV_EV_THREAD_STARTED
                                     ? Ruby32ThAtStarted(s.vm, s.dis, start, vaddr, layout, &why)
                                     : Ruby32ThAtResumed(s.vm, s.dis, start, vaddr, a.test_jump, layout, &why);
  if (!th) {
    *note = "no CRuby 3.2 shape: " + why;
    return false;
  }
  site->th = *th;
  site->th_source = "disasm";
  return true;
}

// One thread-scheduler hook site: its event (Finder::AnalyzeHookSite) and where `th` is there, from DWARF, else the
// rsi load before the hook call, else (3.2 without DWARF) the statement before the hook, else the current thread
// where the event allows it. Errors: the event cannot be told, or an event that needs th cannot locate it.
Result<ProbeSite> ThreadHookSite(SiteSearch& s, Finder& finder, const Ruby32ThLayout& layout, uint64_t vaddr,
                                 const std::string& function, int* ruby32_shapes) {
  HookAnalysis a = finder.AnalyzeHookSite(vaddr);
  if (a.event == RV_EV_NONE && s.dis.deadline_passed()) return s.timed_out;
  if (a.event == RV_EV_NONE) {
    return Error(ErrorCode::kUnsupportedVersion, "hook site " + Hex(vaddr) + " in " + function + " of " +
                                                     s.vm.path() + ": cannot tell its event (" + a.why +
                                                     "); this VM build is not supported yet");
  }
  ProbeSite site;
  site.vaddr = vaddr;
  site.event = a.event;
  site.function = FunctionName(s.vm, s.stripped_ptr(), vaddr);
  site.method = "hook-site";
  site.th_disasm = a.rsi_th;
  // STARTED and READY can fire on another native thread in 3.3+, so "the current thread" would be wrong there.
  // And "current" is only known once a site with an explicit th has run on the native thread (bpf current_th):
  // STARTED is a thread's first event and RESUMED precedes every SUSPENDED, so those two must locate th
  // themselves, or no event could be attributed (3.2 without DWARF: its hook calls pass no thread).
  const bool needs_explicit_th = a.event == RV_EV_THREAD_STARTED || a.event == RV_EV_THREAD_RESUMED ||
                                 (finder.ThreadHookTakesTh() && a.event == RV_EV_THREAD_READY);
  std::string dwarf_note;
  bool decided = s.dwarf && ThFromDwarf(*s.dwarf, vaddr, needs_explicit_th, &site, &dwarf_note);
  if (!decided && a.rsi_th) {
    site.th = *a.rsi_th;
    site.th_source = "disasm";
    decided = true;
  }
  std::string shape_note = "no rsi load before the hook call";
  if (!decided && needs_explicit_th && !finder.ThreadHookTakesTh() && s.stripped &&
      (a.event == RV_EV_THREAD_STARTED || a.event == RV_EV_THREAD_RESUMED)) {
    // 3.2 without DWARF: th from the statement before the hook (sites/ruby32_th.h).
    decided = ThFromRuby32Shape(s, a, vaddr, layout, &site, &shape_note);
    if (decided) ++*ruby32_shapes;
  }
  if (!decided) {
    if (needs_explicit_th) {
      return Error(ErrorCode::kNoSymbols,
                   EventKindName(a.event) + " hook site " + Hex(vaddr) + " in " + site.function + " of " +
                       s.vm.path() + ": cannot locate th (" + (dwarf_note.empty() ? "no DWARF" : dwarf_note) + ", " +
                       shape_note + "); install the matching debug symbols (-dbgsym)");
    }
    site.th = ThLocation{RV_LOC_CURRENT, 0, 0};
    site.th_source = "current";
  }
  return site;
}

// The 3.2 thread layout at READY (stripped 3.2): a READY left on "current" in the function of a RESUMED whose th was
// found in a register takes the same argument (Ruby32ThAtReady). Counts the sites so located in `ruby32_shapes`.
void LocateRuby32ReadyTh(SiteSearch& s, int* ruby32_shapes) {
  const std::vector<CodeRange>& functions = s.stripped->functions;
  for (ProbeSite& ready : s.set.sites) {
    if (ready.event != RV_EV_THREAD_READY || ready.th_source != "current") continue;
    std::optional<CodeRange> fn = RangeContaining(functions, ready.vaddr);
    if (!fn) continue;
    for (const ProbeSite& resumed : s.set.sites) {
      if (resumed.event != RV_EV_THREAD_RESUMED || resumed.th_source != "disasm" || resumed.th.kind != RV_LOC_REG ||
          resumed.th.offset != 0 || RangeContaining(functions, resumed.vaddr) != fn) {
        continue;
      }
      std::string why;
      const bool straight = StraightLineStart(s.stripped->branch_targets, fn->start, ready.vaddr) == fn->start;
      if (std::optional<ThLocation> th =
              Ruby32ThAtReady(s.vm, s.dis, *fn, ready.vaddr, straight, resumed.th.reg, &why)) {
        ready.th = *th;
        ready.th_source = "disasm";
        ++*ruby32_shapes;
      }
      break;
    }
  }
}

// Thread-scheduler hook sites: one site per hook-list reference (ThreadHookSite), the 3.2 READY pass, and without
// .symtab the names of the scheduler functions the release-reason rules read (NameStrippedSchedulerFunctions).
Status AddThreadHookSites(SiteSearch& s, Finder& finder) {
  Ruby32ThLayout ruby32_layout;
  if (s.major == 3 && s.minor == 2) {
    rv_offsets table{};
    uint32_t main_serial = 0;
    TableOffsets(3, 2, &table, &main_serial);
    ruby32_layout = Ruby32ThLayout{table.th_nt, table.nt_tid, kRuby32SchedRunningOffset};
  }
  int ruby32_shapes = 0;  // 3.2 sites whose th was read off the statement before the hook
  for (const auto& [vaddr, function] : s.hook_refs) {
    Result<ProbeSite> site = ThreadHookSite(s, finder, ruby32_layout, vaddr, function, &ruby32_shapes);
    if (!site.ok()) return site.error();
    s.set.sites.push_back(std::move(site.value()));
  }
  if (s.stripped && ruby32_shapes > 0) LocateRuby32ReadyTh(s, &ruby32_shapes);
  if (ruby32_shapes > 0) {
    s.set.provenance.push_back(
        {"th at 3.2 STARTED/READY/RESUMED",
         "disassembly (" + std::to_string(ruby32_shapes) + " sites): the th whose nt receives the tid store of "
         "native_thread_init(th->nt) before STARTED; the th stored by sched->running = th before RESUMED (table 3.2 "
         "offsets); at READY, the same argument register as its function's RESUMED"});
  }
  if (s.stripped) {
    NameStrippedSchedulerFunctions(s.vm, s.dis, *s.stripped, !finder.ThreadHookTakesTh(), finder.execute_hooks_called,
                                   &s.set);
  }
  return Status::Ok();
}

// 3.4+ calls of rb_gc_event_hook in a .symtab binary (sites/gc_hook_calls.h). GCC's .cold parts jump back into their
// parent's body, so the functions holding calls are checked again with the branch targets of their .cold parts
// (decoded only for those functions, so the cost stays small).
GcHookCalls FindSymtabGcHookCalls(SiteSearch& s) {
  GcHookCalls calls = FindGcHookCalls(s.vm, s.dis, UnitRanges(s.units), {});
  std::vector<uint64_t> cold_targets;
  std::vector<CodeRange> holders;
  for (const GcHookCall& c : calls.calls) {
    std::optional<ElfSymbol> fn = s.vm.FunctionContaining(c.vaddr);
    if (!fn || (!holders.empty() && holders.back().start == fn->value)) continue;
    holders.push_back({fn->value, fn->value + fn->size});
    const std::string base = fn->name.substr(0, fn->name.find('.'));
    for (const ElfSymbol& cold : s.vm.FindSymbolsWithPrefix(base + ".cold")) {
      s.dis.DecodeRange(s.vm.BytesAt(cold.value, cold.size), cold.value, [&](const cs_insn& insn) {
        if (std::optional<uint64_t> t = DirectBranchTarget(insn)) cold_targets.push_back(*t);
        return true;
      });
    }
  }
  if (!cold_targets.empty()) {
    std::sort(cold_targets.begin(), cold_targets.end());
    const size_t ambiguous_elsewhere = calls.ambiguous;
    calls = FindGcHookCalls(s.vm, s.dis, holders, cold_targets);
    calls.ambiguous += ambiguous_elsewhere;
  }
  return calls;
}

// GC sites of 3.4+ (§4): the hook checks of the ruby_vm_event_flags byte found by the reference scan, and the calls
// of rb_gc_event_hook of builds that call it rather than inlining its flag test (only when every call's event is
// certain; SettleGcSites falls back otherwise).
void AddGcGlobalSites(SiteSearch& s) {
  for (const auto& [vaddr, event] : s.gc_global_refs) {
    s.set.sites.push_back({vaddr, 0, event, {RV_LOC_CURRENT, 0, 0}, FunctionName(s.vm, s.stripped_ptr(), vaddr),
                           "gc-hook-site", "current", std::nullopt});
  }
  if (!s.gc_flags_global) return;
  s.gc_calls = s.stripped ? FindGcHookCalls(s.vm, s.dis, s.stripped->functions, s.stripped->branch_targets)
                          : FindSymtabGcHookCalls(s);
  if (s.gc_calls.ambiguous == 0) {
    for (const GcHookCall& c : s.gc_calls.calls) {
      s.set.sites.push_back({c.vaddr, 0, c.event, {RV_LOC_CURRENT, 0, 0}, FunctionName(s.vm, s.stripped_ptr(), c.vaddr),
                             "gc-hook-site", "current", std::nullopt});
    }
  }
}

// The functions that may hold a 3.2/3.3 GC hook check: every function (.symtab, else .eh_frame) whose bytes hold a
// `testb $imm8, disp8(%reg)` of the hook byte with the GC_ENTER or GC_EXIT bit. Not only the GC functions by name:
// 3.2 inlines gc_continue's checks into newobj_alloc.
std::vector<CodeRange> FunctionsTestingHookByte(SiteSearch& s, int64_t hook_byte) {
  const std::vector<CodeRange> candidates = s.stripped ? s.stripped->functions : UnitRanges(s.units);
  std::vector<CodeRange> gc_units;
  for (const CodeRange& fn : candidates) {
    std::span<const uint8_t> b = s.vm.BytesAt(fn.start, fn.end - fn.start);
    auto is_bit = [](uint8_t v) { return v == kGcEnterByteBit || v == kGcExitByteBit; };
    const uint8_t hb = static_cast<uint8_t>(hook_byte);
    for (size_t i = 0; i + 4 < b.size(); ++i) {
      // f6 modrm [sib] disp8 imm8
      if (b[i] == 0xf6 && ((b[i + 2] == hb && is_bit(b[i + 3])) || (b[i + 3] == hb && is_bit(b[i + 4])))) {
        gc_units.push_back(fn);
        break;
      }
    }
  }
  return gc_units;
}

// The 3.2/3.3 GC hook checks of one function: each `testb $bit, hook_byte(%reg)` within kGcDuringGcWindow
// instructions of an access to objspace->flags (during_gc) on the same base register, directly or at the target of
// the jump right after it. That pairing is what makes a test of the byte a GC hook check.
void AddGcChecksNearDuringGc(SiteSearch& s, const CodeRange& unit, int64_t hook_byte, uint32_t flags) {
  struct Seen {
    uint64_t addr;
    uint8_t event;           // RV_EV_GC_* when this is a hook check
    int base;                // base register of the check / flags access
    bool flags_ref;          // accesses objspace->flags (during_gc)
    uint64_t branch_target;  // direct jcc target, 0 otherwise
  };
  std::vector<Seen> insns;
  s.dis.DecodeRange(s.vm.BytesAt(unit.start, unit.end - unit.start), unit.start, [&](const cs_insn& insn) {
    Seen seen{insn.address, RV_EV_NONE, -1, false, 0};
    if (IsConditionalJump(insn)) seen.branch_target = DirectBranchTarget(insn).value_or(0);
    const cs_x86& x86 = insn.detail->x86;
    int64_t imm = -1;
    for (uint8_t i = 0; i < x86.op_count; ++i) {
      const cs_x86_op& op = x86.operands[i];
      if (op.type == X86_OP_IMM) imm = op.imm;
      if (op.type != X86_OP_MEM || op.mem.index != X86_REG_INVALID) continue;
      int b = CapstoneRegToDwarf(op.mem.base);
      if (b < 0 || b >= RV_REG_COUNT) continue;
      if (op.mem.disp == static_cast<int64_t>(flags)) {
        seen.flags_ref = true;
        seen.base = b;
      }
      if (op.mem.disp == hook_byte && insn.id == X86_INS_TEST) seen.base = b;
    }
    if (insn.id == X86_INS_TEST && seen.base >= 0 && !seen.flags_ref) {
      if (imm == kGcEnterByteBit) seen.event = RV_EV_GC_ENTER;
      if (imm == kGcExitByteBit) seen.event = RV_EV_GC_EXIT;
    }
    insns.push_back(seen);
    return true;
  });
  auto flags_ref_near = [&](size_t center, int base) {
    size_t lo = center >= kGcDuringGcWindow ? center - kGcDuringGcWindow : 0;
    size_t hi = std::min(insns.size(), center + kGcDuringGcWindow + 1);
    for (size_t j = lo; j < hi; ++j) {
      if (insns[j].flags_ref && insns[j].base == base) return true;
    }
    return false;
  };
  for (size_t i = 0; i < insns.size(); ++i) {
    if (insns[i].event == RV_EV_NONE) continue;
    bool near = flags_ref_near(i, insns[i].base);
    // GCC duplicates gc_exit's tail: the check may jump back to the shared `during_gc = FALSE` store.
    if (!near && i + 1 < insns.size() && insns[i + 1].branch_target != 0) {
      auto it = std::find_if(insns.begin(), insns.end(),
                             [&](const Seen& x) { return x.addr == insns[i + 1].branch_target; });
      near = it != insns.end() && flags_ref_near(static_cast<size_t>(it - insns.begin()), insns[i].base);
    }
    if (!near) continue;
    s.set.sites.push_back({insns[i].addr, 0, insns[i].event, {RV_LOC_CURRENT, 0, 0},
                           FunctionName(s.vm, s.stripped_ptr(), insns[i].addr), "gc-hook-site", "current",
                           std::nullopt});
  }
}

// GC sites of 3.2/3.3 (§4): `testb $bit, hook_events+3(%objspace)` near the `during_gc` flag access, with the
// rb_objspace member offsets from DWARF (the CU of gc_start) or, for 3.2 and 3.3, the known layout.
void AddGcObjspaceSites(SiteSearch& s) {
  std::optional<ElfSymbol> gc_start = s.vm.FindSymbol("gc_start");
  std::optional<uint32_t> hook_events, flags;
  if (s.dwarf && gc_start) {
    hook_events = s.dwarf->MemberOffset(gc_start->value, "rb_objspace", "hook_events");
    flags = s.dwarf->MemberOffset(gc_start->value, "rb_objspace", "flags");
  }
  // rb_objspace of 3.2.11 and 3.3.8 (gdb ptype /o; §4): the check reads byte 0x17. The stripped-copy tests compare
  // the 3.3 sites found with them to the DWARF ones.
  if (!hook_events && (s.minor == 2 || s.minor == 3)) hook_events = 0x14;
  if (!flags && (s.minor == 2 || s.minor == 3)) flags = 0x10;
  if (!hook_events || !flags) return;
  const int64_t hook_byte = *hook_events + kGcFlagsByte;
  for (const CodeRange& unit : FunctionsTestingHookByte(s, hook_byte)) {
    AddGcChecksNearDuringGc(s, unit, hook_byte, *flags);
  }
}

// GC enter/exit, settled: without both GC hook checks (another compiler's shape, a build whose objspace layout we
// cannot read), or with a call of rb_gc_event_hook whose event is not certain (GcHookCalls::ambiguous, an event the
// checks found would miss), the GC functions' entries and returns stand for all of them (FindGcFunctionSites).
// Records where the GC sites came from.
void SettleGcSites(SiteSearch& s) {
  SiteSet& set = s.set;
  const bool has_gc_enter = std::any_of(set.sites.begin(), set.sites.end(),
                                        [](const ProbeSite& p) { return p.event == RV_EV_GC_ENTER; });
  const bool has_gc_exit = std::any_of(set.sites.begin(), set.sites.end(),
                                       [](const ProbeSite& p) { return p.event == RV_EV_GC_EXIT; });
  if (!has_gc_enter || !has_gc_exit || s.gc_calls.ambiguous > 0) {
    std::erase_if(set.sites, [](const ProbeSite& p) { return IsGcEvent(p.event); });
    for (ProbeSite& p : FindGcFunctionSites(s.vm, s.ruby_version)) set.sites.push_back(std::move(p));
    const bool any =
        std::any_of(set.sites.begin(), set.sites.end(), [](const ProbeSite& p) { return IsGcEvent(p.event); });
    const std::string why = s.gc_calls.ambiguous > 0 ? "a call of rb_gc_event_hook whose event a branch may change"
                                                     : "no GC hook check found";
    set.provenance.push_back(
        {"GC enter/exit", any ? "symtab (entry and return of gc_start, gc_rest, gc_continue: " + why + ")"
                              : "none: " + why + std::string(s.stripped ? " and no GC function names without .symtab"
                                                                        : "")});
  } else if (s.gc_flags_global) {
    std::string how;
    if (!s.gc_global_refs.empty()) {
      how = std::to_string(s.gc_global_refs.size()) + " hook checks of ruby_vm_event_flags+3 (address from " +
            s.gc_flags_source + "; checks by disassembly)";
    }
    if (s.gc_calls.ambiguous == 0 && !s.gc_calls.calls.empty()) {
      how += std::string(how.empty() ? "" : " and ") + std::to_string(s.gc_calls.calls.size()) +
             " calls of rb_gc_event_hook with GC_ENTER/GC_EXIT in esi (" + s.gc_calls.via + "; disassembly)";
    }
    set.provenance.push_back({"GC enter/exit", how});
  } else {
    set.provenance.push_back(
        {"GC enter/exit", std::string("hook checks of objspace->hook_events (offsets ") +
                              (s.dwarf ? "dwarf" : "table") + "; every " + (s.stripped ? "FDE" : "symtab function") +
                              " with the check's bytes, by disassembly)"});
  }
}

// Entry sites of the functions named `base` (and its clones) from the symbols. A `.part.N`/`.cold` piece is reached
// from its parent, so probing it too would count one call twice; it is probed only when it is all there is.
void AddFunctionEntries(SiteSearch& s, const std::string& base, uint8_t event) {
  std::vector<ElfSymbol> syms = s.vm.FindSymbolsWithPrefix(base);
  std::erase_if(syms, [](const ElfSymbol& sym) { return sym.type != STT_FUNC || sym.size == 0; });
  bool has_whole = std::any_of(syms.begin(), syms.end(), [](const ElfSymbol& sym) { return !IsColdOrPart(sym.name); });
  std::set<uint64_t> added;
  for (const ElfSymbol& sym : syms) {
    if ((has_whole && IsColdOrPart(sym.name)) || !added.insert(sym.value).second) continue;
    s.set.sites.push_back({sym.value, 0, event, {RV_LOC_CURRENT, 0, 0}, sym.name, "function-entry", "current",
                           std::nullopt});
  }
}

// Without .symtab, the entry of a static method function found where the VM registers it: an Init function's call
// `definer`(..., "method", func, ...) (an exported callee, string and function loaded by lea; the name in rdi for
// rb_define_global_function, in rsi for rb_define_method). Exactly one such call must exist, naming the entry of a
// function of its own; otherwise the provenance says none was found.
void AddRegisteredEntry(SiteSearch& s, const std::string& definer, const std::string& method, bool name_in_rdi,
                        const std::string& label, uint8_t event) {
  const StrippedCode& code = *s.stripped;
  const std::vector<uint64_t> names = RodataStrings(s.vm, method);
  std::set<uint64_t> funcs;
  for (const DefineCall& c : code.define_calls) {
    if (c.callee != definer) continue;
    const uint64_t name = name_in_rdi ? c.name_rdi : c.name_rsi;
    const uint64_t func = name_in_rdi ? c.func_rsi : c.func_rdx;
    if (name == 0 || func == 0 || std::find(names.begin(), names.end(), name) == names.end()) continue;
    funcs.insert(func);
  }
  std::optional<CodeRange> fn = funcs.size() == 1 ? RangeContaining(code.functions, *funcs.begin()) : std::nullopt;
  if (!fn || fn->start != *funcs.begin()) {
    s.set.provenance.push_back({label, "none: " + std::to_string(funcs.size()) + " registrations " + definer + "(\"" +
                                           method + "\") found in the code (one whose target starts a function is "
                                           "needed)"});
    return;
  }
  s.set.sites.push_back({fn->start, 0, event, {RV_LOC_CURRENT, 0, 0}, StrippedFunctionName(s.vm, code, fn->start),
                         "function-entry", "current", std::nullopt});
  s.set.provenance.push_back({label, Hex(fn->start) + " from disassembly of its registration " + definer + "(\"" +
                                         method + "\")"});
}

// Sleep and mutex probes (§5): Kernel#sleep and Thread::Mutex#lock at the entry of their workers, from .symtab or,
// without it, from the exports and the methods' registrations.
void AddSleepAndMutexSites(SiteSearch& s) {
  if (s.stripped) {
    AddRegisteredEntry(s, "rb_define_global_function", "sleep", true, "Kernel#sleep", RV_EV_SLEEP_ENTER);
  } else {
    AddFunctionEntries(s, "rb_f_sleep", RV_EV_SLEEP_ENTER);
    s.set.provenance.push_back({"Kernel#sleep", "symtab (rb_f_sleep)"});
  }
  if (s.major >= 4) {
    // 4.0: Mutex#lock and #synchronize are Ruby methods reaching the builtin rb_mut_lock.
    AddFunctionEntries(s, "rb_mut_lock", RV_EV_MUTEX_LOCK_ENTER);
    return;
  }
  // 3.2-3.4: Mutex#lock is the cfunc rb_mutex_lock and Mutex#synchronize is rb_mutex_synchronize_m. The worker
  // do_mutex_lock also serves C-level locks (every IO#write takes its write_lock through rb_mutex_synchronize),
  // which an in-process Mutex#lock probe never sees, so the probe is on the method functions, and a call of
  // rb_mutex_lock made from rb_mutex_synchronize (the C API; in a shared libruby it goes through the PLT) is
  // excluded by its return address. Static builds inline rb_mutex_lock there, so the exclusion is moot.
  AddFunctionEntries(s, "rb_mutex_lock", RV_EV_MUTEX_LOCK_ENTER);  // exported: .dynsym has it when .symtab is gone
  s.set.provenance.push_back({"Mutex#lock", std::string(s.use_symtab ? "symtab" : "exports") + " (rb_mutex_lock)"});
  if (s.stripped) {
    AddRegisteredEntry(s, "rb_define_method", "synchronize", false, "Mutex#synchronize", RV_EV_MUTEX_LOCK_ENTER);
  } else {
    AddFunctionEntries(s, "rb_mutex_synchronize_m", RV_EV_MUTEX_LOCK_ENTER);
    s.set.provenance.push_back({"Mutex#synchronize", "symtab (rb_mutex_synchronize_m)"});
  }
  if (std::optional<ElfSymbol> sync = s.vm.FindSymbol("rb_mutex_synchronize"); sync && sync->size > 0) {
    for (ProbeSite& p : s.set.sites) {
      if (p.event == RV_EV_MUTEX_LOCK_ENTER && p.function == "rb_mutex_lock") {
        p.exclude_caller_start = sync->value;
        p.exclude_caller_end = sync->value + sync->size;
      }
    }
  }
}

// Struct offsets (th->serial, th->nt, nt->tid) and the main thread's serial: DWARF of the CU that holds the scheduler
// (thread.c, found through rb_thread_execute_hooks), else the version table. kUnsupportedVersion with neither.
Status FindStructOffsets(SiteSearch& s, const Finder& finder) {
  SiteSet& set = s.set;
  bool have_table = TableOffsets(s.major, s.minor, &set.offsets, &set.main_thread_serial);
  set.offsets_source = "table";
  if (s.dwarf && !(finder.execute_hooks.empty() && finder.execute_hooks_called.empty())) {
    uint64_t cu_pc =
        !finder.execute_hooks.empty() ? *finder.execute_hooks.begin() : *finder.execute_hooks_called.begin();
    std::optional<uint32_t> serial = s.dwarf->MemberOffset(cu_pc, "rb_thread_struct", "serial");
    std::optional<uint32_t> nt = s.dwarf->MemberOffset(cu_pc, "rb_thread_struct", "nt");
    std::optional<uint32_t> tid = s.dwarf->MemberOffset(cu_pc, "rb_native_thread", "tid");
    if (serial && nt && tid) {
      set.offsets = rv_offsets{*serial, *nt, *tid, 0};  // serial: see TableOffsets
      set.offsets_source = "dwarf";
      if (!have_table) set.main_thread_serial = (s.major == 3 && s.minor == 2) ? 0 : 1;
      have_table = true;
    }
  }
  if (!have_table) {
    return Error(ErrorCode::kUnsupportedVersion, "CRuby " + s.ruby_version + " (" + s.vm.path() +
                                                     ") has no DWARF struct layout and no built-in offset table; "
                                                     "install its debug symbols (-dbgsym)");
  }
  set.provenance.push_back({"thread struct offsets", set.offsets_source == "dwarf"
                                                         ? std::string("dwarf")
                                                         : "table " + std::to_string(s.major) + "." +
                                                               std::to_string(s.minor)});
  if (s.stripped) {
    set.provenance.push_back({"rb_thread_execute_hooks", "disassembly: the callee of the hook checks' taken paths "
                                                         "that takes the hook list's lock (" +
                                                         std::to_string(finder.execute_hooks_called.size()) +
                                                         " entries)"});
  }
  return Status::Ok();
}

}  // namespace

// The passes in the order they depend on each other: the hook list before the references to it, the hook sites
// before the 3.2 READY pass and the stripped names, the GC checks before the fallback that replaces them, every site
// before placement, and DWARF offsets after the hook analysis has found rb_thread_execute_hooks.
Result<SiteSet> FindSites(const ElfFile& vm, const std::string& ruby_version, std::chrono::milliseconds timeout) {
  int major = 0, minor = 0;
  if (Status st = CheckSupportedVersion(vm, ruby_version, &major, &minor); !st) return st.error();
  Result<Disassembler> dis = Disassembler::Create();
  if (!dis.ok()) return dis.error();
  dis->set_deadline(std::chrono::steady_clock::now() + timeout);
  SiteSearch s(vm, ruby_version, major, minor, *dis);
  s.set.build_id = vm.build_id();
  s.set.ruby_version = ruby_version;
  s.set.symbols_source = vm.symbols_source();
  s.set.analysed_with_symtab = vm.has_symtab();
  FindGcFlagsGlobal(s);
  if (Status st = FindHookList(s); !st) return st.error();
  s.dwarf = DwarfInfo::Open(vm);
  Finder finder{vm, *dis, s.dwarf.get(), major, minor, {}, s.stripped_ptr(), {}};
  if (Status st = FindExecuteHooks(s, finder); !st) return st.error();
  if (Status st = CollectHookRefs(s); !st) return st.error();
  if (Status st = AddThreadHookSites(s, finder); !st) return st.error();
  AddGcGlobalSites(s);
  if (!s.gc_flags_global) AddGcObjspaceSites(s);
  if (dis->deadline_passed()) return s.timed_out;
  SettleGcSites(s);
  AddSleepAndMutexSites(s);

  PlaceOnEmulatedInstructions(vm, *dis, s.dwarf.get(), &s.set.sites, s.stripped_ptr());
  if (Status st = AssignFileOffsetsAndSort(vm, &s.set.sites); !st) return st.error();
  if (s.set.sites.size() > RV_MAX_SITES) {
    return Error(ErrorCode::kUnsupportedVersion, vm.path() + " yields " + std::to_string(s.set.sites.size()) +
                                                     " probe sites, more than the " + std::to_string(RV_MAX_SITES) +
                                                     " the BPF side holds");
  }
  if (Status st = FindStructOffsets(s, finder); !st) return st.error();
  if (Status st = CheckSiteSet(s.set); !st) return Error(st.error().code(), vm.path() + ": " + st.error().message());
  if (Status st = CheckSitesAgainstCode(vm, *dis, s.set.sites); !st) return st.error();
  if (dis->deadline_passed()) return s.timed_out;
  return std::move(s.set);
}

std::vector<ProbeSite> FindGcFunctionSites(const ElfFile& vm, const std::string& ruby_version) {
  int major = 0, minor = 0, teeny = 0;
  if (!ParseRubyVersion(ruby_version, &major, &minor, &teeny)) return {};
  // Each of these runs exactly one gc_enter() ... gc_exit() pair per call (gc.c 3.2/3.3, gc/default/default.c 3.4),
  // and they never nest: gc_start and gc_rest are called one after the other (garbage_collect), gc_continue from
  // the allocation path. rb_objspace_call_finalizer (the shutdown GC) and rb_memerror (GC_EXIT only) are left out.
  //
  // Why a return probe is safe here although rvbpfd uses none on the scheduler: GC runs on the thread that holds the
  // GVL and triggered it, with the VM lock held; it runs no Ruby code (finalizers are deferred to a postponed job),
  // never releases the GVL and never switches coroutines, so under M:N the call returns on the native thread it was
  // entered on (a return on another one is what makes the kernel SIGILL). A longjmp out of GC (NoMemoryError) leaves
  // a stale return instance that the kernel discards on that thread's next return probe; it never fires.
  static const std::vector<std::string> kGc32 = {"gc_start", "gc_rest", "gc_marks_continue", "gc_sweep_continue"};
  static const std::vector<std::string> kGc33 = {"gc_start", "gc_rest", "gc_continue"};
  const std::vector<std::string>& bases = (major == 3 && minor == 2) ? kGc32 : kGc33;
  std::vector<ProbeSite> out;
  std::set<uint64_t> added;
  for (const std::string& base : bases) {
    std::vector<ElfSymbol> syms = vm.FindSymbolsWithPrefix(base);
    std::erase_if(syms, [](const ElfSymbol& s) {
      return s.type != STT_FUNC || s.size == 0 || s.shndx == SHN_UNDEF || s.name.find(".cold") != std::string::npos;
    });
    // A .part.N piece holds the body after the function's early-out test: probe it instead of the whole function,
    // whose entry is also reached when the function returns at once.
    const bool has_part = std::any_of(syms.begin(), syms.end(),
                                      [](const ElfSymbol& s) { return s.name.find(".part.") != std::string::npos; });
    for (const ElfSymbol& s : syms) {
      if (has_part && s.name.find(".part.") == std::string::npos) continue;
      if (!added.insert(s.value).second) continue;
      ProbeSite entry;
      entry.vaddr = s.value;
      entry.event = RV_EV_GC_ENTER;
      entry.th = ThLocation{RV_LOC_CURRENT, 0, 0};
      entry.function = s.name;
      entry.method = "gc-function-entry";
      entry.th_source = "current";
      ProbeSite ret = entry;
      ret.event = RV_EV_GC_EXIT;
      ret.method = "gc-function-return";
      ret.return_probe = true;
      out.push_back(std::move(entry));
      out.push_back(std::move(ret));
    }
  }
  if (!AssignFileOffsetsAndSort(vm, &out)) return {};
  return out;
}

Status UseGcFunctionProbes(const ElfFile& vm, SiteSet* set) {
  std::vector<ProbeSite> gc = FindGcFunctionSites(vm, set->ruby_version);
  if (gc.empty()) {
    return Error(ErrorCode::kNoSymbols, vm.path() + " has no GC function (gc_start, gc_rest, gc_continue) in its "
                                                    "symbol table: --gc-probes=fallback cannot be used with it");
  }
  Result<Disassembler> dis = Disassembler::Create();
  if (!dis.ok()) return dis.error();
  PlaceOnEmulatedInstructions(vm, *dis, nullptr, &gc);  // they stay on their entries; this marks single-stepped ones
  std::erase_if(set->sites, [](const ProbeSite& s) { return IsGcEvent(s.event); });
  for (ProbeSite& s : gc) set->sites.push_back(std::move(s));
  if (Status st = AssignFileOffsetsAndSort(vm, &set->sites); !st) return st;
  if (Status st = CheckSiteSet(*set); !st) return Error(st.error().code(), vm.path() + ": " + st.error().message());
  if (Status st = CheckSitesAgainstCode(vm, *dis, set->sites); !st) return st;
  return {};
}

}  // namespace rvbpfd
