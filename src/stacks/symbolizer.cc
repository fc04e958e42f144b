#include "stacks/symbolizer.h"

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <span>
#include <vector>

#include "common/label_bound.h"

namespace rvbpfd {

namespace {

// RBasic.flags builtin types (ruby/internal/value_type.h).
constexpr uint64_t kTString = 0x05;
constexpr uint64_t kTArray = 0x07;
constexpr uint64_t kTClass = 0x02;
constexpr uint64_t kTModule = 0x03;
constexpr uint64_t kTIClass = 0x1c;
constexpr uint64_t kImemoIseq = 7;
// RSTRING_NOEMBED and RARRAY_EMBED_FLAG are both FL_USER1; the embedded array length is in FL_USER3..9.
constexpr uint64_t kFlUser1 = 0x2000;
constexpr int kArrayEmbedLenShift = 15;
constexpr uint32_t kIseqTypeMethod = 1;  // ISEQ_TYPE_METHOD
// rb_symbols_t: IDs are stored in chunks of ID_ENTRY_UNIT serials, ID_ENTRY_SIZE slots each (String, Symbol).
constexpr uint64_t kIdEntryUnit = 512;
constexpr uint64_t kIdEntrySize = 2;
constexpr int kIdScopeShift = 4;  // RUBY_ID_SCOPE_SHIFT
// Succinct bitvector (iseq.c): 54 positions are encoded in imm_part[6] (9 x 7-bit ranks per word), the rest in
// 80-byte blocks of 512 bits: {u32 rank, pad, u64 small_block_ranks (7 x 9 bits), u64 bits[8]}.
constexpr uint64_t kImmediateTableSize = 54;
constexpr uint64_t kSuccPartOffset = 48;
constexpr uint64_t kSuccBlockBytes = 80;
constexpr uint64_t kInsnInfoEntryBytes = 12;
// One block of the succinct table's second part: 512 positions (succ_dict_block).
struct SuccBlock {
  uint32_t rank;
  uint32_t pad;
  uint64_t small_block_ranks;
  uint64_t bits[8];
};
static_assert(sizeof(SuccBlock) == kSuccBlockBytes);
// calc_lineno's instruction position of pc: (pc - iseq_encoded) in words, minus one when non-zero (pc already points
// past the current instruction); nullopt for a pc outside the iseq or not on a word.
std::optional<uint64_t> PositionOf(uint64_t encoded, uint32_t iseq_size, uint64_t pc) {
  if (pc < encoded || (pc - encoded) % 8 != 0 || (pc - encoded) / 8 > iseq_size) return std::nullopt;
  const uint64_t pos = (pc - encoded) / 8;
  return pos > 0 ? pos - 1 : 0;
}
// The 1-based insns_info index of a position below kImmediateTableSize, from its immediate word (9 per word).
uint64_t ImmediateIndex(uint64_t imm, uint64_t pos) { return (imm >> (7 * (pos % 9))) & 0x7f; }
// The same for position kImmediateTableSize + x, from its block (succ_index_lookup).
uint64_t BlockIndex(const SuccBlock& block, uint64_t x) {
  const uint64_t bit = x % 512, small = bit / 64;
  const uint64_t small_rank = small == 0 ? 0 : (block.small_block_ranks >> (9 * (small - 1))) & 0x1ff;
  return block.rank + small_rank + __builtin_popcountll(block.bits[small] << (63 - bit % 64));
}
// 3.1 st_table (include/ruby/st.h): {u8 entry_power, bin_power, size_ind; u32 rebuilds_num; type; num_entries; bins;
// entries_start; entries_bound; entries}, entries being {hash, key, record} triples; hash ~0 marks a deleted entry.
struct StTable {
  uint8_t entry_power, bin_power, size_ind;
  uint32_t rebuilds_num;
  uint64_t type, num_entries, bins, entries_start, entries_bound, entries;
};
static_assert(sizeof(StTable) == 56);
struct StEntry {
  uint64_t hash, key, record;
};
static_assert(sizeof(StEntry) == 24);
constexpr uint64_t kStDeletedHash = ~uint64_t{0};
// A class's ivar table holds its class-level ivars plus a few hidden ones; more is not a class we can trust.
constexpr uint64_t kMaxClassIvars = 1024;
constexpr uint32_t kIseqTypeTop = 0;  // ISEQ_TYPE_TOP
// 3.2 shapes (shape.h): the id in the upper half of RBasic.flags, the parent of the root, SHAPE_IVAR.
constexpr int kShapeFlagShift = 32;
constexpr uint32_t kInvalidShapeId = 0xffffffff;
constexpr uint8_t kShapeIvar = 1;
// Nesting bound for rb_tmp_class_path's recursion through an anonymous module's class.
constexpr int kMaxClassPathDepth = 8;
// rb_class_real's walk up singleton classes and iclasses.
constexpr int kMaxSuperHops = 64;

bool IsHeapObject(uint64_t v) {
  // Special constants (nil, true, false, undef, Fixnums, Flonums, static Symbols) are small or tagged.
  return v >= 4096 && (v & 7) == 0;
}

}  // namespace

std::string RubyPointerString(uint64_t value) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%016" PRIx64, value);
  return buf;
}

