#include "elf/elf_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <utility>

#include "common/capabilities.h"

namespace rvbpfd {
namespace {

// Headers beyond these counts (a real VM binary has ~40 sections, ~12 program headers): nothing is deferred.
constexpr uint16_t kMaxDeferSections = 1024;

// Debug sections by name: what the DWARF readers use and nothing else does.
bool IsDebugSectionName(std::string_view name) {
  return name.starts_with(".debug_") || name.starts_with(".zdebug_");
}

// Reads exactly `len` bytes at `off` of fd; false on an error or a short file.
bool PreadAll(int fd, void* buf, uint64_t len, uint64_t off) {
  uint64_t got = 0;
  while (got < len) {
    const ssize_t n = pread(fd, static_cast<char*>(buf) + got, len - got, static_cast<off_t>(off + got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    got += static_cast<uint64_t>(n);
  }
  return true;
}

// The ELF header of the regular file open at fd, read (64 bytes) and judged before anything else of the file is:
// a file a target maps under a VM's name may be anything of any size, and only a 64-bit little-endian x86-64 ELF
// file whose program headers lie inside it is worth copying. Errors (kIo) name `path` and say what it is not, in the
// words ElfFile::Parse uses.
Status CheckElfHeader(int fd, const std::string& path) {
  struct stat st;
  if (fstat(fd, &st) != 0) return Error(ErrorCode::kIo, ErrnoMessage("fstat of ELF file " + path, errno));
  const uint64_t size = st.st_size > 0 ? static_cast<uint64_t>(st.st_size) : 0;
  Elf64_Ehdr eh;
  if (size < sizeof(eh)) {
    return Error(ErrorCode::kIo, path + " is not an ELF file (" + std::to_string(size) + " bytes)");
  }
  if (!PreadAll(fd, &eh, sizeof(eh), 0)) {
    return Error(ErrorCode::kIo, ErrnoMessage("reading the ELF header of " + path, errno));
  }
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) return Error(ErrorCode::kIo, path + " is not an ELF file");
  if (eh.e_ident[EI_CLASS] != ELFCLASS64) return Error(ErrorCode::kIo, path + " is not a 64-bit ELF file");
  if (eh.e_ident[EI_DATA] != ELFDATA2LSB || eh.e_machine != EM_X86_64) {
    return Error(ErrorCode::kIo, path + " is not an x86-64 little-endian ELF file");
  }
  // The program headers (what a loaded file needs; a cut-off section header table is judged, bounded, by Parse).
  if (eh.e_phoff > size || uint64_t{eh.e_phnum} * eh.e_phentsize > size - eh.e_phoff) {
    return Error(ErrorCode::kIo, path + ": bad ELF header: its program headers lie outside the file");
  }
  return Status::Ok();
}

// File ranges of the non-allocated debug sections of the ELF file open at fd, from its section headers read with
// pread (bounded by the file's size); empty when the headers are not a 64-bit little-endian ELF's or lie outside the
// file: nothing is deferred then, and Parse judges the whole copy. A debug section whose bytes any other section or a
// program header also claims (never so in a real binary) is not deferred: only debug readers ever wait for a copy.
std::vector<std::pair<uint64_t, uint64_t>> DebugSectionRanges(int fd) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size <= 0) return out;
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  auto read_at = [fd](void* buf, uint64_t len, uint64_t off) { return PreadAll(fd, buf, len, off); };
  Elf64_Ehdr eh;
  if (!read_at(&eh, sizeof(eh), 0) || std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
      eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_ident[EI_DATA] != ELFDATA2LSB ||
      eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shnum == 0 || eh.e_shnum > kMaxDeferSections ||
      eh.e_shstrndx == SHN_UNDEF || eh.e_shstrndx >= eh.e_shnum || eh.e_shoff > size ||
      uint64_t{eh.e_shnum} * sizeof(Elf64_Shdr) > size - eh.e_shoff || eh.e_phnum > kMaxDeferSections ||
      (eh.e_phnum != 0 && eh.e_phentsize != sizeof(Elf64_Phdr)) || eh.e_phoff > size ||
      uint64_t{eh.e_phnum} * sizeof(Elf64_Phdr) > size - eh.e_phoff) {
    return out;
  }
  std::vector<Elf64_Phdr> ph(eh.e_phnum);
  if (!ph.empty() && !read_at(ph.data(), ph.size() * sizeof(Elf64_Phdr), eh.e_phoff)) return out;
  std::vector<Elf64_Shdr> sh(eh.e_shnum);
  if (!read_at(sh.data(), sh.size() * sizeof(Elf64_Shdr), eh.e_shoff)) return out;
  constexpr uint64_t kMaxNames = 1u << 20;  // .shstrtab holds a few hundred bytes
  const Elf64_Shdr& names = sh[eh.e_shstrndx];
  if (names.sh_type == SHT_NOBITS || names.sh_size == 0 || names.sh_size > kMaxNames || names.sh_offset > size ||
      names.sh_size > size - names.sh_offset) {
    return out;
  }
  std::string strtab(names.sh_size, '\0');
  if (!read_at(strtab.data(), strtab.size(), names.sh_offset)) return out;
  // Every other claim on the file's bytes: the other sections', the program headers' and the headers' own.
  std::vector<std::pair<uint64_t, uint64_t>> claimed = {
      {0, sizeof(Elf64_Ehdr)},
      {eh.e_shoff, eh.e_shoff + uint64_t{eh.e_shnum} * sizeof(Elf64_Shdr)},
      {eh.e_phoff, eh.e_phoff + uint64_t{eh.e_phnum} * sizeof(Elf64_Phdr)}};
  std::vector<std::pair<uint64_t, uint64_t>> debug;
  for (const Elf64_Shdr& s : sh) {
    if (s.sh_type == SHT_NOBITS || s.sh_offset > size || s.sh_size > size - s.sh_offset) continue;
    const bool is_debug = (s.sh_flags & SHF_ALLOC) == 0 && s.sh_name < strtab.size() &&
                          IsDebugSectionName(std::string_view(strtab.c_str() + s.sh_name));
    (is_debug ? debug : claimed).emplace_back(s.sh_offset, s.sh_offset + s.sh_size);
  }
  for (const Elf64_Phdr& p : ph) {
    if (p.p_offset > size) continue;
    claimed.emplace_back(p.p_offset, p.p_offset + std::min<uint64_t>(p.p_filesz, size - p.p_offset));
  }
  for (const auto& d : debug) {
    const bool overlaps = std::any_of(claimed.begin(), claimed.end(),
                                      [&d](const auto& c) { return c.first < d.second && d.first < c.second; });
    if (!overlaps) out.push_back(d);
  }
  return out;
}

bool IsDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

bool MatchesWithCloneSuffix(std::string_view name, std::string_view base) {
  if (name.size() < base.size() || name.substr(0, base.size()) != base) return false;
  std::string_view rest = name.substr(base.size());
  // Each suffix is ".cold" or ".<kind>.<digits>" with kind one of GCC's clone kinds.
  while (!rest.empty()) {
    if (rest.rfind(".cold", 0) == 0) {
      rest.remove_prefix(5);
      continue;
    }
    bool matched = false;
    for (std::string_view kind : {".constprop.", ".isra.", ".part.", ".lto_priv."}) {
      if (rest.rfind(kind, 0) != 0) continue;
      std::string_view tail = rest.substr(kind.size());
      size_t n = 0;
      while (n < tail.size() && tail[n] >= '0' && tail[n] <= '9') ++n;
      if (!IsDigits(tail.substr(0, n))) return false;
      rest = tail.substr(n);
      matched = true;
      break;
    }
    if (!matched) return false;
  }
  return true;
}

Result<ElfFile> ElfFile::Open(const std::string& path) {
  Result<FileFd> fd = OpenRegularFile(path, "ELF file");
  if (!fd) return fd.error();
  if (Status st = CheckElfHeader(fd->get(), path); !st) return st.error();
  Result<MappedFile> mapped = MappedFile::FromFd(fd->get(), path, "ELF file", kMaxBytes,
                                                 {.writable = true, .deferred = DebugSectionRanges(fd->get())});
  if (!mapped) return mapped.error();
  return FromMapped(std::move(mapped.value()), path);
}

Result<ElfFile> ElfFile::OpenHandle(const FileFd& handle, const std::string& path) {
  Result<FileFd> fd = ReopenRegularFile(handle, path, "ELF file");
  if (!fd) return fd.error();
  return OpenReopened(*fd, path);
}

Result<ElfFile> ElfFile::OpenReopened(const FileFd& file, const std::string& path) {
  if (Status st = CheckElfHeader(file.get(), path); !st) return st.error();
  Result<MappedFile> mapped = MappedFile::FromFd(file.get(), path, "ELF file", kMaxBytes,
                                                 {.writable = true, .deferred = DebugSectionRanges(file.get())});
  if (!mapped) return mapped.error();
  return FromMapped(std::move(mapped.value()), path);
}

std::span<const uint8_t> ElfFile::content() const {
  if (!file_.LoadDeferred().ok()) return {};
  return {data_, static_cast<size_t>(size_)};
}

Result<ElfFile> ElfFile::FromMapped(MappedFile mapped, const std::string& path) {
  ElfFile file;
  file.path_ = path;
  file.file_ = std::move(mapped);
  file.data_ = file.file_.data();
  file.size_ = file.file_.size();
  Status parsed = file.Parse();
  if (!parsed.ok()) return parsed.error();
  return file;
}

ElfFile::ElfFile(ElfFile&& other) noexcept { *this = std::move(other); }

ElfFile& ElfFile::operator=(ElfFile&& other) noexcept {
  if (this == &other) return *this;
  Reset();
  path_ = std::move(other.path_);
  origin_path_ = std::move(other.origin_path_);
  file_ = std::move(other.file_);
  data_ = std::exchange(other.data_, nullptr);
  size_ = std::exchange(other.size_, 0);
  elf_ = std::exchange(other.elf_, nullptr);
  build_id_ = std::move(other.build_id_);
  has_symtab_ = other.has_symtab_;
  elf_type_ = other.elf_type_;
  sections_ = std::move(other.sections_);
  segments_ = std::move(other.segments_);
  tls_ = std::move(other.tls_);
  has_interp_ = other.has_interp_;
  symbols_ = std::move(other.symbols_);
  functions_by_addr_ = std::move(other.functions_by_addr_);
  debug_ = std::move(other.debug_);
  symbols_source_ = std::move(other.symbols_source_);
  return *this;
}

ElfFile::~ElfFile() { Reset(); }

void ElfFile::Reset() {
  if (elf_ != nullptr) elf_end(elf_);
  elf_ = nullptr;
}

Status ElfFile::Parse() {
  if (elf_version(EV_CURRENT) == EV_NONE) {
    return Error(ErrorCode::kInternal, std::string("libelf initialisation failed: ") + elf_errmsg(-1));
  }
  static_assert(sizeof(char) == sizeof(uint8_t));
  elf_ = elf_memory(const_cast<char*>(reinterpret_cast<const char*>(data_)), size_);
  if (elf_ == nullptr || elf_kind(elf_) != ELF_K_ELF) {
    return Error(ErrorCode::kIo, path_ + " is not an ELF file");
  }
  if (gelf_getclass(elf_) != ELFCLASS64) return Error(ErrorCode::kIo, path_ + " is not a 64-bit ELF file");
  GElf_Ehdr ehdr;
  if (gelf_getehdr(elf_, &ehdr) == nullptr) {
    return Error(ErrorCode::kIo, path_ + ": bad ELF header: " + elf_errmsg(-1));
  }
  if (ehdr.e_ident[EI_DATA] != ELFDATA2LSB || ehdr.e_machine != EM_X86_64) {
    return Error(ErrorCode::kIo, path_ + " is not an x86-64 little-endian ELF file");
  }
  elf_type_ = ehdr.e_type;

  size_t phnum = 0;
  if (elf_getphdrnum(elf_, &phnum) == 0) {
    for (size_t i = 0; i < phnum; ++i) {
      GElf_Phdr ph;
      if (gelf_getphdr(elf_, static_cast<int>(i), &ph) == nullptr) continue;
      if (ph.p_type == PT_TLS && !tls_) tls_ = ElfTlsSegment{ph.p_vaddr, ph.p_filesz, ph.p_memsz, ph.p_align};
      if (ph.p_type == PT_INTERP) has_interp_ = true;
      if (ph.p_type != PT_LOAD) continue;
      segments_.push_back({ph.p_vaddr, ph.p_offset, ph.p_filesz, ph.p_memsz, ph.p_flags});
    }
  }

  size_t shstrndx = 0;
  if (elf_getshdrstrndx(elf_, &shstrndx) != 0) shstrndx = 0;
  std::vector<std::pair<Elf_Scn*, GElf_Shdr>> symtabs;
  for (Elf_Scn* scn = elf_nextscn(elf_, nullptr); scn != nullptr; scn = elf_nextscn(elf_, scn)) {
    GElf_Shdr sh;
    if (gelf_getshdr(scn, &sh) == nullptr) continue;
    const char* name = shstrndx != 0 ? elf_strptr(elf_, shstrndx, sh.sh_name) : nullptr;
    sections_.push_back({name != nullptr ? name : "", sh.sh_type, sh.sh_flags, sh.sh_addr, sh.sh_offset, sh.sh_size});
    if (sh.sh_type == SHT_SYMTAB) has_symtab_ = true;
    if (sh.sh_type == SHT_SYMTAB || sh.sh_type == SHT_DYNSYM) symtabs.emplace_back(scn, sh);
    if (sh.sh_type == SHT_NOTE && build_id_.empty()) {
      Elf_Data* data = elf_getdata(scn, nullptr);
      if (data == nullptr) continue;
      size_t offset = 0, name_off = 0, desc_off = 0;
      GElf_Nhdr nhdr;
      while ((offset = gelf_getnote(data, offset, &nhdr, &name_off, &desc_off)) > 0) {
        if (nhdr.n_type != NT_GNU_BUILD_ID || nhdr.n_namesz != 4 || desc_off + nhdr.n_descsz > data->d_size ||
            std::memcmp(static_cast<const char*>(data->d_buf) + name_off, "GNU", 4) != 0) {
          continue;
        }
        static constexpr char kHex[] = "0123456789abcdef";
        const auto* desc = static_cast<const uint8_t*>(data->d_buf) + desc_off;
        for (size_t i = 0; i < nhdr.n_descsz; ++i) {
          build_id_ += kHex[desc[i] >> 4];
          build_id_ += kHex[desc[i] & 0xf];
        }
        break;
      }
    }
  }
  // .symtab before .dynsym so lookups prefer the richer table.
  std::stable_sort(symtabs.begin(), symtabs.end(),
                   [](const auto& a, const auto& b) { return a.second.sh_type == SHT_SYMTAB && b.second.sh_type != SHT_SYMTAB; });
  // What the symbols may cost is bounded by the file's size: the entries of all tables together must fit in it, and
  // the names copied may total at most kMaxNameBytesPerFileByte times it. A crafted file could otherwise make the
  // daemon copy the file once per table (many tables over the same bytes) or one long string once per symbol.
  uint64_t entries = 0;
  for (const auto& [scn, sh] : symtabs) entries += sh.sh_entsize == 0 ? 0 : sh.sh_size / sh.sh_entsize;
  if (entries > size_ / sizeof(Elf64_Sym)) {
    return Error(ErrorCode::kIo, path_ + ": its symbol tables together are larger than the file");
  }
  uint64_t name_bytes = 0;
  for (auto& [scn, sh] : symtabs) {
    Elf_Data* data = elf_getdata(scn, nullptr);
    if (data == nullptr || sh.sh_entsize == 0) continue;
    size_t count = data->d_size / sh.sh_entsize;
    for (size_t i = 0; i < count; ++i) {
      GElf_Sym sym;
      if (gelf_getsym(data, static_cast<int>(i), &sym) == nullptr) break;
      const char* name = elf_strptr(elf_, sh.sh_link, sym.st_name);
      if (name == nullptr || *name == '\0') continue;
      symbols_.push_back({name, sym.st_value, sym.st_size, static_cast<uint8_t>(GELF_ST_TYPE(sym.st_info)),
                          static_cast<uint8_t>(GELF_ST_BIND(sym.st_info)), sym.st_shndx,
                          sh.sh_type == SHT_SYMTAB});
      name_bytes += symbols_.back().name.size();
      if (name_bytes > kMaxNameBytesPerFileByte * size_) {
        symbols_.clear();
        return Error(ErrorCode::kIo, path_ + ": its symbol names total more than " +
                                         std::to_string(kMaxNameBytesPerFileByte) + " times the file's size");
      }
    }
  }
  IndexFunctions();
  return Status::Ok();
}

void ElfFile::IndexFunctions() {
  functions_by_addr_.clear();
  for (size_t i = 0; i < symbols_.size(); ++i) {
    const ElfSymbol& s = symbols_[i];
    if (s.type == STT_FUNC && s.shndx != SHN_UNDEF && s.size > 0) functions_by_addr_.push_back(i);
  }
  std::sort(functions_by_addr_.begin(), functions_by_addr_.end(), [this](size_t a, size_t b) {
    return symbols_[a].value != symbols_[b].value ? symbols_[a].value < symbols_[b].value : a < b;
  });
}

std::vector<ElfRelocation> ElfFile::DynamicRelocations(uint32_t type) const {
  std::vector<ElfRelocation> out;
  if (elf_ == nullptr) return out;
  for (Elf_Scn* scn = elf_nextscn(elf_, nullptr); scn != nullptr; scn = elf_nextscn(elf_, scn)) {
    GElf_Shdr sh;
    if (gelf_getshdr(scn, &sh) == nullptr || sh.sh_type != SHT_RELA || (sh.sh_flags & SHF_ALLOC) == 0 ||
        sh.sh_entsize == 0) {
      continue;
    }
    Elf_Data* data = elf_getdata(scn, nullptr);
    if (data == nullptr) continue;
    // The symbol table the entries index (.dynsym), for names; absent or unreadable: names stay empty.
    Elf_Scn* symscn = sh.sh_link != 0 ? elf_getscn(elf_, sh.sh_link) : nullptr;
    GElf_Shdr symsh;
    Elf_Data* symdata = nullptr;
    if (symscn != nullptr && gelf_getshdr(symscn, &symsh) != nullptr && symsh.sh_entsize != 0) {
      symdata = elf_getdata(symscn, nullptr);
    }
    const size_t count = data->d_size / sh.sh_entsize;
    for (size_t i = 0; i < count; ++i) {
      GElf_Rela rela;
      if (gelf_getrela(data, static_cast<int>(i), &rela) == nullptr) break;
      if (GELF_R_TYPE(rela.r_info) != type) continue;
      ElfRelocation r;
      r.offset = rela.r_offset;
      r.type = static_cast<uint32_t>(GELF_R_TYPE(rela.r_info));
      r.symbol = static_cast<uint32_t>(GELF_R_SYM(rela.r_info));
      r.addend = rela.r_addend;
      GElf_Sym sym;
      if (r.symbol != 0 && symdata != nullptr && r.symbol < symdata->d_size / symsh.sh_entsize &&
          gelf_getsym(symdata, static_cast<int>(r.symbol), &sym) != nullptr) {
        const char* name = elf_strptr(elf_, symsh.sh_link, sym.st_name);
        if (name != nullptr) r.symbol_name = name;
      }
      out.push_back(std::move(r));
    }
  }
  return out;
}

std::optional<ElfSection> ElfFile::FindSection(std::string_view name) const {
  for (const ElfSection& s : sections_) {
    if (s.name == name) return s;
  }
  return std::nullopt;
}

std::span<const uint8_t> ElfFile::SectionData(const ElfSection& section) const {
  if (section.type == SHT_NOBITS || section.offset > size_ || section.size > size_ - section.offset) return {};
  if (IsDebugSectionName(section.name) && !file_.LoadDeferred().ok()) return {};
  return {data_ + section.offset, section.size};
}

std::optional<ElfSymbol> ElfFile::FindSymbol(std::string_view name) const {
  const ElfSymbol* undefined = nullptr;
  for (const ElfSymbol& s : symbols_) {  // .symtab entries come first
    if (s.name != name) continue;
    if (s.shndx != SHN_UNDEF) return s;
    if (undefined == nullptr) undefined = &s;
  }
  if (undefined != nullptr) return *undefined;
  return std::nullopt;
}

std::vector<ElfSymbol> ElfFile::FindSymbolsWithPrefix(std::string_view base) const {
  std::vector<ElfSymbol> out;
  // A set, not a scan of `out`: a crafted file may hold thousands of clones of one name (linear, not quadratic).
  std::set<std::pair<std::string_view, uint64_t>> seen;
  for (const ElfSymbol& s : symbols_) {
    if (s.shndx == SHN_UNDEF || !MatchesWithCloneSuffix(s.name, base)) continue;
    if (seen.emplace(s.name, s.value).second) out.push_back(s);
  }
  return out;
}

std::optional<ElfSymbol> ElfFile::FunctionContaining(uint64_t vaddr) const {
  // Functions are sorted by start; scan back from the last one starting at or before vaddr. Symbols may overlap
  // (aliases), so keep the smallest extent containing vaddr among those starting at the nearest addresses.
  auto it = std::upper_bound(functions_by_addr_.begin(), functions_by_addr_.end(), vaddr,
                             [this](uint64_t v, size_t idx) { return v < symbols_[idx].value; });
  const ElfSymbol* best = nullptr;
  // Bounded look-back: aliases share a start, nested extents are rare; 16 is plenty and keeps this O(log n).
  for (int steps = 0; it != functions_by_addr_.begin() && steps < 16; ++steps) {
    --it;
    const ElfSymbol& s = symbols_[*it];
    if (vaddr >= s.value && vaddr - s.value < s.size && (best == nullptr || s.size < best->size)) best = &s;
  }
  if (best == nullptr) return std::nullopt;
  return *best;
}

std::optional<uint64_t> ElfFile::VaddrToFileOffset(uint64_t vaddr) const {
  for (const ElfSegment& seg : segments_) {
    if (vaddr >= seg.vaddr && vaddr - seg.vaddr < seg.filesz) {
      uint64_t off = seg.offset + (vaddr - seg.vaddr);
      if (off < seg.offset || off >= size_) return std::nullopt;  // overflow or segment claims beyond the file
      return off;
    }
  }
  return std::nullopt;
}

std::span<const uint8_t> ElfFile::BytesAt(uint64_t vaddr, uint64_t len) const {
  for (const ElfSegment& seg : segments_) {
    if (vaddr < seg.vaddr || vaddr - seg.vaddr >= seg.filesz) continue;
    uint64_t rel = vaddr - seg.vaddr;
    if (len > seg.filesz - rel) return {};
    uint64_t off = seg.offset + rel;
    if (off < seg.offset || off > size_ || len > size_ - off) return {};
    return {data_ + off, len};
  }
  return {};
}

std::optional<std::string> ElfFile::CStringAt(uint64_t vaddr, size_t max_len) const {
  std::optional<uint64_t> off = VaddrToFileOffset(vaddr);
  if (!off) return std::nullopt;
  // Stay inside the segment that holds vaddr.
  uint64_t limit = 0;
  for (const ElfSegment& seg : segments_) {
    if (vaddr >= seg.vaddr && vaddr - seg.vaddr < seg.filesz) limit = seg.filesz - (vaddr - seg.vaddr);
  }
  limit = std::min<uint64_t>({limit, max_len, size_ - *off});
  const auto* p = reinterpret_cast<const char*>(data_ + *off);
  const void* nul = std::memchr(p, '\0', limit);
  if (nul == nullptr) return std::nullopt;
  return std::string(p, static_cast<const char*>(nul) - p);
}

Status ElfFile::AttachDebugFile(ElfFile debug, std::string source) {
  if (build_id_.empty() || debug.build_id_ != build_id_) {
    return Error(ErrorCode::kIo, "debug file " + debug.path_ + " has build-id " +
                                     (debug.build_id_.empty() ? "none" : debug.build_id_) + ", " + path_ + " has " +
                                     (build_id_.empty() ? "none" : build_id_) + ": not its debug info");
  }
  const bool has_dwarf = debug.FindSection(".debug_info").has_value();
  if (!debug.has_symtab_ && !has_dwarf) {
    return Error(ErrorCode::kIo, "debug file " + debug.path_ + " has neither .symtab nor .debug_info");
  }
  // The debug file's .symtab goes first, so lookups prefer it as they prefer an unstripped binary's own .symtab.
  // Its section indices (shndx) are the debug file's; callers only compare them with SHN_UNDEF.
  std::vector<ElfSymbol> merged;
  for (const ElfSymbol& s : debug.symbols_) {
    if (!s.from_symtab) continue;
    merged.push_back(s);
    merged.back().from_debug_file = true;
  }
  for (ElfSymbol& s : symbols_) merged.push_back(std::move(s));
  symbols_ = std::move(merged);
  has_symtab_ = has_symtab_ || debug.has_symtab_;
  IndexFunctions();
  debug_ = std::make_unique<ElfFile>(std::move(debug));
  symbols_source_ = std::move(source);
  return Status::Ok();
}

const ElfFile& ElfFile::dwarf_file() const {
  if (debug_ != nullptr && debug_->FindSection(".debug_info")) return *debug_;
  return *this;
}

}  // namespace rvbpfd
