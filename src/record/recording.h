// Record()'s pipeline from an analysed target on (recorder.h), with what it depends on outside itself injectable: the
// kernel side (a ProbeBackend), the clocks, the target's exit, stop requests and the release of the probes at exit.
// Record wires the real ones (SystemRecorderEnv); the unit tests wire a fake backend and clock, so that the main loop
// (draining, drop counts, the overhead budget's pauses, the end of a recording) runs without BPF or root.
#ifndef RVBPFD_SRC_RECORD_RECORDING_H_
#define RVBPFD_SRC_RECORD_RECORDING_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/error.h"
#include "common/target_file.h"
#include "elf/elf_file.h"
#include "probe/bpf_session.h"
#include "probe/probe_backend.h"
#include "record/exit_hold.h"
#include "record/record_sink.h"
#include "record/recorder.h"
#include "session/vm_binary.h"

namespace rvbpfd {

struct RecorderEnv {
  // Loads the BPF programs and maps for `options`. Called on a helper thread (the speculative load, while the VM
  // binary is analysed) and, when the analysis needs other programs, once more on the recording's thread.
  std::function<Result<std::unique_ptr<ProbeBackend>>(const SessionOptions& options)> open_backend;
  // CLOCK_MONOTONIC (the clock of BPF's record timestamps), ns.
  std::function<uint64_t()> monotonic_ns;
  // The calling thread's CPU time, ns: what detaching and reattaching probes cost the daemon.
  std::function<uint64_t()> thread_cpu_ns;
  // A descriptor that becomes readable once process `pid` has exited (a pidfd), or -1 when there is none (the exit
  // is then seen in /proc). The recording owns it.
  std::function<int(int pid)> open_exit_fd;
  // The stack resolver of the target's process (session/vm_binary.h MakeStackResolver: its memory through
  // process_vm_readv, C function names through its maps). Called once the VM is mapped.
  std::function<std::unique_ptr<StackResolver>(int pid, const std::string& vm_path, const StackSetup& setup)>
      make_stack_resolver;
  // Hands the release of the probes of a target that has exited to a child process (common/release_in_child.h);
  // false when it could not, and the recording releases them itself.
  std::function<bool()> hand_off_release;
  // The ptrace calls that hold the recorded process (launched or attached, --hold) at its exit until its frames are
  // named (record/exit_hold.h); null: no hold.
  std::function<std::unique_ptr<PtraceOps>()> make_ptrace;
  // Set when the recording should end cleanly (Record's SIGINT/SIGTERM handler, RequestStop). Never null.
  const std::atomic<bool>* stop_requested = nullptr;
};

// The real kernel side (BpfProbeBackend), clocks, pidfds and release hand-off.
RecorderEnv SystemRecorderEnv(const std::atomic<bool>* stop_requested);

// The target of a recording, as its analysis found it.
struct RecordTarget {
  int pid = 0;     // attach mode; launch mode: set once the command is spawned
  int ns_pid = 0;  // attach mode: the pid in the target's own pid namespace (RubyTarget::ns_pid)
  std::string vm_path;  // the VM binary's path for messages (host view: /proc/PID/root/... in attach mode)
  // What is read and probed: vm_path itself in launch mode; in attach mode /proc/self/fd/N of an O_PATH descriptor
  // opened inside the target's root (an absolute symlink there never names a host file, and the file analysed is the
  // file probed even if the path is swapped meanwhile).
  std::string open_path;
  std::shared_ptr<const FileFd> vm_file;  // attach mode: the descriptor open_path names
  std::string ruby_version;
  std::string build_id;
  std::shared_ptr<ElfFile> vm_elf;  // the VM binary, parsed once for the whole run (released after the analysis)
};

// Records `target`, whose VM binary's analysis is `prepared`, as Record does once it has analysed it: the backend
// loaded (starting at once, on a helper thread), the trace created, the probes attached, the main loop run to the
// end, the trace finished. The launch mode's command runs as rvbpfd's own user. Returns the process exit status;
// errors were printed or are returned.
// make_sink: as Record's.
Result<int> RecordAnalysedTarget(const RecordOptions& options, const RecorderEnv& env, RecordTarget target,
                                 PreparedBinary prepared, RecordSinkFactory make_sink = nullptr);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_RECORD_RECORDING_H_