std::optional<uint64_t> Symbolizer::Flags(uint64_t obj) {
  uint64_t flags = 0;
  if (!IsHeapObject(obj) || !ReadWord(obj, &flags)) return std::nullopt;
  return flags;
}

bool Symbolizer::IsType(uint64_t obj, uint64_t type) {
  std::optional<uint64_t> f = Flags(obj);
  return f && (*f & RV_RB_T_MASK) == type;
}

bool Symbolizer::IsImemo(uint64_t obj, uint64_t imemo_type) {
  std::optional<uint64_t> f = Flags(obj);
  return f && (*f & RV_RB_T_MASK) == RV_RB_T_IMEMO && ((*f >> RV_RB_IMEMO_SHIFT) & RV_RB_IMEMO_MASK) == imemo_type;
}

std::optional<std::string> Symbolizer::ReadString(uint64_t value) {
  std::optional<uint64_t> flags = Flags(value);
  if (!flags || (*flags & RV_RB_T_MASK) != kTString) return std::nullopt;
  const bool embedded = !(*flags & kFlUser1);  // RSTRING_NOEMBED: as.heap.{len, ptr}
  int64_t len = 0;
  if (embedded && off_.string_embed_len_mask != 0) {
    // 3.1: RSTRING_EMBED_LEN_MASK bits of the flags.
    len = static_cast<int64_t>((*flags & off_.string_embed_len_mask) >> __builtin_ctzll(off_.string_embed_len_mask));
  } else if (!mem_->ReadValue(value + 16, &len) || len < 0 || static_cast<uint64_t>(len) > kMaxStringBytes) {
    return std::nullopt;
  }
  if (len == 0) return std::string();
  uint64_t ptr = value + off_.string_embed_bytes;
  if (!embedded) {
    if (!ReadWord(value + 24, &ptr) || ptr == 0) return std::nullopt;
  }
  std::string s(static_cast<size_t>(len), '\0');
  if (!mem_->Read(ptr, s.data(), s.size())) return std::nullopt;
  return s;
}

std::optional<uint64_t> Symbolizer::ArrayEntry(uint64_t ary, uint64_t index) {
  std::optional<uint64_t> flags = Flags(ary);
  if (!flags || (*flags & RV_RB_T_MASK) != kTArray) return std::nullopt;
  uint64_t len = 0, elems = 0;
  if (*flags & kFlUser1) {  // RARRAY_EMBED_FLAG
    len = (*flags >> kArrayEmbedLenShift) & off_.array_embed_len_mask;
    elems = ary + 16;
  } else if (!ReadWord(ary + 16, &len) || !ReadWord(ary + 32, &elems) || elems == 0) {
    return std::nullopt;
  }
  // rb_ary_entry returns nil past the end; callers treat "absent" the same way.
  if (index >= len) return std::nullopt;
  uint64_t v = 0;
  if (!ReadWord(elems + index * 8, &v)) return std::nullopt;
  return v;
}

bool Symbolizer::GlobalSymbolsUsable() {
  if (global_symbols_ok_) return true;
  if (global_symbols_ == 0) return false;
  uint32_t last_id = 0;
  uint64_t ids = 0, len = 0;
  if (!mem_->ReadValue(global_symbols_ + off_.symbols_last_id, &last_id) ||
      !ReadWord(global_symbols_ + off_.symbols_ids, &ids) || last_id <= off_.last_op_id) {
    return false;
  }
  std::optional<uint64_t> flags = Flags(ids);
  if (!flags || (*flags & RV_RB_T_MASK) != kTArray) return false;
  if (*flags & kFlUser1) {
    len = (*flags >> kArrayEmbedLenShift) & off_.array_embed_len_mask;
  } else if (!ReadWord(ids + 16, &len)) {
    return false;
  }
  // One chunk per ID_ENTRY_UNIT serials, created as serials are handed out (the newest may still be on its way).
  if (len < last_id / kIdEntryUnit || len > last_id / kIdEntryUnit + 1) return false;
  // Operator IDs are their own character: rb_id2str('+') is "+" in every version.
  std::optional<std::string> plus = LookupId('+');
  global_symbols_ok_ = plus && *plus == "+";
  return global_symbols_ok_;
}

