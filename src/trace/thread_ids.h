// ThreadIds numbers Ruby threads the way an in-process recorder does: the main thread is 1 and every other thread
// gets the next number when it first appears, because CRuby release builds have no thread serial of their own
// (rb_thread_t.serial is assigned only with USE_RUBY_DEBUG_LOG).
//
// Identity comes from the rb_thread_t pointer, which the VM reuses after a thread is freed, so a thread_started always
// opens a new number and a thread_exited retires the pointer. The main thread is the one that runs on the process's
// initial native thread (native tid == pid); it never gets STARTED or EXITED events. An event with no th on that
// native thread is main's too (CRuby never runs another Ruby thread there).
//
// A sample's GVL reading names threads by pointer too (holder, queued): those get the number of a thread already seen
// and nothing otherwise, so a reading never invents a thread (a pointer read mid-update of the queue stays unnamed).
//
// Must see events in timestamp order (after the Reorderer): STARTED has to precede the new thread's other events.
#ifndef RVBPFD_SRC_TRACE_THREAD_IDS_H_
#define RVBPFD_SRC_TRACE_THREAD_IDS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>

#include "trace/event.h"

namespace rvbpfd {

class ThreadIds {
 public:
  static constexpr uint32_t kMainThread = 1;

  explicit ThreadIds(uint32_t pid) : pid_(pid), next_id_(std::make_shared<uint32_t>(2)) {}
  // One process of several in a trace (the recorder following a process tree): its main thread is `main_id` and its
  // other threads take their numbers from `next_id`, shared by every process's ThreadIds, so that numbers are unique
  // across the trace.
  ThreadIds(uint32_t pid, uint32_t main_id, std::shared_ptr<uint32_t> next_id)
      : pid_(pid), main_id_(main_id), next_id_(std::move(next_id)) {}
  // Sets event->ruby_thread from event->th (nothing when th is unknown), and names the threads of its GVL reading.
  void Assign(TraceEvent* event);
  uint32_t threads_seen() const { return numbered_ + (main_th_ != 0 ? 1 : 0); }

 private:
  void Number(TraceEvent* event);
  // The number of a live thread already seen; nullopt otherwise.
  std::optional<uint32_t> Known(uint64_t th) const;
  void NameGvl(GvlReading* gvl) const;

  uint32_t pid_;
  uint32_t main_id_ = kMainThread;
  uint64_t main_th_ = 0;
  std::shared_ptr<uint32_t> next_id_;  // the next number a thread other than main gets
  uint32_t numbered_ = 0;              // threads other than main numbered so far
  std::unordered_map<uint64_t, uint32_t> ids_;  // live rb_thread_t * -> number
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_TRACE_THREAD_IDS_H_
