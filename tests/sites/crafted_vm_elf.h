// A crafted CRuby VM look-alike ELF with any number of function symbols, written byte by byte (no compiler): what a
// hostile tenant can hand the site finder. Shared by the site-finder scaling benchmark (benchmarks/sites_scaling.cc)
// and the `sites` fuzz harness (tests/fuzz/fuzz_sites.cc).
//
// Layout: one R+X PT_LOAD from offset 0 (vaddr 0), .text at 0x1000 holding `functions` filler functions of
// `fn_bytes` each (push rbp; mov rbp,rsp; nops; pop rbp; ret), then rb_thread_execute_hooks, one hook check
// (`cmpq $0, rb_internal_thread_event_hooks(%rip); jne; ret; mov $8,%edi; jmp rb_thread_execute_hooks`: a SUSPENDED
// site), rb_f_sleep, rb_mutex_lock and rb_mutex_synchronize_m; the hook list lies in the segment's zero-filled tail.
// With `overlapping`, every filler symbol's size runs to the end of .text (so each one's extent covers the whole rest
// of the code and the hook check): the shape that made the finder's per-symbol scans quadratic.
#ifndef RVBPFD_TESTS_SITES_CRAFTED_VM_ELF_H_
#define RVBPFD_TESTS_SITES_CRAFTED_VM_ELF_H_

#include <elf.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace rvbpfd::testing {

struct CraftedVmSpec {
  size_t functions = 1000;  // filler function symbols
  size_t fn_bytes = 16;     // bytes per filler function (at least 6)
  bool overlapping = true;  // filler sizes run to the end of .text
  size_t hook_checks = 1;   // hook checks (each its own function after the fillers)
};

namespace crafted_internal {

template <typename T>
void Put(std::string* out, size_t at, const T& v) {
  if (out->size() < at + sizeof(T)) out->resize(at + sizeof(T), '\0');
  std::memcpy(out->data() + at, &v, sizeof(T));
}

inline void Append32(std::string* code, int32_t v) {
  char b[4];
  std::memcpy(b, &v, 4);
  code->append(b, 4);
}

}  // namespace crafted_internal

