// The fleet agent's core: discovery of CRuby processes, one shared probe set per VM binary, per-process profiles
// cut every --interval and handed to the sinks, the overhead budget per probe set, metrics, and config reloads.
//
// Lifecycle: Create -> Start (BPF config, sampling, exec/exit tracepoints, the /proc scan) -> RunOnce repeatedly (wake
// when timed work is due, read the ring every kDrainPeriodNs or when BPF wakes it, then the housekeeping below) ->
// Shutdown (the last partial interval is cut and submitted, the sinks flushed with a deadline). Reload applies a
// SIGHUP's config.
//
// Per RunOnce, after the ring was read (when due): exec'd pids whose inspection is due are inspected
// (ExecRetrySchedule), processes that vanished without an exit record are finished (checked every second), the budgets
// of the probe sets are updated (pausing/resuming their high-rate sites), an interval that ended is cut for every
// process, and the metrics are refreshed (every second).
//
// Threading: one thread (the caller's); the sinks and the metrics server have their own threads.
#ifndef RVBPFD_SRC_AGENT_AGENT_H_
#define RVBPFD_SRC_AGENT_AGENT_H_

#include <poll.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include "agent/agent_env.h"
#include "agent/discovery.h"
#include "agent/probe_sets.h"
#include "agent/process_registry.h"
#include "common/deadline.h"
#include "common/error.h"
#include "common/memory_budget.h"
#include "ops/agent_config.h"
#include "ops/process_filter.h"
#include "session/reorder.h"
#include "trace/event.h"

namespace rvbpfd {

class Agent {
 public:
  // Longest wait (ms) of one RunOnce. It waits less when timed work is due sooner (NextWaitMs): a ring read, a
  // budget check, a cut, the housekeeping, an exec'd pid's next inspection (at most one wakeup per kShortWaitNs for
  // them), and every kShortWaitNs while a new process's EC route is retried.
  static constexpr int kPollMs = 1000;
  static constexpr uint64_t kShortWaitNs = 50'000'000;
  // Ring read period (ns): records wait in the ring this long at most, unless BPF wakes the agent first (it does
  // once the ring is a quarter full, bpf/rvbpfd.bpf.c). Reading the ring touches the state of every watched process,
  // which the processes themselves evict from the CPU caches in between, so each read pays a refill that on a busy
  // host costs more than the records it brings (docs/design.md, "Fleet agent: the loop"). It also bounds how late an
  // exec, a fork or an exit is noticed and a record's frames are named. Three ticks: the ring is read at every third
  // budget check.
  static constexpr uint64_t kDrainPeriodNs = 600'000'000;
  // Costs of a uprobe hit assumed by the overhead budget (us), as the recorder's --probe-cost-us,
  // --stepped-probe-cost-us and --cold-probe-extra-us defaults.
  static constexpr double kProbeCostUs = 1.5;
  static constexpr double kSteppedProbeCostUs = 10.5;
  static constexpr double kColdProbeExtraUs = 3;
  static constexpr uint64_t kHousekeepingNs = 1'000'000'000;  // liveness and metrics period
  static constexpr uint64_t kMinRescanGapNs = 10'000'000'000;  // /proc rescans after drops, at most this often
  // Records are held this long (event time) and handed to the profiles sorted: ProcessProfile needs time order, and
  // records from different CPUs reach the ring out of order by microseconds.
  static constexpr uint64_t kReorderWindowNs = 20'000'000;
  // A new process's EC route is retried every loop for this long (ld.so relocates the VM within milliseconds of
  // exec), then once per housekeeping period.
  static constexpr uint64_t kEcEagerNs = 2'000'000'000;
  // Overhead budget window: the agent checks every kBudgetCheckNs, so its windows are longer than the recorder's.
  static constexpr uint64_t kBudgetWindowNs = 1'000'000'000;
  // How often the per-process trap counts are read for the budgets: a fifth of a window bounds the overshoot the next
  // windows repay. Also the loop's tick: the timed work falls on these checks, counted from Start (the ring read at
  // the last one within kDrainPeriodNs of the previous read, the housekeeping at the last one within kHousekeepingNs
  // of the previous), so a quiet loop wakes once per tick rather than once per kind of work.
  static constexpr uint64_t kBudgetCheckNs = 200'000'000;

