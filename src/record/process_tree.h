// The recorder following its target's process tree (issue 46; docs/rvtrace.md "Process lines"): every process the
// target forks or becomes by exec gets a process id, a line in the trace and, when it runs the traced VM binary, its
// own thread numbering, thread names and stack symbolization against its own memory.
//
// BPF does the part that cannot wait (bpf/rvbpfd.bpf.c rv_proc_fork / rv_proc_exec, rv_config.follow_forks): a forked
// child is in the pid filter before it runs, with its parent's EC route; an exec keeps the pid in the filter and
// forgets the old image's EC route. This class does the rest from the lifecycle records, in ring order:
//   fork  a traced parent's child is traced at once (same image, same VM file); a skipped parent's child is skipped
//         for the same reason (it stays in the filter follow-only, so that its own forks and execs are seen);
//   exec  ends the process (process_end "exec") and starts a new one, pending until it is known to run the traced VM
//         binary (a record of it, or the file in its maps: traced, with fresh symbolization state) or not (skipped:
//         "not Ruby: EXE", "another Ruby VM binary: PATH: not followed"; marked follow-only in BPF);
//   exit  ends the process (process_end "exit").
// The root process (id 1) keeps the recording's own per-process state (recorder.cc); this class owns the others'.
//
// Process lines go out in the time order of the events (WriteLinesBefore, called before each event is written): a
// process line is never written after an event of its process, a process_end never before one.
//
// Threading: the recording's thread only (ring callbacks and main loop).
#ifndef RVBPFD_SRC_RECORD_PROCESS_TREE_H_
#define RVBPFD_SRC_RECORD_PROCESS_TREE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/deadline.h"
#include "common/error.h"
#include "probe/ec_install.h"
#include "probe/probe_backend.h"
#include "record/record_sink.h"
#include "session/ingest.h"
#include "session/stack_resolver.h"
#include "session/thread_info.h"
#include "session/vm_binary.h"
#include "stacks/memory_reader.h"
#include "trace/event.h"
#include "trace/thread_ids.h"

namespace rvbpfd {

struct FollowContext {
  std::string vm_open_path;     // the traced VM file as the recorder opens it: a process that maps it is traced
  std::string ruby_version;     // of that VM
  std::string build_id;
  std::optional<StackSetup> stack_setup;  // stacks and thread names; nullopt: none
  bool sampling = false;        // samples on: each traced process gets its EC route installed
  uint8_t bin = 0;              // the VM binary's backend index
  bool quiet = false;
  bool own_pidns = false;       // the processes live in a pid namespace of their own (attach mode into a container)
  ProbeBackend* backend = nullptr;
  RecordSink* sink = nullptr;
  // The stack resolver of process `pid` (RecorderEnv::make_stack_resolver): its memory, its mappings.
  std::function<std::unique_ptr<StackResolver>(int pid)> make_resolver;
  // The wait status of the root process once known (launch mode: the command reaped), else nullopt.
  std::function<std::optional<int>()> root_wait_status;
  // Launch mode: true while the root is still being launched (rvbpfd's held child, then `env` or another #!
  // interpreter on the way to the VM): its execs until the VM runs are the launch itself, not new images. Null: never.
  std::function<bool()> root_launching;
  // CLOCK_MONOTONIC ns of the trace's t = 0.
  uint64_t origin_ns = 0;
};

class ProcessFollower {
 public:
  // How long a new image may take to map the traced VM binary before it is taken for another program (ld.so maps a
  // shared libruby within milliseconds of the exec).
  static constexpr uint64_t kExecDecisionNs = 500'000'000;
  // Most processes followed in one recording (each holds a line of state; BPF's filter holds RV_MAX_TARGETS).
  static constexpr size_t kMaxProcesses = RV_MAX_TARGETS;

  // `root`: the recording's target as its process line says (id 1).
  ProcessFollower(FollowContext ctx, ProcessInfo root);

  // The numbers of Ruby threads, shared by every process's ThreadIds (the root's included).
  std::shared_ptr<uint32_t> thread_counter() const { return next_thread_; }
  // Writes the root's process line (right after tracing_started).
  void WriteRootLine();

  // Attach mode (--follow): the root's descendants that exist now, found in /proc (at most kMaxProcesses, parents
  // before children), each added to the pid filter and inspected as a new image is: traced when it maps the traced
  // VM file, else listed skipped (and followed for its own children). Their lines have no cause and t_ns 0 (they
  // were there when the recording started). Forks they make after this are followed by BPF. Returns how many.
  size_t AdoptDescendants();
  // A lifecycle record (RV_EV_PROC_FORK / _EXEC / _EXIT) from the ring.
  void OnProcRecord(const rv_record& r);
  // The process id of an event record of host pid `pid`, 0 when the pid is not followed. A record of a process
  // whose image is pending proves it runs the traced VM (the probes are on that file): it becomes traced.
  uint32_t ProcessOf(uint32_t pid) {
    if (pid == cache_pid_) return cache_id_;
    return Lookup(pid);
  }
  // The stack resolver of a traced process other than the root; null for one that is not traced.
  StackResolver* Resolver(uint32_t id);

