#include "trace/thread_ids.h"

namespace rvbpfd {

void ThreadIds::Assign(TraceEvent* e) {
  if (e->th == 0) {
    // th unknown (a site where DWARF has no th, before this native thread reported one): the process's initial
    // native thread only ever runs the main Ruby thread (it keeps a dedicated native thread even under M:N), so
    // such an event on it is main's. Other native threads can host several Ruby threads: left unknown.
    if (e->native_tid && *e->native_tid == pid_) e->ruby_thread = kMainThread;
    return;
  }
  if (main_th_ == 0 && e->native_tid && *e->native_tid == pid_ && e->event != EventName::kThreadStarted) {
    main_th_ = e->th;
    ids_.erase(e->th);  // numbered before it was recognised (a foreign READY with no tid): it is main from now on
  }
  if (e->th == main_th_) {
    e->ruby_thread = kMainThread;
    return;
  }
  auto it = ids_.find(e->th);
  if (it == ids_.end() || e->event == EventName::kThreadStarted) {
    it = ids_.insert_or_assign(e->th, next_id_++).first;
  }
  e->ruby_thread = it->second;
  if (e->event == EventName::kThreadExited) ids_.erase(it);  // the VM may reuse this pointer for a new thread
}

}  // namespace rvbpfd