std::optional<std::string> Symbolizer::IdToString(uint64_t id) {
  if (!GlobalSymbolsUsable()) return std::nullopt;
  return LookupId(id);
}

std::optional<std::string> Symbolizer::LookupId(uint64_t id) {
  if (id == 0 || global_symbols_ == 0) return std::nullopt;
  // rb_id_to_serial: operator IDs (up to tLAST_OP_ID) are their own serial, others carry scope bits.
  const uint64_t serial = id > off_.last_op_id ? id >> kIdScopeShift : id;
  uint32_t last_id = 0;
  uint64_t ids = 0;
  if (!mem_->ReadValue(global_symbols_ + off_.symbols_last_id, &last_id) ||
      !ReadWord(global_symbols_ + off_.symbols_ids, &ids)) {
    return std::nullopt;
  }
  if (serial == 0 || serial > last_id) return std::nullopt;
  std::optional<uint64_t> chunk = ArrayEntry(ids, serial / kIdEntryUnit);
  if (!chunk) return std::nullopt;
  std::optional<uint64_t> str = ArrayEntry(*chunk, (serial % kIdEntryUnit) * kIdEntrySize);
  if (!str) return std::nullopt;
  return ReadString(*str);
}

bool Symbolizer::ReadFirstLineno(uint64_t body, int32_t* out) {
  const uint64_t addr = body + off_.body_location + off_.loc_first_lineno;
  if (!off_.loc_first_lineno_is_fixnum) return mem_->ReadValue(addr, out);
  // 3.1: INT2FIX(lineno) = (lineno << 1) | 1.
  int64_t v = 0;
  if (!mem_->ReadValue(addr, &v) || (v & 1) == 0) return false;
  v >>= 1;
  if (v < INT32_MIN || v > INT32_MAX) return false;
  *out = static_cast<int32_t>(v);
  return true;
}

std::optional<int> Symbolizer::LineNumber(uint64_t iseq, uint64_t pc) {
  if (!IsImemo(iseq, kImemoIseq)) return std::nullopt;
  if (pc == 0 && (off_.walk.flags & RV_RB_WALK_F_NULL_PC_IS_RUBY_FRAME)) {
    // 3.1 calc_pos() without a pc: 0 for a TOP iseq (rb_vm_call_cfunc's frame), else the iseq's first line.
    uint64_t body = 0;
    uint32_t type = 0;
    int32_t first = 0;
    if (!ReadWord(iseq + off_.iseq_body, &body) || body == 0 || !mem_->ReadValue(body + off_.body_type, &type)) {
      return std::nullopt;
    }
    if (type == kIseqTypeTop) return 0;
    if (!ReadFirstLineno(body, &first)) return std::nullopt;
    return first;
  }
  LineHeader h;
  if (!ReadLineHeader(iseq, &h)) return std::nullopt;
  const std::optional<uint64_t> pos = PositionOf(h.encoded, h.iseq_size, pc);
  if (!pos) return std::nullopt;
  if (h.size == 0) return 0;  // no line information: rb_iseq_line_no returns 0
  uint64_t index = 1;
  if (h.size > 1) {
    if (*pos < kImmediateTableSize) {
      uint64_t imm = 0;
      if (!ReadWord(h.table + (*pos / 9) * 8, &imm)) return std::nullopt;
      index = ImmediateIndex(imm, *pos);
    } else {
      const uint64_t x = *pos - kImmediateTableSize;
      SuccBlock block;
      if (!mem_->Read(h.table + kSuccPartOffset + (x / 512) * kSuccBlockBytes, &block, sizeof(block))) {
        return std::nullopt;
      }
      index = BlockIndex(block, x);
    }
  }
  if (index < 1 || index > h.size) return std::nullopt;  // CRuby would index insns_info[-1]: a corrupt table
  int32_t line = 0;
  if (!mem_->ReadValue(h.insns + (index - 1) * kInsnInfoEntryBytes, &line)) return std::nullopt;
  return line;
}

