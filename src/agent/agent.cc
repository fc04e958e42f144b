#include "agent/agent.h"

#include <malloc.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <iterator>
#include <unordered_map>

#include "ops/process_labels.h"
#include "session/ingest.h"
#include "session/thread_info.h"
#include "session/vm_binary.h"
#include "target/pid_namespace.h"

namespace rvbpfd {
namespace {

constexpr uint64_t kDeliveryLogGapNs = 30'000'000'000;  // delivery problems are logged at most every 30 s
constexpr std::chrono::milliseconds kReloadFlush{2000};  // replaced sinks get this long to deliver their queue

std::string DefaultHost() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "unknown";
  return buf;
}

bool AllUnresolved(const SharedStack& stack) {
  if (stack == nullptr || stack->empty()) return true;
  const std::vector<SharedFrame>& frames = *stack;
  return std::all_of(frames.begin(), frames.end(),
                     [](const SharedFrame& f) { return f->kind == FrameKind::kUnresolved; });
}

}  // namespace

Agent::Agent(AgentConfig config, AgentEnv env)
    : config_(std::move(config)),
      env_(std::move(env)),
      inspector_(config_.proc_root),
      probe_sets_(env_.backend, env_.preparer, config_.max_overhead_pct,
                   TrapCosts(kProbeCostUs, kSteppedProbeCostUs, kColdProbeExtraUs, kCycleTargetUs), kBudgetWindowNs,
                   ProbeSetManager::kDefaultPrepareTimeout,
                   [](uint8_t event) { return ProcessProfile::ReadsEvent(event); }),
      budget_(std::make_unique<MemoryBudget>(config_.memory_budget)),
      drain_period_ns_(env_.drain_period_ns.value_or(kDrainPeriodNs)) {
  inspector_.set_cancel(env_.stop_requested);
  probe_sets_.set_cancel(env_.stop_requested);
}

Agent::~Agent() = default;

Result<std::unique_ptr<Agent>> Agent::Create(const AgentConfig& config, AgentEnv env) {
  if (env.backend == nullptr || env.clock == nullptr || !env.preparer || !env.make_sinks) {
    return Error(ErrorCode::kInternal, "agent environment incomplete");
  }
  Result<ProcessFilter> filter = ProcessFilter::Create(config.include, config.exclude);
  if (!filter) return filter.error();
  Result<ServiceNamePolicy> policy = ServiceNamePolicy::Create(config.service_pins, config.ignore_env_service);
  if (!policy) return policy.error();
  Result<AgentSinks> sinks = env.make_sinks(config);
  if (!sinks) return sinks.error();
  if (!sinks->dir && !sinks->push) {
    return Error(ErrorCode::kUsage, "the agent needs somewhere to send profiles: give --output-dir DIR and/or "
                                    "--push-url URL");
  }
  std::unique_ptr<Agent> a(new Agent(config, std::move(env)));
  a->filter_ = std::move(filter.value());
  a->service_policy_ = std::move(policy.value());
  a->sinks_ = std::move(sinks.value());
  a->host_ = config.host.empty() ? DefaultHost() : config.host;
  return a;
}

rv_config Agent::ProbeConfig(const AgentConfig& config) {
  rv_config cfg{};
  if (config.stacks != "off") {
    cfg.stack_events = 1u << RV_EV_THREAD_SUSPENDED;
    if (config.stacks.find("ready") != std::string::npos) cfg.stack_events |= 1u << RV_EV_THREAD_READY;
    // A contended READY carries the holder's stack (where the binary's GVL layout is known): gvl_blame names the
    // holder's work whatever --hz is (model/attribution.h).
    cfg.holder_stacks = 1;
  }
  cfg.sampling = config.hz > 0 ? 1 : 0;
  // Samples read their VM's GVL (where the binary's layout has it), so contention stays visible while the budget
  // has the scheduler sites detached (ProcessProfile's estimate).
  cfg.gvl_readings = cfg.sampling;
  cfg.watch_exec = 1;
  cfg.cold_gap_ns = OverheadBudget::kColdGapNs;
  return cfg;
}

Status Agent::Start() {
  env_.backend->SetHandlers([this](const rv_record& r) { OnRecord(r); },
                            [this](const rv_record& r, const rv_stack_header& h,
                                   std::span<const rv_ruby_frame> frames,
                                   const rv_gvl_reading* gvl) { OnStack(r, h, frames, gvl); });
  // Exec watching starts before the scan, so a process that execs during the scan is seen by one or the other.
  if (Status st = env_.backend->WatchProcesses(); !st) return st.error().Wrap("watching process exec/exit");
  if (config_.hz > 0) {
    if (Status st = env_.backend->StartSampling(config_.hz); !st) return st.error().Wrap("starting on-CPU sampling");
  }
  const uint64_t now = env_.clock->MonotonicNs();
  mono_to_unix_ns_ = env_.clock->RealtimeNs() - static_cast<int64_t>(now);
  interval_ns_ = static_cast<uint64_t>(config_.interval_s * 1e9);
  next_cut_ns_ = now + interval_ns_;
  next_housekeeping_ns_ = now + kHousekeepingNs;
  tick_origin_ns_ = now;
  started_ = true;
  // The agent's own CPU and RSS are read when the metrics are rendered (a scrape), not by the loop.
  if (env_.metrics != nullptr) env_.metrics->AddCollector(SelfUsageCollector(env_.self_usage));
  ScanProc("scan");
  UpdateMetrics();
  return Status::Ok();
}

void Agent::ScanProc(const char* how) {
  last_rescan_ns_ = env_.clock->MonotonicNs();
  rescan_pending_ = false;
  const int self = getpid();
  for (int pid : ListPids(config_.proc_root)) {
    if (pid == self || registry_.Find(pid) != nullptr || retries_.contains(pid)) continue;
    TryWatch(pid, how);
  }
}

bool Agent::FirstTimeLogged(const std::string& problem) {
  if (logged_problems_.size() >= kMaxLoggedProblems) logged_problems_.clear();
  return logged_problems_.insert(std::hash<std::string>{}(problem)).second;
}

InspectOutcome Agent::TryWatch(int pid, const char* how, bool vm_may_be_starting) {
  try {
    return TryWatchUnguarded(pid, how, vm_may_be_starting);
  } catch (const std::exception& e) {
    // A hostile process must not take the agent down with it (a bad name, a huge allocation): skip it.
    ++skipped_exception_;
    if (FirstTimeLogged(std::string("exception:") + e.what())) {
      log().Warn("not profiling a process: handling it failed", {{"pid", pid}, {"error", e.what()}});
    }
    return InspectOutcome::kSkip;
  }
}

