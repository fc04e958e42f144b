// What a Ruby thread is called and its namespace tid (trace/event.h ThreadInfo), read as a recording goes: Thread#name
// from the VM's memory (rb_thread_t.name), the native thread's name from /proc/PID/task/TID/comm, and for a target in
// a pid namespace of its own, the tid it sees there (NSpid of /proc/PID/task/TID/status).
//
// Names change (Puma names its pool threads right after they start), so they are read again, cheaply: at an event a
// thread runs itself (its native tid is the probe's), the first time one is seen and then at most once per
// kRefreshNs of trace time per thread; never per event. The namespace tid is read once per native thread.
//
// Not thread-safe: one instance per traced process, fed events in time order (after the reorder window).
#ifndef RVBPFD_SRC_SESSION_THREAD_INFO_H_
#define RVBPFD_SRC_SESSION_THREAD_INFO_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "common/deadline.h"
#include "stacks/memory_reader.h"
#include "stacks/ruby_offsets.h"
#include "target/target.h"
#include "trace/event.h"

namespace rvbpfd {

class ThreadInfoTracker {
 public:
  static constexpr uint64_t kRefreshNs = 1'000'000'000;

  // Where the parts come from; a source left empty is not read. All of them return nullopt for what they cannot read.
  struct Sources {
    std::function<std::optional<std::string>(uint64_t th)> ruby_name;     // Thread#name of an rb_thread_t *
    std::function<std::optional<std::string>(uint32_t tid)> native_name;  // the comm of a host tid
    std::function<std::optional<uint32_t>(uint32_t tid)> ns_tid;          // the namespace tid of a host tid
  };
  explicit ThreadInfoTracker(Sources sources) : sources_(std::move(sources)) {}

  // The thread's info, read now, when `e` is due for a reading (see above); nullopt otherwise. Parts that could not
  // be read are unset (the writer then keeps what it had).
  std::optional<ThreadInfo> Observe(const TraceEvent& e);
  // The same for callers that key threads otherwise (the agent: by rb_thread_t *): `own_tid` is the host tid of the
  // native thread the thread runs on, when the event says so (0: it does not), `exited` its thread_exited.
  std::optional<ThreadInfo> ObserveThread(uint64_t key, uint64_t t_ns, bool exited, uint32_t own_tid, uint64_t th);
  size_t tracked() const { return last_.size(); }

 private:
  struct State {
    uint64_t read_at_ns = 0;
    uint32_t ns_tid_of = 0;  // the host tid whose namespace tid was read (0: none yet)
  };
  Sources sources_;
  std::unordered_map<uint64_t, State> last_;  // thread key -> its last reading; erased at its thread_exited
};

// Thread#name of the rb_thread_t at `th`: the String at th + offsets.thread_name, read as the symbolizer reads strings
// (type-checked, bounded) and cut to kMaxLabelBytes; nullopt when the layout has no thread_name, the name is nil or
// the memory does not hold a String.
std::optional<std::string> ReadRubyThreadName(MemoryReader& mem, const RubyOffsets& offsets, uint64_t th);

// Sources reading the native name and the namespace tid of process `pid` through `procfs`, each read bounded in time
// (a helper thread, common/deadline.h; a read that overruns gives nullopt). `own_namespace`: the target is in a pid
// namespace of its own (else no namespace tid is read: it is the host tid). `worker`: the helper thread to read on,
// shared by the sources of several processes (the agent's: one thread for all, its loop being their one caller);
// null: one of their own.
ThreadInfoTracker::Sources ProcThreadInfoSources(int pid, ProcFs procfs, bool own_namespace,
                                                 std::shared_ptr<DeadlineWorker> worker = nullptr);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_SESSION_THREAD_INFO_H_
