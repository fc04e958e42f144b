// ElfFile: a read-only, bounds-checked view of one ELF file (the CRuby VM binary of a target process).
//
// The file comes from a process we do not trust (it is opened through /proc/PID/root), so it is opened the one safe way
// (src/common/target_file.h: never blocking, confined to the process's root, regular files only) and copied once into
// a size-bounded private anonymous mapping whose holes cost no memory (writable: libelf and libdw decompress
// sections in place in the image); every access (section data, symbol names, bytes at a virtual address) is checked
// against the file size: a truncated or crafted file yields an error or an empty result, never a read out of bounds. A copy rather than a file mapping, so a file the target truncates while we analyse it
// cannot SIGBUS the daemon.
#ifndef RVBPFD_SRC_ELF_ELF_FILE_H_
#define RVBPFD_SRC_ELF_ELF_FILE_H_

#include <gelf.h>
#include <libelf.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "common/target_file.h"

namespace rvbpfd {

struct ElfSymbol {
  std::string name;
  uint64_t value = 0;   // st_value: a virtual address for defined functions and objects
  uint64_t size = 0;    // st_size in bytes
  uint8_t type = 0;     // STT_*
  uint8_t binding = 0;  // STB_*
  uint16_t shndx = 0;   // section index; SHN_UNDEF for imports
  bool from_symtab = false;  // true: .symtab, false: .dynsym
  bool from_debug_file = false;  // from an attached debug file's .symtab (AttachDebugFile), not the binary's own
};

struct ElfSection {
  std::string name;
  uint32_t type = 0;    // SHT_*
  uint64_t flags = 0;   // SHF_*
  uint64_t addr = 0;    // virtual address (0 for non-allocated sections)
  uint64_t offset = 0;  // file offset
  uint64_t size = 0;    // bytes (in the file unless SHT_NOBITS)
};

struct ElfSegment {  // one PT_LOAD program header
  uint64_t vaddr = 0;
  uint64_t offset = 0;
  uint64_t filesz = 0;
  uint64_t memsz = 0;
  uint32_t flags = 0;  // PF_*
};

// The PT_TLS program header: the object's thread-local storage template (bytes).
struct ElfTlsSegment {
  uint64_t vaddr = 0;
  uint64_t filesz = 0;  // initialized part (.tdata)
  uint64_t memsz = 0;   // whole block (.tdata + .tbss)
  uint64_t align = 0;   // p_align (0 or 1: no alignment)
};

// One entry of an allocated SHT_RELA section (.rela.dyn, .rela.plt): a relocation ld.so applies at load time.
struct ElfRelocation {
  uint64_t offset = 0;      // r_offset: the virtual address ld.so writes
  uint32_t type = 0;        // R_X86_64_*
  uint32_t symbol = 0;      // index into the section's symbol table (.dynsym); 0: none (the object's own module)
  std::string symbol_name;  // "" when symbol is 0
  int64_t addend = 0;
};

// True when `name` is `base` or `base` followed by GCC clone suffixes (`.constprop.N`, `.isra.N`, `.part.N`,
// `.cold`, possibly chained, e.g. `gc_rest.part.0` or `do_mutex_lock.constprop.0.cold`).
bool MatchesWithCloneSuffix(std::string_view name, std::string_view base);

class ElfFile {
 public:
  // Copies the file (at most kMaxBytes) and parses its headers, sections, program headers, symbols and build-id. The
  // debug sections (non-allocated .debug_* and .zdebug_*: most of an unstripped VM binary) are copied only when
  // something reads them (content(), SectionData of one, LoadDeferredSections: what DWARF readers call first), so an
  // analysis that caches answered reads a few MB, not tens.
  // Errors: kIo when the file cannot be read; kNotRuby is not decided here (callers know the context), a file that is
  // not a 64-bit little-endian ELF yields kIo with a message saying so.
  static Result<ElfFile> Open(const std::string& path);
  // The same for the file an O_PATH descriptor (OpenPathInRoot's) refers to: the very inode, however its path changes
  // meanwhile. `path` names it in messages and is where its debug file is looked up (origin_path).
  static Result<ElfFile> OpenHandle(const FileFd& handle, const std::string& path);
  // The same for `file`, a readable descriptor already reopened from such a handle (ReopenRegularFile's).
  static Result<ElfFile> OpenReopened(const FileFd& file, const std::string& path);
  // A VM binary with full DWARF is tens of MB; a larger file is not a plausible libruby/ruby (bytes).
  static constexpr uint64_t kMaxBytes = 1ull << 30;
  // The symbol names a file's tables give may total at most this many times its size (a real file's names are a part
  // of it, the same name repeated a few times at most); a file over it is refused as crafted.
  static constexpr uint64_t kMaxNameBytesPerFileByte = 4;

  ElfFile(ElfFile&& other) noexcept;
  ElfFile& operator=(ElfFile&& other) noexcept;
  ElfFile(const ElfFile&) = delete;
  ElfFile& operator=(const ElfFile&) = delete;
  ~ElfFile();

  const std::string& path() const { return path_; }
  // The path the file is known by in its process's view (/proc/PID/root/..., /proc/PID/map_files/...) when it was
  // opened through another one (/proc/self/fd/N of a descriptor opened inside the target's root): where the debug
  // lookup finds the target's own /usr/lib/debug. path() when not set.
  const std::string& origin_path() const { return origin_path_.empty() ? path_ : origin_path_; }
  void set_origin_path(std::string p) { origin_path_ = std::move(p); }
  // Lower-case hex of NT_GNU_BUILD_ID, empty when the file has none.
  const std::string& build_id() const { return build_id_; }
  bool has_symtab() const { return has_symtab_; }
  // ET_EXEC or ET_DYN (PIE executables and shared libraries are both ET_DYN).
  uint16_t elf_type() const { return elf_type_; }
  // The raw libelf handle of this file (its code, .eh_frame, relocations). Valid as long as this object lives.
  Elf* handle() const { return elf_; }