InspectOutcome Agent::TryWatchUnguarded(int pid, const char* how, bool vm_may_be_starting) {
  const uint64_t inspect_timeouts = inspector_.timed_out();
  Inspection insp = inspector_.Inspect(pid);
  if (insp.outcome == InspectOutcome::kSkip) return LogSkippedInspection(pid, insp, inspect_timeouts);
  if (insp.outcome != InspectOutcome::kRuby) return insp.outcome;

  Result<ProcessLabels> labels = insp.labels ? std::move(*insp.labels)
                                             : Result<ProcessLabels>(ReadProcessLabels(config_.proc_root, pid));
  if (!labels) {
    if (labels.error().code() == ErrorCode::kNoSuchProcess) return InspectOutcome::kGone;
    log().Warn("cannot read process labels", {{"pid", pid}, {"error", labels.error().message()}});
    return InspectOutcome::kSkip;
  }
  ApplyServiceNamePolicy(service_policy_, &*labels);
  if (!filter_.Matches(*labels)) {
    log().Debug("process excluded by filter", {{"pid", pid}, {"comm", labels->comm}});
    return InspectOutcome::kSkip;
  }
  ProbeSet* set = nullptr;
  if (InspectOutcome o = AcquireProbeSet(pid, insp.target, *labels, &set); o != InspectOutcome::kRuby) return o;
  // The process's memory must match what the analysis of its binary assumed before any of its events count.
  if (InspectOutcome o = CheckProcessLayout(pid, insp.target, set, *labels, vm_may_be_starting);
      o != InspectOutcome::kRuby) {
    return o;
  }
  // Its share of the memory budget: the profile's fixed part is reserved now (the other processes' caches make room,
  // the largest first); with no room even so, it is not profiled.
  std::unique_ptr<MemoryBudget::Account> memory = budget_->Open();
  const size_t table_bytes = ProfileTableBytes(budget_->share());
  if (!memory->Charge(ProcessReservation(table_bytes))) {
    probe_sets_.Release(pid, set);
    ++skipped_memory_;
    if (FirstTimeLogged("memory budget full")) {
      log().Warn("not profiling a Ruby process: the memory budget has no room for another process",
                 {{"pid", pid},
                  {"comm", labels->comm},
                  {"memory_budget", static_cast<uint64_t>(budget_->budget())},
                  {"processes", static_cast<uint64_t>(registry_.size())}});
    }
    return InspectOutcome::kSkip;
  }
  // A process in a pid namespace of its own (a container) names threads by that namespace's tids.
  Result<TargetPidNamespace> pidns = ReadPidNamespace(pid, ProcFs(config_.proc_root));
  if (!pidns) {
    probe_sets_.Release(pid, set);
    if (pidns.error().code() == ErrorCode::kNoSuchProcess) return InspectOutcome::kGone;
    log().Warn("cannot read the pid namespace of a process", {{"pid", pid}, {"error", pidns.error().message()}});
    return InspectOutcome::kSkip;
  }
  if (Status st = env_.backend->AddPid(static_cast<uint32_t>(pid), pidns->ns, pidns->threads); !st) {
    probe_sets_.Release(pid, set);
    log().Warn("cannot add process to the BPF filter", {{"pid", pid}, {"error", st.error().message()}});
    return InspectOutcome::kSkip;
  }
  const uint64_t now = env_.clock->MonotonicNs();
  WatchedProcess& w = registry_.Add(NewWatchedProcess(pid, std::move(labels.value()), std::move(insp.target), set,
                                                      std::move(memory), table_bytes, pidns->own_namespace(), now));
  PollEc(w);
  log().Info("process attached", {{"pid", pid},
                                  {"comm", w.labels.comm},
                                  {"ruby_version", w.target.ruby_version},
                                  {"container_id", w.labels.container_id},
                                  {"service_name", w.labels.service_name},
                                  {"vm_path", w.target.vm_path},
                                  {"found_by", how}});
  WatchEarlierChildren(pid);
  return InspectOutcome::kRuby;
}

InspectOutcome Agent::LogSkippedInspection(int pid, const Inspection& insp, uint64_t inspect_timeouts) {
  if (inspector_.timed_out() != inspect_timeouts) {
    ++skipped_timeout_;
    // Each timeout is logged (it names its pid and cost the scan its bound); refusals while earlier ones are still
    // stuck cost nothing and are logged once.
    const bool refused = insp.error && insp.error->message().find("still stuck") != std::string::npos;
    if (refused && !FirstTimeLogged("inspections stuck")) return insp.outcome;
    log().Warn("not profiling a process: inspecting it hit the time bound",
               {{"pid", pid}, {"reason", insp.error ? insp.error->message() : std::string()}});
    return insp.outcome;
  }
  if (insp.error && FirstTimeLogged(insp.error->message())) {
    log().Warn("not profiling a Ruby process", {{"pid", pid}, {"reason", insp.error->message()}});
  }
  return insp.outcome;
}

InspectOutcome Agent::AcquireProbeSet(int pid, const RubyTarget& target, const ProcessLabels& labels,
                                      ProbeSet** set) {
  bool first_failure = false;
  const uint64_t prepare_timeouts = probe_sets_.prepare_timeouts();
  Result<ProbeSetManager::Acquired> acq = probe_sets_.Acquire(pid, target, &first_failure);
  if (!acq) {
    if (acq.error().code() == ErrorCode::kNoSuchProcess) return InspectOutcome::kGone;
    if (probe_sets_.prepare_timeouts() != prepare_timeouts) ++skipped_timeout_;
    if (first_failure || FirstTimeLogged(acq.error().message())) {
      log().Warn("cannot probe Ruby binary", {{"pid", pid}, {"comm", labels.comm},
                                              {"path", target.vm_path},
                                              {"ruby_version", target.ruby_version},
                                              {"error", acq.error().message()}});
    }
    return InspectOutcome::kSkip;
  }
  *set = acq->set;
  if (acq->newly_attached) {
    // Preparing a binary read its ELF and DWARF (tens of MB, freed now): give the pages back to the system.
    malloc_trim(0);
    log().Info("binary probed", {{"path", (*set)->vm_path},
                                 {"build_id", (*set)->key.build_id},
                                 {"ruby_version", (*set)->ruby_version},
                                 {"sites", static_cast<uint64_t>((*set)->site_count)},
                                 {"stacks", (*set)->stacks.has_value()},
                                 {"attach_ms", (*set)->attach_ms}});
  }
  return InspectOutcome::kRuby;
}

