// Crafted ELF core files for tests: PT_LOAD segments and notes (NT_FILE, NT_PRSTATUS, NT_PRPSINFO, NT_AUXV) laid out
// as the kernel and gdb write them, so that a test can also break any part of them.
#ifndef RVBPFD_TESTS_STACKS_CORE_BUILDER_H_
#define RVBPFD_TESTS_STACKS_CORE_BUILDER_H_

#include <elf.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace rvbpfd::testing {

struct CoreSeg {
  uint64_t vaddr = 0, memsz = 0;
  std::vector<uint8_t> data;  // p_filesz = data.size()
};
struct CoreNoteSpec {
  std::string name;  // "CORE"
  uint32_t type = 0;
  std::vector<uint8_t> desc;
};
struct CoreFileEntry {
  uint64_t start = 0, end = 0, pgoff = 0;
  std::string path;
};

// An x86-64 little-endian ELF header of `type` whose `phnum` program headers follow it.
inline Elf64_Ehdr ElfHeader(uint16_t type, uint16_t phnum) {
  Elf64_Ehdr eh{};
  std::memcpy(eh.e_ident, ELFMAG, SELFMAG);
  eh.e_ident[EI_CLASS] = ELFCLASS64;
  eh.e_ident[EI_DATA] = ELFDATA2LSB;
  eh.e_ident[EI_VERSION] = EV_CURRENT;
  eh.e_type = type;
  eh.e_machine = EM_X86_64;
  eh.e_phoff = sizeof(Elf64_Ehdr);
  eh.e_ehsize = sizeof(Elf64_Ehdr);
  eh.e_phentsize = sizeof(Elf64_Phdr);
  eh.e_phnum = phnum;
  return eh;
}

inline void PutWords(std::vector<uint8_t>* out, size_t off, std::initializer_list<uint64_t> words) {
  if (out->size() < off + 8 * words.size()) out->resize(off + 8 * words.size());
  for (uint64_t w : words) {
    std::memcpy(out->data() + off, &w, 8);
    off += 8;
  }
}

inline std::vector<uint8_t> NtFileDesc(uint64_t page_size, const std::vector<CoreFileEntry>& entries) {
  std::vector<uint8_t> d;
  PutWords(&d, 0, {entries.size(), page_size});
  for (size_t i = 0; i < entries.size(); i++) {
    PutWords(&d, 16 + 24 * i, {entries[i].start, entries[i].end, entries[i].pgoff});
  }
  for (const CoreFileEntry& e : entries) {
    d.insert(d.end(), e.path.begin(), e.path.end());
    d.push_back(0);
  }
  return d;
}

// struct elf_prstatus (x86-64, 336 bytes): pr_cursig at 12, pr_pid at 32, pr_reg at 112 (orig_rax is register 15;
// rdi 14, rsi 13, rdx 12, r10 7, r8 9, r9 8).
inline std::vector<uint8_t> PrstatusDesc(int32_t tid, int64_t orig_rax, uint64_t rdi = 0, uint64_t rsi = 0,
                                         int16_t signal = 0) {
  std::vector<uint8_t> d(336, 0);
  std::memcpy(d.data() + 12, &signal, 2);
  std::memcpy(d.data() + 32, &tid, 4);
  PutWords(&d, 112 + 8 * 15, {static_cast<uint64_t>(orig_rax)});
  PutWords(&d, 112 + 8 * 14, {rdi});
  PutWords(&d, 112 + 8 * 13, {rsi});
  return d;
}

// struct elf_prpsinfo (x86-64, 136 bytes): pr_pid at 24, pr_fname at 40.
inline std::vector<uint8_t> PrpsinfoDesc(int32_t pid, const std::string& fname) {
  std::vector<uint8_t> d(136, 0);
  std::memcpy(d.data() + 24, &pid, 4);
  std::memcpy(d.data() + 40, fname.data(), std::min<size_t>(fname.size(), 16));
  return d;
}

inline std::vector<uint8_t> NoteBytes(const std::vector<CoreNoteSpec>& notes) {
  std::vector<uint8_t> out;
  for (const CoreNoteSpec& n : notes) {
    const uint32_t hdr[3] = {static_cast<uint32_t>(n.name.size() + 1), static_cast<uint32_t>(n.desc.size()), n.type};
    const size_t at = out.size();
    out.resize(at + 12);
    std::memcpy(out.data() + at, hdr, 12);
    out.insert(out.end(), n.name.begin(), n.name.end());
    out.push_back(0);
    while (out.size() % 4) out.push_back(0);
    out.insert(out.end(), n.desc.begin(), n.desc.end());
    while (out.size() % 4) out.push_back(0);
  }
  return out;
}

// An ET_CORE file: one PT_NOTE with `note` bytes, then the segments.
inline std::vector<uint8_t> BuildCoreFile(const std::vector<CoreSeg>& segs, const std::vector<uint8_t>& note) {
  const size_t phnum = 1 + segs.size();
  uint64_t off = sizeof(Elf64_Ehdr) + phnum * sizeof(Elf64_Phdr);
  std::vector<Elf64_Phdr> ph(phnum);
  ph[0] = {PT_NOTE, 0, off, 0, 0, note.size(), 0, 4};
  off += note.size();
  for (size_t i = 0; i < segs.size(); i++) {
    ph[i + 1] = {PT_LOAD, PF_R, off, segs[i].vaddr, 0, segs[i].data.size(), segs[i].memsz, 4096};
    off += segs[i].data.size();
  }
  const Elf64_Ehdr eh = ElfHeader(ET_CORE, static_cast<uint16_t>(phnum));
  std::vector<uint8_t> out(sizeof(eh) + phnum * sizeof(Elf64_Phdr));
  std::memcpy(out.data(), &eh, sizeof(eh));
  std::memcpy(out.data() + sizeof(eh), ph.data(), phnum * sizeof(Elf64_Phdr));
  out.insert(out.end(), note.begin(), note.end());
  for (const CoreSeg& s : segs) out.insert(out.end(), s.data.begin(), s.data.end());
  return out;
}

}  // namespace rvbpfd::testing

#endif  // RVBPFD_TESTS_STACKS_CORE_BUILDER_H_
