// The input format of the stacks harness (fuzz_stacks), shared with the seed writer (make_seeds, which records real
// target memory from the coredump cases in this form):
//   a 96-byte Header (below), then memory records: u64 address, u16 length, `length` bytes; repeated to the end.
// A record cut short by the end of the input keeps the bytes that are there.
#ifndef RVBPFD_TESTS_FUZZ_STACKS_INPUT_H_
#define RVBPFD_TESTS_FUZZ_STACKS_INPUT_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "stacks/ec_route.h"
#include "stacks/memory_reader.h"
#include "stacks/ruby_offsets.h"
#include "stacks/symbolizer.h"
#include "stacks/walker.h"

namespace rvbpfd::fuzz {

struct StacksHeader {
  uint8_t version = 0;        // index into kStacksVersions
  uint8_t flags = 0;          // kStacksWrap, kStacksNoGlobalSymbols
  uint8_t route_kind = 0;     // EcTlsKind, modulo 4
  uint8_t tlsdesc_extra = 0;  // EcRoute::tlsdesc_extra, bytes
  uint32_t th_nt = 0;         // the thread's rb_thread_t.nt offset for the EC lookup, bytes
  uint64_t th = 0;            // rb_thread_t * of the thread to walk (walked as an EC when its ec is unreadable)
  uint64_t global_symbols = 0;  // &ruby_global_symbols
  uint64_t frame_addr = 0;    // a frame symbolized directly (iseq or CME)
  uint64_t frame_pc = 0;
  uint64_t string = 0;        // a VALUE read as a T_STRING
  uint64_t id = 0;            // an ID looked up in the symbol table
  uint64_t load_bias = 0;     // the EC route's load bias, bytes
  uint32_t got_vaddr = 0;     // EcRoute::got_vaddr
  uint32_t tls_value = 0;     // EcRoute::tls_symbol_value
  uint32_t tp_offset = 0;     // -EcRoute::tp_offset
  uint32_t vm_ptr_vaddr = 0;  // EcRoute::vm_ptr_vaddr
  uint64_t thread_pointer = 0;  // the sampled thread's fsbase
  uint32_t nt_tid = 0;        // rb_native_thread.tid offset
  uint32_t tid = 0;           // the sampled tid
};
static_assert(sizeof(StacksHeader) == 96, "StacksHeader is the input's first 96 bytes");

inline constexpr int kStacksVersions[][2] = {{3, 1}, {3, 2}, {3, 3}, {3, 4}, {4, 0}};
inline constexpr uint8_t kStacksWrap = 1;             // unmapped addresses read the input's bytes, modulo its size
inline constexpr uint8_t kStacksNoGlobalSymbols = 2;  // the symbolizer gets no symbol table

// The memory the records describe. Reads must lie inside one record's bytes (after merging overlapping records:
// later ones win); in wrap mode any other read is served from the raw input instead.
class FuzzMemory : public MemoryReader {
 public:
  FuzzMemory(std::span<const uint8_t> input, size_t records_at, bool wrap) : input_(input), wrap_(wrap) {
    size_t at = records_at;
    while (at + 10 <= input.size()) {
      uint64_t addr;
      uint16_t len;
      std::memcpy(&addr, input.data() + at, 8);
      std::memcpy(&len, input.data() + at + 8, 2);
      at += 10;
      const size_t n = std::min<size_t>(len, input.size() - at);
      Put(addr, input.subspan(at, n));
      at += n;
    }
  }
  bool Read(uint64_t addr, void* dst, size_t len) override {
    if (len == 0 || len > kMaxReadBytes) return false;
    if (++reads_ > kMaxReads) return false;  // the harness's own bound, far above what one input needs
    auto it = regions_.upper_bound(addr);
    if (it != regions_.begin()) {
      --it;
      const uint64_t off = addr - it->first;
      if (off <= it->second.size() && len <= it->second.size() - off) {
        std::memcpy(dst, it->second.data() + off, len);
        return true;
      }
    }
    if (!wrap_ || input_.empty()) return false;
    uint8_t* out = static_cast<uint8_t*>(dst);
    uint64_t at = addr % input_.size();
    for (size_t i = 0; i < len; ++i) {
      out[i] = input_[at];
      at = at + 1 == input_.size() ? 0 : at + 1;
    }
    return true;
  }

 private:
  static constexpr uint64_t kMaxReads = 1 << 22;
  // Adds bytes at addr, merging with the regions they overlap or touch.
  void Put(uint64_t addr, std::span<const uint8_t> bytes) {
    if (bytes.empty() || addr + bytes.size() < addr) return;
    uint64_t start = addr, end = addr + bytes.size();
    auto it = regions_.upper_bound(addr);
    if (it != regions_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second.size() >= addr) it = prev;
    }
    std::vector<uint8_t> merged;
    std::vector<std::map<uint64_t, std::vector<uint8_t>>::iterator> absorbed;
    for (; it != regions_.end() && it->first <= end; ++it) {
      start = std::min(start, it->first);
      end = std::max(end, it->first + it->second.size());
      absorbed.push_back(it);
    }
    merged.resize(end - start);
    for (auto a : absorbed) std::memcpy(merged.data() + (a->first - start), a->second.data(), a->second.size());
    std::memcpy(merged.data() + (addr - start), bytes.data(), bytes.size());
    for (auto a : absorbed) regions_.erase(a);
    regions_[start] = std::move(merged);
  }