bool Symbolizer::ReadLineHeader(uint64_t iseq, LineHeader* h) {
  uint64_t body = 0;
  if (!ReadWord(iseq + off_.iseq_body, &body) || body == 0 || !ReadWord(body + off_.body_iseq_encoded, &h->encoded) ||
      !mem_->ReadValue(body + off_.body_iseq_size, &h->iseq_size) ||
      !mem_->ReadValue(body + off_.body_insns_info_size, &h->size) ||
      !ReadWord(body + off_.body_insns_info_body, &h->insns)) {
    return false;
  }
  if (h->size > 1 && (!ReadWord(body + off_.body_succ_index_table, &h->table) || h->table == 0)) return false;
  return true;
}

std::optional<Symbolizer::LineTable> Symbolizer::ReadLineTable(uint64_t iseq) {
  if (!IsImemo(iseq, kImemoIseq)) return std::nullopt;
  LineHeader h;
  if (!ReadLineHeader(iseq, &h)) return std::nullopt;
  LineTable t;
  t.encoded = h.encoded;
  t.iseq_size = h.iseq_size;
  t.size = h.size;
  // The index words any position of the iseq can reach (LineNumber's reads for every pc), and every entry's line.
  const uint64_t blocks = h.size > 1 && h.iseq_size > kImmediateTableSize
                              ? (uint64_t{h.iseq_size} - kImmediateTableSize - 1) / 512 + 1
                              : 0;
  const uint64_t succ_bytes = h.size > 1 ? kSuccPartOffset + blocks * kSuccBlockBytes : 0;
  const uint64_t insns_bytes = uint64_t{h.size} * kInsnInfoEntryBytes;
  if (succ_bytes + insns_bytes > kMaxLineTableReadBytes) return std::nullopt;
  t.succ.resize(succ_bytes / 8);
  std::vector<uint8_t> entries(insns_bytes);
  MemoryReader::Request reads[2];
  size_t n = 0;
  if (succ_bytes > 0) reads[n++] = {h.table, t.succ.data(), succ_bytes};
  if (insns_bytes > 0) reads[n++] = {h.insns, entries.data(), insns_bytes};
  if (mem_->ReadMany(std::span(reads, n)) != n) return std::nullopt;
  t.lines.resize(h.size);
  for (size_t i = 0; i < h.size; ++i) std::memcpy(&t.lines[i], entries.data() + i * kInsnInfoEntryBytes, 4);
  return t;
}

std::optional<int> Symbolizer::LineAt(const LineTable& t, uint64_t pc) {
  const std::optional<uint64_t> pos = PositionOf(t.encoded, t.iseq_size, pc);
  if (!pos) return std::nullopt;
  if (t.size == 0) return 0;
  uint64_t index = 1;
  if (t.size > 1) {
    // ReadLineTable sized succ for every position of the iseq; a table made otherwise is checked, not trusted.
    if (*pos < kImmediateTableSize) {
      if (*pos / 9 >= t.succ.size()) return std::nullopt;
      index = ImmediateIndex(t.succ[*pos / 9], *pos);
    } else {
      const uint64_t x = *pos - kImmediateTableSize;
      const uint64_t word = (kSuccPartOffset + (x / 512) * kSuccBlockBytes) / 8;
      if (word + kSuccBlockBytes / 8 > t.succ.size()) return std::nullopt;
      SuccBlock block;
      std::memcpy(&block, t.succ.data() + word, sizeof(block));
      index = BlockIndex(block, x);
    }
  }
  if (index < 1 || index > t.size || index > t.lines.size()) return std::nullopt;
  return t.lines[index - 1];
}

bool Symbolizer::IsSingleton(uint64_t klass) {
  std::optional<uint64_t> f = Flags(klass);
  if (!f || !(*f & off_.fl_singleton)) return false;
  return !off_.singleton_requires_t_class || (*f & RV_RB_T_MASK) == kTClass;
}

std::optional<uint64_t> Symbolizer::RealClass(uint64_t klass) {
  for (int i = 0; i < kMaxSuperHops; i++) {
    if (klass == 0) return klass;
    std::optional<uint64_t> f = Flags(klass);
    if (!f) return std::nullopt;
    if (!IsSingleton(klass) && (*f & RV_RB_T_MASK) != kTIClass) return klass;
    if (!ReadWord(klass + off_.klass_super, &klass)) return std::nullopt;
  }
  return std::nullopt;
}

