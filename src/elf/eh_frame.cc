#include "elf/eh_frame.h"

#include <elf.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <span>
#include <string>

namespace rvbpfd {
namespace {

// DWARF pointer encodings (DW_EH_PE_*) as used in .eh_frame (LSB 5.0, "Exception Frames").
constexpr uint8_t kPeOmit = 0xff;
constexpr uint8_t kPeFormatMask = 0x0f;
constexpr uint8_t kPeApplMask = 0x70;
constexpr uint8_t kPeAbsptr = 0x00, kPeUleb128 = 0x01, kPeUdata2 = 0x02, kPeUdata4 = 0x03, kPeUdata8 = 0x04,
                  kPeSleb128 = 0x09, kPeSdata2 = 0x0a, kPeSdata4 = 0x0b, kPeSdata8 = 0x0c;
constexpr uint8_t kPePcrel = 0x10;

// A bounded cursor over the section bytes; every read fails (ok = false) instead of running past the end.
struct Cursor {
  std::span<const uint8_t> data;
  uint64_t pos = 0;
  uint64_t limit = 0;  // end of the current entry
  bool ok = true;

  bool Need(uint64_t n) {
    if (!ok || pos > limit || limit - pos < n) ok = false;
    return ok;
  }
  uint64_t Fixed(uint64_t n) {
    if (!Need(n)) return 0;
    uint64_t v = 0;
    std::memcpy(&v, data.data() + pos, n);  // little-endian host and file (ElfFile accepts only ELFDATA2LSB)
    pos += n;
    return v;
  }
  uint64_t Uleb() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (!Need(1)) return 0;
      uint8_t b = data[pos++];
      v |= uint64_t{b & 0x7fu} << shift;
      if ((b & 0x80) == 0) return v;
    }
    ok = false;
    return 0;
  }
  int64_t Sleb() {
    int64_t v = 0;
    int shift = 0;
    uint8_t b = 0;
    do {
      if (!Need(1) || shift >= 64) {
        ok = false;
        return 0;
      }
      b = data[pos++];
      v |= static_cast<int64_t>(uint64_t{b & 0x7fu} << shift);
      shift += 7;
    } while ((b & 0x80) != 0);
    if (shift < 64 && (b & 0x40) != 0) v |= -(int64_t{1} << shift);
    return v;
  }
  // An encoded pointer; `field_vaddr` is the vaddr of the field itself (the base of pc-relative values).
  uint64_t Encoded(uint8_t enc, uint64_t field_vaddr, bool apply_base) {
    uint64_t v = 0;
    switch (enc & kPeFormatMask) {
      case kPeAbsptr: v = Fixed(8); break;
      case kPeUleb128: v = Uleb(); break;
      case kPeUdata2: v = Fixed(2); break;
      case kPeUdata4: v = Fixed(4); break;
      case kPeUdata8: v = Fixed(8); break;
      case kPeSleb128: v = static_cast<uint64_t>(Sleb()); break;
      case kPeSdata2: v = static_cast<uint64_t>(static_cast<int64_t>(static_cast<int16_t>(Fixed(2)))); break;
      case kPeSdata4: v = static_cast<uint64_t>(static_cast<int64_t>(static_cast<int32_t>(Fixed(4)))); break;
      case kPeSdata8: v = Fixed(8); break;
      default: ok = false; return 0;
    }
    if (!apply_base) return v;
    switch (enc & kPeApplMask) {
      case 0: return v;
      case kPePcrel: return field_vaddr + v;
      default: ok = false; return 0;  // datarel/textrel/funcrel do not occur in x86-64 .eh_frame FDEs
    }
  }
};

}  // namespace