  // Memory budget (--memory-budget, common/memory_budget.h): every watched process has an account whose fair share is
  // budget / processes. Reserved when it is watched: kProcessBaseBytes (its resolver's and profile's fixed
  // structures: front index, stack memos, thread state) plus twice its stack table's cap, ProfileTableBytes(share)
  // (the table, its frame memo and container growth). Charged as it grows: its frame cache's entries (strings by
  // capacity + StackResolver::kEntryOverheadBytes) and line tables.
  static constexpr size_t kProcessBaseBytes = 512u << 10;
  // Records waiting in the reorder window hold at most about this many bytes (PendingBytes): past it, records older
  // than a window behind the newest are handed over at once, within a drain. Outside the budget, a fixed part of
  // the agent's base.
  static constexpr size_t kMaxPendingBytes = 16u << 20;
  static constexpr size_t kMinProfileTableBytes = 64u << 10;
  // share / 8, between kMinProfileTableBytes and ProcessProfileLimits' default (2 MiB).
  static size_t ProfileTableBytes(size_t share);
  static size_t ProcessReservation(size_t table_bytes);

  // The BPF programs' switches for `config`: stacks at release (and wants), sampling at hz, every exec watched. Fixed
  // when the programs load (SessionOptions::config), so the backend is opened with them.
  static rv_config ProbeConfig(const AgentConfig& config);

  // `config` must be valid (ValidateAgentConfig). The sinks are created here (errors: the sink's).
  static Result<std::unique_ptr<Agent>> Create(const AgentConfig& config, AgentEnv env);
  ~Agent();

  Status Start();
  // One loop iteration, waiting at most poll_ms (less when work is due sooner); errors are fatal to the agent (the
  // ring cannot be read).
  Status RunOnce(int poll_ms = kPollMs);
  // How long the next RunOnce waits at `now`, at most poll_ms: until the earliest of the next ring read, budget check,
  // cut and housekeeping (or rescan, when one is pending) and the next exec'd pid's inspection (but at least
  // kShortWaitNs for that one), and at most kShortWaitNs while a process attached less than kEcEagerNs ago has its
  // EC route retried.
  int NextWaitMs(uint64_t now, int poll_ms) const;
  // Applies a reloaded config (already merged over the defaults/flags and validated): see PlanReload. Processes that
  // no longer match the filter are dropped (their partial profile is submitted), new matches are picked up by a
  // /proc rescan, sinks are recreated when output-dir/push-url/push-queue/output-max-mb changed.
  Status Reload(const AgentConfig& loaded);
  // Cuts the last partial interval of every process, submits it and flushes the sinks. True when all was delivered.
  bool Shutdown(std::chrono::milliseconds flush_deadline);

  // Introspection (tests, metrics).
  std::vector<int> watched_pids() const { return registry_.pids(); }
  const WatchedProcess* process(int pid) { return registry_.Find(pid); }
  ProbeSetManager& probe_sets() { return probe_sets_; }
  const ExecRetrySchedule& retries() const { return retries_; }
  const AgentConfig& config() const { return config_; }
  uint64_t next_cut_ns() const { return next_cut_ns_; }
  uint64_t next_budget_check_ns() const { return next_budget_check_ns_; }
  uint64_t next_drain_ns() const { return next_drain_ns_; }
  uint64_t next_housekeeping_ns() const { return next_housekeeping_ns_; }
  // Records that reached the reorder window after a later one was handed to the profiles (out of order): 0 unless
  // a CPU's records lagged by more than kReorderWindowNs.
  uint64_t late_records() const { return pending_.late(); }
  size_t pending_bytes() const { return pending_bytes_; }
  uint64_t early_releases() const { return early_releases_; }
  uint64_t profiles_built() const { return profiles_built_; }
  uint64_t events() const { return events_; }
  uint64_t samples() const { return samples_; }
  uint64_t unsymbolized() const { return unsymbolized_; }
  const std::string& host() const { return host_; }
  const MemoryBudget& memory_budget() const { return *budget_; }
  ProfileSink* dir_sink() { return sinks_.dir.get(); }
  ProfileSink* push_sink() { return sinks_.push.get(); }
  // Refreshes the metrics registry now (also done every second by RunOnce).
  void UpdateMetrics();

 private:
  Agent(AgentConfig config, AgentEnv env);

