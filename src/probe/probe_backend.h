// The daemon's view of the kernel side: an interface over BpfSession, so that the fleet agent's decisions (which
// binaries get probes, which pids are filtered, when probes pause) and the recorder's main loop (draining, drop
// counts, the overhead budget's pauses, the end of a recording) are unit-tested against a fake without BPF or root.
//
// Groups are identified by an id the backend assigns; a detached group keeps its id (and its BPF cookies), so a binary
// whose last process exited and that comes back later is reattached without consuming new site slots. A released
// group's cookies and a removed binary's index go back to the backend for later groups and binaries (the BPF arrays
// they index are fixed-size: RV_MAX_SITES, RV_MAX_BINARIES).
//
// Threading: used from the daemon's main loop only (but for ReleaseGroup, below); the handlers run on that thread
// inside Consume(). A backend may be opened on another thread and handed over.
#ifndef RVBPFD_SRC_PROBE_PROBE_BACKEND_H_
#define RVBPFD_SRC_PROBE_PROBE_BACKEND_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/error.h"
#include "probe/bpf_session.h"
#include "probe/ec_install.h"
#include "rvbpfd/abi.h"

namespace rvbpfd {

class ProbeBackend {
 public:
  using RecordHandler = std::function<void(const rv_record&)>;
  // `gvl`: the GVL reading a sample carried (rv_config.gvl_readings), or the holder a contended READY carried
  // (rv_config.holder_stacks: only `holder` is set, and the stack is the holder's); null when none.
  using StackHandler = std::function<void(const rv_record&, const rv_stack_header&,
                                          std::span<const rv_ruby_frame> frames, const rv_gvl_reading* gvl)>;

  virtual ~ProbeBackend() = default;
  // Records without a stack (scheduler events, process exec/exit) and records with one (samples, released stacks).
  // Without on_stack, a record's stack is ignored (the record goes to on_record) and samples are dropped.
  virtual void SetHandlers(RecordHandler on_record, StackHandler on_stack) = 0;
  // The lowest free binary index (BpfSession::AddBinary); fails when RV_MAX_BINARIES are in use.
  virtual Result<uint8_t> AddBinary(const rv_offsets& offsets) = 0;
  // Frees an AddBinary index once every group of that binary is released.
  virtual Status RemoveBinary(uint8_t binary) = 0;
  virtual Status SetWalkConfig(uint8_t binary, const rv_walk_config& config) = 0;
  // Binary indexes and site cookies in use, and their limits.
  virtual BpfSession::SlotUsage slot_usage() const = 0;
  // Attaches `sites` of the file at `path`, assigning them the lowest free BPF cookies; fails when fewer than
  // sites.size() of the RV_MAX_SITES cookies are free.
  // pid > 0 restricts the uprobes to that process in the kernel as well; -1 attaches for every process mapping the
  // file (the pid filter decides whose hits count).
  virtual Result<int> AttachGroup(const std::string& path, const std::vector<SiteSpec>& sites, int pid) = 0;
  Result<int> AttachGroup(const std::string& path, const std::vector<SiteSpec>& sites) {
    return AttachGroup(path, sites, -1);
  }
  // Detaches a group, its sites ordered by `site_hits` (ReadSiteHits, by cookie), as BpfSession::Detach: the hot
  // breakpoints go first. A caller that has just read the hits passes them (one map read fewer).
  virtual void DetachGroup(int group, std::span<const uint64_t> site_hits) = 0;
  // The same, ordered by the hits read now.
  virtual void DetachGroup(int group) = 0;
  // Attaches a detached group again, through `path` (the path it was attached through, or another path to the same
  // file).
  virtual Status ReattachGroup(int group, const std::string& path) = 0;
  virtual bool GroupAttached(int group) const = 0;
  // The BPF cookies of a group's sites (indexes into ReadSiteHits); empty for an unknown or released group.
  virtual std::vector<uint64_t> GroupCookies(int group) const = 0;
  // Detaches a group for good and frees its links and its cookies; its id is not reused. Closing a multi-uprobe link
  // waits for an RCU grace period (tens of ms): two groups may be released from two threads at once, so that they
  // wait for the same one, while nothing else uses the backend.
  virtual void ReleaseGroup(int group) = 0;
  // pidns / threads: as BpfSession::AddPid (the process's pid namespace when it is not the host's).
  virtual Status AddPid(uint32_t pid, const rv_pidns& pidns,
                        std::span<const std::pair<uint32_t, uint32_t>> threads) = 0;
  virtual Status RemovePid(uint32_t pid) = 0;
  // BpfSession::MarkFollowOnly (the recorder's followed processes that are not traced). Backends without process
  // following accept it and do nothing.
  virtual Status MarkFollowOnly(uint32_t pid) {
    (void)pid;
    return Status::Ok();
  }
  virtual Status StartSampling(int hz) = 0;
  virtual Status WatchProcesses() = 0;
  // One attempt of a process's EC route installation (proc_ec map): how its samples find their thread's EC.
  virtual ProcessEcInstaller::State PollEc(ProcessEcInstaller& installer) = 0;
  // Waits at most timeout_ms for the ring to be woken (BPF wakes it only once it is a quarter full) or for the
  // WakePollOn fd, consuming nothing: true when either woke it (the ring then stays readable until consumed).
  virtual Result<bool> Wait(int timeout_ms) = 0;
  // Hands every record the ring holds now to the handlers, without waiting. Returns records consumed.
  virtual Result<int> Consume() = 0;
  // Wait, then Consume: drains records, waiting at most timeout_ms for a wakeup.
  Result<int> Poll(int timeout_ms) {
    if (Result<bool> woke = Wait(timeout_ms); !woke) return woke.error();
    return Consume();
  }
  // Poll also ends its wait as soon as `fd` is readable (the target's pidfd: its exit is seen at once rather than at
  // the end of a wait). Not owned; -1 removes it.
  virtual void WakePollOn(int fd) = 0;
  // The recorder's hold (--hold; record/exit_hold.h): the process whose GCs wait for the daemon to name the stacks with
  // new frames it has not read yet (rvbpfd/abi.h rv_held); 0: none. A backend without it does nothing.
  virtual Status SetHeldPid(uint32_t /*pid*/) { return Status::Ok(); }
  // Folds the per-CPU counters (each as include/rvbpfd/counters.h says: a sum or a maximum).
  virtual rv_counters ReadCounters() const = 0;
  // Events lost to a full ring so far (ReadCounters().dropped): what a loop checks at every poll, cheaper there.
  virtual uint64_t EventsDropped() const { return ReadCounters().dropped; }
  // Probe hits per cookie (index = cookie, for every cookie assigned so far), summed over CPUs; hits include those
  // BPF discarded. Empty when they cannot be read.
  virtual std::vector<uint64_t> ReadSiteHits() const = 0;
  // Uprobe hits of a watched process (host pid) since it was added: the per-process budget's input. nullopt for a
  // pid not watched. Cheap (no syscall): read for every watched process at every budget check.
  virtual std::optional<rv_pid_traps> PidTraps(uint32_t pid) const = 0;
  // Whether groups attach as one multi-uprobe link each (Linux 6.6+) rather than one link per site.
  virtual bool uses_multi_links() const = 0;
};

// The real backend: one BpfSession and the groups attached through it.
class BpfProbeBackend : public ProbeBackend {
 public:
  // Loads the BPF object for `options` (BpfSession::Open, errors included). May run on a helper thread.
  static Result<std::unique_ptr<BpfProbeBackend>> Open(const SessionOptions& options);
  // The fleet agent's session (watch_processes). `config`: the programs' switches, fixed at load
  // (Agent::ProbeConfig); `cache_dir`: SessionOptions::cache_dir.
  static Result<std::unique_ptr<BpfProbeBackend>> Open(uint32_t ring_buffer_bytes, const rv_config& config,
                                                       const std::string& cache_dir);