  std::span<const uint8_t> input_;
  bool wrap_;
  std::map<uint64_t, std::vector<uint8_t>> regions_;
  uint64_t reads_ = 0;
};

// Appends one memory record (split in pieces of at most 65535 bytes).
inline void AppendMemoryRecord(std::string* out, uint64_t addr, std::span<const uint8_t> bytes) {
  while (!bytes.empty()) {
    const uint16_t n = static_cast<uint16_t>(std::min<size_t>(bytes.size(), 0xffff));
    out->append(reinterpret_cast<const char*>(&addr), 8);
    out->append(reinterpret_cast<const char*>(&n), 2);
    out->append(reinterpret_cast<const char*>(bytes.data()), n);
    addr += n;
    bytes = bytes.subspan(n);
  }
}

// A line table read whole stays within the read bound and, in a memory whose bytes do not depend on how they are
// read (`consistent`), gives pc the line LineNumber reads for it: the stack resolver names new pcs from such tables.
// Wrap mode is not such a memory: a read that leaves a record takes all its bytes from the input instead.
inline void CheckLineTable(Symbolizer& symbolizer, uint64_t iseq, uint64_t pc, bool consistent) {
  const std::optional<Symbolizer::LineTable> table = symbolizer.ReadLineTable(iseq);
  if (!table) return;
  FUZZ_CHECK(8 * table->succ.size() + 4 * table->lines.size() <= Symbolizer::kMaxLineTableReadBytes);
  const std::optional<int> line = Symbolizer::LineAt(*table, pc);
  if (consistent) FUZZ_CHECK(line == symbolizer.LineNumber(iseq, pc));
}

// What the harness does with one input, and what the seed writer records the reads of: find the thread's EC, walk it,
// symbolize its frames and the header's own frame, read a string and an ID, resolve the process's EC route and run
// the sampler's EC lookup. False when the header names no supported layout.
inline bool ExerciseStacks(MemoryReader& mem, const StacksHeader& h) {
  const auto& version = kStacksVersions[h.version % std::size(kStacksVersions)];
  Result<RubyOffsets> offsets = RubyOffsets::ForVersion(version[0], version[1]);
  if (!offsets.ok()) return false;
  const uint64_t ec = ThreadEc(mem, h.th, offsets->thread_ec).value_or(h.th);
  WalkLimits limits;  // tighter than the defaults, so one input stays fast; the bounds are what is tested
  limits.max_frames = 2048;
  limits.max_steps = 1 << 14;
  const WalkResult walk = WalkRubyStack(mem, offsets->walk, ec, limits);
  FUZZ_CHECK(walk.frames.size() <= limits.max_frames);
  // ruby_current_vm_ptr is the same global the EC route reads: 3.2's class paths start from it (vm->shape_list).
  const uint64_t vm_ptr = h.vm_ptr_vaddr != 0 ? h.vm_ptr_vaddr + h.load_bias : 0;
  Symbolizer symbolizer(&mem, *offsets, (h.flags & kStacksNoGlobalSymbols) != 0 ? 0 : h.global_symbols, vm_ptr);
  size_t symbolized = 0;
  const bool consistent = (h.flags & kStacksWrap) == 0;
  for (const rv_ruby_frame& frame : walk.frames) {
    if (++symbolized > 128) break;
    const SymbolizedFrame f = symbolizer.Symbolize(frame);
    if (!f.resolved) FUZZ_CHECK(f.full_label && !f.path && !f.absolute_path);
    if (symbolized <= 16 && frame.pc != 0) CheckLineTable(symbolizer, frame.cfp_iseq, frame.pc, consistent);
  }
  for (uint32_t kind = 0; kind < 2; ++kind) {
    rv_ruby_frame frame{};
    frame.addr = h.frame_addr;
    frame.pc = h.frame_pc;
    frame.cfp_iseq = h.frame_addr;
    frame.kind = kind;
    (void)symbolizer.Symbolize(frame);
  }
  if (h.frame_pc != 0) CheckLineTable(symbolizer, h.frame_addr, h.frame_pc, consistent);
  (void)symbolizer.ReadString(h.string);
  (void)symbolizer.IdToString(h.id);

  EcRoute route;
  route.kind = static_cast<EcTlsKind>(h.route_kind % 4);
  route.got_vaddr = h.got_vaddr;
  route.tls_symbol_value = h.tls_value;
  route.tp_offset = -static_cast<int64_t>(h.tp_offset);
  route.tlsdesc_extra = h.tlsdesc_extra;
  route.vm_ptr_vaddr = h.vm_ptr_vaddr;
  route.ec_thread_ptr = offsets->ec_thread_ptr;
  route.vm_main_ractor = offsets->vm_main_ractor;
  route.ractor_running_ec = offsets->ractor_running_ec;
  Result<std::optional<rv_proc_ec>> proc = ResolveProcessEc(route, 0, h.load_bias, mem);
  rv_walk_config config{};
  config.walk = offsets->walk;
  config.thread_ec = offsets->thread_ec;
  config.valid = 1;
  ApplyEcRoute(route, &config);
  rv_proc_ec pe{};
  if (proc.ok() && proc->has_value()) pe = **proc;
  (void)FindEcForThread(mem, pe, config, h.th_nt, h.nt_tid, h.thread_pointer, h.tid);
  return true;
}

}  // namespace rvbpfd::fuzz

#endif  // RVBPFD_TESTS_FUZZ_STACKS_INPUT_H_
