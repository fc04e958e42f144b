#include "stacks/memory_reader.h"

#include <elf.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/target_file.h"

namespace rvbpfd {

bool ProcessMemoryReader::Read(uint64_t addr, void* dst, size_t len) {
  if (len == 0 || len > kMaxReadBytes || addr + len < addr) return false;
  struct iovec local = {dst, len};
  struct iovec remote = {reinterpret_cast<void*>(addr), len};
  // process_vm_readv may return a partial count when the range crosses into an unmapped page: that is a failure here.
  ++syscalls_;
  ssize_t n = process_vm_readv(pid_, &local, 1, &remote, 1, 0);
  return n == static_cast<ssize_t>(len);
}

size_t ProcessMemoryReader::ReadMany(std::span<Request> requests) {
  size_t ok = 0;
  struct iovec local[kMaxBatch];
  struct iovec remote[kMaxBatch];
  size_t i = 0;
  while (i < requests.size()) {
    // Invalid requests fail here, without a syscall, exactly as Read would fail them.
    Request& first = requests[i];
    if (first.len == 0 || first.len > kMaxReadBytes || first.addr + first.len < first.addr) {
      first.ok = false;
      ++i;
      continue;
    }
    size_t n = 0;
    while (i + n < requests.size() && n < kMaxBatch) {
      const Request& r = requests[i + n];
      if (r.len == 0 || r.len > kMaxReadBytes || r.addr + r.len < r.addr) break;
      local[n] = {r.dst, r.len};
      remote[n] = {reinterpret_cast<void*>(r.addr), r.len};
      ++n;
    }
    ++syscalls_;
    const ssize_t got = process_vm_readv(pid_, local, n, remote, n, 0);
    if (got < 0 && errno == ESRCH) {  // the target is gone: nothing else can be read either
      for (; i < requests.size(); ++i) requests[i].ok = false;
      break;
    }
    // The kernel never splits an element: the bytes read cover whole leading elements, and the first one not
    // covered is the one that failed. Mark the covered ones, fail that one, and continue after it.
    size_t covered = 0;
    size_t bytes = got > 0 ? static_cast<size_t>(got) : 0;
    while (covered < n && bytes >= requests[i + covered].len) {
      bytes -= requests[i + covered].len;
      requests[i + covered].ok = true;
      ++covered;
    }
    ok += covered;
    i += covered;
    if (covered < n) {
      requests[i].ok = false;
      ++i;
    }
  }
  return ok;
}

Result<std::vector<uint8_t>> ReadMaybeGzipFile(const std::string& path, size_t max_bytes) {
  gzFile gz = gzopen(path.c_str(), "rb");  // transparently reads uncompressed files too
  if (gz == nullptr) return Error(ErrorCode::kIo, ErrnoMessage("opening " + path, errno));
  std::vector<uint8_t> out;
  constexpr size_t kChunk = 1 << 20;
  for (;;) {
    if (out.size() >= max_bytes) {
      gzclose(gz);
      return Error(ErrorCode::kIo, path + ": larger than " + std::to_string(max_bytes) + " bytes");
    }
    size_t old = out.size();
    out.resize(old + kChunk);
    int n = gzread(gz, out.data() + old, kChunk);
    if (n < 0) {
      int zerr = 0;
      std::string msg = gzerror(gz, &zerr);
      gzclose(gz);
      return Error(ErrorCode::kIo, path + ": " + msg);
    }
    out.resize(old + static_cast<size_t>(n));
    if (n == 0) break;
  }
  gzclose(gz);
  return out;
}

Result<std::unique_ptr<CoreFileReader>> CoreFileReader::Open(const std::string& path, const Options& options) {
  // 4 GiB: far above any test case; protects against a corrupt gzip stream inflating without end.
  constexpr size_t kMaxCoreBytes = size_t{4} << 30;
  Result<FileFd> fd = OpenRegularFile(path, "core file");
  if (!fd) return fd.error();
  uint8_t magic[2] = {};
  const bool gzip = pread(fd->get(), magic, 2, 0) == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
  std::unique_ptr<CoreFileReader> reader(new CoreFileReader());
  reader->options_ = options;
  reader->path_ = path;
  if (gzip) {
    Result<std::vector<uint8_t>> data = ReadMaybeGzipFile(path, kMaxCoreBytes);
    if (!data.ok()) return data.error();
    reader->data_ = std::move(data).value();
    reader->core_size_ = reader->data_.size();
  } else {
    struct stat st;
    if (fstat(fd->get(), &st) != 0) return Error(ErrorCode::kIo, ErrnoMessage("stat " + path, errno));
    reader->core_size_ = static_cast<uint64_t>(st.st_size);
    reader->core_fd_ = fd->Release();
  }
  Status st = reader->Parse();
  if (!st.ok()) return st.error();
  return reader;
}

Result<std::unique_ptr<CoreFileReader>> CoreFileReader::FromBytes(std::vector<uint8_t> bytes, const Options& options) {
  std::unique_ptr<CoreFileReader> reader(new CoreFileReader());
  reader->options_ = options;
  reader->path_ = "core";
  reader->data_ = std::move(bytes);
  reader->core_size_ = reader->data_.size();
  Status st = reader->Parse();
  if (!st.ok()) return st.error();
  return reader;
}

CoreFileReader::~CoreFileReader() {
  if (core_fd_ >= 0) close(core_fd_);
  for (auto& [p, fd] : fds_) {
    if (fd >= 0) close(fd);
  }
}

bool CoreFileReader::ReadCore(uint64_t offset, void* dst, size_t len) {
  if (offset > core_size_ || len > core_size_ - offset) return false;
  if (core_fd_ < 0) {
    std::memcpy(dst, data_.data() + offset, len);
    return true;
  }
  auto* out = static_cast<uint8_t*>(dst);
  while (len > 0) {
    const ssize_t n = pread(core_fd_, out, len, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;  // an error, or the file shrank since it was opened
    out += n;
    offset += static_cast<uint64_t>(n);
    len -= static_cast<size_t>(n);
  }
  return true;
}

namespace {

template <typename T>
T Load(std::span<const uint8_t> d, size_t off) {
  T v;
  std::memcpy(&v, d.data() + off, sizeof(T));
  return v;
}

Error BadNote(const std::string& why) { return Error(ErrorCode::kIo, "malformed " + why); }

// NT_FILE desc: count, page_size, count x {start, end, file_ofs (in pages)}, then count NUL-terminated names.
Status ParseNtFile(std::span<const uint8_t> d, CoreNotes* notes) {
  if (d.size() < 16) return BadNote("NT_FILE note: shorter than its header");
  const uint64_t count = Load<uint64_t>(d, 0), page_size = Load<uint64_t>(d, 8);
  if (count > (d.size() - 16) / 24) return BadNote("NT_FILE note: count larger than the note");
  if (notes->files.size() + count > kMaxCoreFileMappings) return BadNote("NT_FILE note: too many mappings");
  uint64_t names = 16 + count * 24;
  for (uint64_t k = 0; k < count; k++) {
    const uint64_t start = Load<uint64_t>(d, 16 + k * 24), end = Load<uint64_t>(d, 24 + k * 24),
                   pgoff = Load<uint64_t>(d, 32 + k * 24);
    const void* nul = names < d.size() ? std::memchr(d.data() + names, 0, d.size() - names) : nullptr;
    if (nul == nullptr) return BadNote("NT_FILE note: names truncated");
    const size_t len = static_cast<size_t>(static_cast<const uint8_t*>(nul) - (d.data() + names));
    std::string name(reinterpret_cast<const char*>(d.data() + names), len);
    names += len + 1;
    if (end < start || (page_size != 0 && pgoff > UINT64_MAX / page_size)) return BadNote("NT_FILE entry");
    notes->files.push_back({start, end, pgoff * page_size, std::move(name)});
  }
  return Status::Ok();
}

// struct elf_prstatus (x86-64): pr_cursig at 12, pr_pid at 32, pr_reg (27 words of user_regs_struct) at 112.
constexpr size_t kPrstatusSize = 336;
constexpr size_t kPrstatusReg = 112;
enum RegIndex { kR10 = 7, kR9 = 8, kR8 = 9, kRdx = 12, kRsi = 13, kRdi = 14, kOrigRax = 15, kRip = 16, kRsp = 19 };

Status ParsePrstatus(std::span<const uint8_t> d, CoreNotes* notes) {
  if (d.size() < kPrstatusSize) return BadNote("NT_PRSTATUS note: shorter than struct elf_prstatus (x86-64)");
  if (notes->threads.size() >= kMaxCoreThreads) return BadNote("core: too many NT_PRSTATUS notes");
  CoreThread t;
  t.signal = Load<int16_t>(d, 12);
  t.tid = Load<int32_t>(d, 32);
  auto reg = [&](int i) { return Load<uint64_t>(d, kPrstatusReg + 8 * static_cast<size_t>(i)); };
  t.orig_rax = reg(kOrigRax);
  const int args[6] = {kRdi, kRsi, kRdx, kR10, kR8, kR9};
  for (int i = 0; i < 6; i++) t.args[i] = reg(args[i]);
  t.rip = reg(kRip);
  t.rsp = reg(kRsp);
  if (t.tid <= 0) return BadNote("NT_PRSTATUS note: tid " + std::to_string(t.tid));
  notes->threads.push_back(t);
  return Status::Ok();
}

// struct elf_prpsinfo (x86-64): pr_pid at 24, pr_fname[16] at 40.
Status ParsePrpsinfo(std::span<const uint8_t> d, CoreNotes* notes) {
  if (d.size() < 56) return BadNote("NT_PRPSINFO note: shorter than struct elf_prpsinfo (x86-64)");
  notes->pid = std::max(0, Load<int32_t>(d, 24));
  const char* f = reinterpret_cast<const char*>(d.data() + 40);
  notes->fname.assign(f, strnlen(f, 16));
  return Status::Ok();
}

// NT_AUXV: {type, value} pairs up to AT_NULL.
void ParseAuxv(std::span<const uint8_t> d, CoreNotes* notes) {
  for (size_t off = 0; off + 16 <= d.size(); off += 16) {
    const uint64_t type = Load<uint64_t>(d, off);
    if (type == AT_NULL) break;
    if (type == AT_ENTRY) notes->entry = Load<uint64_t>(d, off + 8);
  }
}

}  // namespace

Status ParseCoreNote(std::string_view name, uint32_t type, std::span<const uint8_t> desc, CoreNotes* notes) {
  // NT_FILE's number is unique; the others are numbered per owner (a GNU note of type 1 or 3 is something else).
  if (type == NT_FILE) return ParseNtFile(desc, notes);
  if (name != "CORE") return Status::Ok();
  switch (type) {
    case NT_PRSTATUS: return ParsePrstatus(desc, notes);
    case NT_PRPSINFO: return ParsePrpsinfo(desc, notes);
    case NT_AUXV: ParseAuxv(desc, notes); return Status::Ok();
    default: return Status::Ok();
  }
}

Status CoreFileReader::Parse() {
  auto bad = [this](const std::string& why) { return Error(ErrorCode::kIo, path_ + ": not a usable ELF core: " + why); };
  // Notes held at once: gdb's and the kernel's are tens of KB (NT_FILE grows with the mappings: ~100 bytes each).
  constexpr uint64_t kMaxNoteBytes = 64 << 20;
  Elf64_Ehdr eh;
  if (!ReadCore(0, &eh, sizeof(eh))) return bad("too short");
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
      eh.e_ident[EI_DATA] != ELFDATA2LSB) {
    return bad("not a 64-bit little-endian ELF");
  }
  if (eh.e_type != ET_CORE) return bad("e_type is not ET_CORE");
  if (eh.e_phentsize != sizeof(Elf64_Phdr)) return bad("unexpected e_phentsize");
  const uint64_t phnum = eh.e_phnum;
  if (eh.e_phoff > core_size_ || phnum * sizeof(Elf64_Phdr) > core_size_ - eh.e_phoff) {
    return bad("program headers outside the file");
  }
  std::vector<Elf64_Phdr> phdrs(phnum);
  if (phnum != 0 && !ReadCore(eh.e_phoff, phdrs.data(), phnum * sizeof(Elf64_Phdr))) return bad("program headers");
  uint64_t note_bytes = 0;
  for (const Elf64_Phdr& ph : phdrs) {
    if (ph.p_offset > core_size_ || ph.p_filesz > core_size_ - ph.p_offset) return bad("segment outside the file");
    if (ph.p_type == PT_LOAD) {
      if (ph.p_filesz > ph.p_memsz || ph.p_vaddr + ph.p_memsz < ph.p_vaddr) return bad("inconsistent PT_LOAD");
      if (ph.p_memsz != 0) segments_.push_back({ph.p_vaddr, ph.p_memsz, ph.p_offset, ph.p_filesz});
      continue;
    }
    if (ph.p_type != PT_NOTE) continue;
    note_bytes += ph.p_filesz;
    if (note_bytes > kMaxNoteBytes) return bad("notes larger than " + std::to_string(kMaxNoteBytes) + " bytes");
    std::vector<uint8_t> seg(ph.p_filesz);
    if (!seg.empty() && !ReadCore(ph.p_offset, seg.data(), seg.size())) return bad("unreadable notes");
    // Notes: {namesz, descsz, type, name (4-aligned), desc (4-aligned)}.
    uint64_t pos = 0;
    const uint64_t end = seg.size();
    while (pos + 12 <= end) {
      uint32_t hdr[3];
      std::memcpy(hdr, seg.data() + pos, 12);
      const uint64_t name_len = (uint64_t{hdr[0]} + 3) & ~uint64_t{3};
      const uint64_t desc_len = (uint64_t{hdr[1]} + 3) & ~uint64_t{3};
      const uint64_t desc = pos + 12 + name_len;
      if (desc > end || desc_len > end - desc || hdr[1] > end - desc) return bad("truncated note");
      std::string_view name(reinterpret_cast<const char*>(seg.data() + pos + 12), hdr[0]);
      if (!name.empty() && name.back() == '\0') name.remove_suffix(1);
      Status st = ParseCoreNote(name, hdr[2], std::span<const uint8_t>(seg.data() + desc, hdr[1]), &notes_);
      if (!st) return bad(st.error().message());
      pos = desc + desc_len;
    }
  }
  std::sort(segments_.begin(), segments_.end(), [](const Segment& a, const Segment& b) { return a.vaddr < b.vaddr; });
  if (segments_.empty()) return bad("no PT_LOAD segments");
  return Status::Ok();
}

void CoreFileReader::SetOriginalFile(const std::string& recorded_path, const std::string& host_path) {
  overrides_[recorded_path] = host_path;
}

bool CoreFileReader::ReadFromOriginalFile(uint64_t addr, uint8_t* dst, size_t len, bool* covered) {
  *covered = false;
  for (const CoreFileMapping& m : notes_.files) {
    if (addr < m.start || addr >= m.end) continue;
    *covered = true;
    if (!options_.use_original_files || len > m.end - addr) return false;
    auto over = overrides_.find(m.path);
    const std::string full = over != overrides_.end() ? over->second : options_.file_root + m.path;
    auto it = fds_.find(full);
    if (it == fds_.end()) {
      // The mapped files of a dump: under a /proc/PID/root style root they are resolved inside it, and only a
      // regular file is read (a FIFO there must not block the reader).
      Result<FileFd> opened = OpenRegularFile(full, "mapped file");
      it = fds_.emplace(full, opened ? opened->Release() : -1).first;
    }
    if (it->second < 0) return false;
    ssize_t n = pread(it->second, dst, len, static_cast<off_t>(m.offset + (addr - m.start)));
    if (n != static_cast<ssize_t>(len)) return false;
    original_file_reads_++;
    return true;
  }
  return false;
}

bool CoreFileReader::ReadFromSegment(const Segment& seg, uint64_t addr, uint8_t* dst, size_t len) {
  uint64_t rel = addr - seg.vaddr;
  // Part carried by the file.
  if (rel < seg.filesz) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(len, seg.filesz - rel));
    if (!ReadCore(seg.offset + rel, dst, n)) return false;
    dst += n;
    addr += n;
    len -= n;
    rel += n;
  }
  if (len == 0) return true;
  // Declared but not carried: the original file's bytes if a file was mapped there, zeros for anonymous memory.
  bool covered = false;
  if (ReadFromOriginalFile(addr, dst, len, &covered)) return true;
  if (covered) return false;
  std::memset(dst, 0, len);
  return true;
}

