// Ruby objects laid out in a FakeMemory for the symbolizer's version tests (symbolizer31_test, symbolizer32_test):
// a bump allocator, heap arrays, the global symbol table (ruby_global_symbols) and C method entries. Strings differ
// between releases, so each test passes its own String writer.
#ifndef RVBPFD_TESTS_STACKS_SYNTHETIC_OBJECTS_H_
#define RVBPFD_TESTS_STACKS_SYNTHETIC_OBJECTS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "fake_memory.h"
#include "rvbpfd/ruby_walker_types.h"
#include "stacks/ruby_offsets.h"

namespace rvbpfd::testing {

class SyntheticObjects {
 public:
  SyntheticObjects(FakeMemory* mem, uint64_t start) : mem_(mem), next_(start) {}

  uint64_t Alloc(size_t n) {
    const uint64_t a = next_;
    next_ += (n + 15) & ~size_t{15};
    return a;
  }
  uint64_t next() const { return next_; }  // where the next allocation goes
  // A T_ARRAY with its elements on the heap (length at +16, pointer at +32), the same in 3.1 and 3.2+.
  uint64_t HeapArray(const std::vector<uint64_t>& elems) {
    const uint64_t ary = Alloc(40), ptr = Alloc(8 * elems.size());
    mem_->Put64(ary, 0x07);
    mem_->Put64(ary + 16, elems.size());
    mem_->Put64(ary + 32, ptr);
    for (size_t i = 0; i < elems.size(); i++) mem_->Put64(ptr + 8 * i, elems[i]);
    return ary;
  }
  // ruby_global_symbols at `gsym`: serial -> name for `names` ('+' among them, which GlobalSymbolsUsable checks),
  // last_id 600 (two chunks of 512 serials; other entries hold the non-heap 0x08). Returns the `ids` array.
  uint64_t IdTable(const RubyOffsets& off, uint64_t gsym, const std::map<uint64_t, std::string>& names,
               const std::function<uint64_t(const std::string&)>& string) {
    constexpr uint64_t kUnit = 512;
    std::vector<uint64_t> chunk0(2 * kUnit, 0x08), chunk1(2 * kUnit, 0x08);
    for (const auto& [serial, name] : names) (serial < kUnit ? chunk0 : chunk1)[(serial % kUnit) * 2] = string(name);
    mem_->Put32(gsym + off.symbols_last_id, 600);
    const uint64_t ids = HeapArray({HeapArray(chunk0), HeapArray(chunk1)});
    mem_->Put64(gsym + off.symbols_ids, ids);
    return ids;
  }
  static uint64_t Id(uint64_t serial) { return (serial << 4) | 1; }  // a static local ID
  // A C method entry defined on `klass`, its method named by `method_id`, as a frame of the walker.
  rv_ruby_frame CfuncFrame(const RubyOffsets& off, uint64_t klass, uint64_t method_id) {
    const uint64_t cme = Alloc(40), def = Alloc(48);
    mem_->Put64(cme, RV_RB_T_IMEMO | (RV_RB_IMEMO_MENT << RV_RB_IMEMO_SHIFT));
    mem_->Put64(cme + off.cme_defined_class, klass);
    mem_->Put64(cme + off.cme_def, def);
    mem_->Put32(def, RV_RB_METHOD_TYPE_CFUNC);
    mem_->Put64(def + off.def_original_id, method_id);
    rv_ruby_frame f{};
    f.kind = RV_RB_FRAME_CME_CFUNC;
    f.addr = cme;
    return f;
  }

  // A top-level iseq (ISEQ_TYPE_TOP, its own local iseq; imemo type 7) named by the String VALUEs `label` and `path`,
  // with no line table (line 0), as a walker frame at its first instruction.
  rv_ruby_frame TopIseqFrame(const RubyOffsets& off, uint64_t label, uint64_t path) {
    const uint64_t iseq = Alloc(64), body = Alloc(400), encoded = Alloc(64);
    mem_->Put64(iseq, RV_RB_T_IMEMO | (7ull << RV_RB_IMEMO_SHIFT));
    mem_->Put64(iseq + off.iseq_body, body);
    mem_->Put32(body + off.body_type, 0);
    mem_->Put64(body + off.body_iseq_encoded, encoded);
    mem_->Put32(body + off.body_iseq_size, 8);
    mem_->Put32(body + off.body_insns_info_size, 0);
    mem_->Put64(body + off.body_location + off.loc_label, label);
    mem_->Put64(body + off.body_location + off.loc_base_label, label);
    mem_->Put64(body + off.body_location + off.loc_pathobj, path);
    mem_->Put64(body + off.body_local_iseq, iseq);
    return rv_ruby_frame{iseq, encoded, iseq, RV_RB_FRAME_ISEQ, 0};
  }

 private:
  FakeMemory* mem_;
  uint64_t next_;
};

}  // namespace rvbpfd::testing

#endif  // RVBPFD_TESTS_STACKS_SYNTHETIC_OBJECTS_H_
