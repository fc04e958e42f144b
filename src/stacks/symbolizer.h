// Userspace symbolizer for walker frames: labels, paths and line numbers exactly as CRuby's
// rb_profile_frame_full_label / rb_profile_frame_path / rb_profile_frame_absolute_path / rb_profile_frame_first_lineno
// and the line numbers of rb_profile_frames compute them (vm_backtrace.c, iseq.c, variable.c, symbol.c, shape.c;
// 3.1 - 4.0).
//
// Everything is read from target memory: every object's type is checked before it is interpreted, string and array
// reads are bounded, and a frame that cannot be resolved gets a visible "<unresolved ...>" label instead of a guess.
#ifndef RVBPFD_SRC_STACKS_SYMBOLIZER_H_
#define RVBPFD_SRC_STACKS_SYMBOLIZER_H_

#include <linux/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rvbpfd/ruby_walker_types.h"
#include "stacks/memory_reader.h"
#include "stacks/ruby_offsets.h"

namespace rvbpfd {

// std::nullopt stands for Ruby's nil (rb_profile_frame_path of a cfunc, first_lineno of a cfunc, ...).
struct SymbolizedFrame {
  std::optional<std::string> full_label;     // rb_profile_frame_full_label
  std::optional<std::string> path;           // rb_profile_frame_path
  std::optional<std::string> absolute_path;  // rb_profile_frame_absolute_path ("<cfunc>" for C functions)
  std::optional<int> first_lineno;           // rb_profile_frame_first_lineno
  int line = 0;                              // the line rb_profile_frames reports
  bool resolved = true;                      // false: full_label is "<unresolved ...>" and the rest is empty
  bool truncated = false;                    // a label or path was cut to kMaxLabelBytes (common/label_bound.h)
};

class Symbolizer {
 public:
  // Longest string read from the target (labels, paths, class names), in bytes. Longer ones are unresolved; what is
  // kept of a label or path is cut further, to kMaxLabelBytes.
  static constexpr size_t kMaxStringBytes = 64 * 1024;

  // `global_symbols` is the runtime address of ruby_global_symbols (0: C function names are unresolved);
  // `current_vm_ptr` that of ruby_current_vm_ptr, which 3.2's class paths need (vm->shape_list; 0: 3.2 methods'
  // classes are unresolved; other versions do not read it).
  Symbolizer(MemoryReader* mem, const RubyOffsets& offsets, uint64_t global_symbols, uint64_t current_vm_ptr = 0)
      : mem_(mem), off_(offsets), global_symbols_(global_symbols), current_vm_ptr_(current_vm_ptr) {}

  // Labels and paths come back cut to kMaxLabelBytes and marked (common/label_bound.h): this is the one place
  // where they are made, so the recorder, its traces and the agent all hold the same bounded strings.
  SymbolizedFrame Symbolize(const rv_ruby_frame& frame);

  // Pieces, public for tests. Each returns nullopt when the target memory does not hold what it should.
  std::optional<std::string> ReadString(uint64_t value);       // a T_STRING's bytes
  std::optional<int> LineNumber(uint64_t iseq, uint64_t pc);  // calc_lineno(iseq, pc)

  // One iseq's line table (insns_info's lines and the succinct index from instruction positions to them), read in
  // one batch, so that any pc of the iseq is mapped to its line without reading again: LineNumber costs about nine
  // dependent reads per pc, and a sampled frame's pc is a new one each time in a hot method.
  struct LineTable {
    uint64_t encoded = 0;        // body->iseq_encoded
    uint32_t iseq_size = 0;      // body->iseq_size, words
    uint32_t size = 0;           // body->insns_info.size, entries
    std::vector<uint64_t> succ;  // succ_index_table (size > 1): the 6-word immediate part, then 10 words per block
                                 // of 512 positions, up to the block of the iseq's last position
    std::vector<int32_t> lines;  // insns_info.body[i].line_no
    size_t bytes() const { return sizeof(LineTable) + 8 * succ.capacity() + 4 * lines.capacity(); }
  };
  // Larger tables (iseqs of tens of thousands of instructions) are not read whole: LineNumber serves them.
  static constexpr size_t kMaxLineTableReadBytes = 64 * 1024;
  // nullopt when the iseq's memory does not hold a readable table or it is over kMaxLineTableReadBytes.
  std::optional<LineTable> ReadLineTable(uint64_t iseq);
  // What LineNumber(iseq, pc) gives for a pc != 0 (3.1's pc-less frames have a rule of their own), from the table
  // of that iseq, with the same reads done once: the same line, or nullopt for a pc outside the iseq.
  static std::optional<int> LineAt(const LineTable& table, uint64_t pc);
  // rb_id2str: the String of an ID through the global symbol table (nullopt when absent, or while the table at
  // `global_symbols` does not pass GlobalSymbolsUsable()).
  std::optional<std::string> IdToString(uint64_t id);
  // Whether `global_symbols` holds an rb_symbols_t: last_id above the operator IDs, ids a T_ARRAY with one chunk per
  // 512 serials, and ID '+' naming "+". The address may come from disassembly (stripped binaries) or the VM may not
  // have built the table yet, so it is checked before the first use; a pass is remembered, a failure re-checked.
  bool GlobalSymbolsUsable();