  void SetHandlers(RecordHandler on_record, StackHandler on_stack) override;
  Result<uint8_t> AddBinary(const rv_offsets& offsets) override { return session_->AddBinary(offsets); }
  Status RemoveBinary(uint8_t binary) override { return session_->RemoveBinary(binary); }
  BpfSession::SlotUsage slot_usage() const override { return session_->slot_usage(); }
  Status SetWalkConfig(uint8_t binary, const rv_walk_config& config) override {
    return session_->SetWalkConfig(binary, config);
  }
  using ProbeBackend::AttachGroup;
  Result<int> AttachGroup(const std::string& path, const std::vector<SiteSpec>& sites, int pid) override;
  void DetachGroup(int group, std::span<const uint64_t> site_hits) override;
  void DetachGroup(int group) override;
  Status ReattachGroup(int group, const std::string& path) override;
  bool GroupAttached(int group) const override;
  std::vector<uint64_t> GroupCookies(int group) const override;
  void ReleaseGroup(int group) override;
  Status AddPid(uint32_t pid, const rv_pidns& pidns, std::span<const std::pair<uint32_t, uint32_t>> threads) override {
    return session_->AddPid(pid, pidns, threads);
  }
  Status RemovePid(uint32_t pid) override { return session_->RemovePid(pid); }
  Status MarkFollowOnly(uint32_t pid) override { return session_->MarkFollowOnly(pid); }
  Status StartSampling(int hz) override { return session_->StartSampling(hz); }
  Status WatchProcesses() override { return session_->WatchProcesses(); }
  ProcessEcInstaller::State PollEc(ProcessEcInstaller& installer) override;
  Result<bool> Wait(int timeout_ms) override { return session_->Wait(timeout_ms); }
  Result<int> Consume() override { return session_->Consume(); }
  void WakePollOn(int fd) override { session_->WakePollOn(fd); }
  Status SetHeldPid(uint32_t pid) override { return session_->SetHeldPid(pid); }
  rv_counters ReadCounters() const override { return session_->ReadCounters(); }
  uint64_t EventsDropped() const override { return session_->EventsDropped(); }
  std::vector<uint64_t> ReadSiteHits() const override { return session_->ReadSiteHits(); }
  std::optional<rv_pid_traps> PidTraps(uint32_t pid) const override { return session_->PidTraps(pid); }
  bool uses_multi_links() const override { return session_->uses_multi_links(); }

 private:
  BpfProbeBackend() = default;
  // The group with that id, null when unknown or released.
  SiteGroup* GroupAt(int group) const;

  // Handlers live here (not in the session's callbacks) so SetHandlers can be called after Open.
  RecordHandler on_record_;
  StackHandler on_stack_;
  std::unique_ptr<BpfSession> session_;
  std::vector<std::unique_ptr<SiteGroup>> groups_;  // index = group id; null once released
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_PROBE_PROBE_BACKEND_H_
