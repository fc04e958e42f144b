#include "stacks/memory_reader.h"

#include <elf.h>
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
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
  Result<std::vector<uint8_t>> data = ReadMaybeGzipFile(path, kMaxCoreBytes);
  if (!data.ok()) return data.error();
  std::unique_ptr<CoreFileReader> reader(new CoreFileReader());
  reader->options_ = options;
  reader->path_ = path;
  reader->data_ = std::move(data).value();
  Status st = reader->Parse();
  if (!st.ok()) return st.error();
  return reader;
}

CoreFileReader::~CoreFileReader() {
  for (auto& [p, fd] : fds_) {
    if (fd >= 0) close(fd);
  }
}

Status CoreFileReader::Parse() {
  auto bad = [this](const std::string& why) { return Error(ErrorCode::kIo, path_ + ": not a usable ELF core: " + why); };
  if (data_.size() < sizeof(Elf64_Ehdr)) return bad("too short");
  Elf64_Ehdr eh;
  std::memcpy(&eh, data_.data(), sizeof(eh));
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
      eh.e_ident[EI_DATA] != ELFDATA2LSB) {
    return bad("not a 64-bit little-endian ELF");
  }
  if (eh.e_type != ET_CORE) return bad("e_type is not ET_CORE");
  if (eh.e_phentsize != sizeof(Elf64_Phdr)) return bad("unexpected e_phentsize");
  uint64_t phnum = eh.e_phnum;
  if (eh.e_phoff > data_.size() || phnum * sizeof(Elf64_Phdr) > data_.size() - eh.e_phoff) {
    return bad("program headers outside the file");
  }
  for (uint64_t i = 0; i < phnum; i++) {
    Elf64_Phdr ph;
    std::memcpy(&ph, data_.data() + eh.e_phoff + i * sizeof(Elf64_Phdr), sizeof(ph));
    if (ph.p_offset > data_.size() || ph.p_filesz > data_.size() - ph.p_offset) return bad("segment outside the file");
    if (ph.p_type == PT_LOAD) {
      if (ph.p_filesz > ph.p_memsz || ph.p_vaddr + ph.p_memsz < ph.p_vaddr) return bad("inconsistent PT_LOAD");
      if (ph.p_memsz != 0) segments_.push_back({ph.p_vaddr, ph.p_memsz, ph.p_offset, ph.p_filesz});
    } else if (ph.p_type == PT_NOTE) {
      // Notes: {namesz, descsz, type, name (4-aligned), desc (4-aligned)}.
      uint64_t pos = ph.p_offset;
      const uint64_t end = ph.p_offset + ph.p_filesz;
      while (pos + 12 <= end) {
        uint32_t hdr[3];
        std::memcpy(hdr, data_.data() + pos, 12);
        uint64_t name_len = (uint64_t{hdr[0]} + 3) & ~uint64_t{3};
        uint64_t desc_len = (uint64_t{hdr[1]} + 3) & ~uint64_t{3};
        uint64_t desc = pos + 12 + name_len;
        if (desc > end || desc_len > end - desc) return bad("truncated note");
        if (hdr[2] == NT_FILE) {
          // NT_FILE desc: count, page_size, count x {start, end, file_ofs (in pages)}, then count NUL-terminated names.
          const uint8_t* d = data_.data() + desc;
          uint64_t dlen = hdr[1];
          if (dlen < 16) return bad("short NT_FILE");
          uint64_t count, page_size;
          std::memcpy(&count, d, 8);
          std::memcpy(&page_size, d + 8, 8);
          if (count > (dlen - 16) / 24) return bad("NT_FILE count too large");
          uint64_t names = 16 + count * 24;
          for (uint64_t k = 0; k < count; k++) {
            uint64_t e[3];
            std::memcpy(e, d + 16 + k * 24, 24);
            const void* nul = names < dlen ? std::memchr(d + names, 0, dlen - names) : nullptr;
            if (nul == nullptr) return bad("NT_FILE names truncated");
            std::string name(reinterpret_cast<const char*>(d + names),
                             static_cast<const uint8_t*>(nul) - (d + names));
            names += name.size() + 1;
            if (e[1] < e[0] || (page_size != 0 && e[2] > UINT64_MAX / page_size)) return bad("bad NT_FILE entry");
            files_.push_back({e[0], e[1], e[2] * page_size, std::move(name)});
          }
        }
        pos = desc + desc_len;
      }
    }
  }
  std::sort(segments_.begin(), segments_.end(), [](const Segment& a, const Segment& b) { return a.vaddr < b.vaddr; });
  if (segments_.empty()) return bad("no PT_LOAD segments");
  return Status::Ok();
}

bool CoreFileReader::ReadFromOriginalFile(uint64_t addr, uint8_t* dst, size_t len, bool* covered) {
  *covered = false;
  for (const CoreFileMapping& m : files_) {
    if (addr < m.start || addr >= m.end) continue;
    *covered = true;
    if (!options_.use_original_files || len > m.end - addr) return false;
    std::string full = options_.file_root + m.path;
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
    std::memcpy(dst, data_.data() + seg.offset + rel, n);
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

bool CoreFileReader::Read(uint64_t addr, void* dst, size_t len) {
  if (len == 0 || len > kMaxReadBytes || addr + len < addr) return false;
  auto* out = static_cast<uint8_t*>(dst);
  while (len > 0) {
    // The last segment starting at or below addr.
    auto it = std::upper_bound(segments_.begin(), segments_.end(), addr,
                               [](uint64_t a, const Segment& s) { return a < s.vaddr; });
    if (it == segments_.begin()) return false;
    --it;
    if (addr - it->vaddr >= it->memsz) return false;
    size_t n = static_cast<size_t>(std::min<uint64_t>(len, it->memsz - (addr - it->vaddr)));
    if (!ReadFromSegment(*it, addr, out, n)) return false;
    out += n;
    addr += n;
    len -= n;
  }
  return true;
}

}  // namespace rvbpfd