  // Writes the process lines and ends due before an event at t_ns of process `id` (and that process's own line).
  void WriteLinesBefore(uint64_t t_ns, uint32_t id) {
    if (!lines_.empty()) WriteLinesThrough(t_ns, id);
  }
  // An event of a process other than the root, in time order: numbered with that process's threads and written.
  Status Write(TraceEvent& e);

  // From the main loop: pending images decided, EC routes installed, processes whose exit record was lost ended.
  void Poll(uint64_t now_t_ns);
  // Every followed process but the root has ended.
  bool OthersEnded() const;
  // The end of the recording: the remaining lines, and the count on stderr.
  void Finish();

 private:
  enum class State { kTraced, kPending, kSkipped };
  struct Followed {
    ProcessInfo info;
    State state = State::kPending;
    bool ended = false;
    uint32_t main_ruby_thread = 0;  // traced: its main thread's number
    uint64_t pending_since_ns = 0;  // pending: monotonic ns of the exec
    std::string exe;                // pending: /proc/PID/exe when the exec was seen
    bool exe_is_ruby = false;       // pending: exe has a ruby_version string (a static Ruby VM)
    std::string comm;               // pending after an exec: the new image's comm, as BPF read it (12 bytes)
    uint64_t gone_seen_ns = 0;      // /proc says it is gone since (monotonic ns), its exit record not seen yet
    // Traced (not the root): its own state, nothing shared with another image.
    std::unique_ptr<ThreadIds> ids;
    ExitedThreads exited;
    std::unique_ptr<ThreadInfoTracker> thread_info;
    std::unique_ptr<ProcessMemoryReader> name_mem;
    std::unique_ptr<StackResolver> resolver;
    std::optional<ProcessEcInstaller> ec;
  };
  struct Line {
    uint64_t t_ns = 0;
    uint32_t id = 0;
    std::optional<ProcessEnd> end;  // set: a process_end line; else the process line of `id`
  };

  uint32_t Lookup(uint32_t pid);
  Followed* ById(uint32_t id) { return id >= 1 && id <= procs_.size() ? procs_[id - 1].get() : nullptr; }
  uint64_t T(uint64_t ts_ns) const { return ts_ns > ctx_.origin_ns ? ts_ns - ctx_.origin_ns : 0; }
  Followed* Add(uint32_t pid, std::optional<uint32_t> parent, const char* cause, uint64_t t_ns);
  void OnFork(uint32_t child, uint32_t parent, uint64_t t_ns);
  // comm: the new image's comm as BPF read it at the exec (at most 12 bytes).
  void OnExec(uint32_t pid, uint64_t t_ns, const std::string& comm);
  // wait_status: the kernel's exit status of an exit (RV_EV_PROC_EXIT's), when known.
  void End(Followed& p, uint64_t t_ns, const char* how, std::optional<int> wait_status = std::nullopt);
  void MakeTraced(Followed& p);
  void MakeSkipped(Followed& p, std::string why);
  void DecidePending(Followed& p, bool exited);
  // p.exe and p.exe_is_ruby, from /proc/PID/exe (bounded).
  void InspectExe(Followed& p);
  void QueueLine(Line line);
  void WriteLinesThrough(uint64_t t_ns, uint32_t id);
  void WriteLine(const Line& line);
  std::vector<std::string> ReadCommand(uint32_t pid);

  FollowContext ctx_;
  std::shared_ptr<uint32_t> next_thread_ = std::make_shared<uint32_t>(2);
  std::shared_ptr<DeadlineWorker> worker_ = std::make_shared<DeadlineWorker>();  // bounded /proc reads
  std::vector<std::unique_ptr<Followed>> procs_;         // index: id - 1
  std::unordered_map<uint32_t, uint32_t> live_by_pid_;  // host pid -> id of the process it runs now
  uint32_t cache_pid_ = 0, cache_id_ = 0;               // ProcessOf's last answer
  std::vector<Line> lines_;                             // not written yet, in t_ns order
  uint64_t last_liveness_ns_ = 0;
  size_t overflow_ = 0;                                 // processes not followed past kMaxProcesses
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_RECORD_PROCESS_TREE_H_