void Symbolizer::LearnHiddenIvarId(uint64_t id) {
  static constexpr const char* kNames[] = {"__classpath__", "__tmp_classpath__", "__attached__"};
  static_assert(std::size(kNames) == kHiddenIvarCount);
  std::optional<std::string> name = IdToString(id);
  if (!name) return;
  for (size_t i = 0; i < kHiddenIvarCount; i++) {
    if (*name == kNames[i]) hidden_ivar_ids_[i] = id;
  }
}

Symbolizer::Lookup Symbolizer::ShapeClassIvar(uint64_t klass, HiddenIvar which, uint64_t* value) {
  // rb_ivar_lookup (T_CLASS/T_MODULE) -> rb_shape_get_iv_index, 3.2's variable.c and shape.c.
  std::optional<uint64_t> f = Flags(klass);
  if (!f) return Lookup::kError;
  uint32_t shape_id = static_cast<uint32_t>(*f >> kShapeFlagShift);
  uint64_t vm = 0, shapes = 0;
  uint32_t next_shape_id = 0;
  if (current_vm_ptr_ == 0 || !ReadWord(current_vm_ptr_, &vm) || vm == 0 ||
      !ReadWord(vm + off_.vm_shape_list, &shapes) || shapes == 0 ||
      !mem_->ReadValue(vm + off_.vm_next_shape_id, &next_shape_id)) {
    return Lookup::kError;
  }
  // Each step goes to a parent, so a well-formed chain is at most as long as the class has ivars (plus the root and
  // capacity changes); a longer one, or an id the VM has not handed out, is corruption.
  for (uint64_t steps = 0; steps <= kMaxClassIvars; ++steps) {
    if (shape_id >= next_shape_id) return Lookup::kError;
    const uint64_t shape = shapes + uint64_t{shape_id} * off_.shape_size;
    uint32_t parent = 0, next_iv_index = 0;
    uint64_t edge_name = 0;
    uint8_t type = 0;
    if (!mem_->ReadValue(shape + off_.shape_parent_id, &parent)) return Lookup::kError;
    if (parent == kInvalidShapeId) return Lookup::kAbsent;  // the root: no such ivar
    if (!ReadWord(shape + off_.shape_edge_name, &edge_name) || !mem_->ReadValue(shape + off_.shape_type, &type)) {
      return Lookup::kError;
    }
    if (type == kShapeIvar && hidden_ivar_ids_[which] == 0) LearnHiddenIvarId(edge_name);
    if (hidden_ivar_ids_[which] != 0 && edge_name == hidden_ivar_ids_[which]) {
      // SHAPE_IVAR gives the index; any other transition named by the ID means the ivar is not there.
      if (type != kShapeIvar) return Lookup::kAbsent;
      if (!mem_->ReadValue(shape + off_.shape_next_iv_index, &next_iv_index)) return Lookup::kError;
      if (next_iv_index == 0 || next_iv_index > kMaxClassIvars) return Lookup::kError;
      uint64_t ivptr = 0;
      if (!ReadWord(klass + off_.klass_ext_inline + off_.classext_iv_ptr, &ivptr) || ivptr == 0) {
        return Lookup::kError;
      }
      return ReadWord(ivptr + uint64_t{next_iv_index - 1} * 8, value) ? Lookup::kFound : Lookup::kError;
    }
    shape_id = parent;
  }
  return Lookup::kError;
}

