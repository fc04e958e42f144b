// Finding the CRuby processes of a host: a /proc scan at start, and for every exec the BPF tracepoint reports, a few
// inspections with backoff (at exec time a dynamically linked ruby has not loaded libruby yet: the dynamic loader
// runs after the exec tracepoint). Processes in other mount namespaces are read through /proc/PID/root
// (src/target's DiscoverTarget); pids are host pids.
//
// Pure logic over an injectable /proc root and explicit times, so the schedule and the outcomes are unit-tested
// without BPF. Threading: used from the agent's main loop only.
#ifndef RVBPFD_SRC_AGENT_DISCOVERY_H_
#define RVBPFD_SRC_AGENT_DISCOVERY_H_

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/deadline.h"
#include "common/error.h"
#include "ops/process_labels.h"
#include "target/target.h"

namespace rvbpfd {

// When an exec'd process is inspected: 20 ms, 100 ms, 500 ms and 2 s after its exec, then it is given up (a program
// that maps libruby later than 2 s after exec is found by the next /proc rescan, if any).
class ExecRetrySchedule {
 public:
  static constexpr std::array<uint64_t, 4> kDelaysNs = {20'000'000, 100'000'000, 500'000'000, 2'000'000'000};
  // Bounds the memory an exec storm can cost: beyond this many pending pids the oldest are given up.
  static constexpr size_t kMaxPending = 65536;

  struct Due {
    int pid;
    int attempt;  // 0-based index into kDelaysNs
    uint64_t exec_ns;
  };
  // (Re)starts the schedule of `pid` (an exec of a pid already pending restarts it: it is a new program).
  void Add(int pid, uint64_t exec_ns);
  // Removes and returns the pids whose next inspection is due at now_ns, oldest first.
  std::vector<Due> TakeDue(uint64_t now_ns);
  // Schedules the attempt after `due`; false when `due` was the last one (the pid is given up).
  bool Retry(const Due& due);
  void Remove(int pid);
  size_t size() const { return pending_.size(); }
  bool contains(int pid) const { return pending_.count(pid) != 0; }
  std::optional<uint64_t> next_due_ns() const;
  uint64_t given_up() const { return given_up_; }

 private:
  struct Entry {
    uint64_t exec_ns;
    int attempt;
  };
  static uint64_t DueAt(const Entry& e) { return e.exec_ns + kDelaysNs[static_cast<size_t>(e.attempt)]; }
  std::map<int, Entry> pending_;
  uint64_t given_up_ = 0;
};

enum class InspectOutcome {
  kRuby,     // a supported CRuby: target is filled
  kNotRuby,  // no CRuby VM mapped (yet)
  kGone,     // the process exited
  kSkip,     // a CRuby (or something like one) rvbpfd cannot probe: error says why (Ruby < 3.2, no symbols, ...)
};

struct Inspection {
  InspectOutcome outcome = InspectOutcome::kNotRuby;
  RubyTarget target;
  std::optional<Error> error;
  // For kRuby: ReadProcessLabels of the process, read within the same bound (its environ is the process's memory,
  // which may lie on a file that stalls reads).
  std::optional<Result<ProcessLabels>> labels;
};

// Inspections are bounded in time (DeadlineWorker, on one helper thread kept between them): a process whose files stall
// every read (a FUSE mount in its own namespace, a huge crafted binary) costs at most `timeout` and becomes a kSkip
// whose error says so, counted in timed_out(). The work runs on a helper thread over shared state (the caches below,
// behind a mutex), so an abandoned inspection that finishes late cannot touch a destroyed inspector.
class ProcessInspector {
 public:
  // What one inspection may take at most: DiscoverTarget reads the VM binary's ELF (20-50 MB for the test Rubies, a
  // fraction of a second), so 5 s is far above any honest process.
  static constexpr std::chrono::milliseconds kDefaultTimeout{5000};

  explicit ProcessInspector(std::string proc_root, std::chrono::milliseconds timeout = kDefaultTimeout)
      : ProcessInspector(std::make_shared<ProcFs>(std::move(proc_root)), timeout) {}
  // With an injected /proc (tests: one whose reads stall).
  ProcessInspector(std::shared_ptr<const ProcFs> procfs, std::chrono::milliseconds timeout);
  Inspection Inspect(int pid);
  // A flag (set by the agent's stop signal) that ends a wait for an inspection at once; the inspection is then
  // abandoned like one at the bound (a kSkip without an error, not counted in timed_out()).
  void set_cancel(const std::atomic<bool>* cancel) { cancel_ = cancel; }
  const std::string& proc_root() const { return state_->procfs->root(); }
  // Full DiscoverTarget runs (the cheap pre-filter and the VM cache avoided the rest), for tests.
  uint64_t full_inspections() const { return state_->full_inspections.load(); }
  // Inspections abandoned at the time bound, and those refused because too many were still stuck.
  uint64_t timed_out() const { return timed_out_; }

 private:
  // What DiscoverTarget learned from a VM binary's ELF (reading it means reading the whole file: 20-50 MB for the
  // test Rubies), keyed by the file's identity as the process sees it: the next process of the same binary is
  // described from its maps alone.
  struct FileKey {
    uint64_t dev, ino, size;
    int64_t mtime_ns;
    bool operator<(const FileKey& o) const {
      return std::tie(dev, ino, size, mtime_ns) < std::tie(o.dev, o.ino, o.size, o.mtime_ns);
    }
  };
  struct VmFacts {
    bool shared = false;
    std::string build_id, ruby_version;
    int major = 0, minor = 0, teeny = 0;
  };
  static constexpr size_t kMaxVmCache = 256;
  // Executables (st_dev, st_ino) known to define no VM: a process with such an exe and no libruby mapping is not
  // Ruby, decided from its maps alone (every exec on the host is inspected, so this keeps `ls` cheap).
  static constexpr size_t kMaxNonVmCache = 4096;

  struct State {
    std::shared_ptr<const ProcFs> procfs;
    std::mutex mu;  // guards the two caches; never held across I/O
    std::map<FileKey, VmFacts> vm_cache;
    std::set<std::pair<uint64_t, uint64_t>> non_vm_exes;
    std::atomic<uint64_t> full_inspections{0};

    Inspection InspectNow(int pid);
    std::optional<Inspection> FromVmCache(int pid, const std::vector<MapsEntry>& maps);
    void RememberVm(const RubyTarget& target);
  };
  std::shared_ptr<State> state_;
  std::chrono::milliseconds timeout_;
  uint64_t timed_out_ = 0;
  const std::atomic<bool>* cancel_ = nullptr;
  DeadlineWorker worker_;  // one helper thread for every inspection, replaced only when one is abandoned
};

// Child processes of pid (every thread's <proc_root>/PID/task/TID/children), ascending, without duplicates.
std::vector<int> ListChildren(const std::string& proc_root, int pid);
// Numeric entries of proc_root, ascending.
std::vector<int> ListPids(const std::string& proc_root);
// True while the process is neither ended nor ending: !ProcessEnding (target/target.h) under proc_root.
bool ProcessAlive(const std::string& proc_root, int pid);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_AGENT_DISCOVERY_H_
