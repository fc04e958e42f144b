// Probe sets: one set of uprobes per CRuby VM binary, shared by every watched process that maps it.
//
// A binary is identified by (st_dev, st_ino) of the file as the process sees it (opened through /proc/PID/root, so
// two containers with their own copies are two binaries and two processes sharing one libruby are one) plus its
// build-id and the identity of the debug file its analysis would read (BinaryKey::debug). Its sites come from the site cache (PrepareVmBinary, shared with the recorder). The uprobes are
// attached for every process mapping the file (pid -1) through /proc/self/fd/N of an O_PATH descriptor the set
// holds, so they stay reattachable when the process that brought the binary exits; the BPF pid filter decides whose
// hits are recorded. Processes are reference counted: when the last one leaves, the uprobes are detached (no trap
// cost for processes nobody watches) and the set stays dormant with its BPF slots, to be reattached if the binary
// comes back. A dormant set is recycled (its groups released, its cookies and binary index returned to the backend)
// once it has been dormant for kDormantTtl, or at once, least recently used first, when a new binary needs its
// slots: the BPF arrays are fixed-size, and a host that deploys every day sees thousands of distinct binaries over
// weeks. A binary that cannot be probed (no symbols, ...) is remembered so it is reported once, for kFailedTtl and
// at most kMaxFailed binaries (oldest forgotten first).
//
// Each set also carries the --max-overhead budget of its uprobes (OverheadBudget): the trap cost is paid per
// process, so the budget follows the busiest process of the set.
//
// Threading: used from the agent's main loop only.
#ifndef RVBPFD_SRC_AGENT_PROBE_SETS_H_
#define RVBPFD_SRC_AGENT_PROBE_SETS_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "probe/probe_backend.h"
#include "session/overhead_budget.h"
#include "session/vm_binary.h"
#include "target/target.h"

namespace rvbpfd {

struct BinaryKey {
  uint64_t dev = 0;
  uint64_t ino = 0;
  std::string build_id;
  // The debug file the analysis of a process of this binary would read (DebugFileIdentity): processes share a set
  // only when they also share it, so a debug file planted in one tenant's root never places another tenant's probes.
  std::string debug = "none";
  bool operator<(const BinaryKey& o) const {
    return std::tie(dev, ino, build_id, debug) < std::tie(o.dev, o.ino, o.build_id, o.debug);
  }
  bool operator==(const BinaryKey&) const = default;
};

// Closes an fd on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = o.fd_;
      o.fd_ = -1;
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }
  void Reset();

 private:
  int fd_ = -1;
};

struct ProbeSet {
  BinaryKey key;
  std::string vm_path;       // the path as the first process saw it (for logs)
  std::string ruby_version;
  uint8_t binary = 0;        // index of its offsets in BPF
  std::optional<StackSetup> stacks;
  LiveLayout layout;         // what each process of the binary is checked against (CheckLiveLayout)
  size_t site_count = 0;     // sites attached (of the events the manager attaches)
  int low_group = -1;        // thread start/exit sites
  int high_group = -1;       // READY/RESUMED/SUSPENDED, GC (and any sleep/Mutex#lock sites): what the budget pauses
  UniqueFd file;             // O_PATH fd of the binary while attached
  std::set<int> pids;        // the watched processes using it (refcount)
  double attach_ms = 0;      // last attach time
  std::chrono::steady_clock::time_point dormant_since{};  // when its last process left (while !active())

  // --max-overhead: budget over the busiest process's traps (BPF counts every uprobe hit per process, discarded
  // ones included, and the cold ones; budget_traps accumulates the new hits of the process whose new hits cost
  // most at each poll).
  std::unique_ptr<OverheadBudget> budget;
  TrapCounts budget_traps;
  bool paused = false;

  bool active() const { return !pids.empty(); }
  std::string attach_path() const { return "/proc/self/fd/" + std::to_string(file.get()); }
};

// Prepares the VM binary at vm_path; `parsed`: discovery's parse of that file (RubyTarget::vm_elf), used instead of
// parsing it again when not null (it is the preparer's alone while it runs); `handle`: the O_PATH descriptor it was
// parsed through (RubyTarget::vm_fd; may be null), for reading the very same file elsewhere (an analysis child).
using BinaryPreparer = std::function<Result<PreparedBinary>(const std::string& vm_path, const std::string& ruby_version,
                                                            std::shared_ptr<ElfFile> parsed,
                                                            std::shared_ptr<const FileFd> handle)>;