Symbolizer::Lookup Symbolizer::ClassIvar(uint64_t klass, HiddenIvar which, uint64_t* value) {
  if (off_.klass_ext_inline != 0) return ShapeClassIvar(klass, which, value);
  uint64_t ext = 0, tbl = 0;
  if (!ReadWord(klass + off_.klass_ext_ptr, &ext)) return Lookup::kError;
  if (ext == 0) return Lookup::kAbsent;  // classname(): !RCLASS_EXT(klass)
  if (!ReadWord(ext + off_.classext_iv_tbl, &tbl)) return Lookup::kError;
  if (tbl == 0) return Lookup::kAbsent;
  StTable t;
  if (!mem_->ReadValue(tbl, &t)) return Lookup::kError;
  if (t.entries_start > t.entries_bound || t.entries_bound - t.entries_start > kMaxClassIvars || t.entry_power >= 32 ||
      t.entries_bound > (uint64_t{1} << t.entry_power)) {
    return Lookup::kError;
  }
  const uint64_t n = t.entries_bound - t.entries_start;
  if (n == 0) return Lookup::kAbsent;
  if (t.entries == 0) return Lookup::kError;
  std::vector<StEntry> entries(n);
  if (!mem_->Read(t.entries + t.entries_start * sizeof(StEntry), entries.data(), n * sizeof(StEntry))) {
    return Lookup::kError;
  }
  // st_lookup by linear scan: the table's ID keys are compared as numbers (a numtable); deleted entries are skipped.
  // The hidden ivars' IDs are learned by name through the ID table the first time they are seen.
  for (const StEntry& e : entries) {
    if (e.hash == kStDeletedHash) continue;
    if (hidden_ivar_ids_[which] == 0) LearnHiddenIvarId(e.key);
    if (hidden_ivar_ids_[which] != 0 && e.key == hidden_ivar_ids_[which]) {
      *value = e.record;
      return Lookup::kFound;
    }
  }
  return Lookup::kAbsent;
}

bool Symbolizer::StoredClassPath(uint64_t klass, uint64_t* path) {
  *path = 0;
  if (!HiddenIvarClasses()) return ReadWord(klass + off_.klass_classpath, path);
  // 3.1/3.2 classname(): __classpath__ (permanent), else __tmp_classpath__.
  for (HiddenIvar which : {kIvarClasspath, kIvarTmpClasspath}) {
    switch (ClassIvar(klass, which, path)) {
      case Lookup::kFound:
        return true;
      case Lookup::kError:
        return false;
      case Lookup::kAbsent:
        break;
    }
  }
  *path = 0;
  return true;
}

bool Symbolizer::AttachedObject(uint64_t klass, uint64_t* obj) {
  if (!HiddenIvarClasses()) return ReadWord(klass + off_.klass_attached_object, obj);
  // 3.1/3.2: rb_ivar_get(klass, id__attached__); a singleton class always has it, so absence is corruption.
  return ClassIvar(klass, kIvarAttached, obj) == Lookup::kFound;
}

std::optional<std::string> Symbolizer::ClassPath(uint64_t klass, int depth) {
  if (depth > kMaxClassPathDepth) return std::nullopt;
  std::optional<uint64_t> f = Flags(klass);
  if (!f) return std::nullopt;
  const uint64_t type = *f & RV_RB_T_MASK;
  if (type != kTClass && type != kTModule && type != kTIClass) return std::nullopt;
  uint64_t classpath = 0;
  if (!StoredClassPath(klass, &classpath)) return std::nullopt;
  // classname(): a permanent or temporary path when one was assigned.
  if (classpath != 0) return ReadString(classpath);
  // make_temporary_path(): "#<Class:%p>", "#<Module:%p>" (a plain Module instance) or "#<ClassPath:%p>" (an instance
  // of a Module subclass, named after its class).
  if (type == kTModule) {
    uint64_t meta = 0;
    if (!ReadWord(klass + 8, &meta)) return std::nullopt;  // RBASIC(klass)->klass
    std::optional<uint64_t> real = RealClass(meta);
    if (!real) return std::nullopt;
    // rb_obj_class(klass) == rb_cModule: the only class whose permanent path is "Module" is rb_cModule itself.
    uint64_t real_path = 0;
    if (*real != 0 && StoredClassPath(*real, &real_path) && real_path != 0) {
      std::optional<std::string> name = ReadString(real_path);
      if (name && *name == "Module") return "#<Module:" + RubyPointerString(klass) + ">";
    }
    std::optional<std::string> parent = ClassPath(meta, depth + 1);
    if (!parent) return std::nullopt;
    return "#<" + *parent + ":" + RubyPointerString(klass) + ">";
  }
  return "#<Class:" + RubyPointerString(klass) + ">";
}