// The ELF bytes of `spec`.
inline std::string CraftVmElf(const CraftedVmSpec& spec) {
  using crafted_internal::Append32;
  using crafted_internal::Put;
  constexpr uint64_t kText = 0x1000;
  const size_t fn_bytes = spec.fn_bytes < 6 ? 6 : spec.fn_bytes;
  struct Sym {
    std::string name;
    uint64_t value, size;
    uint8_t type;
  };
  std::vector<Sym> syms;
  std::string code;
  for (size_t i = 0; i < spec.functions; ++i) {
    std::string f = "\x55\x48\x89\xe5";  // push rbp; mov rbp, rsp
    f.append(fn_bytes - 6, '\x90');
    f += "\x5d\xc3";  // pop rbp; ret
    syms.push_back({"fn_" + std::to_string(i), kText + code.size(), fn_bytes, STT_FUNC});
    code += f;
  }
  const uint64_t execute_hooks = kText + code.size();
  syms.push_back({"rb_thread_execute_hooks", execute_hooks, 16, STT_FUNC});
  code += std::string("\xc3", 1) + std::string(15, '\x90');
  // The hook list: 64 bytes past the end of the code (zero-filled memory of the segment).
  std::vector<uint64_t> check_at;
  for (size_t i = 0; i < spec.hook_checks; ++i) check_at.push_back(kText + code.size() + i * 32);
  const uint64_t code_end_guess = kText + code.size() + spec.hook_checks * 32 + 3 * 16;
  const uint64_t hooks = code_end_guess + 64;
  for (size_t i = 0; i < spec.hook_checks; ++i) {
    const uint64_t at = kText + code.size();
    std::string f = "\x48\x83\x3d";  // cmpq $0, disp32(%rip)
    Append32(&f, static_cast<int32_t>(hooks - (at + 8)));
    f += std::string("\x00\x75\x01\xc3", 4);  // imm8 0; jne +1; ret
    f += std::string("\xbf\x08\x00\x00\x00", 5);  // mov $8, %edi (SUSPENDED)
    f += "\xe9";                                  // jmp rb_thread_execute_hooks
    Append32(&f, static_cast<int32_t>(execute_hooks - (at + f.size() + 4)));
    f.append(32 - f.size(), '\x90');
    syms.push_back({"fx_suspended_" + std::to_string(i), at, 32, STT_FUNC});
    code += f;
  }
  for (const char* name : {"rb_f_sleep", "rb_mutex_lock", "rb_mutex_synchronize_m"}) {
    syms.push_back({name, kText + code.size(), 16, STT_FUNC});
    code += "\x55\x48\x89\xe5\x5d\xc3";
    code.append(10, '\x90');
  }
  if (spec.overlapping) {
    for (size_t i = 0; i < spec.functions; ++i) syms[i].size = kText + code.size() - syms[i].value;
  }
  syms.push_back({"rb_internal_thread_event_hooks", hooks, 8, STT_OBJECT});

  // Symbol and section name tables.
  std::string strtab(1, '\0');
  std::vector<uint32_t> name_off;
  for (const Sym& s : syms) {
    name_off.push_back(static_cast<uint32_t>(strtab.size()));
    strtab += s.name;
    strtab += '\0';
  }
  const std::string shstrtab = std::string("\0.text\0.symtab\0.strtab\0.shstrtab\0", 33);
  const uint32_t kNameText = 1, kNameSymtab = 7, kNameStrtab = 15, kNameShstrtab = 23;

  std::string out;
  const uint64_t text_off = kText;
  const uint64_t symtab_off = (text_off + code.size() + 7) & ~7ull;
  const uint64_t symtab_size = (syms.size() + 1) * sizeof(Elf64_Sym);
  const uint64_t strtab_off = symtab_off + symtab_size;
  const uint64_t shstrtab_off = strtab_off + strtab.size();
  const uint64_t shdr_off = (shstrtab_off + shstrtab.size() + 7) & ~7ull;

  Elf64_Ehdr eh{};
  std::memcpy(eh.e_ident, ELFMAG, SELFMAG);
  eh.e_ident[EI_CLASS] = ELFCLASS64;
  eh.e_ident[EI_DATA] = ELFDATA2LSB;
  eh.e_ident[EI_VERSION] = EV_CURRENT;
  eh.e_type = ET_DYN;
  eh.e_machine = EM_X86_64;
  eh.e_version = EV_CURRENT;
  eh.e_phoff = sizeof(Elf64_Ehdr);
  eh.e_shoff = shdr_off;
  eh.e_ehsize = sizeof(Elf64_Ehdr);
  eh.e_phentsize = sizeof(Elf64_Phdr);
  eh.e_phnum = 1;
  eh.e_shentsize = sizeof(Elf64_Shdr);
  eh.e_shnum = 5;
  eh.e_shstrndx = 4;
  Put(&out, 0, eh);
  Elf64_Phdr ph{};
  ph.p_type = PT_LOAD;
  ph.p_flags = PF_R | PF_X;
  ph.p_offset = 0;
  ph.p_vaddr = ph.p_paddr = 0;
  ph.p_filesz = text_off + code.size();
  ph.p_memsz = hooks + 4096;
  ph.p_align = 0x1000;
  Put(&out, sizeof(Elf64_Ehdr), ph);
  out.resize(text_off, '\0');
  out += code;
  out.resize(symtab_off, '\0');
  Put(&out, symtab_off, Elf64_Sym{});
  for (size_t i = 0; i < syms.size(); ++i) {
    Elf64_Sym s{};
    s.st_name = name_off[i];
    s.st_info = ELF64_ST_INFO(STB_GLOBAL, syms[i].type);
    s.st_shndx = 1;
    s.st_value = syms[i].value;
    s.st_size = syms[i].size;
    Put(&out, symtab_off + (i + 1) * sizeof(Elf64_Sym), s);
  }
  out.resize(strtab_off, '\0');
  out += strtab;
  out += shstrtab;
  out.resize(shdr_off, '\0');
  Elf64_Shdr sh[5]{};
  sh[1] = {kNameText, SHT_PROGBITS, SHF_ALLOC | SHF_EXECINSTR, kText, text_off, code.size(), 0, 0, 16, 0};
  sh[2] = {kNameSymtab, SHT_SYMTAB, 0, 0, symtab_off, symtab_size, 3, 1, 8, sizeof(Elf64_Sym)};
  sh[3] = {kNameStrtab, SHT_STRTAB, 0, 0, strtab_off, strtab.size(), 0, 0, 1, 0};
  sh[4] = {kNameShstrtab, SHT_STRTAB, 0, 0, shstrtab_off, shstrtab.size(), 0, 0, 1, 0};
  for (int i = 0; i < 5; ++i) Put(&out, shdr_off + i * sizeof(Elf64_Shdr), sh[i]);
  return out;
}

}  // namespace rvbpfd::testing

#endif  // RVBPFD_TESTS_SITES_CRAFTED_VM_ELF_H_