Result<std::vector<CodeRange>> FunctionRangesFromEhFrame(const ElfFile& elf) {
  std::optional<ElfSection> sec = elf.FindSection(".eh_frame");
  if (!sec || sec->type == SHT_NOBITS) {
    return Error(ErrorCode::kNoSymbols, elf.path() + " has no .eh_frame: its functions cannot be told apart");
  }
  std::span<const uint8_t> data = elf.SectionData(*sec);
  if (data.empty()) return Error(ErrorCode::kNoSymbols, elf.path() + ": .eh_frame lies outside the file");
  auto bad = [&](uint64_t at, const char* what) {
    return Error(ErrorCode::kNoSymbols, elf.path() + ": .eh_frame entry at +" + std::to_string(at) + ": " + what);
  };
  std::map<uint64_t, uint8_t> fde_encoding_of_cie;  // CIE offset -> its FDE pointer encoding ('R')
  std::vector<CodeRange> out;
  uint64_t pos = 0;
  while (pos < data.size()) {
    Cursor c{data, pos, data.size()};
    const uint64_t entry = pos;
    uint64_t length = c.Fixed(4);
    if (!c.ok) return bad(entry, "truncated length");
    if (length == 0) break;  // terminator
    if (length == 0xffffffffu) {
      length = c.Fixed(8);
      if (!c.ok) return bad(entry, "truncated 64-bit length");
    }
    if (length > data.size() - c.pos) return bad(entry, "length runs past the section");
    const uint64_t id_pos = c.pos;
    c.limit = c.pos + length;
    const uint64_t next = c.limit;
    const uint64_t id = c.Fixed(4);
    if (!c.ok) return bad(entry, "truncated id");
    if (id == 0) {
      // CIE: version, augmentation, code/data alignment, return register, augmentation data.
      const uint8_t version = static_cast<uint8_t>(c.Fixed(1));
      std::string aug;
      while (c.Need(1) && data[c.pos] != 0) aug += static_cast<char>(data[c.pos++]);
      c.Fixed(1);
      if (!c.ok || (version != 1 && version != 3)) return bad(entry, "unsupported CIE");
      c.Uleb();
      c.Sleb();
      if (version == 1) c.Fixed(1); else c.Uleb();
      uint8_t fde_enc = kPeAbsptr;
      if (!aug.empty() && aug[0] == 'z') {
        c.Uleb();  // augmentation data length; the fields are parsed one by one below
        for (size_t i = 1; i < aug.size() && c.ok; ++i) {
          switch (aug[i]) {
            case 'R': fde_enc = static_cast<uint8_t>(c.Fixed(1)); break;
            case 'L': c.Fixed(1); break;
            case 'P': {
              const uint8_t penc = static_cast<uint8_t>(c.Fixed(1));
              c.Encoded(penc & 0x7f, 0, false);
              break;
            }
            case 'S': case 'B': case 'G': break;
            default: return bad(entry, "unknown CIE augmentation");
          }
        }
      } else if (!aug.empty()) {
        return bad(entry, "unknown CIE augmentation");
      }
      if (!c.ok) return bad(entry, "truncated CIE");
      fde_encoding_of_cie[entry] = fde_enc;
    } else {
      // FDE: the CIE pointer is relative to its own field.
      if (id > id_pos) return bad(entry, "CIE pointer before the section");
      auto cie = fde_encoding_of_cie.find(id_pos - id);
      if (cie == fde_encoding_of_cie.end()) return bad(entry, "FDE without a preceding CIE");
      const uint8_t enc = cie->second;
      if (enc == kPeOmit) return bad(entry, "FDE without a pc_begin encoding");
      const uint64_t begin = c.Encoded(enc, sec->addr + c.pos, true);
      const uint64_t range = c.Encoded(enc & kPeFormatMask, 0, false);
      if (!c.ok) return bad(entry, "truncated FDE");
      if (range != 0 && begin + range > begin) {
        bool in_code = false;
        for (const ElfSegment& s : elf.load_segments()) {
          if ((s.flags & PF_X) != 0 && begin >= s.vaddr && begin + range <= s.vaddr + s.filesz) in_code = true;
        }
        if (in_code) out.push_back({begin, begin + range});
      }
    }
    pos = next;
  }
  // One range per start (the longest), each cut at the next one's start: a real binary's FDEs do not overlap, and a
  // crafted file's overlapping ones would make every walk over the ranges quadratic in the code.
  std::sort(out.begin(), out.end(),
            [](const CodeRange& a, const CodeRange& b) { return a.start != b.start ? a.start < b.start : a.end > b.end; });
  out.erase(std::unique(out.begin(), out.end(), [](const CodeRange& a, const CodeRange& b) { return a.start == b.start; }),
            out.end());
  for (size_t i = 0; i + 1 < out.size(); ++i) out[i].end = std::min(out[i].end, out[i + 1].start);
  if (out.empty()) return Error(ErrorCode::kNoSymbols, elf.path() + ": .eh_frame describes no code");
  return out;
}

std::optional<CodeRange> RangeContaining(const std::vector<CodeRange>& ranges, uint64_t vaddr) {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), vaddr,
                             [](uint64_t v, const CodeRange& r) { return v < r.start; });
  if (it == ranges.begin()) return std::nullopt;
  --it;
  if (vaddr >= it->start && vaddr < it->end) return *it;
  return std::nullopt;
}

}  // namespace rvbpfd