class ProbeSetManager {
 public:
  // max_overhead_pct <= 0: no budget (never pauses). costs: what a hit costs the target (OverheadBudget).
  // Preparing one binary (ELF, DWARF, site analysis; a few seconds for a 50 MB VM with DWARF) may take at most this:
  // a binary whose reads stall or whose analysis runs away fails once (remembered, logged, counted) and the agent
  // goes on (RunWithDeadline).
  static constexpr std::chrono::milliseconds kDefaultPrepareTimeout{60'000};
  // How long a set whose processes all left keeps its slots for the binary's return, unless they are needed sooner.
  static constexpr std::chrono::minutes kDormantTtl{10};
  // How long, and for how many binaries, a preparation's failure is remembered (then the binary is tried again).
  static constexpr std::chrono::hours kFailedTtl{1};
  static constexpr size_t kMaxFailed = 4096;
  // How many failures are remembered at most (kMaxFailed; tests lower it).
  void set_max_failed(size_t n) { max_failed_ = n; }

  // `attaches`: whether a site of this event (rv_event_kind) is attached; null: every site. A site whose records
  // nothing reads would only cost the target its traps and the agent its records.
  ProbeSetManager(ProbeBackend* backend, BinaryPreparer preparer, double max_overhead_pct, TrapCosts costs,
                  uint64_t budget_window_ns = 1'000'000'000,
                  std::chrono::milliseconds prepare_timeout = kDefaultPrepareTimeout,
                  std::function<bool(uint8_t event)> attaches = nullptr);

  struct Acquired {
    ProbeSet* set = nullptr;
    bool newly_attached = false;  // the set's uprobes were attached by this call (log "binary probed")
  };
  // Adds process `pid` (described by `target`, whose vm_host_path is alive now) to its binary's set, attaching the
  // binary's probes if no other watched process uses it. An unprobeable binary's error is returned every time
  // (the `first_failure` flag says whether this is the first time, for logging once).
  Result<Acquired> Acquire(int pid, const RubyTarget& target, bool* first_failure = nullptr);
  // Removes `pid` from its set; the last process out detaches the set's uprobes.
  void Release(int pid, ProbeSet* set);
  // Recycles the sets dormant for kDormantTtl at `now` and forgets failures older than kFailedTtl. Housekeeping.
  void Expire(std::chrono::steady_clock::time_point now);

  // A flag (the agent's stop signal) that ends a wait for a preparation at once (the binary is then not remembered
  // as failed: the next run tries again).
  void set_cancel(const std::atomic<bool>* cancel) { cancel_ = cancel; }

  size_t active_sets() const;
  size_t total_sets() const { return sets_.size(); }
  // Binaries whose preparation was abandoned at the time bound (or refused: too many still stuck) or threw, or whose
  // site analysis passed its own time cap (kSiteAnalysisTimeout).
  uint64_t prepare_timeouts() const { return prepare_timeouts_; }
  // Dormant sets recycled so far (their slots returned), and binaries remembered as unprobeable now.
  uint64_t recycled_sets() const { return recycled_sets_; }
  size_t failed_binaries() const { return failed_.size(); }
  const ProbeSet* Find(const BinaryKey& key) const;
  std::vector<ProbeSet*> ActiveSets();

 private:
  Status AttachSet(ProbeSet& set, const std::string& via_path);
  // The binary index, groups and cookies a new set of `sites` sites needs, freed by recycling dormant sets (least
  // recently used first) where the backend has too few. False when even that cannot make room.
  bool MakeRoom(size_t sites);
  // Releases a set's groups and binary index (not attached, or being discarded after a failed attach).
  void Recycle(ProbeSet& set);
  // Attaches a new set's groups for its split sites; on failure everything it took is released.
  Status AttachNew(ProbeSet& set, const SplitSiteSpecs& split, const std::string& vm_path);
  void RememberFailure(const BinaryKey& key, const Error& e);
  // Acquire's steps. The key of the target's binary: its identity (a stat bounded in time), build-id and debug file.
  Result<BinaryKey> KeyOf(const RubyTarget& target);
  // The binary's preparation (sites, stacks, live layout), bounded by prepare_timeout_. One past the bound or that
  // threw, and the facts of the file (no symbols, an unsupported version, not a VM), are remembered for the key;
  // those and a refusal because too many are stuck set *first_failure.
  Result<PreparedBinary> PrepareBounded(const RubyTarget& target, const BinaryKey& key, bool* first_failure);
  // A new set for a prepared binary: its BPF binary index, walk configuration and attached groups, with pid as its
  // first process.
  Result<ProbeSet*> AddPrepared(int pid, const RubyTarget& target, const BinaryKey& key, PreparedBinary prepared);

  ProbeBackend* backend_;
  BinaryPreparer preparer_;
  double max_overhead_pct_;
  TrapCosts costs_;
  uint64_t budget_window_ns_;
  std::chrono::milliseconds prepare_timeout_;
  std::function<bool(uint8_t event)> attaches_;
  uint64_t prepare_timeouts_ = 0;
  uint64_t recycled_sets_ = 0;
  size_t max_failed_ = kMaxFailed;
  const std::atomic<bool>* cancel_ = nullptr;
  std::map<BinaryKey, std::unique_ptr<ProbeSet>> sets_;
  struct Failure {
    Error error;
    std::chrono::steady_clock::time_point at;
  };
  std::map<BinaryKey, Failure> failed_;
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_AGENT_PROBE_SETS_H_