Symbolizer::MaybeString Symbolizer::Classpath(uint64_t cme) {
  MaybeString r;
  // No layout to read class paths with (a 3.2 build whose classext is not inline).
  if (off_.klass_classpath == 0 && !HiddenIvarClasses()) return {false, std::nullopt};
  uint64_t klass = 0;
  if (!ReadWord(cme + off_.cme_defined_class, &klass)) return {false, std::nullopt};
  if (!IsHeapObject(klass)) return r;  // 0 or nil: no class path
  std::optional<uint64_t> f = Flags(klass);
  if (!f) return {false, std::nullopt};
  if ((*f & RV_RB_T_MASK) == kTIClass) {
    if (!ReadWord(klass + 8, &klass)) return {false, std::nullopt};  // the included/prepended module
  } else if (IsSingleton(klass)) {
    uint64_t attached = 0;
    if (!AttachedObject(klass, &attached)) return {false, std::nullopt};
    std::optional<uint64_t> af = Flags(attached);
    if (!af) return {false, std::nullopt};
    const uint64_t at = *af & RV_RB_T_MASK;
    if (at != kTClass && at != kTModule) {
      // A singleton method of a plain object: "#<" + rb_class2name(rb_obj_class(obj)) + ":" + %p + ">".
      uint64_t obj_klass = 0;
      if (!ReadWord(attached + 8, &obj_klass)) return {false, std::nullopt};
      std::optional<uint64_t> real = RealClass(obj_klass);
      if (!real || *real == 0) return {false, std::nullopt};
      std::optional<std::string> name = ClassPath(*real, 0);
      if (!name) return {false, std::nullopt};
      r.value = "#<" + *name + ":" + RubyPointerString(attached) + ">";
      return r;
    }
    klass = attached;
  }
  std::optional<std::string> path = ClassPath(klass, 0);
  if (!path) return {false, std::nullopt};
  r.value = std::move(path);
  return r;
}

bool Symbolizer::IsSingletonOwner(uint64_t cme) {
  uint64_t klass = 0;
  return ReadWord(cme + off_.cme_defined_class, &klass) && IsHeapObject(klass) && IsSingleton(klass);
}

std::optional<uint64_t> Symbolizer::MethodIseq(uint64_t cme) {
  uint64_t def = 0, iseq = 0;
  uint32_t type = 0;
  if (!IsImemo(cme, RV_RB_IMEMO_MENT) || !ReadWord(cme + off_.cme_def, &def) || def == 0 ||
      !mem_->ReadValue(def, &type) || (type & RV_RB_METHOD_TYPE_MASK) != RV_RB_METHOD_TYPE_ISEQ ||
      !ReadWord(def + off_.def_iseqptr, &iseq) || !IsImemo(iseq, kImemoIseq)) {
    return std::nullopt;
  }
  return iseq;
}

SymbolizedFrame Symbolizer::Unresolved(const rv_ruby_frame& frame, const std::string& why) {
  SymbolizedFrame s;
  s.resolved = false;
  s.full_label = "<unresolved " + why + " " + RubyPointerString(frame.addr) + ">";
  return s;
}

SymbolizedFrame Symbolizer::Symbolize(const rv_ruby_frame& frame) {
  SymbolizedFrame s = SymbolizeUnbounded(frame);
  for (std::optional<std::string>* text : {&s.full_label, &s.path, &s.absolute_path}) {
    if (*text) s.truncated |= BoundLabel(&**text);
  }
  return s;
}

