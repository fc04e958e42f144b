// Where a recording's events go once the reorder window has put them in time order and ThreadIds has numbered their
// threads: the consumer interface of the recorder's pipeline (recorder.h). `rvbpfd record` writes them to an
// .rvtrace file (TraceFileSink); `rvbpfd top` aggregates them per interval on the terminal (src/top), optionally
// writing the same file. Stacks are interned through the sink, so the ids events carry are the sink's.
//
// Called from the recording's thread only (the ring callbacks and the main loop).
#ifndef RVBPFD_SRC_RECORD_RECORD_SINK_H_
#define RVBPFD_SRC_RECORD_RECORD_SINK_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "common/error.h"
#include "trace/compressed.h"
#include "trace/event.h"
#include "trace/stacks.h"
#include "trace/writer.h"

namespace rvbpfd {

class RecordSink {
 public:
  virtual ~RecordSink() = default;

  // The id of `frame` / of the stack made of `frame_ids` (leaf first, ids from InternFrame), stable for the run.
  virtual uint32_t InternFrame(const FrameInfo& frame) = 0;
  virtual uint32_t InternStack(std::span<const uint32_t> frame_ids) = 0;
  // One event, in time order, its thread numbered; fails only on an output error (the recording then stops).
  virtual Status Write(const TraceEvent& event) = 0;
  // A thread's names or namespace tid, new or changed at t_ns (session/thread_info.h), before its next event.
  virtual void SetThreadInfo(uint32_t ruby_thread, const ThreadInfo& info, uint64_t t_ns) = 0;
  // A followed process's line and its end (TraceWriter::WriteProcess / WriteProcessEnd), in stream order. Sinks that
  // show one process ignore them.
  virtual void WriteProcess(const ProcessInfo& process, std::optional<uint32_t> main_ruby_thread) {
    (void)process;
    (void)main_ruby_thread;
  }
  virtual void WriteProcessEnd(const ProcessEnd& end) { (void)end; }
  // Called from the main loop at least every 20 ms: now_t_ns is "now" in the events' time (ns since the origin).
  virtual Status Tick(std::chrono::steady_clock::time_point now, uint64_t now_t_ns) = 0;
  // The end of the recording (every event was written).
  virtual Status Finish(const FinishInfo& info) = 0;
  // A recording that failed before anything useful was written: nothing is left behind.
  virtual void Abandon() = 0;
  // The trace file written, "" when none.
  virtual const std::string& output_path() const = 0;
  // Wants events as soon as the reorder window can release them by the clock, not only once a newer event arrives
  // (a live view of a quiet process).
  virtual bool live() const { return false; }
};

// Creates the sink of a recording, given its trace header (the origin and target filled in).
using RecordSinkFactory = std::function<Result<std::unique_ptr<RecordSink>>(const TraceHeader& header)>;

// The .rvtrace file at `path` (TraceWriter::Create's rules).
class TraceFileSink : public RecordSink {
 public:
  static Result<std::unique_ptr<TraceFileSink>> Create(const std::string& path, const TraceHeader& header,
                                                       TraceFormat format);

  uint32_t InternFrame(const FrameInfo& frame) override { return writer_.InternFrame(frame); }
  uint32_t InternStack(std::span<const uint32_t> frame_ids) override { return writer_.InternStack(frame_ids); }
  Status Write(const TraceEvent& event) override { return writer_.Write(event); }
  void SetThreadInfo(uint32_t ruby_thread, const ThreadInfo& info, uint64_t t_ns) override {
    writer_.SetThreadInfo(ruby_thread, info, t_ns);
  }
  void WriteProcess(const ProcessInfo& process, std::optional<uint32_t> main_ruby_thread) override {
    writer_.WriteProcess(process, main_ruby_thread);
  }
  void WriteProcessEnd(const ProcessEnd& end) override { writer_.WriteProcessEnd(end); }
  Status Tick(std::chrono::steady_clock::time_point now, uint64_t) override { return writer_.MaybeFlush(now); }
  Status Finish(const FinishInfo& info) override { return writer_.Finish(info); }
  void Abandon() override { writer_.Abandon(); }
  const std::string& output_path() const override { return writer_.path(); }

 private:
  explicit TraceFileSink(TraceWriter writer) : writer_(std::move(writer)) {}
  TraceWriter writer_;
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_RECORD_RECORD_SINK_H_