InspectOutcome Agent::CheckProcessLayout(int pid, const RubyTarget& target, ProbeSet* set,
                                         const ProcessLabels& labels, bool vm_may_be_starting) {
  std::unique_ptr<MemoryReader> mem = env_.memory ? env_.memory(pid) : std::make_unique<ProcessMemoryReader>(pid);
  Result<LiveLayoutResult> layout =
      CheckLiveLayout(pid, target.ns_pid, set->layout,
                      LoadBiasFromLowestMapping(set->layout.lowest_load_vaddr, target.vm_load_start), *mem,
                      vm_may_be_starting);
  if (layout && *layout != LiveLayoutResult::kNotStarted) return InspectOutcome::kRuby;
  probe_sets_.Release(pid, set);
  if (!ProcessAlive(config_.proc_root, pid)) return InspectOutcome::kGone;
  if (layout && vm_may_be_starting) {
    log().Debug("VM of a process still starting; inspected again later", {{"pid", pid}});
    return InspectOutcome::kNotRuby;
  }
  // A VM still without its main thread at the last look (2 s after its exec, or found by a scan) is refused too.
  const Error e = layout ? LiveLayoutRefusal(set->layout, pid, NotStartedReason(set->layout)) : layout.error();
  if (FirstTimeLogged(e.message())) {
    ++skipped_layout_;
    log().Warn("not profiling a Ruby process: its memory does not match its binary's analysis",
               {{"pid", pid}, {"comm", labels.comm}, {"error", e.message()}});
  }
  return InspectOutcome::kSkip;
}

std::unique_ptr<WatchedProcess> Agent::NewWatchedProcess(int pid, ProcessLabels labels, RubyTarget target,
                                                         ProbeSet* set, std::unique_ptr<MemoryBudget::Account> memory,
                                                         size_t table_bytes, bool own_pid_namespace, uint64_t now) {
  auto p = std::make_unique<WatchedProcess>();
  p->pid = pid;
  p->labels = std::move(labels);
  p->target = std::move(target);
  // Discovery's parse of the VM binary (tens of MB: MappedFile holds the whole file) is not needed past here: the
  // set's preparation, if this process brought the binary, analysed it already. Kept, it stayed resident for the
  // process's life.
  p->target.vm_elf.reset();
  p->set = set;
  ProcessProfileLimits limits;
  limits.max_table_bytes = table_bytes;
  limits.reset_above_bytes = std::min(limits.reset_above_bytes, table_bytes / 2);
  p->profile = std::make_unique<ProcessProfile>(1'000'000'000ull / static_cast<uint64_t>(std::max(config_.hz, 1)),
                                                limits);
  // Evicted under pressure: the frame cache (its frames are named again at their next use) and the shared frames
  // the profile still refers to. The profile's own stack table stays (its cap is reserved).
  p->memory = std::move(memory);
  p->memory->set_evictor([w = p.get()] {
    if (w->frames) w->frames->ClearCache();
    w->profile->ForgetSharedFrames();
  });
  ThreadInfoTracker::Sources names = ProcThreadInfoSources(pid, ProcFs(config_.proc_root), own_pid_namespace,
                                                                name_reader_);
  if (set->stacks && set->stacks->offsets.thread_name != RubyOffsets::kNoThreadName) {
    std::shared_ptr<MemoryReader> mem =
        env_.memory ? env_.memory(pid) : std::make_unique<ProcessMemoryReader>(pid);
    names.ruby_name = [mem, offsets = set->stacks->offsets](uint64_t th) {
      return ReadRubyThreadName(*mem, offsets, th);
    };
  }
  p->thread_info.emplace(std::move(names));
  p->interval_start_ns = now;
  p->attached_ns = now;
  ec_eager_until_ns_ = std::max(ec_eager_until_ns_, now + kEcEagerNs);  // its EC route is retried meanwhile
  if (env_.open_exit_fd) {
    const auto held = std::count_if(registry_.all().begin(), registry_.all().end(),
                                    [](const auto& entry) { return entry.second->exit_fd.ok(); });
    if (static_cast<size_t>(held) < env_.max_exit_fds) p->exit_fd = FileFd(env_.open_exit_fd(pid));
  }
  if (set->paused) p->profile->OnTracingPaused(now);
  if (set->stacks && config_.hz > 0) {
    p->ec.emplace(pid, p->target.vm_host_path, set->stacks->ec_route, set->binary, config_.proc_root);
  }
  return p;
}

void Agent::WatchEarlierChildren(int pid) {
  // Workers it forked before it was in the pid filter had no fork record: look for them now (later forks are
  // reported, since the pid is in the filter from here on). Bounded depth: a fork bomb is not followed forever.
  if (child_depth_ >= kMaxChildDepth) return;
  ++child_depth_;
  for (int child : ListChildren(config_.proc_root, pid)) {
    if (registry_.Find(child) == nullptr && !retries_.contains(child)) TryWatch(child, "fork");
  }
  --child_depth_;
}

void Agent::InspectDue(uint64_t now) {
  for (const ExecRetrySchedule::Due& due : retries_.TakeDue(now)) {
    if (registry_.Find(due.pid) != nullptr) continue;
    const bool more_attempts = static_cast<size_t>(due.attempt) + 1 < ExecRetrySchedule::kDelaysNs.size();
    if (TryWatch(due.pid, "exec", more_attempts) == InspectOutcome::kNotRuby) retries_.Retry(due);
  }
}

void Agent::OnRecord(const rv_record& r) {
  Pending item;
  item.t_ns = r.ts_ns;
  item.pid = static_cast<int>(r.pid);
  item.kind = r.kind;
  item.th = r.th;
  item.tid = r.tid;
  if (r.kind < RV_EV_KIND_COUNT) {
    WatchedProcess* p = registry_.Find(item.pid);
    if (p == nullptr) return;
    p->gc_epoch.OnRecord(r.kind);
  } else if (r.kind != RV_EV_PROC_EXEC && r.kind != RV_EV_PROC_EXIT && r.kind != RV_EV_PROC_FORK) {
    return;
  }
  Enqueue(std::move(item));
}

