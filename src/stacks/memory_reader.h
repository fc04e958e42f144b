// Reading a Ruby process's memory from outside: live (process_vm_readv) or from an ELF coredump.
//
// The walker and the symbolizer read memory that belongs to a process we do not trust and that may change under us,
// so every read is bounded (kMaxReadBytes), either fully succeeds or fails, and never faults the daemon.
#ifndef RVBPFD_SRC_STACKS_MEMORY_READER_H_
#define RVBPFD_SRC_STACKS_MEMORY_READER_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace rvbpfd {

class MemoryReader {
 public:
  // Largest single read, in bytes. The walker reads words and the symbolizer reads strings capped far below this;
  // a larger request is a bug or a corrupt length and fails instead of allocating.
  static constexpr size_t kMaxReadBytes = 1 << 20;

  virtual ~MemoryReader() = default;
  // Copies len bytes at addr into dst. False (dst contents unspecified) when any byte is unreadable or len is 0 or
  // above kMaxReadBytes.
  virtual bool Read(uint64_t addr, void* dst, size_t len) = 0;

  template <typename T>
  bool ReadValue(uint64_t addr, T* out) {
    return Read(addr, out, sizeof(T));
  }

  // One read of a batch: len bytes at addr into dst; ok says whether all of them were read.
  struct Request {
    uint64_t addr = 0;
    void* dst = nullptr;
    size_t len = 0;
    bool ok = false;
  };
  // Performs every request, each with Read's all-or-nothing rule, and sets its ok. A live reader does the whole
  // batch in as few syscalls as it can (the stack resolver revalidates dozens of cached frames after each GC; one
  // process_vm_readv each was most of the fleet agent's kernel time). Returns how many succeeded.
  virtual size_t ReadMany(std::span<Request> requests) {
    size_t ok = 0;
    for (Request& r : requests) ok += (r.ok = Read(r.addr, r.dst, r.len)) ? 1 : 0;
    return ok;
  }
};

// Live process memory through process_vm_readv (needs ptrace access to the target).
class ProcessMemoryReader : public MemoryReader {
 public:
  explicit ProcessMemoryReader(int pid) : pid_(pid) {}
  bool Read(uint64_t addr, void* dst, size_t len) override;
  // One process_vm_readv per up to kMaxBatch requests; the kernel stops at the first unreadable element, so the
  // requests after it are retried from there (one syscall per failure, and a failure is rare: a freed object).
  size_t ReadMany(std::span<Request> requests) override;
  // Requests per process_vm_readv (well under IOV_MAX = 1024).
  static constexpr size_t kMaxBatch = 256;
  // process_vm_readv calls made so far (tests check the batching).
  uint64_t syscalls() const { return syscalls_; }
  int pid() const { return pid_; }

 private:
  int pid_;
  uint64_t syscalls_ = 0;
};

// Forwards to a reader owned elsewhere (for a consumer that takes ownership of its reader, e.g. StackResolver, over
// a reader that must outlive it).
class BorrowedMemoryReader : public MemoryReader {
 public:
  explicit BorrowedMemoryReader(MemoryReader& mem) : mem_(mem) {}
  bool Read(uint64_t addr, void* dst, size_t len) override { return mem_.Read(addr, dst, len); }
  size_t ReadMany(std::span<Request> requests) override { return mem_.ReadMany(requests); }

 private:
  MemoryReader& mem_;
};

// One NT_FILE entry of a coredump: [start, end) of the process mapped `path` at file offset `offset` (bytes).
struct CoreFileMapping {
  uint64_t start = 0;
  uint64_t end = 0;
  uint64_t offset = 0;
  std::string path;
};

// One thread of a coredump (its NT_PRSTATUS note, x86-64): the tid as the dumper saw it and the registers a dump
// needs. A thread stopped inside a system call has its number in orig_rax and the arguments in rdi, rsi, rdx, r10,
// r8, r9; one stopped in user space has orig_rax -1.
struct CoreThread {
  int tid = 0;
  int signal = 0;  // pr_cursig: the signal that stopped it (the crash's on the thread that crashed)
  uint64_t orig_rax = ~uint64_t{0};
  uint64_t args[6] = {};  // rdi, rsi, rdx, r10, r8, r9
  uint64_t rip = 0;
  uint64_t rsp = 0;
  bool in_syscall() const { return static_cast<int64_t>(orig_rax) >= 0; }
};

