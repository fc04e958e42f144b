// Debug info by build-id: the split debug file of a stripped VM binary (its .symtab and DWARF), looked up where
// distributions install it and through debuginfod.
//
// A binary that lacks .symtab or .debug_info is looked up, in this order:
//   1. <target root><debug dir>/.build-id/<xx>/<rest>.debug, the target's own file system (a container's root is
//      /proc/PID/root: its debug packages describe its binaries);
//   2. <debug dir>/.build-id/<xx>/<rest>.debug on the host;
//   3. debuginfod (libdebuginfod: the servers in DEBUGINFOD_URLS, its cache in DEBUGINFOD_CACHE_PATH or the default
//      per-user cache), bounded by a deadline.
// The debug dir is /usr/lib/debug unless configured (--debug-dir, RVBPFD_DEBUG_DIR). A candidate is used only when its
// NT_GNU_BUILD_ID equals the binary's; otherwise it is skipped and the lookup goes on. The debug file is read like
// the binary (bounded, into memory: ElfFile::Open).
//
// Threading: Configure once at startup, before other threads run; lookups may then run on any thread.
#ifndef RVBPFD_SRC_ELF_DEBUG_LOOKUP_H_
#define RVBPFD_SRC_ELF_DEBUG_LOOKUP_H_

#include <functional>
#include <string>
#include <vector>

#include "common/error.h"
#include "elf/elf_file.h"

namespace rvbpfd {

struct DebugLookupConfig {
  std::string debug_dir = "/usr/lib/debug";  // the build-id tree's parent, in the target's root and on the host
  int debuginfod_timeout_s = 30;             // whole debuginfod query, seconds; 0 disables debuginfod
};

// The process-wide configuration; the defaults above overridden by RVBPFD_DEBUG_DIR until Configure is called.
const DebugLookupConfig& DebugLookupSettings();
void ConfigureDebugLookup(const DebugLookupConfig& config);

// Fetches the debug file of a build-id (lower-case hex): the local path of the file, and where it came from (for
// provenance, e.g. the server URL). The default queries debuginfod (FetchFromDebuginfod).
struct FetchedDebugFile {
  std::string path;
  std::string origin;
};
using DebugFetcher = std::function<Result<FetchedDebugFile>(const std::string& build_id)>;

// debuginfod_find_debuginfo with a deadline of timeout_s (the transfer is aborted when it passes). Errors: kIo naming
// the step and errno (ENOSYS: DEBUGINFOD_URLS is unset or empty; ENOENT: no server has the build-id).
Result<FetchedDebugFile> FetchFromDebuginfod(const std::string& build_id, int timeout_s);

// The root of the file system `path` belongs to: "/proc/PID/root" for a path under /proc/PID/root/ or
// /proc/PID/map_files/ (how the daemon opens a target's files), "" (the host's) otherwise.
std::string FileSystemRootOf(const std::string& path);

// <root><debug_dir>/.build-id/<first two hex digits>/<rest>.debug; "" for a build-id shorter than 3 hex digits or
// with other characters.
std::string BuildIdDebugPath(const std::string& root, const std::string& debug_dir, const std::string& build_id);

// Where a lookup looked and why each place gave nothing (for the error of a binary left without symbols).
struct DebugLookupResult {
  bool attached = false;
  std::vector<std::string> tried;  // "<path>: <why not>", "debuginfod: <why not>"
  std::string Summary() const;     // the tried list, "; "-joined
};

// Attaches the split debug file of `elf` (ElfFile::AttachDebugFile) when it lacks .symtab or .debug_info and the
// lookup finds one; otherwise leaves it as it is. Never fails: a binary without debug info is the caller's to judge.
// `fetch` null: FetchFromDebuginfod with config.debuginfod_timeout_s (none when that is 0).
DebugLookupResult AttachDebugInfo(ElfFile* elf, const DebugLookupConfig& config, const DebugFetcher& fetch = nullptr);
// The same with DebugLookupSettings().
DebugLookupResult AttachDebugInfo(ElfFile* elf);

// Which debug file AttachDebugInfo would find for the binary at `path` (as the daemon reaches it) with `build_id`,
// without reading it: "target:" or "host:" and "<dev>:<ino>:<size>:<mtime_ns>:<ctime_ns>" of the first build-id
// candidate that exists (the binary's own root first, then the host's), "none" when neither does (debuginfod, when
// configured, serves every process alike). For in-memory memos of analyses (the agent's probe sets): two processes
// of one binary share an analysis only when they would read the same debug file, so a debug file a tenant planted in
// its own root serves that tenant's processes only.
std::string DebugFileIdentity(const std::string& path, const std::string& build_id,
                              const DebugLookupConfig& config = DebugLookupSettings());

// ElfFile::Open, then AttachDebugInfo.
Result<ElfFile> OpenWithDebugInfo(const std::string& path, DebugLookupResult* lookup = nullptr);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_ELF_DEBUG_LOOKUP_H_