  // Split debug info (src/elf/debug_lookup.h): a separate file with this binary's .symtab and DWARF, found by build-id.
  // Attaching it adds its .symtab symbols (same virtual addresses; they take precedence over .dynsym) and makes
  // dwarf_file() return it; code bytes, segments, sections and relocations still come from this file.
  // Errors (nothing changes): kIo when the build-ids differ or either has none, or the debug file has neither .symtab
  // nor .debug_info. `source` says where it came from, for symbols_source().
  Status AttachDebugFile(ElfFile debug, std::string source);
  // The file whose DWARF (.debug_info, .debug_frame) describes this binary: the attached debug file if it has
  // .debug_info, else this one.
  const ElfFile& dwarf_file() const;
  // The attached debug file (AttachDebugFile), if any: its content keys the analyses made with it.
  const ElfFile* debug_file() const { return debug_.get(); }
  // Where .symtab/DWARF came from: "binary" (this file), else the `source` of the attached debug file.
  const std::string& symbols_source() const { return symbols_source_; }

  // The PT_TLS header, if the object has thread-local storage.
  const std::optional<ElfTlsSegment>& tls_segment() const { return tls_; }
  // True when the file has a PT_INTERP header: an executable started through ld.so (PIE or not), as opposed to a
  // shared library. Its TLS block is the first one (local-exec offsets are fixed at link time).
  bool has_interp() const { return has_interp_; }
  // The dynamic relocations of `type` (R_X86_64_*), from every allocated SHT_RELA section, in file order. Bounded by
  // the section sizes; a malformed section yields what could be read.
  std::vector<ElfRelocation> DynamicRelocations(uint32_t type) const;

  // The whole file as read (what every other accessor is a view of), and what fstat said of it before the read.
  // Copies the deferred debug sections first; empty when that fails (LoadDeferredSections says why).
  std::span<const uint8_t> content() const;
  uint64_t content_size() const { return size_; }  // content()'s size, without copying anything in
  // The byte ranges of content() that may hold anything but zeros (MappedFile::written_ranges): readers of the whole
  // content skip the rest without touching it. Complete only once content() has loaded the deferred sections.
  const std::vector<std::pair<uint64_t, uint64_t>>& content_written_ranges() const { return file_.written_ranges(); }
  // Copies the deferred debug sections now (once; MappedFile::LoadDeferred): kIo when the file changed since it was
  // opened. DWARF readers (libdw on handle()) call it before reading any.
  Status LoadDeferredSections() const { return file_.LoadDeferred(); }
  const FileIdentity& identity() const { return file_.identity(); }

  const std::vector<ElfSection>& sections() const { return sections_; }
  const std::vector<ElfSegment>& load_segments() const { return segments_; }
  // All symbols of .symtab then .dynsym, in file order.
  const std::vector<ElfSymbol>& symbols() const { return symbols_; }

  std::optional<ElfSection> FindSection(std::string_view name) const;
  // The bytes of a section in the file; empty for SHT_NOBITS or a section whose extent lies outside the file.
  std::span<const uint8_t> SectionData(const ElfSection& section) const;

  // Exact name lookup. Prefers a defined symbol from .symtab, then a defined one from .dynsym; undefined symbols
  // (imports) are returned only when nothing defines the name.
  std::optional<ElfSymbol> FindSymbol(std::string_view name) const;
  // Defined symbols whose name is `base` or `base` plus clone suffixes (see MatchesWithCloneSuffix), one per
  // distinct (name, address), .symtab first.
  std::vector<ElfSymbol> FindSymbolsWithPrefix(std::string_view base) const;
  // The defined function symbol whose [value, value+size) contains vaddr (the smallest such), if any.
  std::optional<ElfSymbol> FunctionContaining(uint64_t vaddr) const;

  // Maps a virtual address to its file offset through the PT_LOAD headers; nullopt when no segment holds it in the
  // file part (filesz), e.g. .bss.
  std::optional<uint64_t> VaddrToFileOffset(uint64_t vaddr) const;
  // `len` bytes at virtual address `vaddr`, all inside one segment's file part; empty span when out of bounds.
  std::span<const uint8_t> BytesAt(uint64_t vaddr, uint64_t len) const;
  // A NUL-terminated string at vaddr, at most max_len bytes; nullopt when unterminated or out of bounds.
  std::optional<std::string> CStringAt(uint64_t vaddr, size_t max_len) const;

 private:
  static Result<ElfFile> FromMapped(MappedFile mapped, const std::string& path);
  ElfFile() = default;
  Status Parse();
  void IndexFunctions();  // rebuilds functions_by_addr_ from symbols_
  void Reset();

  std::string path_;
  std::string origin_path_;
  // The whole file; stable address for libelf's elf_memory. Mutable: const readers copy in the deferred sections.
  mutable MappedFile file_;
  const uint8_t* data_ = nullptr;  // file_.data()
  uint64_t size_ = 0;
  Elf* elf_ = nullptr;
  std::string build_id_;
  bool has_symtab_ = false;
  uint16_t elf_type_ = 0;
  std::vector<ElfSection> sections_;
  std::vector<ElfSegment> segments_;
  std::optional<ElfTlsSegment> tls_;
  bool has_interp_ = false;
  std::vector<ElfSymbol> symbols_;
  std::vector<size_t> functions_by_addr_;  // indices into symbols_ of defined sized functions, sorted by value
  std::unique_ptr<ElfFile> debug_;  // attached split debug file (AttachDebugFile), if any
  std::string symbols_source_ = "binary";
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_ELF_ELF_FILE_H_
