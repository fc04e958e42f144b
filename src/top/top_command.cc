#include "top/top_command.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "record/record_sink.h"
#include "top/top_render.h"
#include "top/top_state.h"
#include "top/top_terminal.h"

namespace rvbpfd {
namespace {

// Events reach the sink once the reorder window lets them out (20 ms) and the ring has been polled (20 ms): an
// interval is cut this long after its end, so that its events are in.
constexpr uint64_t kCutLagNs = 60'000'000;

void OnStopSignal(int) { RequestStop(); }

// The recorder's events into TopState, a snapshot shown every interval; with -o, the trace written as well.
class TopSink : public RecordSink {
 public:
  // stop_reason: set to the recording's at its end.
  TopSink(const TopOptions& o, const TraceHeader& header, std::optional<TraceWriter> writer, TopTerminal* terminal,
          std::string* stop_reason)
      : o_(o),
        stop_reason_(stop_reason),
        writer_(std::move(writer)),
        state_(static_cast<int>(header.pid), header.ruby_version, writer_ ? &writer_->stack_table() : &stacks_),
        terminal_(terminal),
        interval_ns_(static_cast<uint64_t>(o.interval_s * 1e9)) {}

  uint32_t InternFrame(const FrameInfo& frame) override {
    return writer_ ? writer_->InternFrame(frame) : stacks_.InternFrame(frame).id;
  }
  uint32_t InternStack(std::span<const uint32_t> frame_ids) override {
    return writer_ ? writer_->InternStack(frame_ids) : stacks_.InternStack(frame_ids).id;
  }
  Status Write(const TraceEvent& event) override {
    state_.OnEvent(event);
    return writer_ ? writer_->Write(event) : Status::Ok();
  }
  void SetThreadInfo(uint32_t ruby_thread, const ThreadInfo& info, uint64_t t_ns) override {
    state_.SetThreadInfo(ruby_thread, info);
    if (writer_) writer_->SetThreadInfo(ruby_thread, info, t_ns);
  }
  Status Tick(std::chrono::steady_clock::time_point now, uint64_t now_t_ns) override;
  Status Finish(const FinishInfo& info) override {
    *stop_reason_ = info.stop_reason;
    return writer_ ? writer_->Finish(info) : Status::Ok();
  }
  void Abandon() override {
    if (writer_) writer_->Abandon();
  }
  const std::string& output_path() const override { return writer_ ? writer_->path() : kNone; }
  bool live() const override { return true; }

 private:
  void Show(const TopSnapshot& snap);

  static inline const std::string kNone;
  const TopOptions& o_;
  std::string* stop_reason_;
  std::optional<TraceWriter> writer_;
  StackTable stacks_;  // without -o
  TopState state_;
  TopTerminal* terminal_;  // null: plain snapshots on stdout
  uint64_t interval_ns_;
  uint64_t next_cut_ns_ = 0;
  uint64_t shown_ = 0;
};

Status TopSink::Tick(std::chrono::steady_clock::time_point now, uint64_t now_t_ns) {
  if (writer_) {
    if (Status st = writer_->MaybeFlush(now); !st) return st;
  }
  if (terminal_ && terminal_->QuitPressed()) RequestStop();
  if (!state_.started()) {
    // The first interval starts when the main loop does: the probes are live.
    state_.Start(now_t_ns);
    next_cut_ns_ = now_t_ns + interval_ns_;
    return Status::Ok();
  }
  if (now_t_ns < next_cut_ns_ + kCutLagNs) return Status::Ok();
  Show(state_.Cut(next_cut_ns_));
  // A loop held up for longer than an interval (a burst of new stacks to symbolize) skips the intervals it missed.
  next_cut_ns_ += interval_ns_;
  if (next_cut_ns_ + kCutLagNs < now_t_ns) next_cut_ns_ = now_t_ns - kCutLagNs + interval_ns_;
  if (o_.iterations > 0 && ++shown_ >= o_.iterations) RequestStop();
  return Status::Ok();
}

void TopSink::Show(const TopSnapshot& snap) {
  if (terminal_) {
    terminal_->Draw(RenderTop(snap, TopLayout{.width = terminal_->width(), .height = terminal_->height()}));
    return;
  }
  std::string text;
  if (o_.json) {
    text = TopJson(snap) + "\n";
  } else {
    for (const std::string& line : RenderTop(snap, TopLayout{.max_table_rows = 10})) text += line + "\n";
    text += "\n";
  }
  // A reader that went away (top | head) ends the view; nothing else is affected.
  if (fwrite(text.data(), 1, text.size(), stdout) != text.size() || fflush(stdout) != 0) RequestStop();
}

}  // namespace

Result<int> RunTop(TopOptions o) {
  std::unique_ptr<TopTerminal> terminal;
  if (isatty(STDOUT_FILENO) && !o.json) {
    terminal = TopTerminal::Open(STDIN_FILENO, STDOUT_FILENO);
    terminal->Draw({"rvbpfd top: attaching to pid " + std::to_string(o.record.pid) + " ..."});
    o.record.quiet = true;  // the screen is the output: no messages over it
  }
  o.record.status_line = false;
  // A live view names frames as they come: no ptrace hold of the target (a debugger can still attach to it).
  o.record.hold = false;
  // Record stops cleanly on SIGINT and SIGTERM; a closed terminal or Ctrl-\ must not leave it raw either.
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGHUP, &sa, nullptr);
  sigaction(SIGQUIT, &sa, nullptr);
  std::string stop_reason;
  RecordSinkFactory make_sink = [&o, &terminal,
                                 &stop_reason](const TraceHeader& header) -> Result<std::unique_ptr<RecordSink>> {
    std::optional<TraceWriter> writer;
    if (!o.record.output.empty()) {
      Result<TraceWriter> w = TraceWriter::Create(o.record.output, header, o.record.trace_format);
      if (!w) return w.error();
      writer.emplace(std::move(w.value()));
    }
    return std::unique_ptr<RecordSink>(new TopSink(o, header, std::move(writer), terminal.get(), &stop_reason));
  };
  Result<int> r = Record(o.record, make_sink);
  const bool full_screen = terminal != nullptr;
  terminal.reset();  // the screen restored before any error is printed
  // The screen vanished with the target: say why (without a terminal the recorder's own last line says it).
  if (r && full_screen && stop_reason == "target_exited") {
    fprintf(stderr, "rvbpfd: pid %d exited\n", o.record.pid);
  }
  return r;
}

}  // namespace rvbpfd