  // A record on its way to a profile: frames already named (at arrival), dispatched in time order.
  struct Pending {
    uint64_t t_ns = 0;  // event time (monotonic ns)
    int pid = 0;
    uint32_t kind = 0;
    uint64_t th = 0;
    uint32_t tid = 0;  // host tid of the thread the record is about (0: unknown)
    bool in_gc = false;
    SharedStack stack;  // the stack it carried (the resolver's shared object: no per-record copies), null: none
    std::shared_ptr<GvlReading> gvl;  // a sample's GVL reading (holder_th / queued_th are th keys), null when none
    size_t bytes = 0;                 // PendingBytes, charged to pending_bytes_ while it waits
  };
  // What a pending record holds: itself, its stack's vector and its frames (each counted whole, shared or not).
  static size_t PendingBytes(const Pending& item);

  // Pending kinds of the agent's own (past every rv_event_kind): the budget paused / resumed a process's sites.
  static constexpr uint32_t kPendingTracingPaused = 0x10000;
  static constexpr uint32_t kPendingTracingResumed = 0x10001;

  void OnRecord(const rv_record& r);
  // `may_release`: past kMaxPendingBytes, the records a window older than this one are dispatched now.
  void Enqueue(Pending item, bool may_release = false);
  void EnqueueMarker(int pid, uint32_t kind, uint64_t t_ns);
  void ReleasePending(uint64_t upto_ns);
  void Dispatch(Pending& item);
  void OnStack(const rv_record& r, const rv_stack_header& h, std::span<const rv_ruby_frame> frames,
               const rv_gvl_reading* gvl);
  // Reads the ring until it is empty (bounded rounds) and hands every pending record over (cuts, housekeeping).
  void DrainRing();
  // The ring was read whole from `read_from_ns` on: the release horizon, and the next read is due at the last tick
  // within a period of it (at the next RunOnce when the period is 0).
  void NoteDrained(uint64_t read_from_ns);
  // The first tick (kBudgetCheckNs apart from tick_origin_ns_) after t_ns.
  uint64_t TickAfter(uint64_t t_ns) const;
  // The latest tick at most period_ns after from_ns, but never before the first tick after it.
  uint64_t LastTickWithin(uint64_t from_ns, uint64_t period_ns) const;
  void ScanProc(const char* how);
  void InspectDue(uint64_t now);
  // Inspects pid and starts watching it when it is a supported CRuby matching the filter and its memory matches its
  // binary's analysis (CheckLiveLayout; a mismatch is logged once and counted as skipped, reason "layout"). Returns
  // the outcome. `how` says what found it (logged): "scan", "rescan", "exec", "fork". `vm_may_be_starting`: the
  // process was just exec'd and will be inspected again (ExecRetrySchedule), so a VM that has not set its main
  // thread up yet is kNotRuby, to be tried at the next attempt.
  // No exception escapes: one that does is logged and counted, and the process is skipped.
  InspectOutcome TryWatch(int pid, const char* how, bool vm_may_be_starting = false);
  InspectOutcome TryWatchUnguarded(int pid, const char* how, bool vm_may_be_starting);
  // TryWatchUnguarded's steps, in its order. Each returns kRuby to go on, else the outcome to return; a step that
  // fails releases the probe set the earlier ones acquired.
  // A kSkip inspection: counted as a timeout when it hit the inspector's bound, logged (once per problem).
  InspectOutcome LogSkippedInspection(int pid, const Inspection& insp, uint64_t inspect_timeouts);
  // The probe set of the process's VM binary into *set (prepared and attached when it is the first process of it).
  InspectOutcome AcquireProbeSet(int pid, const RubyTarget& target, const ProcessLabels& labels, ProbeSet** set);
  // The live layout check (CheckLiveLayout); kNotRuby for a VM still starting that will be inspected again.
  InspectOutcome CheckProcessLayout(int pid, const RubyTarget& target, ProbeSet* set, const ProcessLabels& labels,
                                    bool vm_may_be_starting);
  // The watched process's state: its profile (within its memory account), thread names, exit descriptor, EC route.
  std::unique_ptr<WatchedProcess> NewWatchedProcess(int pid, ProcessLabels labels, RubyTarget target, ProbeSet* set,
                                                    std::unique_ptr<MemoryBudget::Account> memory, size_t table_bytes,
                                                    bool own_pid_namespace, uint64_t now);
  // Tries the children a newly watched process forked before it was in the pid filter (bounded depth).
  void WatchEarlierChildren(int pid);
  // True the first time `problem` is seen (then it is logged); remembered as a hash, at most kMaxLoggedProblems of
  // them (then forgotten all at once: a problem may be logged again, memory stays bounded).
  bool FirstTimeLogged(const std::string& problem);
  void FinishProcess(int pid, uint64_t end_ns, const char* reason);
  // Ends p's interval at cut_ns: its profiles, ready for the sinks.
  std::vector<ProfileUpload> CutProcess(WatchedProcess& p, uint64_t cut_ns);
  void SubmitUploads(std::vector<ProfileUpload> uploads);  // to every sink, in one hand-over each
  void CutAll(uint64_t cut_ns);
  // Finishes the processes that exited without an exit record (a ring drop): their exit descriptors, one poll.
  void CheckLiveness();
  // One EC route installation attempt for a process whose route is still pending.
  void PollEc(WatchedProcess& p);
  void UpdateBudgets(uint64_t now);
  void CheckCounters(uint64_t now);
  void LogDeliveryProblems(uint64_t now);
  int64_t UnixNs(uint64_t mono_ns) const { return static_cast<int64_t>(mono_ns) + mono_to_unix_ns_; }
  Logger& log() { return env_.log ? *env_.log : AgentLog(); }

