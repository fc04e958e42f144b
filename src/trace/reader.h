// Reads an .rvtrace file, written by rvbpfd or by the in-process recorder ("recorder":"in-process"), finished or cut
// short by a crash (docs/rvtrace.md, "Crash safety"), plain JSON Lines or zstd-compressed (told by the zstd magic
// number, trace/compressed.h).
#ifndef RVBPFD_SRC_TRACE_READER_H_
#define RVBPFD_SRC_TRACE_READER_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/error.h"
#include "trace/event.h"
#include "trace/stacks.h"
#include "trace/summary.h"
#include "trace/writer.h"

namespace rvbpfd {

struct ThreadLine {
  uint32_t ruby_thread = 0;
  bool main = false;          // its process's main thread
  uint32_t process = kRootProcessId;  // ProcessInfo::id of the thread's process (the line's "process"; absent: 1)
  // Names and namespace tid: the thread line's, updated by the thread_info lines that follow it (the latest name).
  ThreadInfo info;
  uint32_t renames = 0;  // thread_info lines that changed a name the thread already had
};

// How tools label a Ruby thread: "main" or "Thread #N", then " (NAME)" when the thread has a name (ThreadName; not
// repeated for a main thread named "main").
std::string ThreadLabelWithName(uint32_t ruby_thread, bool main, std::string_view name);

// How tools name a process: "pid 4242 (ruby app.rb)" (its command joined by spaces, cut after
// kMaxProcessCommandLabelBytes and ended with U+2026), "pid 4242" without a command, "process N" without a pid.
inline constexpr size_t kMaxProcessCommandLabelBytes = 60;
std::string ProcessLabel(const ProcessInfo& process);

struct TraceFile {
  TraceHeader header;                 // started_at is kept as written; missing optional keys keep their defaults
  std::vector<ThreadLine> threads;    // in file order
  // Processes of a multi-process trace, in file order (process lines); empty for a trace of one process, whose
  // process is the header's. ends: the process_end lines. The reader guarantees: ids are unique; every thread line's
  // and process_end's process is defined (or is the root); a parent is an earlier process (no cycles); when there
  // are process lines the root is among them (made from the header when the file has no line for it).
  std::vector<ProcessInfo> processes;
  std::vector<ProcessEnd> process_ends;
  std::vector<TraceEvent> events;     // in file order (samples included); sources are interned (InternSource)
  // Dictionaries by id. Every id an event or stack uses is defined here: the reader rejects a use before its
  // definition (the writer always emits the dictionary line first, so only a corrupt file has one).
  std::unordered_map<uint32_t, FrameInfo> frames;
  std::unordered_map<uint32_t, std::vector<uint32_t>> stacks;  // frame ids, leaf first
  std::optional<TraceSummary> summary;  // absent when the recording did not finish
  bool summary_has_threads = false;     // the summary carried a per-thread list of the documented shape
  // A last line without its '\n' was cut while being written: it is not parsed, only reported.
  bool truncated_last_line = false;
  // A compressed trace ended inside a zstd frame (the writer was killed between two flushes): the text its complete
  // blocks decode to was read, the rest is lost.
  bool truncated_frame = false;
  size_t lines = 0;                   // complete lines read
  size_t unknown_event_lines = 0;     // events with a name this version does not know (skipped)
  size_t unknown_lines = 0;           // complete JSON objects of no known line type (skipped, for forward compat)
  size_t out_of_order_events = 0;     // events whose t_ns is below the previous event's

  bool IsMain(std::optional<uint32_t> ruby_thread) const;
  // Whether the trace holds more than one process (a followed process tree that forked, exec'd or met a skipped
  // child). Tools label threads with their process only then; a one-process trace reads and renders as before.
  bool MultiProcess() const { return processes.size() > 1; }
  const ProcessInfo* FindProcess(uint32_t id) const;        // nullptr: no process line of that id
  const ProcessEnd* FindProcessEnd(uint32_t id) const;      // nullptr: the process did not end in the trace
  uint32_t ProcessOf(uint32_t ruby_thread) const;           // its thread line's process; the root when none
  std::string ProcessLabel(uint32_t id) const;              // ProcessLabel of the process (the root: the header's)
  // The latest names and namespace tid of a thread's line (nullptr: no line for it).
  const ThreadInfo* FindThreadInfo(uint32_t ruby_thread) const;
  // ThreadInfo::DisplayName of the thread, against the main thread's native name; "" when none is known.
  std::string ThreadName(uint32_t ruby_thread) const;
  // The frames of stack `id`, leaf first; nullptr when the id is not defined.
  const std::vector<uint32_t>* Stack(uint32_t id) const;
  const FrameInfo* Frame(uint32_t id) const;
  // Whether stack `id` was taken in GC (StackTakenInGc).
  bool StackInGc(uint32_t id) const;
};

// Whether stack `id` of these dictionaries was taken in GC: the recorder puts the GC pseudo-frame on top (as the leaf)
// of a sample taken during GC. False for an id not defined and for an empty stack.
bool StackTakenInGc(const std::unordered_map<uint32_t, FrameInfo>& frames,
                    const std::unordered_map<uint32_t, std::vector<uint32_t>>& stacks, uint32_t id);

class TraceReader {
 public:
  // Errors: kBadTrace with the line number for a complete line that is not a valid .rvtrace line, a missing
  // header or an unsupported version; kIo when the file cannot be read.
  // Only a regular file of at most kMaxTraceBytes is read (a FIFO, device or directory is kBadTrace, at once).
  static Result<TraceFile> ReadFile(const std::string& path);
  // The largest trace read (bytes, of the file and of its text once decompressed): a trace is parsed whole into
  // memory, and about as much again is held as events.
  static constexpr uint64_t kMaxTraceBytes = 4ull << 30;
  // `name` is used in error messages only. `text` is JSON Lines.
  static Result<TraceFile> Parse(std::string_view text, const std::string& name);
  // A file's content, plain or zstd-compressed (decompressed first, to at most `max_text_bytes`), parsed as Parse.
  static Result<TraceFile> ParseBytes(std::string_view bytes, const std::string& name,
                                      uint64_t max_text_bytes = kMaxTraceBytes);
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_TRACE_READER_H_