 private:
  // A read value that may also be Ruby's nil; `ok == false` means the memory was unusable.
  struct MaybeString {
    bool ok = true;
    std::optional<std::string> value;
  };
  bool ReadWord(uint64_t addr, uint64_t* out) { return mem_->ReadValue(addr, out); }
  // The fields of an iseq's body that its line numbers need (LineNumber and ReadLineTable read the same ones).
  struct LineHeader {
    uint64_t encoded = 0;
    uint32_t iseq_size = 0;
    uint32_t size = 0;    // insns_info entries
    uint64_t insns = 0;   // insns_info.body
    uint64_t table = 0;   // succ_index_table, read only when size > 1 (then never 0)
  };
  bool ReadLineHeader(uint64_t iseq, LineHeader* h);
  std::optional<uint64_t> Flags(uint64_t obj);
  std::optional<std::string> LookupId(uint64_t id);  // IdToString without the table check
  bool IsType(uint64_t obj, uint64_t type);
  bool IsImemo(uint64_t obj, uint64_t imemo_type);
  std::optional<uint64_t> ArrayEntry(uint64_t ary, uint64_t index);  // Qnil-like results come back as is
  bool IsSingleton(uint64_t klass);
  // The hidden class ivars of 3.1 (klass_ext_ptr != 0: RCLASS_EXT(klass)->iv_tbl) and 3.2 (klass_ext_inline != 0:
  // object shapes): found, absent, or unreadable.
  enum class Lookup { kFound, kAbsent, kError };
  enum HiddenIvar { kIvarClasspath, kIvarTmpClasspath, kIvarAttached, kHiddenIvarCount };
  bool HiddenIvarClasses() const { return off_.klass_ext_ptr != 0 || off_.klass_ext_inline != 0; }
  Lookup ClassIvar(uint64_t klass, HiddenIvar which, uint64_t* value);
  Lookup ShapeClassIvar(uint64_t klass, HiddenIvar which, uint64_t* value);
  // Learns the hidden ivars' IDs from an ID met in a table or shape (by name through the ID table).
  void LearnHiddenIvarId(uint64_t id);
  // classname()'s stored path object (0 when none was assigned); false when unreadable.
  bool StoredClassPath(uint64_t klass, uint64_t* path);
  // A singleton class's attached object; false when unreadable.
  bool AttachedObject(uint64_t klass, uint64_t* obj);
  std::optional<uint64_t> RealClass(uint64_t klass);                  // rb_class_real
  std::optional<std::string> ClassPath(uint64_t klass, int depth);    // rb_class_path
  MaybeString Classpath(uint64_t cme);                                // rb_profile_frame_classpath
  bool IsSingletonOwner(uint64_t cme);  // rb_profile_frame_singleton_method_p
  std::optional<uint64_t> MethodIseq(uint64_t cme);                   // def->body.iseq.iseqptr
  bool ReadFirstLineno(uint64_t body, int32_t* out);  // location.first_lineno (an int, or 3.1's Fixnum VALUE)
  SymbolizedFrame Unresolved(const rv_ruby_frame& frame, const std::string& why);
  SymbolizedFrame SymbolizeUnbounded(const rv_ruby_frame& frame);  // Symbolize before the labels are bounded

  MemoryReader* mem_;
  RubyOffsets off_;
  uint64_t global_symbols_;
  uint64_t current_vm_ptr_;
  // IDs of __classpath__, __tmp_classpath__, __attached__ once seen (0: not yet). IDs never change in a process.
  uint64_t hidden_ivar_ids_[kHiddenIvarCount] = {};
  bool global_symbols_ok_ = false;
};

// "0x" + 16 lower-case hex digits: rb_sprintf's %p, as used in "#<Class:%p>".
std::string RubyPointerString(uint64_t value);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_STACKS_SYMBOLIZER_H_