void Agent::OnStack(const rv_record& r, const rv_stack_header& h, std::span<const rv_ruby_frame> frames,
                    const rv_gvl_reading* gvl) {
  WatchedProcess* p = registry_.Find(static_cast<int>(r.pid));
  if (p == nullptr) return;
  if (r.kind != RV_EV_SAMPLE && r.kind >= RV_EV_KIND_COUNT) return;
  // Frames are named now, while the objects they point to are as fresh as they will ever be.
  if (!p->frames && env_.frame_source) {
    p->frames = env_.frame_source(p->pid, p->target, *p->set);
    if (p->frames) p->frames->SetMemoryAccount(p->memory.get());
  }
  Pending item;
  item.t_ns = r.ts_ns;
  item.pid = p->pid;
  item.kind = r.kind;
  item.th = r.th;
  item.tid = r.tid;
  item.in_gc = (r.flags & RV_REC_IN_GC) != 0;
  const uint64_t epoch = p->gc_epoch.ForStack(p->set->paused);  // the budget detaches the GC sites with the rest
  const StackEnd end = StackEndOf(h);
  if (p->frames) {
    item.stack = p->frames->ResolveStack(frames, epoch, end);
  } else if (end != StackEnd::kWhole) {
    item.stack = std::make_shared<const std::vector<SharedFrame>>(1, StackEndFrame(end));
  }
  if (r.kind == RV_EV_SAMPLE) {
    if (AllUnresolved(item.stack)) {
      // Nothing of the stack could be named (the process is exiting, or its memory is unreadable): a profile
      // entry of "<unresolved>" frames says nothing, so the sample is counted as dropped instead.
      ++unsymbolized_;
      return;
    }
    if (gvl != nullptr) item.gvl = GvlReadingFromRecord(*gvl);
  } else if (r.kind == RV_EV_THREAD_READY && gvl != nullptr) {
    item.gvl = HolderFromRecord(gvl->holder);  // item.stack is the holder's
  }
  p->gc_epoch.OnRecord(r.kind);
  Enqueue(std::move(item), /*may_release=*/true);
}

void Agent::EnqueueMarker(int pid, uint32_t kind, uint64_t t_ns) {
  Pending item;
  item.t_ns = t_ns;
  item.pid = pid;
  item.kind = kind;
  Enqueue(std::move(item));
}

size_t Agent::PendingBytes(const Pending& item) {
  if (item.stack == nullptr) return sizeof(Pending);
  // Each frame as if it were the stack's alone (an evicted frame is freed only with its last holder).
  size_t bytes = sizeof(Pending) + 64 + item.stack->capacity() * sizeof(SharedFrame);
  for (const SharedFrame& f : *item.stack) {
    bytes += StackResolver::kEntryOverheadBytes + f->label.capacity() + f->path.capacity();
  }
  return bytes;
}

void Agent::Enqueue(Pending item, bool may_release) {
  item.bytes = PendingBytes(item);
  pending_bytes_ += item.bytes;
  const uint64_t t_ns = item.t_ns;
  pending_.Push(std::move(item));
  // One Consume reads for as long as BPF refills the ring, so a slow loop or a flood of deep stacks would keep a
  // whole drain's records (and the frames they hold) until it ends: past kMaxPendingBytes, what is a reorder window
  // older than this record goes now. Only where the caller holds nothing a dispatch may change (an exit record
  // finishes its process; OnStack's record is its last use of its process).
  if (may_release && pending_bytes_ > kMaxPendingBytes && t_ns > kReorderWindowNs) {
    ++early_releases_;
    ReleasePending(t_ns - kReorderWindowNs - 1);
  }
}

void Agent::ReleasePending(uint64_t upto_ns) {
  pending_.PopThrough(upto_ns, [this](Pending&& item) {
    pending_bytes_ -= std::min(pending_bytes_, item.bytes);
    Dispatch(item);
  });
}

void Agent::Dispatch(Pending& item) {
  const int pid = item.pid;
  if (item.kind == RV_EV_PROC_EXEC) {
    if (pid == getpid()) return;
    // A watched process that execs becomes a new program: its old image is finished, the new one inspected.
    if (registry_.Find(pid) != nullptr) FinishProcess(pid, item.t_ns, "exec");
    retries_.Add(pid, item.t_ns);
    return;
  }
  if (item.kind == RV_EV_PROC_EXIT) {
    FinishProcess(pid, item.t_ns, "exit");
    return;
  }
  if (item.kind == RV_EV_PROC_FORK) {
    // A worker forked by a watched process: the same binary, already mapped, so one inspection (served by the VM
    // cache) decides. A child that exec'd since is handled by its exec record.
    if (registry_.Find(pid) == nullptr && !retries_.contains(pid)) TryWatch(pid, "fork");
    return;
  }
  WatchedProcess* p = registry_.Find(pid);
  if (p == nullptr) return;
  if (item.kind == kPendingTracingPaused) {
    p->profile->OnTracingPaused(item.t_ns);
    return;
  }
  if (item.kind == kPendingTracingResumed) {
    p->profile->OnTracingResumed(item.t_ns);
    return;
  }
  // The thread on the process's initial native thread is main (CRuby runs no other Ruby thread there).
  if (item.th != 0 && item.tid == static_cast<uint32_t>(pid)) p->profile->SetMainThread(item.th);
  if (item.th != 0 && p->thread_info) {
    // STARTED and READY run on other threads: the others say which native thread the Ruby thread runs on.
    const bool own = item.kind != RV_EV_THREAD_STARTED && item.kind != RV_EV_THREAD_READY;
    if (std::optional<ThreadInfo> info = p->thread_info->ObserveThread(
            item.th, item.t_ns, item.kind == RV_EV_THREAD_EXITED, own ? item.tid : 0, item.th)) {
      p->profile->SetThreadInfo(item.th, *info);
    }
  }
  if (item.kind == RV_EV_SAMPLE) {
    if (!p->exited_threads.Keep(item.th, /*sample=*/true, /*exited=*/false)) return;
    p->profile->OnSample(item.t_ns, item.th, item.in_gc, item.stack, item.gvl.get());
    ++p->samples;
    ++samples_;
    return;
  }
  p->exited_threads.Keep(item.th, /*sample=*/false, item.kind == RV_EV_THREAD_EXITED);
  if (item.kind == RV_EV_THREAD_READY && item.gvl != nullptr) {
    // A contended READY: its stack is the holder's, a contention observation for blame, not the waiter's own.
    p->profile->OnEvent(item.t_ns, item.th, item.kind, SharedStack());
    p->profile->OnContention(item.t_ns, item.gvl->holder_th, item.stack);
  } else {
    p->profile->OnEvent(item.t_ns, item.th, item.kind, item.stack);
  }
  ++p->events;
  ++events_;
}

