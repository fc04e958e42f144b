// Writes an .rvtrace file (docs/rvtrace.md): header, thread lines, events in the order given, tracing_stopped and
// the summary.
//
// Crash safety: lines are built in a memory buffer and only whole lines are handed to write(2), so a daemon that
// dies leaves a file whose every complete line is valid (at worst the last line is cut inside a write, which the
// reader ignores and reports). In the zstd format (trace/compressed.h) every timed flush ends a zstd frame, so a file
// cut after it decompresses to whole lines; what follows is at most one incomplete frame, which the reader also
// ignores and reports.
#ifndef RVBPFD_SRC_TRACE_WRITER_H_
#define RVBPFD_SRC_TRACE_WRITER_H_

#include <array>
#include <chrono>
#include <memory>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/error.h"
#include "common/safe_file.h"
#include "trace/compressed.h"
#include "trace/event.h"
#include "trace/stacks.h"
#include "trace/summary.h"

namespace rvbpfd {

inline constexpr int kRvtraceVersion = 1;

// Sampling rate assumed for a trace that has samples but no "sample_hz" in its header (rvbpfd's --hz default).
inline constexpr uint32_t kDefaultSampleHz = 99;

struct TraceHeader {
  std::string recorder = "rvbpfd";       // "rvbpfd" or "in-process"
  std::string recorder_version = "0.1.0";
  int64_t pid = 0;                       // target pid (host pid namespace)
  std::string ruby_version;              // "3.4.5"
  std::string clock = "monotonic";       // CLOCK_MONOTONIC
  uint64_t origin_ns = 0;                // CLOCK_MONOTONIC ns that every event's t_ns counts from
  std::string started_at;                // ISO-8601 UTC wall time of origin; empty: Create fills in "now"
  std::vector<std::string> channels = {"thread_hook_site", "gc_hook_site", "probe"};
  std::optional<uint32_t> main_thread = 1;  // serial of the main Ruby thread (0 on 3.2, 1 on 3.3+)
  std::vector<std::string> command;      // launch mode only; written only when non-empty
  std::string build_id;                  // hex GNU build-id of the VM binary; written only when non-empty
  // perf_event CPU sampling frequency in Hz (samples per second per thread on CPU); written only when sampling was
  // on. Exporters weigh each sample as 1e9 / sample_hz ns of CPU time.
  std::optional<uint32_t> sample_hz;
  // Stack capture mode ("release", "release+wants", "off"); written only when non-empty.
  std::string stacks;
};

// What only the caller knows at the end of a recording.
struct FinishInfo {
  uint64_t end_t_ns = 0;               // ns since origin when recording stopped (clamped to the last event)
  uint64_t ring_high_water_bytes = 0;  // from the BPF counters
  uint64_t late_events = 0;            // Reorderer::late()
  std::string stop_reason;             // optional "reason" on tracing_stopped ("signal", "duration", "target_exited")
  // From the BPF counters (rvbpfd only): uprobe traps the target paid for, those that became no record, the cold
  // ones (no trap on their CPU in the 50 us before them) and those of single-stepped sites (both dearer, see
  // OverheadBudget).
  // One member per RV_TRAP_COUNTERS entry (include/rvbpfd/counters.h), as in TraceSummary.
#define RV_TRAP_MEMBER(field, fold, label) std::optional<uint64_t> field;
  RV_TRAP_COUNTERS(RV_TRAP_MEMBER)
  RV_GVL_COUNTERS(RV_TRAP_MEMBER)  // when samples read the GVL: gvl_readings, gvl_queue_truncated
#undef RV_TRAP_MEMBER
  std::optional<SampleEcRoutes> sample_ec_routes;  // when sampling: which route found each sample's EC
};

// "2025-01-31T12:34:56.789012Z".
std::string FormatIso8601Utc(std::chrono::system_clock::time_point time);

class TraceWriter {
 public:
  // Flush thresholds: a buffer past kFlushBytes is written at once (compressed: handed to zstd, which writes out
  // what it has ready); MaybeFlush writes anything older than kFlushInterval (compressed: and ends the zstd frame) so
  // a reader following the file (tail -f, a crash) lags by at most that much.
  static constexpr size_t kFlushBytes = 64 * 1024;
  static constexpr std::chrono::milliseconds kFlushInterval{100};

  // Creates `path` as a new file (common/safe_file: mode 0600, owned by the sudo invoker, never through a symlink;
  // an existing regular file there is replaced), writes the header and the tracing_started line, and flushes them.
  // Fails with kOutputUnwritable naming the path and errno; nothing is left behind on failure. `format`: plain JSON
  // Lines, or the same lines in zstd frames (the recorder's default, --trace-format).
  static Result<TraceWriter> Create(const std::string& path, const TraceHeader& header,
                                    TraceFormat format = TraceFormat::kJsonl);

  TraceWriter(TraceWriter&& other) noexcept;
  TraceWriter& operator=(TraceWriter&& other) noexcept;
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;
  // Writes out buffered whole lines and closes the file (no summary: the trace reads like one cut by a crash).
  ~TraceWriter();