const CoreFileReader::Segment* CoreFileReader::SegmentAt(uint64_t addr) const {
  // The last segment starting at or below addr.
  auto it = std::upper_bound(segments_.begin(), segments_.end(), addr,
                             [](uint64_t a, const Segment& s) { return a < s.vaddr; });
  if (it == segments_.begin()) return nullptr;
  --it;
  return addr - it->vaddr < it->memsz ? &*it : nullptr;
}

bool CoreFileReader::Read(uint64_t addr, void* dst, size_t len) {
  if (len == 0 || len > kMaxReadBytes || addr + len < addr) return false;
  auto* out = static_cast<uint8_t*>(dst);
  while (len > 0) {
    const Segment* seg = SegmentAt(addr);
    if (seg == nullptr) {
      // gdb writes no PT_LOAD at all for a file-backed mapping it leaves out (the kernel one of p_filesz 0): only
      // NT_FILE names it. The rest of the read must lie in that one mapping.
      bool covered = false;
      return ReadFromOriginalFile(addr, out, len, &covered);
    }
    size_t n = static_cast<size_t>(std::min<uint64_t>(len, seg->memsz - (addr - seg->vaddr)));
    if (!ReadFromSegment(*seg, addr, out, n)) return false;
    out += n;
    addr += n;
    len -= n;
  }
  return true;
}

