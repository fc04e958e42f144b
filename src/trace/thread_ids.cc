#include "trace/thread_ids.h"

namespace rvbpfd {

std::optional<uint32_t> ThreadIds::Known(uint64_t th) const {
  if (th == 0) return std::nullopt;
  if (th == main_th_) return main_id_;
  auto it = ids_.find(th);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

void ThreadIds::NameGvl(GvlReading* gvl) const {
  gvl->holder = Known(gvl->holder_th);
  gvl->queued.clear();
  for (uint64_t th : gvl->queued_th) {
    if (std::optional<uint32_t> id = Known(th)) gvl->queued.push_back(*id);
  }
}

void ThreadIds::Assign(TraceEvent* e) {
  Number(e);
  if (e->gvl) NameGvl(e->gvl.get());  // after the sample's own thread: it is usually the holder
}

void ThreadIds::Number(TraceEvent* e) {
  if (e->th == 0) {
    // th unknown (a site where DWARF has no th, before this native thread reported one): the process's initial
    // native thread only ever runs the main Ruby thread (it keeps a dedicated native thread even under M:N), so
    // such an event on it is main's. Other native threads can host several Ruby threads: left unknown.
    if (e->native_tid && *e->native_tid == pid_) e->ruby_thread = main_id_;
    return;
  }
  if (main_th_ == 0 && e->native_tid && *e->native_tid == pid_ && e->event != EventName::kThreadStarted) {
    main_th_ = e->th;
    ids_.erase(e->th);  // numbered before it was recognised (a foreign READY with no tid): it is main from now on
  }
  if (e->th == main_th_) {
    e->ruby_thread = main_id_;
    return;
  }
  auto it = ids_.find(e->th);
  if (it == ids_.end() || e->event == EventName::kThreadStarted) {
    it = ids_.insert_or_assign(e->th, (*next_id_)++).first;
    ++numbered_;
  }
  e->ruby_thread = it->second;
  if (e->event == EventName::kThreadExited) ids_.erase(it);  // the VM may reuse this pointer for a new thread
}

}  // namespace rvbpfd