SymbolizedFrame Symbolizer::SymbolizeUnbounded(const rv_ruby_frame& frame) {
  SymbolizedFrame s;
  switch (frame.kind) {
    case RV_RB_FRAME_CME_CFUNC: {
      uint64_t def = 0, original_id = 0;
      uint32_t type = 0;
      if (!IsImemo(frame.addr, RV_RB_IMEMO_MENT) || !ReadWord(frame.addr + off_.cme_def, &def) || def == 0 ||
          !mem_->ReadValue(def, &type) || (type & RV_RB_METHOD_TYPE_MASK) != RV_RB_METHOD_TYPE_CFUNC ||
          !ReadWord(def + off_.def_original_id, &original_id)) {
        return Unresolved(frame, "cfunc");
      }
      std::optional<std::string> name = IdToString(original_id);
      if (!name) return Unresolved(frame, "cfunc name");
      MaybeString classpath = Classpath(frame.addr);
      if (!classpath.ok) return Unresolved(frame, "cfunc class");
      s.full_label = classpath.value ? *classpath.value + (IsSingletonOwner(frame.addr) ? "." : "#") + *name : *name;
      s.absolute_path = "<cfunc>";
      s.line = 0;
      return s;
    }
    case RV_RB_FRAME_CME_ISEQ:
    case RV_RB_FRAME_ISEQ:
      break;
    default:
      return Unresolved(frame, "frame");
  }
  // frame2iseq: the method's iseq for a CME, the frame's own iseq otherwise.
  uint64_t iseq = 0;
  if (frame.kind == RV_RB_FRAME_CME_ISEQ) {
    iseq = MethodIseq(frame.addr).value_or(0);
  } else if (IsImemo(frame.addr, kImemoIseq)) {
    iseq = frame.addr;
  }
  if (iseq == 0) return Unresolved(frame, "iseq");
  uint64_t body = 0, label_v = 0, base_label_v = 0, pathobj = 0, local = 0, local_body = 0;
  int32_t first_lineno = 0;
  const uint64_t loc = off_.body_location;
  if (!ReadWord(iseq + off_.iseq_body, &body) || body == 0 || !ReadWord(body + loc + off_.loc_label, &label_v) ||
      !ReadWord(body + loc + off_.loc_base_label, &base_label_v) ||
      !ReadWord(body + loc + off_.loc_pathobj, &pathobj) || !ReadFirstLineno(body, &first_lineno) ||
      !ReadWord(body + off_.body_local_iseq, &local) || !IsImemo(local, kImemoIseq) ||
      !ReadWord(local + off_.iseq_body, &local_body) || local_body == 0) {
    return Unresolved(frame, "iseq body");
  }
  std::optional<std::string> label = ReadString(label_v);
  std::optional<std::string> base_label = ReadString(base_label_v);
  if (!label || !base_label) return Unresolved(frame, "label");
  // pathobj: a String (path == realpath) or a frozen [path, realpath-or-nil] Array.
  if (IsType(pathobj, kTString)) {
    s.path = ReadString(pathobj);
    s.absolute_path = s.path;
    if (!s.path) return Unresolved(frame, "path");
  } else if (IsType(pathobj, kTArray)) {
    std::optional<uint64_t> p = ArrayEntry(pathobj, 0), rp = ArrayEntry(pathobj, 1);
    if (!p || !(s.path = ReadString(*p))) return Unresolved(frame, "path");
    if (rp && IsHeapObject(*rp)) {
      s.absolute_path = ReadString(*rp);
      if (!s.absolute_path) return Unresolved(frame, "realpath");
    }
  } else {
    return Unresolved(frame, "pathobj");
  }
  s.first_lineno = first_lineno;

  // rb_iseq_method_name: the local iseq's base_label when the local iseq is a method, else nil.
  uint32_t local_type = 0;
  if (!mem_->ReadValue(local_body + off_.body_type, &local_type)) return Unresolved(frame, "local iseq");
  std::optional<uint64_t> method_name_v;
  if (local_type == kIseqTypeMethod) {
    uint64_t v = 0;
    if (!ReadWord(local_body + loc + off_.loc_base_label, &v)) return Unresolved(frame, "method name");
    method_name_v = v;
  }
  // rb_profile_frame_full_label: label, unless a qualified method name differs from base_label (VALUE identity in
  // CRuby: without a class path the qualified name IS the method-name object), in which case the label's prefix
  // ("block in ", ...) is kept and the qualified name replaces base_label.
  std::optional<std::string> qualified;
  bool qualified_is_base_label = false;
  if (method_name_v) {
    std::optional<std::string> method_name = ReadString(*method_name_v);
    if (!method_name) return Unresolved(frame, "method name");
    MaybeString classpath =
        frame.kind == RV_RB_FRAME_CME_ISEQ ? Classpath(frame.addr) : MaybeString{true, std::nullopt};
    if (!classpath.ok) return Unresolved(frame, "class");
    if (classpath.value) {
      qualified = *classpath.value + (IsSingletonOwner(frame.addr) ? "." : "#") + *method_name;
    } else {
      qualified = *method_name;
      qualified_is_base_label = *method_name_v == base_label_v;
    }
  }
  if (!qualified || qualified_is_base_label) {
    s.full_label = *label;
  } else {
    const size_t prefix = label->size() >= base_label->size() ? label->size() - base_label->size() : 0;
    s.full_label = label->substr(0, prefix) + *qualified;
  }
  if (frame.flags & RV_RB_FRAME_F_LINE_ZERO) {
    s.line = 0;
  } else {
    std::optional<int> line = LineNumber(frame.cfp_iseq, frame.pc);
    if (!line) return Unresolved(frame, "line");
    s.line = *line;
  }
  return s;
}

}  // namespace rvbpfd