bool CoreFileReader::ReadCarried(uint64_t addr, void* dst, size_t len) {
  if (len == 0 || len > kMaxReadBytes || addr + len < addr) return false;
  auto* out = static_cast<uint8_t*>(dst);
  while (len > 0) {
    const Segment* seg = SegmentAt(addr);
    if (seg == nullptr || addr - seg->vaddr >= seg->filesz) return false;
    const uint64_t rel = addr - seg->vaddr;
    size_t n = static_cast<size_t>(std::min<uint64_t>(len, seg->filesz - rel));
    if (!ReadCore(seg->offset + rel, out, n)) return false;
    out += n;
    addr += n;
    len -= n;
  }
  return true;
}

namespace {

// Program headers and note bytes read from a core to find a build-id: a real ELF header page holds a few dozen
// headers and a note segment of a few hundred bytes.
constexpr uint16_t kMaxPhdrs = 256;
constexpr uint64_t kMaxNoteSegment = 64 << 10;

std::optional<std::string> BuildIdInNotes(const std::vector<uint8_t>& seg) {
  size_t pos = 0;
  while (pos + 12 <= seg.size()) {
    uint32_t hdr[3];
    std::memcpy(hdr, seg.data() + pos, 12);
    const uint64_t name_len = (uint64_t{hdr[0]} + 3) & ~uint64_t{3};
    const uint64_t desc_len = (uint64_t{hdr[1]} + 3) & ~uint64_t{3};
    const uint64_t desc = pos + 12 + name_len;
    if (desc > seg.size() || hdr[1] > seg.size() - desc) return std::nullopt;
    if (hdr[0] == 4 && hdr[2] == NT_GNU_BUILD_ID && std::memcmp(seg.data() + pos + 12, "GNU", 4) == 0 &&
        hdr[1] > 0 && hdr[1] <= 64) {
      std::string hex;
      char b[3];
      for (uint32_t i = 0; i < hdr[1]; i++) {
        std::snprintf(b, sizeof(b), "%02x", seg[desc + i]);
        hex += b;
      }
      return hex;
    }
    if (desc_len > seg.size() - desc) return std::nullopt;
    pos = desc + desc_len;
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> CoreBuildIdAt(CoreFileReader& core, uint64_t start) {
  Elf64_Ehdr eh;
  if (!core.ReadCarried(start, &eh, sizeof(eh))) return std::nullopt;
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
      eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum == 0 || eh.e_phnum > kMaxPhdrs) {
    return std::nullopt;
  }
  std::vector<Elf64_Phdr> ph(eh.e_phnum);
  if (start + eh.e_phoff < start || !core.ReadCarried(start + eh.e_phoff, ph.data(), ph.size() * sizeof(Elf64_Phdr))) {
    return std::nullopt;
  }
  // The mapping's first page is the lowest PT_LOAD's (page-aligned) vaddr.
  uint64_t lowest = UINT64_MAX;
  for (const Elf64_Phdr& p : ph) {
    if (p.p_type == PT_LOAD) lowest = std::min(lowest, p.p_vaddr & ~uint64_t{0xfff});
  }
  if (lowest == UINT64_MAX) return std::nullopt;
  for (const Elf64_Phdr& p : ph) {
    if (p.p_type != PT_NOTE || p.p_filesz == 0 || p.p_filesz > kMaxNoteSegment || p.p_vaddr < lowest) continue;
    std::vector<uint8_t> seg(p.p_filesz);
    const uint64_t addr = start + (p.p_vaddr - lowest);
    if (addr < start || !core.ReadCarried(addr, seg.data(), seg.size())) continue;
    if (std::optional<std::string> id = BuildIdInNotes(seg)) return id;
  }
  return std::nullopt;
}

}  // namespace rvbpfd
