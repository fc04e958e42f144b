#include "elf/symbol_names.h"

#include <elf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

namespace rvbpfd {
namespace {

Error NotScannable(const std::string& why) {
  return Error(ErrorCode::kIo, "cannot scan the ELF file's symbol names: " + why);
}

// Reads exactly n bytes at off: 0, or the errno of the failure (EIO when the file ends first: it shrank).
int ReadAt(int fd, void* buf, size_t n, uint64_t off) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    const ssize_t r = pread(fd, p, n, static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return errno;
    if (r == 0) return EIO;
    p += r;
    n -= static_cast<size_t>(r);
    off += static_cast<uint64_t>(r);
  }
  return 0;
}

}  // namespace

Result<bool> StringTablesName(int fd, std::span<const std::string_view> names, size_t chunk_bytes) {
  // A symbol's name is the NUL-terminated string at its st_name offset; linkers share tails between names, so a name
  // may also end another one: what is searched is the name and its NUL, anywhere.
  std::vector<std::string> patterns;
  size_t longest = 0;
  for (std::string_view n : names) {
    if (n.empty() || n.size() >= chunk_bytes) return NotScannable("a name is empty or longer than a chunk");
    patterns.emplace_back(std::string(n) + '\0');
    longest = std::max(longest, patterns.back().size());
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return Error(ErrorCode::kIo, ErrnoMessage("cannot scan the ELF file's symbol names: fstat", errno));
  }
  if (!S_ISREG(st.st_mode)) return NotScannable("not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  Elf64_Ehdr eh;
  if (size < sizeof(eh)) return NotScannable("shorter than an ELF header");
  if (int err = ReadAt(fd, &eh, sizeof(eh), 0); err != 0) {
    return Error(ErrorCode::kIo, ErrnoMessage("cannot scan the ELF file's symbol names: reading its header", err));
  }
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
      eh.e_ident[EI_DATA] != ELFDATA2LSB) {
    return NotScannable("not a 64-bit little-endian ELF file");
  }
  // e_shnum 0 with section headers present means 65,280 or more sections (the count is then in section 0): not a
  // program we expect, so the full parse decides.
  if (eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shnum == 0 || eh.e_shoff > size ||
      uint64_t{eh.e_shnum} * sizeof(Elf64_Shdr) > size - eh.e_shoff) {
    return NotScannable("its section headers are missing or out of the file");
  }
  std::vector<Elf64_Shdr> sh(eh.e_shnum);
  if (int err = ReadAt(fd, sh.data(), sh.size() * sizeof(Elf64_Shdr), eh.e_shoff); err != 0) {
    return Error(ErrorCode::kIo,
                 ErrnoMessage("cannot scan the ELF file's symbol names: reading its section headers", err));
  }
  std::set<uint32_t> tables;  // section indexes of the symbol tables' string tables
  for (const Elf64_Shdr& s : sh) {
    if (s.sh_type != SHT_SYMTAB && s.sh_type != SHT_DYNSYM) continue;
    if (s.sh_link == 0 || s.sh_link >= sh.size()) return NotScannable("a symbol table links no string table");
    tables.insert(s.sh_link);
  }
  // Distinct string tables of a real file do not overlap, so together they are at most the file: a crafted one whose
  // tables each span the file (up to 65,535 of them) would otherwise make this read the file that many times.
  uint64_t total = 0;
  for (uint32_t index : tables) {
    const Elf64_Shdr& t = sh[index];
    if (t.sh_type == SHT_NOBITS) continue;  // no bytes in the file: no names
    if (t.sh_offset > size || t.sh_size > size - t.sh_offset) return NotScannable("a string table is out of the file");
    total += t.sh_size;
    if (total > size) return NotScannable("its string tables overlap");
  }
  std::string buf;
  buf.reserve(longest + chunk_bytes + 1);
  for (uint32_t index : tables) {
    const Elf64_Shdr& t = sh[index];
    if (t.sh_type == SHT_NOBITS || t.sh_size == 0) continue;
    // Chunk by chunk; the last longest-1 bytes of one are kept in front of the next, so a name across a chunk border is
    // found. A virtual NUL after the table: a name at its very end, unterminated, still counts (conservative).
    buf.clear();
    for (uint64_t pos = 0; pos < t.sh_size;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk_bytes, t.sh_size - pos));
      const size_t kept = buf.size();
      buf.resize(kept + n);
      if (int err = ReadAt(fd, buf.data() + kept, n, t.sh_offset + pos); err != 0) {
        return Error(ErrorCode::kIo,
                     ErrnoMessage("cannot scan the ELF file's symbol names: reading a string table", err));
      }
      pos += n;
      if (pos == t.sh_size) buf.push_back('\0');
      for (const std::string& p : patterns) {
        if (buf.find(p) != std::string::npos) return true;
      }
      const size_t keep = std::min(buf.size(), longest - 1);
      buf.erase(0, buf.size() - keep);
    }
  }
  return false;
}

}  // namespace rvbpfd