void Agent::DrainRing() {
  const uint64_t now = env_.clock->MonotonicNs();
  // Records up to now are in the ring or already handled; a bounded number of rounds so a flood cannot pin us here.
  rvbpfd::DrainRing([this] {
    // Each round reads the ring whole, so the records stamped a reorder window before the round began are all read:
    // they are handed over now rather than after the last round. Pending records hold their named stacks (and the
    // frames in them, which an eviction of their process's cache does not free), so a drain that a slow host or a
    // flood stretches over many rounds keeps at most about two rounds of them, not all.
    const uint64_t round_ns = env_.clock->MonotonicNs();
    Result<int> n = env_.backend->Consume();  // what the ring holds, without a poll syscall
    if (round_ns > kReorderWindowNs) ReleasePending(round_ns - kReorderWindowNs);
    return n ? *n : -1;
  });
  NoteDrained(now);
  ReleasePending(UINT64_MAX);
}

void Agent::NoteDrained(uint64_t read_from_ns) {
  drained_ns_ = read_from_ns;
  next_drain_ns_ = drain_period_ns_ == 0 ? read_from_ns : LastTickWithin(read_from_ns, drain_period_ns_);
}

uint64_t Agent::LastTickWithin(uint64_t from_ns, uint64_t period_ns) const {
  // The latest tick at most period_ns after from_ns, and at least the first tick after it.
  const uint64_t first = TickAfter(from_ns);
  const uint64_t limit = from_ns + period_ns;
  if (limit < first) return first;
  return first + (limit - first) / kBudgetCheckNs * kBudgetCheckNs;
}

uint64_t Agent::TickAfter(uint64_t t_ns) const {
  if (t_ns < tick_origin_ns_) return tick_origin_ns_;
  return tick_origin_ns_ + ((t_ns - tick_origin_ns_) / kBudgetCheckNs + 1) * kBudgetCheckNs;
}

std::vector<ProfileUpload> Agent::CutProcess(WatchedProcess& p, uint64_t cut_ns) {
  if (cut_ns <= p.interval_start_ns) return {};
  const uint64_t start = p.interval_start_ns;
  std::vector<BuiltProfile> built =
      p.profile->Cut(cut_ns, UnixNs(start), static_cast<int64_t>(cut_ns - start));
  p.interval_start_ns = cut_ns;
  if (built.empty()) return {};
  profiles_built_ += built.size();
  std::vector<ProfileUpload> uploads = MakeUploads(host_, p, std::move(built), UnixNs(start), UnixNs(cut_ns));
  AddProcessTreeLabels(registry_, p, &uploads);
  return uploads;
}

void Agent::SubmitUploads(std::vector<ProfileUpload> uploads) {
  if (uploads.empty()) return;
  if (sinks_.dir && sinks_.push) {
    sinks_.dir->SubmitAll(uploads);
    sinks_.push->SubmitAll(std::move(uploads));
  } else if (sinks_.dir) {
    sinks_.dir->SubmitAll(std::move(uploads));
  } else if (sinks_.push) {
    sinks_.push->SubmitAll(std::move(uploads));
  }
}

void Agent::CutAll(uint64_t cut_ns) {
  // One hand-over for the whole cut, so the push sink can send it in few requests.
  std::vector<ProfileUpload> uploads;
  for (auto& [pid, p] : registry_.all()) {
    std::vector<ProfileUpload> cut = CutProcess(*p, cut_ns);
    std::move(cut.begin(), cut.end(), std::back_inserter(uploads));
  }
  SubmitUploads(std::move(uploads));
}

void Agent::FinishProcess(int pid, uint64_t end_ns, const char* reason) {
  std::unique_ptr<WatchedProcess> p = registry_.Remove(pid);
  if (!p) return;
  // The exit record's time ends the last interval; a vanished process ends now.
  const uint64_t now = env_.clock->MonotonicNs();
  SubmitUploads(
      CutProcess(*p, std::min(std::max(end_ns, p->interval_start_ns), std::max(now, p->interval_start_ns))));
  if (Status st = env_.backend->RemovePid(static_cast<uint32_t>(pid)); !st) {
    log().Warn("cannot remove process from the BPF filter", {{"pid", pid}, {"error", st.error().message()}});
  }
  ProbeSet* set = p->set;
  probe_sets_.Release(pid, set);
  log().Info("process detached", {{"pid", pid},
                                  {"comm", p->labels.comm},
                                  {"ruby_version", p->target.ruby_version},
                                  {"container_id", p->labels.container_id},
                                  {"reason", reason},
                                  {"events", p->events},
                                  {"samples", p->samples}});
  if (!set->active()) {
    log().Info("binary unprobed", {{"path", set->vm_path}, {"build_id", set->key.build_id}});
  }
}

void Agent::PollEc(WatchedProcess& p) {
  if (!p.ec || p.ec->state() != ProcessEcInstaller::State::kPending) return;
  if (env_.backend->PollEc(*p.ec) == ProcessEcInstaller::State::kFailed &&
      FirstTimeLogged("ec:" + p.ec->error())) {
    log().Warn("samples of this process find their thread only through scheduler events",
               {{"pid", p.pid}, {"comm", p.labels.comm}, {"error", p.ec->error()}});
  }
}

void Agent::CheckLiveness() {
  const uint64_t now = env_.clock->MonotonicNs();
  // One poll of every exit descriptor, with no wait, instead of one /proc/PID/stat read per process: with 50
  // processes the reads were ~5% of the agent's CPU. A process without a descriptor is read from /proc.
  std::vector<int> gone;
  exit_polls_.clear();
  exit_poll_pids_.clear();
  for (const auto& [pid, p] : registry_.all()) {
    if (p->exit_fd.ok()) {
      exit_polls_.push_back(pollfd{p->exit_fd.get(), POLLIN, 0});
      exit_poll_pids_.push_back(pid);
    } else if (!ProcessAlive(config_.proc_root, pid)) {
      gone.push_back(pid);
    }
  }
  if (!exit_polls_.empty()) {
    int n = 0;
    do {
      n = poll(exit_polls_.data(), exit_polls_.size(), 0);
    } while (n < 0 && errno == EINTR);
    for (size_t i = 0; i < exit_polls_.size(); ++i) {
      // Readable: it exited. An error (not expected on a pidfd the agent holds, or a failed poll): /proc decides.
      const short r = n < 0 ? POLLERR : exit_polls_[i].revents;
      const bool error = (r & (POLLERR | POLLNVAL | POLLHUP)) != 0;
      if ((r & POLLIN) || (error && !ProcessAlive(config_.proc_root, exit_poll_pids_[i]))) {
        gone.push_back(exit_poll_pids_[i]);
      }
    }
  }
  for (int pid : gone) FinishProcess(pid, now, "vanished");
}