  // Appends one event line (preceded by a thread line the first time a Ruby thread appears). Fails only when a
  // flush it triggers fails (kIo, e.g. disk full), or with kInternal when event.stack names a stack this writer
  // never interned (the line would be unreadable).
  Status Write(const TraceEvent& event);

  // A process of a trace that follows a process tree (docs/rvtrace.md, "Process lines"): a {"process":...} line,
  // written where the stream stands now, so the caller writes it before any event of the process's threads and
  // after the events older than process.t_ns. Keys that are empty or unknown are left out; a skipped process has no
  // ruby_version. main_ruby_thread: the ruby_thread its main thread has or will have (its thread line then says
  // "main":true). A trace of one process has no process lines.
  void WriteProcess(const ProcessInfo& process, std::optional<uint32_t> main_ruby_thread = std::nullopt);
  // The end of a process: {"process_end":{"id":..,"t_ns":..,"how":"exit"|"exec"[,"exit_code":N]}}, written after
  // every event of the process.
  void WriteProcessEnd(const ProcessEnd& end);
  // Returns the id of `frame`, appending its {"frame":...} dictionary line the first time it is seen. The line goes
  // into the same buffer as events, so it reaches the file before any stack or event that uses the id.
  uint32_t InternFrame(const FrameInfo& frame);
  // What is now known of `ruby_thread` beside its events (names, namespace tid), read at t_ns. Before the thread's
  // line is written it is kept for that line; afterwards, a part that differs from what the file already says (a
  // rename, a name learnt later) is written at once as a {"thread_info":...} line. Parts not set in `info` are left
  // as they were.
  void SetThreadInfo(uint32_t ruby_thread, const ThreadInfo& info, uint64_t t_ns);
  // Returns the id of the stack made of `frame_ids` (leaf first, ids from InternFrame), appending its
  // {"stack":...} dictionary line the first time it is seen. Set TraceEvent::stack to the id.
  uint32_t InternStack(std::span<const uint32_t> frame_ids);
  const StackTable& stack_table() const { return stacks_; }
  // Flushes when kFlushInterval has passed since the last timed flush. Calling it at least every 100 ms bounds how
  // long a line can sit in memory (what a crash loses and a follower of the file waits for) to about 200 ms. The
  // first events after tracing_started are flushed at the first call that sees them: whoever follows the file learns
  // at once that the recording runs.
  Status MaybeFlush(std::chrono::steady_clock::time_point now);
  Status Flush();
  // Writes tracing_stopped and the summary line, flushes, and closes. The writer accepts nothing afterwards.
  Status Finish(const FinishInfo& info);
  // Closes and deletes the file: for recordings that fail before anything useful was written. Outputs that are not
  // regular files (-o /dev/stdout, a FIFO) are closed but not deleted.
  void Abandon();

  const std::string& path() const { return path_; }
  uint64_t events_written() const { return events_written_; }
  // The summary as it stands (Finish writes this with the FinishInfo fields filled in).
  TraceSummary CurrentSummary(uint64_t end_t_ns) const;

 private:
  TraceWriter(std::string path, OutputFile file, const TraceHeader& header);
  // Hands buffer_ to the file (compressed when zstd_ is set; `end_frame` then ends the zstd frame) and clears it.
  // Returns 0 or the errno of write(2); a zstd failure (it can only run out of memory) is reported as ENOMEM.
  int WriteBuffer(bool end_frame);
  void AppendHeader(const TraceHeader& header);
  void AppendEvent(const TraceEvent& event);
  void AppendSummary(const TraceSummary& summary);
  void AppendFrameLine(uint32_t id, const FrameInfo& frame);
  void AppendStackLine(uint32_t id, std::span<const uint32_t> frame_ids);
  void Close();

  std::string path_;
  OutputFile file_;  // fd() is -1 once closed
  bool finished_ = false;
  std::string buffer_;  // whole lines not yet written
  std::unique_ptr<ZstdCompressor> zstd_;  // set in the zstd format
  std::string compressed_;                // zstd's output of one flush, reused
  std::chrono::steady_clock::time_point last_timed_flush_;  // last flush done by MaybeFlush (or Create)
  bool first_events_flushed_ = false;  // MaybeFlush has written events beyond tracing_started
  ThreadAccounting accounting_;
  // Per Ruby thread: what its thread line and thread_info lines said (written) or will say (not yet written).
  struct ThreadInfoState {
    ThreadInfo info;
    bool written = false;
  };
  std::unordered_map<uint32_t, ThreadInfoState> thread_infos_;
  std::unordered_set<uint32_t> process_mains_;  // ruby_threads WriteProcess named main
  void AppendThreadInfoKeys(const ThreadInfo& info);
  StackTable stacks_;
  std::array<uint64_t, kEventNameCount> counts_{};
  uint64_t events_written_ = 0;
  uint64_t dropped_total_ = 0;
  uint64_t last_t_ns_ = 0;  // largest t_ns written
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_TRACE_WRITER_H_