  AgentConfig config_;
  AgentEnv env_;
  std::string host_;
  ProcessFilter filter_;
  ServiceNamePolicy service_policy_;  // --service-pin, --ignore-env-service
  AgentSinks sinks_;
  SinkStats retired_push_stats_;   // stats of push sinks replaced by reloads (metrics stay monotonic)
  uint64_t retired_dir_dropped_ = 0;
  ProcessInspector inspector_;
  ExecRetrySchedule retries_;
  ProbeSetManager probe_sets_;
  // The one helper thread the watched processes' thread-name reads run on (session/thread_info.h).
  std::shared_ptr<DeadlineWorker> name_reader_ = std::make_shared<DeadlineWorker>();
  std::unique_ptr<MemoryBudget> budget_;  // before registry_: the processes' accounts are closed first
  ProcessRegistry registry_;
  // CheckLiveness's scratch space: the exit descriptors polled and their pids, in the same order.
  std::vector<pollfd> exit_polls_;
  std::vector<int> exit_poll_pids_;
  static constexpr size_t kMaxLoggedProblems = 4096;
  std::unordered_set<uint64_t> logged_problems_;  // hashes of skip reasons already logged (once per problem)
  uint64_t skipped_timeout_ = 0;    // processes skipped because inspecting or preparing them hit the time bound
  uint64_t skipped_exception_ = 0;  // processes skipped because their handling threw
  uint64_t skipped_layout_ = 0;
  uint64_t skipped_memory_ = 0;     // processes skipped because the memory budget had no room for them     // processes skipped because their memory does not match their binary's analysis
  int64_t mono_to_unix_ns_ = 0;
  uint64_t interval_ns_ = 0;
  uint64_t next_cut_ns_ = 0;
  uint64_t next_housekeeping_ns_ = 0;
  uint64_t next_budget_check_ns_ = 0;
  uint64_t tick_origin_ns_ = 0;  // Start's time: ticks (kBudgetCheckNs) are counted from it
  uint64_t drain_period_ns_ = kDrainPeriodNs;  // AgentEnv::drain_period_ns, else kDrainPeriodNs
  uint64_t drained_ns_ = 0;     // when the ring was last read whole: records older than this are all handed over
  uint64_t next_drain_ns_ = 0;  // when RunOnce reads the ring next, woken or not
  uint64_t ec_eager_until_ns_ = 0;  // the last attach + kEcEagerNs: until then EC routes may be retried
  uint64_t last_rescan_ns_ = 0;
  bool rescan_pending_ = false;
  bool started_ = false;
  uint64_t drops_seen_ = 0;  // ProbeBackend::EventsDropped at the last poll
  uint64_t profiles_built_ = 0;
  uint64_t events_ = 0;
  uint64_t samples_ = 0;
  uint64_t unsymbolized_ = 0;
  uint64_t last_delivery_log_ns_ = 0;
  uint64_t logged_failures_ = 0;   // push failures+retries+drops at the last delivery-problem log
  bool logged_ingest_fallback_ = false;  // the push sink's switch to /ingest was logged (once per sink)
  static constexpr int kMaxChildDepth = 4;
  int child_depth_ = 0;             // recursion of TryWatch through children
  Reorderer<Pending> pending_{kReorderWindowNs};  // released by the clock (ReleasePending), not by newer records
  size_t pending_bytes_ = 0;      // PendingBytes of the records in pending_
  uint64_t early_releases_ = 0;   // releases because pending_bytes_ passed kMaxPendingBytes
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_AGENT_AGENT_H_
