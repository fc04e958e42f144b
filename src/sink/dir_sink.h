// DirSink: writes each profile to a file under --output-dir, keeping the files' total size under --output-max-mb.
//
//   <dir>/<app>/<profile_type>-<pid>-<from>-<until>.pb.gz      (from/until in Unix seconds, pid = the "pid" label)
//
// Never half-written: each profile goes to a temporary file in the same directory (".<final name>.<pid>.<n>.tmp"),
// is fsync'ed, then renamed over the final name (atomic on POSIX filesystems), and the directory is fsync'ed. A
// temporary file left by a crash is deleted by the next Create. A reader therefore sees either no file or a
// complete one.
//
// Rotation, per service (<app>): after each write, the sink's files (the *.pb.gz files matching the pattern above in
// <dir>'s immediate subdirectories, found at Create and written since) are deleted oldest first (smallest <from>,
// then oldest mtime, then path) within a service, as long as
//   - that service's files exceed max_service_bytes (--output-service-max-mb; 0 = no cap of its own), or
//   - all files exceed max_total_bytes (--output-max-mb): then from the service holding the most bytes (ties: the
//     first by name), so a noisy service rotates away its own files and never a quieter service's while it holds
//     more than that service does.
// A profile larger than either cap is not written (delivery_failures). Other files in <dir> are never touched.
//
// File names are sanitized: in <app>, <profile_type> and <pid> every byte other than [A-Za-z0-9._] becomes '_'
// ('-' too in <profile_type> and <pid>, which the name's fields are split on; <app> keeps '-'), a leading '.' becomes
// '_' (no hidden files, no "." or ".."), and each is cut to 100 bytes; an empty one becomes "unknown".
//
// Writes happen on the sink's worker thread (delivery_worker.h), so Submit never waits for the disk. A failed write
// is not retried (delivery_failures, last_error).
#ifndef RVBPFD_SRC_SINK_DIR_SINK_H_
#define RVBPFD_SRC_SINK_DIR_SINK_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>

#include "common/error.h"
#include "sink/delivery_worker.h"
#include "sink/sink.h"

namespace rvbpfd {

class DirSink : public ProfileSink {
 public:
  // Creates `dir` (and parents) if needed, checks that a file can be written in it, deletes leftover temporary
  // files, and indexes the existing profile files (deleting the oldest if they already exceed the cap).
  // kOutputUnwritable naming --output-dir and the errno if the directory cannot be created or written; kUsage if
  // max_total_bytes is 0. max_service_bytes: each service's own cap (0 = none).
  static Result<std::unique_ptr<DirSink>> Create(const std::string& dir, uint64_t max_total_bytes,
                                                 size_t max_queue = 256, uint64_t max_service_bytes = 0);
  ~DirSink() override;

  void Submit(ProfileUpload upload) override;
  void SubmitAll(std::vector<ProfileUpload> uploads) override;
  bool Flush(std::chrono::milliseconds deadline) override;
  SinkStats stats() const override;

  // The path an upload is written to (sanitized as above).
  std::string PathFor(const ProfileUpload& upload) const;
  // Bytes in the indexed files now. Read from the worker thread's index: call only while no write is in progress
  // (e.g. after Flush), as tests do.
  uint64_t total_bytes_for_test() const { return total_bytes_; }
  // Bytes of one service's (<app> directory's) files, under the same condition.
  uint64_t service_bytes_for_test(const std::string& app) const;

 private:
  struct FileEntry {
    int64_t from = 0;
    int64_t mtime_ns = 0;
    std::string path;
    uint64_t size = 0;
    std::string app;  // the <app> directory: the service whose budget the file counts against
    bool operator<(const FileEntry& o) const { return std::tie(from, mtime_ns, path) < std::tie(o.from, o.mtime_ns, o.path); }
  };
  struct ServiceFiles {
    std::set<FileEntry> files;  // oldest first
    uint64_t bytes = 0;
  };

  DirSink(std::string dir, uint64_t max_total_bytes, uint64_t max_service_bytes)
      : dir_(std::move(dir)), max_total_bytes_(max_total_bytes), max_service_bytes_(max_service_bytes) {}
  // The directory <dir_>/<app> (made first when `create`), opened without following a symlink there. Returns the
  // owned descriptor.
  Result<int> OpenAppDir(const std::string& app, bool create) const;
  // Unlinks one indexed profile inside its app directory, never through a symlink.
  void RemoveProfile(const std::string& path) const;
  Status ScanExisting();
  void IndexFile(FileEntry entry);
  void Unindex(const std::string& path);
  void RemoveOldest(const std::string& app);  // deletes and unindexes the oldest file of a service
  uint64_t Rotate();  // returns the number of files deleted
  DeliveryOutcome Deliver(const ProfileUpload& upload);

  const std::string dir_;
  const uint64_t max_total_bytes_;
  const uint64_t max_service_bytes_;  // 0: none
  // The index of the sink's files: touched at Create and then only on the worker thread.
  std::map<std::string, ServiceFiles> services_;        // by <app>; a service without files is erased
  std::unordered_map<std::string, FileEntry> by_path_;  // the same entries, by path
  uint64_t total_bytes_ = 0;
  std::unique_ptr<DeliveryWorker> worker_;  // stopped first, in ~DirSink
};

// The file-name-safe form of one name component (rules above); `keep_dash` for <app>.
std::string SanitizeFileComponent(std::string_view text, bool keep_dash);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_SINK_DIR_SINK_H_
