// Analysing a VM binary in a short-lived child process, for the long-running fleet agent.
//
// The first analysis of a binary (its sites from disassembly, its stack layout from DWARF) reads a file a target
// process controls and copies its debug sections (38 MB of the 46 MB static test ruby) into memory. Done inside the
// agent, that copy sets the agent's peak RSS, and a parser bug on a hostile file would take the root daemon down with
// it. WarmBinaryCaches runs PrepareVmBinary in a child process instead (rvbpfd itself, re-executed with
// kPrepareChildCommand): the child fills the site, stack-layout and file-identity caches in cache_dir and exits, and
// the agent's own PrepareVmBinary then reads those caches and never loads the debug sections. A crash, a hang or a
// runaway allocation stays in the child: it is reported as an error, and a child still running at the deadline is
// killed.
//
// Protocol: the child gets the binary's O_PATH descriptor as fd 4 (or opens the path itself when there is none) and
// writes one result to fd 3: "ok\n", or "error <code> <length>\n" followed by <length> bytes of message. Its standard
// streams are /dev/null, its signal mask is empty and its signal dispositions are the defaults.
//
// Threading: WarmBinaryCaches blocks the calling thread (the agent's preparation thread) until the child is done or
// the deadline passes; it shares no state.
#ifndef RVBPFD_SRC_SESSION_ISOLATED_PREPARE_H_
#define RVBPFD_SRC_SESSION_ISOLATED_PREPARE_H_

#include <chrono>
#include <span>
#include <string>
#include <string_view>

#include "common/error.h"
#include "common/target_file.h"

namespace rvbpfd {

// argv[1] of the child: not a user command (RunCli hands it to RunPrepareChild before parsing options).
inline constexpr std::string_view kPrepareChildCommand = "__prepare-vm-binary";

struct PrepareChildRequest {
  std::string exe = "/proc/self/exe";  // the program run as the child: rvbpfd itself (tests: a stand-in)
  const FileFd* handle = nullptr;      // O_PATH descriptor of the binary (RubyTarget::vm_fd); null: open `path`
  std::string path;                    // the binary as the daemon reached it: opened when there is no handle, and
                                       // named in messages
  std::string origin_path;             // ElfFile::origin_path (where its debug file is looked up); "" = path
  std::string ruby_version;
  std::string cache_dir;               // must be non-empty: the caches are how the result reaches the caller
  bool want_stacks = true;
  std::chrono::milliseconds timeout{55'000};  // the child is killed when it has not finished by then
};

// What the child run told. kNotStarted: no child could be started (spawn failed), so the caller may analyse the
// binary itself; `error` says why. kFailed: the child ran and the binary cannot be prepared (its error, or a crash,
// a timeout or a malformed answer: all say so and name the binary). kWarmed: the caches are filled.
struct PrepareChildOutcome {
  enum class State { kWarmed, kFailed, kNotStarted };
  State state = State::kFailed;
  Error error{ErrorCode::kInternal, ""};  // for kFailed and kNotStarted
};
PrepareChildOutcome WarmBinaryCaches(const PrepareChildRequest& request);

// The child's side: `args` are the arguments after kPrepareChildCommand. Writes its result to fd 3 and returns the
// process exit status (0 when the result was written, whatever it says).
int RunPrepareChild(std::span<char* const> args);

// The answer's bytes as the child writes them, and the parent's reading of them (bounded, every field checked; a
// malformed answer is an error naming the binary). Exposed for tests.
std::string EncodePrepareAnswer(const Status& result);
Status DecodePrepareAnswer(std::string_view bytes, const std::string& path);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_SESSION_ISOLATED_PREPARE_H_