// What the notes of a coredump say (the ones rvbpfd uses; others are skipped).
struct CoreNotes {
  std::vector<CoreFileMapping> files;  // NT_FILE
  std::vector<CoreThread> threads;     // NT_PRSTATUS, in note order
  int pid = 0;                         // NT_PRPSINFO pr_pid (0: no such note)
  std::string fname;                   // NT_PRPSINFO pr_fname (the executable's name, at most 15 bytes)
  uint64_t entry = 0;                  // NT_AUXV AT_ENTRY: the executable's entry point (0: unknown)
};
// Threads and mappings a core may list: far beyond any real process; a note claiming more is malformed.
inline constexpr size_t kMaxCoreThreads = 1 << 16;
inline constexpr size_t kMaxCoreFileMappings = 1 << 20;

// Adds one note (owner `name` without its NUL, `type`, descriptor bytes) to *notes. Notes of other owners or types
// are ignored. An error (one line naming the note) when a note rvbpfd reads is malformed: shorter than its structure,
// a count its descriptor cannot hold or beyond the limits above, names past its end.
Status ParseCoreNote(std::string_view name, uint32_t type, std::span<const uint8_t> desc, CoreNotes* notes);

// An ELF core file (ET_CORE), plain or gzip-compressed (detected by its magic). Memory comes from the PT_LOAD
// segments; bytes a segment declares (p_memsz) but does not carry (beyond p_filesz) come from the original file named
// by NT_FILE when one covers them (kernel and gdb cores omit read-only file-backed pages), else read as zeros (an
// anonymous page that was never touched). A plain core is read from its file on demand (only its headers and notes
// are held in memory); a compressed one is inflated into memory.
class CoreFileReader : public MemoryReader {
 public:
  struct Options {
    // Prefix for NT_FILE paths when opening original files ("" = as recorded; "/proc/PID/root" style roots work).
    std::string file_root;
    // When false, bytes missing from the core are never read from the original files (a self-contained case must
    // not depend on them).
    bool use_original_files = true;
  };
  static Result<std::unique_ptr<CoreFileReader>> Open(const std::string& path, const Options& options);
  // The same over core bytes already in memory (tests, fuzzing).
  static Result<std::unique_ptr<CoreFileReader>> FromBytes(std::vector<uint8_t> bytes, const Options& options);
  ~CoreFileReader() override;

  bool Read(uint64_t addr, void* dst, size_t len) override;
  // Like Read, but only bytes the core itself carries (never an original file's, never a declared zero page): what
  // the process really had there, e.g. the ELF header a mapping's first page held (build-id checks).
  bool ReadCarried(uint64_t addr, void* dst, size_t len);
  const std::vector<CoreFileMapping>& file_mappings() const { return notes_.files; }
  const CoreNotes& notes() const { return notes_; }
  // Reads bytes the core lacks of the file recorded as `recorded_path` from `host_path` instead (--exe, --libruby).
  void SetOriginalFile(const std::string& recorded_path, const std::string& host_path);
  // Reads that needed an original file (bytes the core did not carry).
  uint64_t original_file_reads() const { return original_file_reads_; }

 private:
  struct Segment {
    uint64_t vaddr = 0;
    uint64_t memsz = 0;
    uint64_t offset = 0;  // in the core
    uint64_t filesz = 0;
  };
  CoreFileReader() = default;
  Status Parse();
  // Copies len bytes at `offset` of the core file; false past its end or on a read error.
  bool ReadCore(uint64_t offset, void* dst, size_t len);
  // Copies [addr, addr+len) that lies inside one segment; false if unreadable.
  bool ReadFromSegment(const Segment& seg, uint64_t addr, uint8_t* dst, size_t len);
  bool ReadFromOriginalFile(uint64_t addr, uint8_t* dst, size_t len, bool* covered);
  const Segment* SegmentAt(uint64_t addr) const;

  Options options_;
  std::string path_;
  std::vector<uint8_t> data_;  // a compressed (or in-memory) core, whole
  int core_fd_ = -1;           // a plain core, read on demand
  uint64_t core_size_ = 0;
  std::vector<Segment> segments_;  // sorted by vaddr
  CoreNotes notes_;
  std::map<std::string, std::string> overrides_;  // recorded path -> host path
  std::map<std::string, int> fds_;  // original files opened on demand
  uint64_t original_file_reads_ = 0;
};

// The GNU build-id (hex) of the ELF file mapped at `start`, read from the bytes the core carries of it (its ELF
// header, program headers and PT_NOTE segments, bounded); nullopt when the core does not carry them or they do not
// parse.
std::optional<std::string> CoreBuildIdAt(CoreFileReader& core, uint64_t start);

// Reads a whole file, inflating it when it is gzip-compressed. Bounded by max_bytes.
Result<std::vector<uint8_t>> ReadMaybeGzipFile(const std::string& path, size_t max_bytes);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_STACKS_MEMORY_READER_H_
