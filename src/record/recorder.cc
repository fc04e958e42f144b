#include "record/recorder.h"

#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "common/deadline.h"
#include "common/release_in_child.h"
#include "common/target_file.h"
#include "common/text_escape.h"
#include "common/threads.h"
#include "elf/debug_lookup.h"
#include "elf/elf_file.h"
#include "probe/bpf_session.h"
#include "probe/ec_install.h"
#include "probe/probe_backend.h"
#include "record/exit_hold.h"
#include "record/launch.h"
#include "record/process_tree.h"
#include "record/record_sink.h"
#include "record/recording.h"
#include "record/release_reason.h"
#include "session/ingest.h"
#include "session/overhead_budget.h"
#include "session/reorder.h"
#include "session/stack_resolver.h"
#include "session/thread_info.h"
#include "session/vm_binary.h"
#include "sites/sites.h"
#include "stacks/memory_reader.h"
#include "stacks/ruby_offsets.h"
#include "target/pid_namespace.h"
#include "target/target.h"
#include "trace/event.h"
#include "trace/stacks.h"
#include "trace/thread_ids.h"
#include "trace/writer.h"

namespace rvbpfd {
namespace {

std::atomic<bool> g_stop{false};

void OnSignal(int) { g_stop.store(true); }

// CPU time of the calling thread (ns): what detaching/reattaching probes cost the daemon, charged to the budget.
uint64_t SystemThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

uint64_t SystemMonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

std::string IsoUtcNow() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  tm utc;
  gmtime_r(&ts.tv_sec, &utc);
  char buf[64];
  snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", utc.tm_year + 1900, utc.tm_mon + 1, utc.tm_mday,
           utc.tm_hour, utc.tm_min, utc.tm_sec, ts.tv_nsec / 1000000);
  return buf;
}

std::string DefaultOutput(int pid) {
  time_t now = time(nullptr);
  tm local;
  localtime_r(&now, &local);
  char buf[96];
  snprintf(buf, sizeof(buf), "rvbpfd-%d-%04d%02d%02d-%02d%02d%02d.rvtrace", pid, local.tm_year + 1900,
           local.tm_mon + 1, local.tm_mday, local.tm_hour, local.tm_min, local.tm_sec);
  return buf;
}

// /proc, not kill(0): a zombie, and a process whose exit has begun, still answer kill(0).
bool ProcessGone(int pid) { return ProcessEnding(ProcFs(), pid); }

Error TargetExitedError(int pid) {
  return Error(ErrorCode::kTargetExited,
               "pid " + std::to_string(pid) + " exited while the probes were being attached; nothing was recorded");
}

// Watches for the end of the target: a pidfd becomes readable when the process exits (attach mode); the launched
// child is reaped with waitpid (launch mode).
class TargetWatch {
 public:
  // `exit_fd`: readable once process `pid` has exited (RecorderEnv::open_exit_fd; owned from here), or -1.
  TargetWatch(int pid, int exit_fd) : pid_(pid), pidfd_(exit_fd) {}
  TargetWatch(TargetWatch&& o) noexcept : pid_(o.pid_), pidfd_(o.pidfd_) { o.pidfd_ = -1; }
  TargetWatch& operator=(TargetWatch&&) = delete;
  ~TargetWatch() {
    if (pidfd_ >= 0) close(pidfd_);
  }
  // The pidfd (readable once the process exited), -1 without one.
  int fd() const { return pidfd_; }
  bool Exited() const {
    if (pidfd_ >= 0) {
      pollfd p{pidfd_, POLLIN, 0};
      return poll(&p, 1, 0) > 0;
    }
    return ProcessGone(pid_);  // no pidfd (old kernel): a zombie still answers kill(0), so /proc state decides
  }

 private:
  int pid_ = -1;
  int pidfd_ = -1;
};

// A probe group of the backend, released (ProbeBackend::ReleaseGroup) when this goes: the recording's handle on it.
class ProbeGroup {
 public:
  ProbeGroup() = default;
  ProbeGroup(ProbeBackend* backend, int id) : backend_(backend), id_(id) {}
  ProbeGroup(const ProbeGroup&) = delete;
  ProbeGroup& operator=(const ProbeGroup&) = delete;
  ProbeGroup& operator=(ProbeGroup&& o) noexcept {
    if (this != &o) {
      Reset();
      backend_ = o.backend_;
      id_ = std::exchange(o.id_, -1);
    }
    return *this;
  }
  ~ProbeGroup() { Reset(); }
  explicit operator bool() const { return id_ >= 0; }
  int id() const { return id_; }
  void Reset() {
    if (id_ >= 0) backend_->ReleaseGroup(std::exchange(id_, -1));
  }

 private:
  ProbeBackend* backend_ = nullptr;
  int id_ = -1;
};

// The rvtrace header's name for a --stacks value.
std::string StacksModeName(const std::string& option) {
  if (option == "off") return "off";
  if (option.find("ready") != std::string::npos) return "release+wants";
  return "release";
}