void Agent::UpdateBudgets(uint64_t now) {
  if (now < next_budget_check_ns_) return;
  next_budget_check_ns_ = TickAfter(now);
  // Traps, not records: a hit that BPF discards (rb_mutex_lock entered by IO#write in a shared libruby) costs the
  // process the same trap. Every watched process's count is read at each check (kBudgetCheckNs).
  for (ProbeSet* set : probe_sets_.ActiveSets()) {
    // The budget is per process: the set's sites pause when its busiest process has spent its share.
    rv_pid_traps busiest{};
    double busiest_ns = 0;
    for (int pid : set->pids) {
      WatchedProcess* p = registry_.Find(pid);
      if (p == nullptr) continue;
      const std::optional<rv_pid_traps> read = env_.backend->PidTraps(static_cast<uint32_t>(pid));
      if (!read) continue;
      // A count below the last one: the pid was added to the filter again (its counts restarted).
      const rv_pid_traps& now_traps = *read;
      const bool restarted = now_traps.traps < p->traps_seen.traps;
      rv_pid_traps delta = now_traps;
      if (!restarted) {
        auto since = [](uint64_t now, uint64_t seen) { return now >= seen ? now - seen : 0; };
        delta.traps -= p->traps_seen.traps;
        delta.cold = since(now_traps.cold, p->traps_seen.cold);
        delta.stepped = since(now_traps.stepped, p->traps_seen.stepped);
        delta.stack_ns = since(now_traps.stack_ns, p->traps_seen.stack_ns);
      }
      p->traps_seen = now_traps;
      const double ns = set->budget->CostNs(delta.traps, delta.cold, delta.stepped, delta.stack_ns);
      if (ns > busiest_ns) {
        busiest_ns = ns;
        busiest = delta;
      }
    }
    set->budget_traps.total += busiest.traps;
    set->budget_traps.cold += busiest.cold;
    set->budget_traps.stepped += busiest.stepped;
    set->budget_traps.stack_ns += busiest.stack_ns;
    const OverheadBudget::Action action = set->budget->Update(now, set->budget_traps);
    if (action == OverheadBudget::Action::kPause && set->high_group >= 0 && !set->paused) {
      env_.backend->DetachGroup(set->high_group);
      set->paused = true;
      // Stamped once the detach has returned (every event of the detach tail is older) and sent through the reorder
      // window, so events still in the ring or the window reach the profile before it, as `rvbpfd record` orders
      // its tracing_paused.
      const uint64_t paused_at = env_.clock->MonotonicNs();
      for (int pid : set->pids) EnqueueMarker(pid, kPendingTracingPaused, paused_at);
      log().Info("tracing paused", {{"path", set->vm_path},
                                    {"reason", "max-overhead"},
                                    {"overhead_pct", set->budget->current_pct(now, set->budget_traps)}});
    } else if (set->paused && !set->budget->paused()) {
      // The window ended (or a reattach failed before and is retried now). Stamped before the reattach: every
      // event after it is newer.
      const uint64_t resumed_at = env_.clock->MonotonicNs();
      if (Status st = env_.backend->ReattachGroup(set->high_group, set->attach_path()); st) {
        set->paused = false;
        for (int pid : set->pids) {
          if (WatchedProcess* p = registry_.Find(pid)) {
            EnqueueMarker(pid, kPendingTracingResumed, resumed_at);
            p->gc_epoch.OnGcSitesReattached();
          }
        }
      } else if (action == OverheadBudget::Action::kResume) {
        log().Warn("cannot resume tracing", {{"path", set->vm_path}, {"error", st.error().message()}});
      }
    }
  }
}

void Agent::CheckCounters(uint64_t /*now*/) {
  const uint64_t dropped = env_.backend->EventsDropped();  // no syscall: checked at every poll
  if (dropped > drops_seen_) {
    // Lost records may be anyone's: every open span is unknown now, a GC may have moved objects, and an exec or
    // exit may be among them, so /proc is scanned again (rate-limited).
    for (auto& [pid, p] : registry_.all()) {
      p->profile->OnEventsLost();
      p->gc_epoch.OnLoss();
    }
    rescan_pending_ = true;
  }
  drops_seen_ = dropped;
}

