// The one way rvbpfd creates an output file (traces, exports, reports, the agent's profiles). It runs as root in
// directories other users may write (/tmp, a shared output dir), so the file is always a new inode of its own:
//   - created under an unpredictable temporary name in the same directory with O_CREAT|O_EXCL|O_NOFOLLOW, mode
//     exactly `mode` (0600 by default: traces hold command lines and paths), owned by `owner` (the sudo invoker);
//   - moved to its name with renameat, which replaces a regular file or hard link there without writing through
//     it; a symbolic link at the name is refused (never followed, never silently replaced), a directory too;
//   - removed again when the caller abandons it, so a failed write leaves nothing behind.
// A FIFO or character device already at the name (-o /dev/null, a named pipe) is written in place instead: opened
// O_NOFOLLOW|O_NONBLOCK (a FIFO without a reader fails with ENXIO rather than blocking), never created or removed;
// /dev/stdout, /dev/stderr and /dev/fd/N are the process's own descriptors, duplicated.
#ifndef RVBPFD_SRC_COMMON_SAFE_FILE_H_
#define RVBPFD_SRC_COMMON_SAFE_FILE_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <streambuf>
#include <string>

#include "common/error.h"
#include "common/invoking_user.h"

namespace rvbpfd {

// The default cap of an export's or report's size (--max-output-bytes): as large as the largest trace read
// (TraceReader::kMaxTraceBytes), far above what real traces give (a million events export to tens of MB), and well
// below what one hostile trace can ask for (a deep stack of long labels repeated per event: tens of GiB).
inline constexpr uint64_t kDefaultMaxOutputBytes = 4ull << 30;

struct OutputFileOptions {
  mode_t mode = 0600;
  std::optional<UserIds> owner;  // fchown to these ids when set (SudoInvokerOfProcess() for user-facing outputs)
  // true: the file takes its name at Create, so a crash leaves a readable prefix there (a trace being recorded);
  // false: only Commit gives it its name, so readers never see a partial file (exports, reports, profiles).
  bool publish_at_create = false;
  bool sync = false;  // Commit fsyncs the file and then the directory (durable profiles)
  // A FIFO or character device already at the name is written in place (a user's -o /dev/null or named pipe);
  // false: refused (where nobody asked for one, e.g. the agent's profile files, a planted FIFO could stall writes).
  bool allow_fifo_or_device = false;
  std::string fix_hint = "choose another path with -o";  // ends creation errors: the flag that fixes them
  // WriteOutputFile: the most bytes the file may get (0 = no cap). A write past it fails the stream, and the file is
  // removed with a kOutputTooLarge error naming `max_bytes_flag`, so what a trace holds cannot fill a disk.
  uint64_t max_bytes = 0;
  std::string max_bytes_flag = "--max-output-bytes";
};

class OutputFile {
 public:
  OutputFile() = default;  // holds nothing; fd() is -1
  // `path` names the file to create; its directory part is resolved once (symlinks there are the caller's choice),
  // its last component never follows a symlink. Errors are kOutputUnwritable naming the path, the step and errno.
  static Result<OutputFile> Create(const std::string& path, const OutputFileOptions& options);
  // The same inside the directory open at `dir_fd` (duplicated, not taken); `name` is one path component and
  // `dir_label` names the directory in messages.
  static Result<OutputFile> CreateAt(int dir_fd, const std::string& dir_label, const std::string& name,
                                     const OutputFileOptions& options);

  OutputFile(OutputFile&& other) noexcept;
  OutputFile& operator=(OutputFile&& other) noexcept;
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  ~OutputFile();  // Abandon() unless committed

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  // False for a FIFO or device written in place (nothing of it is ours to remove).
  bool created() const { return created_; }

  // Closes the file (reporting a late write error: NFS, quota) and gives it its name. kIo errors name the step.
  Status Commit();
  // Closes the file and removes what Create made (the temporary, or the published file while it is still ours).
  void Abandon();

 private:
  int dir_fd_ = -1;
  int fd_ = -1;
  std::string path_;       // for messages
  std::string name_;       // final name inside dir_fd_
  std::string temp_name_;  // empty once published (or never, for a FIFO/device)
  bool created_ = false;
  bool done_ = true;       // committed or abandoned
  bool sync_ = false;

  void CloseAll();
};

// Writes an OutputFile through std::ostream (the exporters and the report write to streams). A failed write() sets
// badbit; error() then holds its errno.
class OutputFileStream : public std::ostream {
 public:
  // max_bytes: at most this many bytes reach the file (0 = no cap); the write that would pass it fails with EFBIG
  // and nothing of it is written.
  explicit OutputFileStream(int fd, uint64_t max_bytes = 0);
  OutputFileStream(const OutputFileStream&) = delete;
  OutputFileStream& operator=(const OutputFileStream&) = delete;
  int error() const { return buf_.error(); }
  bool exceeded() const { return buf_.exceeded(); }

 private:
  class Buf : public std::streambuf {
   public:
    Buf(int fd, uint64_t max_bytes);
    int error() const { return err_; }
    bool exceeded() const { return exceeded_; }

   protected:
    int_type overflow(int_type c) override;
    int sync() override;

   private:
    bool Drain();
    int fd_;
    int err_ = 0;
    uint64_t max_bytes_;
    uint64_t written_ = 0;
    bool exceeded_ = false;
    char data_[64 * 1024];
  };
  Buf buf_;
};

// Creates `path` (OutputFile::Create with `options`), runs `write` on a stream over it and commits; on any failure
// the file is removed (nothing partial is left at `path`) and the error names the path and errno.
Status WriteOutputFile(const std::string& path, const OutputFileOptions& options,
                       const std::function<Status(std::ostream&)>& write);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_COMMON_SAFE_FILE_H_