// One recording, its phases in the order Record runs them:
//   Prepare  the target found (launched command planned, or attached process discovered), its VM binary analysed
//            once, and in attach mode the live process checked against that analysis before any probe goes in;
//   Open     the BPF session (loaded on a helper thread while Prepare runs), the launched command spawned (held
//            before exec), the trace file created;
//   Attach   the probes live, samples started, the command released;
//   Run      the main loop, until the target exits, a signal, --duration or an error;
//   Finish   the last records, the trace's summary, the counters on stderr, the links released.
// A phase that fails returns its error and the recording ends there; from Attach on, the (header-only) trace file is
// abandoned so nothing partial is left behind. The BPF callbacks point at this object: it never moves.
class Recording {
 public:
  Recording(const RecordOptions& o, const RecorderEnv& env, RecordSinkFactory make_sink = nullptr)
      : o_(o),
        env_(env),
        make_sink_(std::move(make_sink)),
        launch_(!o.command.empty()),
        stacks_on_(o.stacks != "off"),
        sampling_(o.hz > 0),
        // With a budget, short windows bound what a short run can overspend; estimating only, 1 s windows keep the
        // warning from firing on a brief burst.
        budget_(o.max_overhead_pct,
                TrapCosts(o.probe_cost_us, o.stepped_probe_cost_us, o.cold_probe_extra_us, o.cycle_cost_us),
                o.max_overhead_pct > 0 ? OverheadBudget::kDefaultWindowNs : 1'000'000'000) {}
  Recording(const Recording&) = delete;
  Recording& operator=(const Recording&) = delete;
  ~Recording() {
    if (bpf_loader_.joinable()) bpf_loader_.join();
  }

  Status Prepare();
  // Instead of Prepare: a target analysed already.
  void Adopt(RecordTarget target, PreparedBinary prepared);
  Status Open();
  Status Attach();
  Status Run();
  Result<int> Finish();

  // Removes the trace file (a failure from Attach on).
  Error Abandon(Error e) {
    if (sink_) sink_->Abandon();
    return e;
  }

 private:
  // The BPF session's options: what the flags ask for, given whether the VM binary gives stacks and a GVL layout.
  SessionOptions SessionOptionsFor(bool stacks_ready, bool gvl_layout) const;
  // Starts the speculative load of the backend on bpf_loader_ (see there).
  void StartBackendLoad();
  Status FindLaunchTarget();
  // --hold: teardown_site_ from the VM binary's symbols (.symtab or .dynsym: ruby_vm_destruct is exported).
  void FindTeardownSite();
  // --hold: seizes the target (exit_hold_); a target that cannot be seized is recorded without the hold (a note).
  void SeizeForHold();
  // Lets the held target go for good: BPF's held pid cleared (no GC or teardown signal after), then detached.
  void ReleaseHold();
  Status FindAttachTarget();
  Status CheckAttachedLayout();
  // BPF ring callbacks.
  void OnRecord(const rv_record& r);
  void OnStackRecord(const rv_record& r, const rv_stack_header& h, std::span<const rv_ruby_frame> frames,
                     const rv_gvl_reading* gvl);
  // Called with every record: launch mode's VM runs once its first scheduler event arrives.
  void SawRecord(uint16_t kind);
  void PollEcRoute();
  void PollLaunchGate();
  // The hold (record/exit_hold.h; both modes): passes signals on, and at the target's exit stop drains the ring
  // (naming every frame while its memory is there) and lets it go. True when HeldChild may wait for the child.
  bool ServiceExitHold();
  bool LayoutChecked() const;
  Error LaunchGateError(const char* why_unchecked) const;
  // --follow: the lifecycle tracepoints attached, the follower set up with the root's process line written.
  Status StartFollowing();
  // The daemon's own events are stamped "now"; everything the probes recorded before now must be in the reorder
  // window first, or those records would arrive after a newer timestamp and be written out of order.
  void DrainRing();
  void CheckCounters();
  void PushDaemon(EventName name, const char* reason, double pct, uint64_t t_ns);
  void CheckBudget();
  // Writes what the reorder window let out (ready_), keeping only events of live threads.
  Status WriteReady();
  uint64_t NowT() const { return MonotonicNs() - origin_ns_; }
  // What the sink writes to, for messages.
  std::string OutputName() const { return sink_->output_path().empty() ? "the live view" : sink_->output_path(); }
  uint64_t MonotonicNs() const { return env_.monotonic_ns(); }
  uint64_t ThreadCpuNs() const { return env_.thread_cpu_ns(); }
  // A failure while the attached process may have died: that is the error to report.
  Error ExitedOr(Error e) const {
    if (!launch_ && ProcessGone(target_.pid)) return TargetExitedError(target_.pid);
    return e;
  }

  const RecordOptions& o_;
  const RecorderEnv env_;
  const RecordSinkFactory make_sink_;  // null: the .rvtrace file of o_.output
  const bool launch_;
  const bool stacks_on_;
  const bool sampling_;

  // Prepare. The BPF load (~50 ms of verification and map allocation, in the kernel) runs on bpf_loader_ while the
  // main thread analyses the VM binary; it assumes the binary gives stacks and a GVL layout (Open loads once more
  // when the analysis says otherwise, so the programs are always the ones the run needs). Written by the loader,
  // read by Open after the join.
  std::thread bpf_loader_;
  SessionOptions speculative_options_;
  std::optional<Result<std::unique_ptr<ProbeBackend>>> loaded_backend_;
  RecordTarget target_;
  std::optional<LaunchIdentity> launch_identity_;
  std::optional<PreparedBinary> prepared_;

  // Open.
  std::unique_ptr<ProbeBackend> backend_;
  std::optional<HeldChild> child_;
  std::unique_ptr<ExitHold> exit_hold_;  // null: --hold off, or the target could not be seized
  // --hold: the VM's teardown (ruby_vm_destruct's entry) as an RV_SITE_TEARDOWN site, attached with the probes when
  // the target is held (exit_hold_); nullopt when the binary does not name it.
  std::optional<SiteSpec> teardown_site_;
  std::optional<StackSetup> stack_setup_;
  uint64_t origin_ns_ = 0;  // monotonic ns of the trace's t = 0
  std::unique_ptr<RecordSink> sink_;

  // Ingest: everything the ring delivers goes through the reorder window first. 20 ms of event time is far more than
  // the skew between CPUs (microseconds) and small enough that the file trails the program by a fraction of a second.
  Reorderer<TraceEvent> reorder_{20'000'000};
  GcEpoch gc_epoch_;  // the stack resolver's cache generation
  ExitedThreads exited_threads_;
  std::optional<ThreadIds> thread_ids_;
  // --follow / launch mode's default: the processes other than the target (record/process_tree.h).
  std::unique_ptr<ProcessFollower> follower_;
  // Thread names and namespace tids (session/thread_info.h), set up by Run; name_mem_ reads Thread#name.
  bool target_own_pidns_ = false;
  std::unique_ptr<ProcessMemoryReader> name_mem_;
  std::optional<ThreadInfoTracker> thread_info_;
  std::vector<TraceEvent> ready_;
  rv_counters seen_{};  // the BPF counters at the last check
  uint64_t ring_records_ = 0;

  // Stacks: symbolized as they come out of the ring (the objects they point to are as fresh as they will ever be),
  // interned into the writer's dictionaries, and pushed through the reorder window like any event.
  uint8_t bin_ = 0;  // ProbeBackend::AddBinary's index of the VM binary
  std::vector<std::string> site_functions_;  // cookie -> enclosing function (for the release-reason rule)
  std::unique_ptr<StackResolver> resolver_;
  std::vector<FrameInfo> frame_infos_;
  std::vector<uint32_t> frame_ids_;
  // How samples find their EC (src/stacks/ec_route.h): installed as soon as the VM is mapped and relocated (at once
  // when attaching; after exec in launch mode, retried from the main loop and, while pending, on every stack record,
  // since symbolizing the first stacks can hold the loop for ~100 ms). Until then samples use current_th.
  std::optional<ProcessEcInstaller> ec_installer_;
  uint64_t ec_last_poll_ns_ = 0;

  // Launch mode: the command's VM runs once the first scheduler event arrives (a scheduler event needs the VM's
  // thread structures); only then can its memory be checked against the analysis (LiveLayoutGate), and its events
  // stay in the reorder window until that check has passed.
  bool vm_running_ = false;
  std::string launch_executable_;  // what the launch execs in the end (LaunchPlan::executable)
  bool launch_exec_seen_ = false;  // following: the root has exec'd launch_executable_
  std::optional<LiveLayoutGate> launch_gate_;
  std::optional<ProcessMemoryReader> gate_mem_;

  // Attach.
  std::optional<TargetWatch> watch_;
  ProbeGroup low_group_, high_group_;
  std::vector<uint64_t> low_cookies_;  // the low group's BPF cookies: its sites stay attached while paused
  uint64_t attached_ns_ = 0;  // monotonic ns when the probes went live

  // --max-overhead. The ring callbacks check the budget too once Run started (budget_active_): a burst of stack
  // records can hold Poll for ~100 ms while new frames are symbolized, and the target's traps do not wait for it.
  OverheadBudget budget_;
  bool budget_active_ = false;
  bool gc_unseen_ = false;  // the GC sites are detached
  std::optional<Error> reattach_error_;
  bool slow_detach_warned_ = false;
  uint64_t next_check_ns_ = 0;
  bool in_check_ = false;

  // Run.
  int child_status_ = 0;
  bool target_exited_ = false;
  std::string stop_reason_ = "target_exited";
};

Status Recording::FindLaunchTarget() {
  Result<std::optional<LaunchIdentity>> identity = DecideLaunchIdentity(
      o_.user, [](const char* name) { return static_cast<const char*>(getenv(name)); }, geteuid(),
      SystemUserDatabase());
  if (!identity) return identity.error();
  launch_identity_ = std::move(identity).value();
  const char* path_env = getenv("PATH");
  const char* ld_path = getenv("LD_LIBRARY_PATH");
  Result<LaunchPlan> plan = PlanLaunch(o_.command, path_env ? path_env : "/usr/bin:/bin", ld_path ? ld_path : "");
  if (!plan) return plan.error();
  target_.vm_elf = plan->vm_elf;  // a static ruby: planning parsed it already
  if (!target_.vm_elf) {
    Result<ElfFile> vm = ElfFile::Open(plan->vm_path);
    if (!vm) return Error(ErrorCode::kNotRuby, vm.error().message());
    target_.vm_elf = std::make_shared<ElfFile>(std::move(vm.value()));
  }
  std::optional<std::string> version = ReadRubyVersion(*target_.vm_elf);
  if (!version) {
    return Error(ErrorCode::kNotRuby, plan->vm_path + " has no readable ruby_version string: not a CRuby VM");
  }
  target_.vm_path = plan->vm_path;
  target_.open_path = plan->vm_path;
  launch_executable_ = plan->executable;
  target_.ruby_version = *version;
  target_.build_id = target_.vm_elf->build_id();
  return Status::Ok();
}

void Recording::ReleaseHold() {
  if (!exit_hold_) return;
  if (teardown_site_) backend_->SetHeldPid(0);  // a failure leaves a pid no probe of this session signals for long
  exit_hold_.reset();
}

void Recording::SeizeForHold() {
  if (!env_.make_ptrace) return;
  Result<std::unique_ptr<ExitHold>> hold =
      ExitHold::Seize(target_.pid, env_.make_ptrace(), teardown_site_ ? RV_TEARDOWN_SIGNAL : 0, launch_);
  if (!hold) {
    if (!o_.quiet) {
      fprintf(stderr, "rvbpfd: note: frames of the %s's last milliseconds may stay unnamed: %s\n",
              launch_ ? "command" : "target", hold.error().ToString().c_str());
    }
    return;
  }
  exit_hold_ = std::move(hold.value());
  WakeOnChildStops();
}

void Recording::FindTeardownSite() {
  std::optional<ElfSymbol> fn = target_.vm_elf->FindSymbol("ruby_vm_destruct");
  if (!fn || fn->type != STT_FUNC || fn->size == 0) return;
  std::optional<uint64_t> off = target_.vm_elf->VaddrToFileOffset(fn->value);
  if (!off) return;
  teardown_site_ = SiteSpec{*off, rv_site{RV_EV_NONE, RV_LOC_NONE, 0, 0, 0, fn->value, 0, 0, RV_SITE_TEARDOWN, 0}};
}

Status Recording::FindAttachTarget() {
  // Bounded and given up on a stop signal: the target's files may lie on a mount that never answers.
  Result<RubyTarget> t = DiscoverTargetBounded(o_.pid, env_.stop_requested);
  if (!t) {
    // A target that dies while we read its maps or ELF shows up as a vanished file: say what happened.
    if (t.error().code() != ErrorCode::kNoSuchProcess && ProcessGone(o_.pid)) return TargetExitedError(o_.pid);
    return t.error();
  }
  target_.pid = o_.pid;
  target_.ns_pid = t->ns_pid;
  target_.vm_path = t->vm_host_path;
  // Discovery parsed the VM through an O_PATH descriptor opened inside the target's root: that one file is analysed,
  // read and probed for the whole run.
  target_.vm_file = t->vm_fd;
  target_.open_path = t->vm_fd_path();
  target_.ruby_version = t->ruby_version;
  target_.build_id = t->build_id;
  target_.vm_elf = t->vm_elf;
  return Status::Ok();
}

// The live process must match what the analysis assumed (version, hook list, thread layout) before a probe goes
// in. A process caught while its VM is still starting is checked again every ms (LiveLayoutGate). The checks read
// the target's memory and stat its VM file, which may stall: they run bounded, on a helper that owns copies of what
// it uses.
Status Recording::CheckAttachedLayout() {
  const int pid = target_.pid, ns_pid = target_.ns_pid;
  const std::string vm_path = target_.vm_path;
  const LiveLayout layout = prepared_->live_layout;
  const std::function<uint64_t()> clock = env_.monotonic_ns;
  Result<bool> checked = RunBounded<bool>(
      "checking the memory of pid " + std::to_string(pid), kAnalysisTimeout, env_.stop_requested,
      [pid, ns_pid, vm_path, layout, clock]() -> Result<bool> {
        if (!LowestMappingOf(pid, vm_path)) {
          return Error(ErrorCode::kNotRuby, vm_path + " is not mapped in process " + std::to_string(pid));
        }
        LiveLayoutGate gate(pid, ns_pid, layout);
        ProcessMemoryReader mem(pid);
        auto lowest = [&] { return LowestMappingOf(pid, vm_path); };
        while (gate.Poll(clock(), lowest, mem) == LiveLayoutGate::State::kPending) {
          if (ProcessGone(pid)) return TargetExitedError(pid);
          usleep(static_cast<useconds_t>(LiveLayoutGate::kRetryNs / 1000));
        }
        if (gate.state() == LiveLayoutGate::State::kFailed) return gate.error();
        return true;
      });
  if (!checked) return ExitedOr(checked.error());
  return Status::Ok();
}

SessionOptions Recording::SessionOptionsFor(bool stacks_ready, bool gvl_layout) const {
  SessionOptions so;
  so.ring_buffer_bytes = o_.ring_buffer_kb * 1024u;
  so.force_single_links = o_.force_single_links;
  so.cache_dir = o_.cache_dir;
  so.config.cold_gap_ns = OverheadBudget::kColdGapNs;
  if (o_.follow) {
    so.watch_processes = true;  // the fork/exec/exit tracepoints
    so.config.follow_forks = 1;
  }
  if (stacks_ready) {
    if (stacks_on_) {
      so.config.stack_events = 1u << RV_EV_THREAD_SUSPENDED;
      if (o_.stacks.find("ready") != std::string::npos) so.config.stack_events |= 1u << RV_EV_THREAD_READY;
    }
    so.config.sampling = sampling_ ? 1 : 0;
    // Samples read the GVL's holder and queue where the binary's layout is known: what keeps contention visible
    // while --max-overhead has the scheduler sites detached (model/attribution.h estimates from it there).
    so.config.gvl_readings = sampling_ && gvl_layout ? 1 : 0;
    // A contended READY reads the holder with the same layout, and walks its stack: GVL blame's contention-start
    // observation (model/attribution.h), whatever --hz is.
    so.config.holder_stacks = stacks_on_ && o_.holder_stacks && gvl_layout ? 1 : 0;
  }
  return so;
}

void Recording::StartBackendLoad() {
  speculative_options_ = SessionOptionsFor(/*stacks_ready=*/stacks_on_ || sampling_, /*gvl_layout=*/true);
  bpf_loader_ = StartHelperThread([this] { loaded_backend_.emplace(env_.open_backend(speculative_options_)); });
}

void Recording::Adopt(RecordTarget target, PreparedBinary prepared) {
  StartBackendLoad();
  target_ = std::move(target);
  prepared_ = std::move(prepared);
  target_.vm_elf.reset();
}

Status Recording::Prepare() {
  StartBackendLoad();
  if (Status st = launch_ ? FindLaunchTarget() : FindAttachTarget(); !st) return st;
  // Stacks: per-binary walker layout for BPF, symbolizer offsets for the daemon.
  Result<PreparedBinary> prepared = PrepareVmBinaryBounded(target_.vm_elf, target_.ruby_version, o_.cache_dir,
                                                            stacks_on_ || sampling_, env_.stop_requested);
  if (!prepared) return ExitedOr(prepared.error());
  prepared_ = std::move(prepared.value());
  if (o_.gc_probes == "fallback") {
    // Diagnostic: the function-level GC probes even where the binary has GC hook-check sites (src/sites).
    AttachDebugInfo(target_.vm_elf.get());  // the function-level sites need .symtab: by build-id when stripped
    if (Status st = UseGcFunctionProbes(*target_.vm_elf, &prepared_->sites); !st) return st;
  }
  if (!launch_) {
    if (Status st = CheckAttachedLayout(); !st) return st;
  }
  if (o_.hold) FindTeardownSite();
  target_.vm_elf.reset();  // everything the run needs from the file is in prepared_ now: its copy is freed
  return Status::Ok();
}

void Recording::SawRecord(uint16_t kind) {
  if (kind >= RV_EV_THREAD_STARTED && kind <= RV_EV_THREAD_EXITED) vm_running_ = true;
  if (launch_gate_) PollLaunchGate();
}

void Recording::OnRecord(const rv_record& r) {
  if (budget_active_ && ++ring_records_ % 64 == 0) CheckBudget();  // cheap records: look at the clock sometimes
  if (r.kind >= RV_EV_PROC_EXEC && r.kind <= RV_EV_PROC_FORK) {  // only loaded when following
    if (follower_) follower_->OnProcRecord(r);
    return;
  }
  gc_epoch_.OnRecord(r.kind);
  TraceEvent e = FromRecord(r, origin_ns_);
  if (follower_) e.process = follower_->ProcessOf(r.pid);
  reorder_.Push(std::move(e));
  SawRecord(r.kind);
}

void Recording::OnStackRecord(const rv_record& r, const rv_stack_header& h, std::span<const rv_ruby_frame> frames,
                              const rv_gvl_reading* gvl) {
  if (budget_active_) CheckBudget();
  if (exit_hold_ && exit_hold_->Traced()) exit_hold_->Service();  // naming a burst of stacks must not delay signals
  PollEcRoute();
  SawRecord(r.kind);
  TraceEvent e;
  if (r.kind == RV_EV_SAMPLE) {
    e.t_ns = r.ts_ns > origin_ns_ ? r.ts_ns - origin_ns_ : 0;
    e.event = EventName::kSample;
    e.source = kSourcePerfEvent;
    e.provenance = Provenance::kObserved;
    e.th = r.th;
    e.native_tid = r.tid;
    e.probe_tid = r.probe_tid;
    if (gvl != nullptr) e.gvl = GvlReadingFromRecord(*gvl);
  } else {
    e = FromRecord(r, origin_ns_);
    if (gvl != nullptr && e.event == EventName::kWantsGvl) e.gvl = HolderFromRecord(gvl->holder);  // the holder's stack
  }
  StackResolver* resolver = nullptr;
  if (follower_) e.process = follower_->ProcessOf(r.pid);
  if (e.process != kRootProcessId) {
    // Another process of the tree: its own memory and mappings; nothing for a process that is not traced.
    resolver = follower_->Resolver(e.process);
    if (resolver == nullptr) return;
  } else {
    if (!resolver_) {
      // The VM's load address is known once the target has mapped it (launch mode: after exec).
      resolver_ = env_.make_stack_resolver(target_.pid, target_.open_path, *stack_setup_);
    }
    resolver = resolver_.get();
  }
  resolver->set_epoch(gc_epoch_.ForStack(gc_unseen_));
  resolver->Resolve(frames, &frame_infos_);
  if (r.flags & RV_REC_IN_GC) {
    frame_infos_.insert(frame_infos_.begin(), FrameInfo{std::string(kGcFrameLabel), "", 0, FrameKind::kGc});
  }
  AppendStackEndMarker(h, &frame_infos_);
  frame_ids_.clear();
  for (const FrameInfo& f : frame_infos_) frame_ids_.push_back(sink_->InternFrame(f));
  // A contended READY's stack is its GVL holder's.
  std::optional<uint32_t>& stack = e.event == EventName::kWantsGvl && e.gvl ? e.holder_stack : e.stack;
  stack = sink_->InternStack(frame_ids_);
  if (e.event == EventName::kGvlReleased) {
    const std::string& fn = r.site < site_functions_.size() ? site_functions_[r.site] : std::string();
    e.reason = std::string(ReleaseReasonTraceName(DeriveReleaseReason(frame_infos_, ClassifyReleaseSite(fn))));
    e.reason_provenance = Provenance::kDerived;
  }
  reorder_.Push(std::move(e));
  gc_epoch_.OnRecord(r.kind);
}

Status Recording::Open() {
  const SessionOptions so = SessionOptionsFor(
      prepared_->stacks.has_value(), prepared_->stacks && prepared_->stacks->offsets.gvl.base != RV_GVL_BASE_NONE);
  bpf_loader_.join();
  if (std::memcmp(&so.config, &speculative_options_.config, sizeof(so.config)) != 0) {
    // The binary gives no stacks or no GVL layout: those programs must not run. The speculative session is
    // released before the right one loads.
    loaded_backend_.reset();
    loaded_backend_.emplace(env_.open_backend(so));
  }
  Result<std::unique_ptr<ProbeBackend>>& b = *loaded_backend_;
  if (!b) return b.error();
  backend_ = std::move(b.value());
  loaded_backend_.reset();

  if (launch_) {
    Result<HeldChild> c = HeldChild::Spawn(o_.command, launch_identity_);
    if (!c) return c.error();
    child_.emplace(std::move(c.value()));
    target_.pid = child_->pid();
  }
  if (o_.hold) SeizeForHold();

  stack_setup_ = prepared_->stacks;
  if (prepared_->stacks_error) {
    // Attach mode reads the VM through /proc/PID/root: a target that died meanwhile is the error to report.
    if (!launch_ && ProcessGone(target_.pid)) return TargetExitedError(target_.pid);
    if (!o_.quiet) {
      fprintf(stderr, "rvbpfd: warning: no Ruby stacks: %s\n", prepared_->stacks_error->ToString().c_str());
    }
  }

  TraceHeader header;
  header.pid = target_.pid;
  header.ruby_version = target_.ruby_version;
  header.build_id = target_.build_id;
  header.main_thread = ThreadIds::kMainThread;
  header.command = o_.command;
  header.started_at = IsoUtcNow();
  origin_ns_ = MonotonicNs();
  header.origin_ns = origin_ns_;
  if (stack_setup_) {
    header.stacks = StacksModeName(o_.stacks);
    if (sampling_) {
      header.sample_hz = static_cast<uint32_t>(o_.hz);
      header.channels.push_back(std::string(kSourcePerfEvent));
    }
  }
  if (make_sink_) {
    Result<std::unique_ptr<RecordSink>> sink = make_sink_(header);
    if (!sink) return sink.error();
    sink_ = std::move(sink.value());
    return Status::Ok();
  }
  Result<std::unique_ptr<TraceFileSink>> sink =
      TraceFileSink::Create(o_.output.empty() ? DefaultOutput(target_.pid) : o_.output, header, o_.trace_format);
  if (!sink) return sink.error();
  sink_ = std::move(sink.value());
  return Status::Ok();
}

void Recording::PollEcRoute() {
  if (!ec_installer_ || ec_installer_->state() != ProcessEcInstaller::State::kPending) return;
  const uint64_t now = MonotonicNs();
  if (now - ec_last_poll_ns_ < 1'000'000) return;  // at most one /proc/PID/maps scan per ms while pending
  ec_last_poll_ns_ = now;
  const ProcessEcInstaller::State st = backend_->PollEc(*ec_installer_);
  if (st == ProcessEcInstaller::State::kFailed && !o_.quiet) {
    fprintf(stderr, "rvbpfd: warning: samples find their thread only through scheduler events: %s\n",
            EscapeControlBytes(ec_installer_->error()).c_str());
  }
}

void Recording::PollLaunchGate() {
  if (!vm_running_ || launch_gate_->state() != LiveLayoutGate::State::kPending) return;
  auto lowest = [&] { return LowestMappingOf(target_.pid, target_.open_path); };
  if (launch_gate_->Poll(MonotonicNs(), lowest, *gate_mem_) == LiveLayoutGate::State::kSkipped && !o_.quiet) {
    fprintf(stderr, "rvbpfd: note: the command runs as another user and its memory is not readable without "
                    "CAP_SYS_PTRACE: the live layout check is skipped (the layout is the binary's own DWARF)\n");
  }
}

bool Recording::ServiceExitHold() {
  if (!exit_hold_ || !exit_hold_->Traced()) return true;
  exit_hold_->Service();
  if (exit_hold_->Held()) {
    DrainRing();
    exit_hold_->Release();
  }
  return !exit_hold_->Traced();
}

bool Recording::LayoutChecked() const {
  return !launch_gate_ || launch_gate_->state() == LiveLayoutGate::State::kPassed ||
         launch_gate_->state() == LiveLayoutGate::State::kSkipped;
}

// Launch mode: why nothing is written when the layout check failed or never ran (the command keeps running: not
// rvbpfd's to kill).
Error Recording::LaunchGateError(const char* why_unchecked) const {
  if (launch_gate_->state() == LiveLayoutGate::State::kFailed) {
    return Error(launch_gate_->error().code(), launch_gate_->error().message() + "; the command (pid " +
                                                   std::to_string(target_.pid) + ") runs on untraced");
  }
  return Error(ErrorCode::kTargetExited, "the command (pid " + std::to_string(target_.pid) + ") " + why_unchecked +
                                             " before its memory could be checked against the layout rvbpfd "
                                             "derived; nothing was recorded");
}

Status Recording::Attach() {
  const SiteSet& sites = prepared_->sites;
  Result<uint8_t> bin = backend_->AddBinary(sites.offsets);
  if (!bin) return bin.error();
  bin_ = *bin;
  ProbeBackend::StackHandler on_stack;
  if (stack_setup_) {
    rv_walk_config wc = WalkConfigFor(*stack_setup_);
    if (Status st = backend_->SetWalkConfig(bin_, wc); !st) return st;
    on_stack = [this](const rv_record& r, const rv_stack_header& h, std::span<const rv_ruby_frame> frames,
                      const rv_gvl_reading* gvl) { OnStackRecord(r, h, frames, gvl); };
  }
  backend_->SetHandlers([this](const rv_record& r) { OnRecord(r); }, std::move(on_stack));
  // A target in a pid namespace of its own (a container) names threads by that namespace's tids (launch mode: the
  // child shares rvbpfd's).
  Result<TargetPidNamespace> pidns = ReadPidNamespace(target_.pid, ProcFs());
  if (!pidns) return ExitedOr(pidns.error().Wrap("reading the target's pid namespace"));
  if (Status st = backend_->AddPid(static_cast<uint32_t>(target_.pid), pidns->ns, pidns->threads); !st) return st;
  target_own_pidns_ = pidns->own_namespace();
  if (o_.follow) {
    if (Status st = StartFollowing(); !st) return st;
  }
  if (stack_setup_ && sampling_) {
    ec_installer_.emplace(target_.pid, target_.open_path, stack_setup_->ec_route, bin_);
    PollEcRoute();
  }
  SplitSiteSpecs split = SplitSites(sites, bin_);
  if (exit_hold_ && teardown_site_) {
    // Among the low-rate sites (one hit per run, never paused); cookies follow split.functions' order.
    teardown_site_->site.binary = bin_;
    split.functions.insert(split.functions.begin() + static_cast<std::ptrdiff_t>(split.low.size()),
                           "ruby_vm_destruct");
    split.low.push_back(*teardown_site_);
    if (Status st = backend_->SetHeldPid(static_cast<uint32_t>(target_.pid)); !st) return st;
  }
  // The backend assigns cookies in attach order (low group, then high group), starting at 0 for this session.
  site_functions_ = split.functions;
  // Attach mode: the VM is mapped already, so the stack resolver (tens of ms for a large static ruby's symbol table)
  // is built before the probes go live rather than inside the first stack record's callback, where it would hold
  // the main loop, and the --max-overhead checks with it, while the target traps.
  if (stack_setup_ && !launch_ && !resolver_) {
    resolver_ = env_.make_stack_resolver(target_.pid, target_.open_path, *stack_setup_);
  }
  watch_.emplace(target_.pid, env_.open_exit_fd(target_.pid));
  backend_->WakePollOn(watch_->fd());  // the main loop sees the exit at once, not at the end of its wait
  const uint64_t attach_start = MonotonicNs();
  for (auto* list : {&split.low, &split.high}) {
    if (list->empty()) continue;
    // Following: for every process mapping the file (a child is in the pid filter before it runs; the kernel's own
    // pid filter would leave it out).
    Result<int> g = backend_->AttachGroup(target_.open_path, *list, o_.follow ? -1 : target_.pid);
    if (!g) {
      if (!launch_ && (watch_->Exited() || ProcessGone(target_.pid))) return TargetExitedError(target_.pid);
      return g.error().Wrap("attaching probes");
    }
    (list == &split.low ? low_group_ : high_group_) = ProbeGroup(backend_.get(), *g);
  }
  if (low_group_) low_cookies_ = backend_->GroupCookies(low_group_.id());
  if (stack_setup_ && sampling_) {
    if (Status st = backend_->StartSampling(o_.hz); !st) return st.error().Wrap("starting on-CPU sampling");
  }
  attached_ns_ = MonotonicNs();
  const double attach_ms = static_cast<double>(attached_ns_ - attach_start) / 1e6;
  if (!launch_ && watch_->Exited()) return TargetExitedError(target_.pid);
  if (!o_.quiet) {
    const std::string writing =
        sink_->output_path().empty() ? "" : "; writing " + EscapeControlBytes(sink_->output_path());
    fprintf(stderr, "rvbpfd: attached %zu probes (%s) to pid %d, ruby %s, %s (symbols: %s), in %.0f ms%s\n",
            sites.sites.size(), backend_->uses_multi_links() ? "multi-uprobe links" : "one link per site",
            target_.pid, EscapeControlBytes(target_.ruby_version).c_str(), EscapeControlBytes(target_.vm_path).c_str(),
            EscapeControlBytes(sites.symbols_source).c_str(), attach_ms, writing.c_str());
  }
  if (exit_hold_ && !launch_ && !o_.quiet) {
    // Someone else's process is traced now: said once, with the way out, so a debugger's EPERM has an explanation.
    fprintf(stderr, "rvbpfd: note: pid %d is traced with ptrace while recorded, and held for a few ms at its exit "
            "and at GCs to name its frames; a debugger cannot attach to it meanwhile (--hold off)\n", target_.pid);
  }
  if (o_.follow && !o_.quiet) {
    // The probes are on the file, not on a pid (a forked child must trap before userspace could name it): whoever
    // else runs this VM binary traps too, and BPF discards the hit. Said once, so nobody learns it from a slowdown.
    fprintf(stderr,
            "rvbpfd: following the process tree: other processes running %s also trap on the probes while this "
            "records (their events are discarded; --no-follow: only pid %d traps)\n",
            EscapeControlBytes(target_.vm_path).c_str(), target_.pid);
  }
  if (child_) {
    if (!o_.quiet) {
      if (launch_identity_) {
        fprintf(stderr, "rvbpfd: running the command as %s (uid %u, gid %u)\n",
                launch_identity_->user.empty() ? "?" : EscapeControlBytes(launch_identity_->user).c_str(),
                static_cast<unsigned>(launch_identity_->uid), static_cast<unsigned>(launch_identity_->gid));
      } else if (geteuid() == 0) {
        fprintf(stderr, "rvbpfd: running the command as root (not under sudo and no --user)\n");
      }
    }
    if (Status st = child_->Release(); !st) return st;
  }
  if (launch_) {
    // The command shares rvbpfd's pid namespace: its main thread's tid is its pid as rvbpfd sees it. Under sudo it
    // may run as another user (LiveLayoutGate::Unreadable).
    const int pid = target_.pid;
    gate_mem_.emplace(pid);
    launch_gate_.emplace(
        pid, pid, prepared_->live_layout,
        LiveLayoutGate::Unreadable{
            .layout_from_binary = prepared_->sites.analysed_with_symtab && prepared_->sites.offsets_source == "dwarf",
            .read_errno = [pid](uint64_t addr) { return ProcessReadErrno(pid, addr); }});
  }
  return Status::Ok();
}

Status Recording::StartFollowing() {
  if (Status st = backend_->WatchProcesses(); !st) return st.error().Wrap("following the target's process tree");
  FollowContext ctx;
  ctx.vm_open_path = target_.open_path;
  ctx.ruby_version = target_.ruby_version;
  ctx.build_id = target_.build_id;
  ctx.stack_setup = stack_setup_;
  ctx.sampling = sampling_;
  ctx.bin = bin_;
  ctx.quiet = o_.quiet;
  ctx.own_pidns = target_own_pidns_;
  ctx.backend = backend_.get();
  ctx.sink = sink_.get();
  ctx.make_resolver = [this](int pid) { return env_.make_stack_resolver(pid, target_.open_path, *stack_setup_); };
  ctx.root_wait_status = [this]() -> std::optional<int> {
    if (!child_ || !target_exited_) return std::nullopt;
    return child_status_;
  };
  ctx.origin_ns = origin_ns_;
  if (launch_) {
    // The launch's execs: the held child's into the command and, for a #! script, its interpreter's (env) into the
    // VM's executable. Once the VM ran, or the executable planned has been exec'd, any exec is a new image.
    ctx.root_launching = [this] {
      if (vm_running_ || launch_exec_seen_) return false;
      struct stat now_exe, planned;
      const std::string exe = "/proc/" + std::to_string(target_.pid) + "/exe";
      if (stat(exe.c_str(), &now_exe) == 0 && stat(launch_executable_.c_str(), &planned) == 0 &&
          now_exe.st_dev == planned.st_dev && now_exe.st_ino == planned.st_ino) {
        launch_exec_seen_ = true;
      }
      return true;
    };
  }
  ProcessInfo root;
  root.pid = static_cast<uint32_t>(target_.pid);
  root.command = o_.command;
  root.ruby_version = target_.ruby_version;
  root.build_id = target_.build_id;
  follower_ = std::make_unique<ProcessFollower>(std::move(ctx), std::move(root));
  follower_->WriteRootLine();
  if (!launch_) {
    const size_t n = follower_->AdoptDescendants();
    if (!o_.quiet && n > 0) fprintf(stderr, "rvbpfd: following %zu descendants of pid %d\n", n, target_.pid);
  }
  return Status::Ok();
}

void Recording::DrainRing() {
  rvbpfd::DrainRing([&] {
    Result<int> n = backend_->Poll(0);
    return n ? *n : -1;
  });
}

void Recording::CheckCounters() {
  rv_counters c = backend_->ReadCounters();
  if (c.dropped > seen_.dropped) {
    gc_epoch_.OnLoss();
    DrainRing();
    TraceEvent e;
    e.t_ns = NowT();
    e.event = EventName::kEventsDropped;
    e.source = kSourceDaemon;
    e.count = c.dropped - seen_.dropped;
    reorder_.Push(std::move(e));
  }
  seen_ = c;
}

void Recording::PushDaemon(EventName name, const char* reason, double pct, uint64_t t_ns) {
  TraceEvent e;
  e.t_ns = t_ns;
  e.event = name;
  e.source = kSourceDaemon;
  e.reason = reason;
  e.overhead_pct = pct;
  reorder_.Push(std::move(e));
}

// --max-overhead: every trap the target paid (BPF's probe_hits, discarded hits included) x the cost of one, plus
// the daemon's CPU time to detach and reattach, against the budget (see OverheadBudget). Per-site hits (one batch
// map read) say what the sites that stay attached cost. Runs from the main loop after Poll and from inside Poll's
// callbacks, so it cannot drain the ring before stamping its records (as CheckCounters does); the stamps are chosen
// instead: tracing_paused once the detach has returned (every trap of the detach tail is older), tracing_resumed
// before the reattach (every event after it is newer). Records still in the ring are older than both and sort into
// place within the reorder window.
void Recording::CheckBudget() {
  const uint64_t now = MonotonicNs();
  if (now < next_check_ns_ || in_check_) return;
  in_check_ = true;
  const std::vector<uint64_t> site_hits = backend_->ReadSiteHits();
  const TrapCounts traps = CountTraps(backend_->ReadCounters(), site_hits, low_cookies_);
  switch (budget_.Update(now, traps)) {
    case OverheadBudget::Action::kPause:
      if (high_group_ && backend_->GroupAttached(high_group_.id())) {
        const uint64_t cpu0 = ThreadCpuNs();
        const uint64_t wall0 = MonotonicNs();
        backend_->DetachGroup(high_group_.id(), site_hits);  // ordered by hits: see BpfSession::Detach
        gc_unseen_ = true;
        budget_.Charge(static_cast<double>(ThreadCpuNs() - cpu0));
        const double detach_ms = static_cast<double>(MonotonicNs() - wall0) / 1e6;
        // A detach slower than a budget window means the sites keep trapping (partly unseen) for longer than the
        // budget can make up for: one link per site (kernels before 6.6) pays an RCU grace period per site.
        if (!slow_detach_warned_ && !o_.quiet && detach_ms * 1e6 > static_cast<double>(budget_.window_ns())) {
          slow_detach_warned_ = true;
          fprintf(stderr,
                  "rvbpfd: warning: detaching the high-rate probes took %.0f ms (%s), longer than a %.0f ms budget "
                  "window: --max-overhead %g cannot hold on this kernel%s\n",
                  detach_ms, backend_->uses_multi_links() ? "multi-uprobe links" : "one link per site",
                  static_cast<double>(budget_.window_ns()) / 1e6, o_.max_overhead_pct,
                  backend_->uses_multi_links() ? "" : " (multi-uprobe links, one grace period per group, need Linux "
                                                      "6.6+)");
        }
        budget_.Detached(CountTraps(backend_->ReadCounters(), {}, {}));
        PushDaemon(EventName::kTracingPaused, "max-overhead", budget_.current_pct(now, traps), NowT());
      }
      break;
    case OverheadBudget::Action::kResume:
      if (high_group_ && !backend_->GroupAttached(high_group_.id())) {
        const uint64_t cpu0 = ThreadCpuNs();
        const uint64_t before_t = NowT();
        Status st = backend_->ReattachGroup(high_group_.id(), target_.open_path);
        budget_.Charge(static_cast<double>(ThreadCpuNs() - cpu0));
        if (st) {
          gc_unseen_ = false;
          gc_epoch_.OnGcSitesReattached();
          PushDaemon(EventName::kTracingResumed, "budget window over", budget_.last_window_pct(), before_t);
        } else if (!reattach_error_) {
          reattach_error_ = st.error();
        }
      }
      break;
    case OverheadBudget::Action::kNone:
      break;
  }
  next_check_ns_ = MonotonicNs() + budget_.NextCheckNs(now);
  in_check_ = false;
}

Status Recording::WriteReady() {
  Status st = Status::Ok();
  for (TraceEvent& e : ready_) {
    if (follower_) {
      follower_->WriteLinesBefore(e.t_ns, e.process);
      if (e.process != kRootProcessId) {
        if (st && e.process != 0) st = follower_->Write(e);
        continue;
      }
    }
    if (!exited_threads_.Keep(e.th, e.event == EventName::kSample, e.event == EventName::kThreadExited)) continue;
    thread_ids_->Assign(&e);
    if (std::optional<ThreadInfo> info = thread_info_->Observe(e)) sink_->SetThreadInfo(*e.ruby_thread, *info, e.t_ns);
    if (st) st = sink_->Write(e);
  }
  ready_.clear();
  return st;
}

Status Recording::Run() {
  if (follower_) {
    thread_ids_.emplace(static_cast<uint32_t>(target_.pid), ThreadIds::kMainThread, follower_->thread_counter());
  } else {
    thread_ids_.emplace(static_cast<uint32_t>(target_.pid));
  }
  ThreadInfoTracker::Sources sources = ProcThreadInfoSources(target_.pid, ProcFs(), target_own_pidns_);
  if (stack_setup_ && stack_setup_->offsets.thread_name != RubyOffsets::kNoThreadName) {
    name_mem_ = std::make_unique<ProcessMemoryReader>(target_.pid);
    sources.ruby_name = [this](uint64_t th) { return ReadRubyThreadName(*name_mem_, stack_setup_->offsets, th); };
  }
  thread_info_.emplace(std::move(sources));
  // The first window starts when the probes went live, with no trap counted yet (the BPF counters start at 0): the
  // main loop's first check can come 100+ ms later (stack setup), and those traps belong to the budget too.
  budget_.Update(attached_ns_, TrapCounts{});
  budget_active_ = o_.max_overhead_pct > 0;
  bool floor_warned = false;
  uint64_t last_status = 0;    // monotonic ns of the last status line
  uint64_t status_events = 0;  // seen_.events at that line, for the events/s figure
  bool warned = false;
  bool stop_now = false;
  // With a budget the counters are checked when the budget asks (1-5 ms: sooner when its allowance is about to run
  // out at the current trap rate); otherwise every 20 ms, which also bounds how long records wait in the ring (BPF
  // does not wake us per record).
  const int poll_ms = 20;
  const uint64_t deadline = o_.duration_s > 0 ? origin_ns_ + static_cast<uint64_t>(o_.duration_s * 1e9) : 0;
  for (;;) {
    int timeout_ms = poll_ms;
    if (o_.max_overhead_pct > 0) {
      const uint64_t now = MonotonicNs();
      timeout_ms = next_check_ns_ > now ? static_cast<int>((next_check_ns_ - now + 999'999) / 1'000'000) : 0;
    }
    // While the launched command's layout is unchecked, records are taken as they come: the check is due as soon as
    // the first scheduler event arrives, while the command is still starting.
    if (!LayoutChecked()) timeout_ms = std::min(timeout_ms, 1);
    Result<int> n = backend_->Poll(timeout_ms);
    if (!n) {
      fprintf(stderr, "%s\n", n.error().ToString().c_str());
      stop_reason_ = "error";
      break;
    }
    CheckCounters();
    PollEcRoute();
    if (follower_) follower_->Poll(NowT());
    if (launch_gate_) {
      PollLaunchGate();
      if (launch_gate_->state() == LiveLayoutGate::State::kFailed) return LaunchGateError("");
    }
    if (LayoutChecked()) {
      reorder_.PopReady(&ready_);
      // A live sink gets what the window holds by the clock too: a quiet process's last events do not wait for a
      // newer one (records still in the ring are at most a poll period old).
      const uint64_t now_t = NowT();
      if (sink_->live() && now_t > reorder_.window_ns()) {
        reorder_.PopThrough(now_t - reorder_.window_ns(), [this](TraceEvent&& e) { ready_.push_back(std::move(e)); });
      }
    }
    Status wst = WriteReady();
    if (wst) wst = sink_->Tick(std::chrono::steady_clock::now(), NowT());
    if (!wst) {
      // Disk full or similar: stop rather than keep recording into a file that silently lacks events.
      fprintf(stderr, "%s\n", wst.error().Wrap("writing " + OutputName()).ToString().c_str());
      stop_reason_ = "write error";
      break;
    }
    const uint64_t now = MonotonicNs();

    if (o_.max_overhead_pct > 0) {
      CheckBudget();
      if (reattach_error_) {
        if (!(!launch_ && watch_->Exited())) {
          fprintf(stderr, "%s\n", reattach_error_->ToString().c_str());
          stop_reason_ = "error";
          stop_now = true;
        }
        reattach_error_.reset();
      }
    } else {
      // Estimate only (1 s windows): the warning below.
      budget_.Update(now, CountTraps(seen_, {}, {}));
    }
    if (o_.max_overhead_pct > 0 && budget_.floor_pct() > o_.max_overhead_pct && !floor_warned && !o_.quiet) {
      floor_warned = true;
      fprintf(stderr, "%srvbpfd: warning: --max-overhead %g%% cannot hold: the probes that stay attached while "
              "paused (thread start/exit) alone cost an estimated %.1f%%\n", o_.status_line ? "\r\033[K" : "",
              o_.max_overhead_pct, budget_.floor_pct());
    }
    if (o_.max_overhead_pct <= 0 && budget_.last_window_pct() > o_.warn_overhead_pct && !warned && !o_.quiet) {
      warned = true;
      fprintf(stderr, "%srvbpfd: warning: probes cost the target an estimated %.1f%% of its time (%.0f probe "
              "hits/s); bound it with --max-overhead PERCENT\n", o_.status_line ? "\r\033[K" : "",
              budget_.last_window_pct(), budget_.last_window_pct() * 1e4 / o_.probe_cost_us);
    }
    if (o_.status_line && now - last_status >= 500'000'000) {
      const double rate = last_status ? static_cast<double>(seen_.events - status_events) * 1e9 /
                                            static_cast<double>(now - last_status)
                                      : 0;
      last_status = now;
      status_events = seen_.events;
      fprintf(stderr, "\r\033[Krvbpfd: pid %d  %llu events (%.0f/s)  %llu dropped  est. overhead %.1f%%%s",
              target_.pid, static_cast<unsigned long long>(seen_.events), rate,
              static_cast<unsigned long long>(seen_.dropped), budget_.last_window_pct(),
              high_group_ && !backend_->GroupAttached(high_group_.id()) ? "  (high-rate probes paused)" : "");
      fflush(stderr);
    }

    if (target_exited_) {
      // Reaped already: following the rest of the tree.
    } else if (child_) {
      if (ServiceExitHold() && child_->Reap(&child_status_)) target_exited_ = true;
    } else {
      ServiceExitHold();  // attach mode: held at its exit, it is released (detached) here and then exits
      if (watch_->Exited()) target_exited_ = true;
    }
    // With the tree followed, the recording goes on while a followed process lives.
    if ((target_exited_ && (!follower_ || follower_->OthersEnded())) || stop_now) break;
    if (env_.stop_requested->load()) {
      stop_reason_ = "signal";
      break;
    }
    if (deadline && now >= deadline) {
      stop_reason_ = "duration";
      break;
    }
  }
  return Status::Ok();
}

Result<int> Recording::Finish() {
  // Drain what the ring still holds, then the final drop count. The budget is over: nothing is reattached now.
  budget_active_ = false;
  // A command still running (--duration, a signal) is let go at once; one at its exit stop after the drain. BPF
  // stops naming it first: its GC and teardown hits must not signal a process nobody traces any more.
  if (exit_hold_ && (exit_hold_->Service(), !exit_hold_->Held())) ReleaseHold();
  DrainRing();
  ReleaseHold();
  CheckCounters();
  if (!LayoutChecked()) {
    return Abandon(LaunchGateError(target_exited_                ? "exited"
                                   : stop_reason_ == "signal"    ? "was still starting when rvbpfd was stopped"
                                                                 : "was still starting when the recording ended"));
  }
  reorder_.Drain(&ready_);
  if (Status st = WriteReady(); !st) return st.error().Wrap("writing " + OutputName());
  if (follower_) follower_->Finish();
  FinishInfo fin;
  fin.end_t_ns = NowT();
  fin.ring_high_water_bytes = seen_.ring_high_water;
  fin.late_events = reorder_.late();
  fin.stop_reason = stop_reason_;
#define RV_TRAP_FINISH(field, fold, label) fin.field = seen_.field;
  RV_TRAP_COUNTERS(RV_TRAP_FINISH)
#undef RV_TRAP_FINISH
  const bool sampled = stack_setup_ && sampling_;
  const bool gvl_read = sampled && stack_setup_->offsets.gvl.base != RV_GVL_BASE_NONE;
  if (gvl_read) {
#define RV_GVL_FINISH(field, fold, label) fin.field = seen_.field;
    RV_GVL_COUNTERS(RV_GVL_FINISH)
#undef RV_GVL_FINISH
  }
  if (sampled) {
    SampleEcRoutes routes;
#define RV_ROUTE_FINISH(field, fold, label, key) routes.key = seen_.field;
    RV_EC_ROUTE_COUNTERS(RV_ROUTE_FINISH)
#undef RV_ROUTE_FINISH
    fin.sample_ec_routes = routes;
  }
  if (o_.status_line) fprintf(stderr, "\r\033[K");
  if (Status st = sink_->Finish(fin); !st) return st.error();
  if (!o_.quiet) {
    // The counters that have a label (include/rvbpfd/counters.h): events and traps on the first line, samples and
    // their EC routes on the second.
    std::string counts;
    const char* sep = "";
#define RV_COUNT_TEXT(field, fold, label, ...)                  \
  if (label[0] != '\0') {                                       \
    counts += sep + std::to_string(seen_.field) + " " + label;  \
    sep = ", ";                                                 \
  }
    RV_EVENT_COUNTERS(RV_COUNT_TEXT)
    RV_TRAP_COUNTERS(RV_COUNT_TEXT)
    const std::string wrote =
        sink_->output_path().empty() ? "" : "; wrote " + EscapeControlBytes(sink_->output_path());
    fprintf(stderr, "rvbpfd: %s; %s%s\n", stop_reason_.c_str(), counts.c_str(), wrote.c_str());
    if (sampled) {
      counts.clear();
      sep = "";
      RV_SAMPLE_COUNTERS(RV_COUNT_TEXT)
      if (gvl_read) {
        RV_GVL_COUNTERS(RV_COUNT_TEXT)
      }
      sep = "; EC by ";
#define RV_ROUTE_TEXT(field, fold, label, key)                            \
  counts += sep + std::string(label) + " " + std::to_string(seen_.field); \
  sep = ", ";
      RV_EC_ROUTE_COUNTERS(RV_ROUTE_TEXT)
#undef RV_ROUTE_TEXT
      fprintf(stderr, "rvbpfd: %s\n", counts.c_str());
    }
#undef RV_COUNT_TEXT
    if (child_ && target_exited_) {
      if (WIFEXITED(child_status_)) {
        fprintf(stderr, "rvbpfd: command exited with status %d\n", WEXITSTATUS(child_status_));
      } else if (WIFSIGNALED(child_status_)) {
        fprintf(stderr, "rvbpfd: command killed by signal %d\n", WTERMSIG(child_status_));
      }
    }
  }
  // Releasing a multi-uprobe link waits for an RCU grace period (40-100 ms, more on a busy machine). Once the target
  // has exited nothing can hit the probes, so a child process does that wait after rvbpfd has exited
  // (common/release_in_child.h). With a live target (--duration, a signal) both groups are released here, at the
  // same time so that they wait for the same grace period, and no probe outlives rvbpfd.
  if (target_exited_ && env_.hand_off_release()) return 0;
  if (low_group_ && high_group_) {
    std::thread release_low([this] { low_group_.Reset(); });
    high_group_.Reset();
    release_low.join();
  }
  return 0;
}

// The phases from Open on, for a recording whose target is analysed (Prepare or Adopt).
Result<int> OpenToFinish(Recording& recording) {
  if (Status st = recording.Open(); !st) return st.error();
  if (Status st = recording.Attach(); !st) return recording.Abandon(st.error());
  if (Status st = recording.Run(); !st) return recording.Abandon(st.error());
  return recording.Finish();
}

}  // namespace

void RequestStop() { g_stop.store(true); }

RecorderEnv SystemRecorderEnv(const std::atomic<bool>* stop_requested) {
  RecorderEnv env;
  env.open_backend = [](const SessionOptions& options) -> Result<std::unique_ptr<ProbeBackend>> {
    Result<std::unique_ptr<BpfProbeBackend>> b = BpfProbeBackend::Open(options);
    if (!b) return b.error();
    return std::unique_ptr<ProbeBackend>(std::move(b.value()));
  };
  env.monotonic_ns = SystemMonotonicNs;
  env.thread_cpu_ns = SystemThreadCpuNs;
  env.open_exit_fd = [](int pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); };
  env.make_stack_resolver = [](int pid, const std::string& vm_path, const StackSetup& setup) {
    return MakeStackResolver(pid, vm_path, setup);
  };
  env.hand_off_release = HandOffFileRelease;
  env.make_ptrace = SystemPtraceOps;
  env.stop_requested = stop_requested;
  return env;
}

Result<int> RecordAnalysedTarget(const RecordOptions& options, const RecorderEnv& env, RecordTarget target,
                                 PreparedBinary prepared, RecordSinkFactory make_sink) {
  Recording recording(options, env, std::move(make_sink));
  recording.Adopt(std::move(target), std::move(prepared));
  return OpenToFinish(recording);
}

Result<int> Record(const RecordOptions& o, RecordSinkFactory make_sink) {
  g_stop.store(false);
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a signal interrupts the ring buffer poll at once
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  Recording recording(o, SystemRecorderEnv(&g_stop), std::move(make_sink));
  if (Status st = recording.Prepare(); !st) return st.error();
  return OpenToFinish(recording);
}

}  // namespace rvbpfd