int Agent::NextWaitMs(uint64_t now, int poll_ms) const {
  uint64_t due = std::min({next_drain_ns_, next_budget_check_ns_, next_cut_ns_, next_housekeeping_ns_});
  if (rescan_pending_) due = std::min(due, last_rescan_ns_ + kMinRescanGapNs);
  if (now < ec_eager_until_ns_) due = std::min(due, now + kShortWaitNs);
  // An exec'd pid is inspected when its next attempt is due, and not sooner than kShortWaitNs from now: however many
  // pids exec (a busy host execs all the time), they wake the loop at most once per kShortWaitNs, and not at all
  // while none of them is due.
  if (std::optional<uint64_t> retry = retries_.next_due_ns()) due = std::min(due, std::max(*retry, now + kShortWaitNs));
  if (due <= now) return 0;
  const uint64_t ms = (due - now + 999'999) / 1'000'000;  // rounded up: a wait never ends before the work is due
  return static_cast<int>(std::min<uint64_t>(ms, static_cast<uint64_t>(std::max(poll_ms, 0))));
}

Status Agent::RunOnce(int poll_ms) {
  Result<bool> woken = env_.backend->Wait(NextWaitMs(env_.clock->MonotonicNs(), poll_ms));
  if (!woken) return woken.error();
  uint64_t now = env_.clock->MonotonicNs();
  if (*woken || now >= next_drain_ns_) {
    // Read before the ring: every record stamped before `now` (less the reorder window's skew) is handed over.
    Result<int> n = env_.backend->Consume();
    if (!n) return n.error();
    NoteDrained(now);
  }
  // Only records older than the last read are known to be complete; a marker enqueued since (a budget pause) waits
  // for the records before it that are still in the ring.
  ReleasePending(drained_ns_ > kReorderWindowNs ? drained_ns_ - kReorderWindowNs : 0);
  CheckCounters(now);
  InspectDue(now);
  if (rescan_pending_ && now - last_rescan_ns_ >= kMinRescanGapNs) ScanProc("rescan");
  UpdateBudgets(now);
  if (now >= next_cut_ns_) {
    DrainRing();
    now = env_.clock->MonotonicNs();
    CutAll(now);
    next_cut_ns_ += interval_ns_;
    if (next_cut_ns_ <= now) next_cut_ns_ = now + interval_ns_;
  }
  // Only while a process attached less than kEcEagerNs ago (until ec_eager_until_ns_) or at the housekeeping: the
  // walk touches every watched process's state, which the targets evict from the CPU caches between wakeups.
  if (now < ec_eager_until_ns_ || now >= next_housekeeping_ns_) {
    for (auto& [pid, p] : registry_.all()) {
      if (now - p->attached_ns < kEcEagerNs || now >= next_housekeeping_ns_) PollEc(*p);
    }
  }
  if (now >= next_housekeeping_ns_) {
    DrainRing();
    CheckLiveness();
    probe_sets_.Expire(std::chrono::steady_clock::now());
    UpdateMetrics();
    LogDeliveryProblems(now);
    next_housekeeping_ns_ = LastTickWithin(now, kHousekeepingNs);
  }
  return Status::Ok();
}

void Agent::LogDeliveryProblems(uint64_t now) {
  if (!sinks_.push && !sinks_.dir) return;
  SinkStats s = sinks_.push ? sinks_.push->stats() : SinkStats{};
  const SinkStats d = sinks_.dir ? sinks_.dir->stats() : SinkStats{};
  if (s.push_api == "ingest" && !logged_ingest_fallback_) {
    logged_ingest_fallback_ = true;
    log().Warn("the push backend has no push API (push.v1.PusherService/Push answered 404, 405 or 415): each "
               "profile now goes to /ingest in a request of its own", {});
  }
  const uint64_t problems = s.delivery_failures + s.retries + s.dropped_queue_full + d.delivery_failures +
                            d.dropped_queue_full;
  if (problems == logged_failures_) return;
  if (last_delivery_log_ns_ != 0 && now - last_delivery_log_ns_ < kDeliveryLogGapNs) return;
  last_delivery_log_ns_ = now;
  logged_failures_ = problems;
  log().Warn("profile delivery problems", {{"push_failures", s.delivery_failures},
                                           {"push_retries", s.retries},
                                           {"dropped_queue_full", s.dropped_queue_full + d.dropped_queue_full},
                                           {"queued", s.queued},
                                           {"last_error", s.last_error.empty() ? d.last_error : s.last_error}});
}

void Agent::UpdateMetrics() {
  MetricsRegistry* m = env_.metrics;
  if (m == nullptr) return;
  const rv_counters seen = env_.backend->ReadCounters();
  m->SetGauge(kMetricProcessesWatched, "Ruby processes being profiled", {}, static_cast<double>(registry_.size()));
  m->SetGauge(kMetricBinariesProbed, "Ruby VM binaries with attached probes", {},
              static_cast<double>(probe_sets_.active_sets()));
  const BpfSession::SlotUsage slots = env_.backend->slot_usage();
  const char* slots_help = "BPF array slots held: binary (a VM binary's offsets), site (a probe site's cookie)";
  m->SetGauge(kMetricBpfSlots, slots_help, {{"kind", "binary"}}, static_cast<double>(slots.binaries));
  m->SetGauge(kMetricBpfSlots, slots_help, {{"kind", "site"}}, static_cast<double>(slots.cookies));
  const char* limit_help = "BPF array slots there are, by kind (rvbpfd_bpf_slots_in_use)";
  m->SetGauge(kMetricBpfSlotsLimit, limit_help, {{"kind", "binary"}}, static_cast<double>(slots.binaries_limit));
  m->SetGauge(kMetricBpfSlotsLimit, limit_help, {{"kind", "site"}}, static_cast<double>(slots.cookies_limit));
  m->SetCounter(kMetricProbeSetsRecycled,
                "Probe sets of binaries with no process left whose BPF slots went back for other binaries", {},
                static_cast<double>(probe_sets_.recycled_sets()));
  m->SetGauge(kMetricBinariesFailed, "VM binaries remembered as unprobeable (each retried after an hour)", {},
              static_cast<double>(probe_sets_.failed_binaries()));
  m->SetCounter(kMetricEvents, "Scheduler and GC events of watched processes handled", {},
                static_cast<double>(events_));
  m->SetCounter(kMetricSamples, "On-CPU samples of watched processes handled", {}, static_cast<double>(samples_));
  m->SetCounter(kMetricGvlReadings, "Samples that read their VM's GVL (holder and queue) in BPF", {},
                static_cast<double>(seen.gvl_readings));
  const char* dropped_help = "Events, samples and profiles lost, by reason";
  SinkStats push = sinks_.push ? sinks_.push->stats() : SinkStats{};
  const SinkStats dir = sinks_.dir ? sinks_.dir->stats() : SinkStats{};
  // The BPF loss counters, each under its own reason (include/rvbpfd/counters.h).
#define RV_DROP_METRIC(field, fold, label, reason)                                                                \
  if (reason[0] != '\0') {                                                                                        \
    m->SetCounter(kMetricDropped, dropped_help, {{"reason", std::string(reason)}}, static_cast<double>(seen.field)); \
  }
  RV_EVENT_COUNTERS(RV_DROP_METRIC)
  RV_SAMPLE_COUNTERS(RV_DROP_METRIC)
#undef RV_DROP_METRIC
  m->SetCounter(kMetricDropped, dropped_help, {{"reason", std::string(kDropQueueFull)}},
                static_cast<double>(push.dropped_queue_full + dir.dropped_queue_full +
                                    retired_push_stats_.dropped_queue_full + retired_dir_dropped_));
  m->SetCounter(kMetricDropped, dropped_help, {{"reason", std::string(kDropUnsymbolized)}},
                static_cast<double>(unsymbolized_));
  m->SetCounter(kMetricProfilesBuilt, "Profiles built (one per process, type and interval)", {},
                static_cast<double>(profiles_built_));
  m->SetCounter(kMetricPushDelivered, "Profiles accepted by the push backend", {},
                static_cast<double>(push.delivered + retired_push_stats_.delivered));
  m->SetCounter(kMetricPushFailures, "Profiles the push backend refused for good", {},
                static_cast<double>(push.delivery_failures + retired_push_stats_.delivery_failures));
  m->SetCounter(kMetricPushRetries, "Push attempts that failed and were retried", {},
                static_cast<double>(push.retries + retired_push_stats_.retries));
  m->SetGauge(kMetricPushQueueLength, "Profiles waiting for the push backend", {}, static_cast<double>(push.queued));
  const char* skipped_help = "Processes not profiled, by reason: timeout (a time bound hit), exception (handling "
                             "threw), layout (its memory does not match its VM binary's analysis)";
  m->SetCounter(kMetricProcessesSkipped, skipped_help, {{"reason", "timeout"}}, static_cast<double>(skipped_timeout_));
  m->SetCounter(kMetricProcessesSkipped, skipped_help, {{"reason", "exception"}},
                static_cast<double>(skipped_exception_));
  m->SetCounter(kMetricProcessesSkipped, skipped_help, {{"reason", "layout"}}, static_cast<double>(skipped_layout_));
  m->SetCounter(kMetricProcessesSkipped, skipped_help, {{"reason", "memory"}}, static_cast<double>(skipped_memory_));
  m->SetGauge(kMetricMemoryBudget, "Bytes the per-process caches may hold together (--memory-budget)", {},
              static_cast<double>(budget_->budget()));
  m->SetGauge(kMetricMemoryHeld, "Bytes the per-process caches hold now (frame caches, stack tables' reservations)",
              {}, static_cast<double>(budget_->held()));
  m->SetCounter(kMetricMemoryEvictions, "Per-process frame caches evicted to stay within --memory-budget", {},
                static_cast<double>(budget_->evictions()));
  m->SetCounter(kMetricMemoryEvictedBytes, "Bytes freed by those evictions", {},
                static_cast<double>(budget_->evicted_bytes()));
  m->SetCounter(kMetricMemoryRefused,
                "Charges the memory budget refused (a frame named but not cached, a process not profiled)", {},
                static_cast<double>(budget_->refused()));
}

size_t Agent::ProfileTableBytes(size_t share) {
  return std::clamp(share / 8, kMinProfileTableBytes, ProcessProfileLimits{}.max_table_bytes);
}

size_t Agent::ProcessReservation(size_t table_bytes) { return kProcessBaseBytes + 2 * table_bytes; }

Status Agent::Reload(const AgentConfig& loaded) {
  const ReloadPlan plan = PlanReload(config_, loaded);
  if (!plan.needs_restart.empty()) {
    std::string keys;
    for (const std::string& k : plan.needs_restart) keys += (keys.empty() ? "" : ",") + k;
    log().Warn("config keys changed that need a restart; keeping their running values", {{"keys", keys}});
  }
  const AgentConfig& next = plan.next;
  Result<ProcessFilter> filter = ProcessFilter::Create(next.include, next.exclude);
  if (!filter) return filter.error();
  Result<ServiceNamePolicy> policy = ServiceNamePolicy::Create(next.service_pins, next.ignore_env_service);
  if (!policy) return policy.error();
  const bool sinks_changed = next.output_dir != config_.output_dir || next.output_max_mb != config_.output_max_mb ||
                             next.output_service_max_mb != config_.output_service_max_mb ||
                             next.push_url != config_.push_url || next.push_queue != config_.push_queue;
  if (sinks_changed) {
    Result<AgentSinks> sinks = env_.make_sinks(next);
    if (!sinks) return sinks.error();
    if (!sinks->dir && !sinks->push) {
      return Error(ErrorCode::kUsage, "the reloaded config has neither output-dir nor push-url");
    }
    // The old sinks deliver what they hold (bounded wait), then their counts carry over into the metrics.
    if (sinks_.push) {
      sinks_.push->Flush(kReloadFlush);
      const SinkStats s = sinks_.push->stats();
      retired_push_stats_.delivered += s.delivered;
      retired_push_stats_.delivery_failures += s.delivery_failures;
      retired_push_stats_.retries += s.retries;
      retired_push_stats_.dropped_queue_full += s.dropped_queue_full;
    }
    if (sinks_.dir) {
      sinks_.dir->Flush(kReloadFlush);
      retired_dir_dropped_ += sinks_.dir->stats().dropped_queue_full;
    }
    sinks_ = std::move(sinks.value());
    logged_ingest_fallback_ = false;  // a new push sink tries the push API again
  }
  DrainRing();
  const uint64_t now = env_.clock->MonotonicNs();
  const uint64_t new_interval = static_cast<uint64_t>(next.interval_s * 1e9);
  if (new_interval != interval_ns_ && started_) {
    const uint64_t last_cut = next_cut_ns_ - interval_ns_;
    next_cut_ns_ = std::max(last_cut + new_interval, now);
    interval_ns_ = new_interval;
  }
  if (next.log_format != config_.log_format) {
    if (Result<LogFormat> f = ParseLogFormat(next.log_format); f) log().SetFormat(*f);
  }
  const bool filter_changed = next.include != config_.include || next.exclude != config_.exclude;
  filter_ = std::move(filter.value());
  service_policy_ = std::move(policy.value());  // names processes found from now on
  config_ = next;
  if (filter_changed) {
    for (int pid : registry_.pids()) {
      WatchedProcess* p = registry_.Find(pid);
      if (p != nullptr && !filter_.Matches(p->labels)) FinishProcess(pid, now, "excluded by reload");
    }
    if (started_) ScanProc("reload");  // processes the new rules include
  }
  std::string applied;
  for (const std::string& k : plan.applied) applied += (applied.empty() ? "" : ",") + k;
  log().Info("config reloaded", {{"applied", applied}, {"processes", static_cast<uint64_t>(registry_.size())}});
  UpdateMetrics();
  return Status::Ok();
}

bool Agent::Shutdown(std::chrono::milliseconds flush_deadline) {
  DrainRing();
  CutAll(env_.clock->MonotonicNs());
  bool ok = true;
  if (sinks_.dir) ok = sinks_.dir->Flush(flush_deadline) && ok;
  if (sinks_.push) ok = sinks_.push->Flush(flush_deadline) && ok;
  UpdateMetrics();
  return ok;
}

}  // namespace rvbpfd
