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
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include "common/target_file.h"
#include "common/text_escape.h"
#include "elf/debug_lookup.h"
#include "elf/elf_file.h"
#include "probe/bpf_session.h"
#include "probe/ec_install.h"
#include "record/launch.h"
#include "record/release_reason.h"
#include "session/ingest.h"
#include "session/overhead_budget.h"
#include "session/reorder.h"
#include "session/stack_resolver.h"
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
uint64_t ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

uint64_t MonotonicNs() {
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

bool ProcessGone(int pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE* f = fopen(path, "r");
  if (!f) return true;
  int p;
  char state = 0;
  char comm[256];
  bool zombie = fscanf(f, "%d %255s %c", &p, comm, &state) == 3 && state == 'Z';
  fclose(f);
  return zombie;
}

Error TargetExitedError(int pid) {
  return Error(ErrorCode::kTargetExited,
               "pid " + std::to_string(pid) + " exited while the probes were being attached; nothing was recorded");
}

// Watches for the end of the target: a pidfd becomes readable when the process exits (attach mode); the launched
// child is reaped with waitpid (launch mode).
class TargetWatch {
 public:
  static TargetWatch ForPid(int pid) {
    TargetWatch w;
    w.pid_ = pid;
    w.pidfd_ = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
    return w;
  }
  TargetWatch(TargetWatch&& o) noexcept : pid_(o.pid_), pidfd_(o.pidfd_) { o.pidfd_ = -1; }
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
  TargetWatch() = default;
  int pid_ = -1;
  int pidfd_ = -1;
};

struct Target {
  int pid = 0;
  int ns_pid = 0;  // attach mode: the pid in the target's own pid namespace (RubyTarget::ns_pid)
  std::string vm_path;  // the VM binary's path for messages (host view: /proc/PID/root/... in attach mode)
  // What is read and probed: vm_path itself in launch mode; in attach mode /proc/self/fd/N of an O_PATH descriptor
  // opened inside the target's root (an absolute symlink there never names a host file, and the file analysed is the
  // file probed even if the path is swapped meanwhile).
  std::string open_path;
  std::shared_ptr<const FileFd> vm_file;  // attach mode: the descriptor open_path names
  std::string ruby_version;
  std::string build_id;
  std::shared_ptr<ElfFile> vm_elf;  // the VM binary, parsed once for the whole run
};

// The rvtrace header's name for a --stacks value.
std::string StacksModeName(const std::string& option) {
  if (option == "off") return "off";
  if (option.find("ready") != std::string::npos) return "release+wants";
  return "release";
}

}  // namespace

void RequestStop() { g_stop.store(true); }

Result<int> Record(const RecordOptions& o) {
  g_stop.store(false);
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a signal interrupts the ring buffer poll at once
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  const bool launch = !o.command.empty();
  Target target;
  std::optional<HeldChild> child;
  std::optional<LaunchIdentity> launch_identity;
  if (launch) {
    Result<std::optional<LaunchIdentity>> identity = DecideLaunchIdentity(
        o.user, [](const char* name) { return static_cast<const char*>(getenv(name)); }, geteuid(),
        SystemUserDatabase());
    if (!identity) return identity.error();
    launch_identity = std::move(identity).value();
    const char* path_env = getenv("PATH");
    const char* ld_path = getenv("LD_LIBRARY_PATH");
    Result<LaunchPlan> plan = PlanLaunch(o.command, path_env ? path_env : "/usr/bin:/bin", ld_path ? ld_path : "");
    if (!plan) return plan.error();
    target.vm_elf = plan->vm_elf;  // a static ruby: planning parsed it already
    if (!target.vm_elf) {
      Result<ElfFile> vm = ElfFile::Open(plan->vm_path);
      if (!vm) return Error(ErrorCode::kNotRuby, vm.error().message());
      target.vm_elf = std::make_shared<ElfFile>(std::move(vm.value()));
    }
    std::optional<std::string> version = ReadRubyVersion(*target.vm_elf);
    if (!version) {
      return Error(ErrorCode::kNotRuby, plan->vm_path + " has no readable ruby_version string: not a CRuby VM");
    }
    target.vm_path = plan->vm_path;
    target.open_path = plan->vm_path;
    target.ruby_version = *version;
    target.build_id = target.vm_elf->build_id();
  } else {
    Result<RubyTarget> t = DiscoverTarget(o.pid, ProcFs());
    if (!t) {
      // A target that dies while we read its maps or ELF shows up as a vanished file: say what happened.
      if (t.error().code() != ErrorCode::kNoSuchProcess && ProcessGone(o.pid)) return TargetExitedError(o.pid);
      return t.error();
    }
    target.pid = o.pid;
    target.ns_pid = t->ns_pid;
    target.vm_path = t->vm_host_path;
    // Discovery parsed the VM through an O_PATH descriptor opened inside the target's root: that one file is
    // analysed, read and probed for the whole run.
    target.vm_file = t->vm_fd;
    target.open_path = t->vm_fd_path();
    target.ruby_version = t->ruby_version;
    target.build_id = t->build_id;
    target.vm_elf = t->vm_elf;
  }

  // Stacks: per-binary walker layout for BPF, symbolizer offsets for the daemon.
  const bool stacks_on = o.stacks != "off";
  const bool sampling = o.hz > 0;
  Result<PreparedBinary> prepared = PrepareVmBinary(*target.vm_elf, target.ruby_version, o.cache_dir,
                                                    stacks_on || sampling);
  if (!prepared) {
    if (!launch && ProcessGone(target.pid)) return TargetExitedError(target.pid);
    return prepared.error();
  }
  if (o.gc_probes == "fallback") {
    // Diagnostic: the function-level GC probes even where the binary has GC hook-check sites (src/sites).
    AttachDebugInfo(target.vm_elf.get());  // the function-level sites need .symtab: by build-id when stripped
    if (Status st = UseGcFunctionProbes(*target.vm_elf, &prepared->sites); !st) return st.error();
  }
  const SiteSet* sites = &prepared->sites;
  if (!launch) {
    // The live process must match what the analysis assumed (version, hook list, thread layout) before a probe
    // goes in. A process caught while its VM is still starting is checked again every ms (LiveLayoutGate).
    if (!LowestMappingOf(target.pid, target.vm_path)) {
      if (ProcessGone(target.pid)) return TargetExitedError(target.pid);
      return Error(ErrorCode::kNotRuby, target.vm_path + " is not mapped in process " + std::to_string(target.pid));
    }
    LiveLayoutGate gate(target.pid, target.ns_pid, prepared->live_layout);
    ProcessMemoryReader mem(target.pid);
    auto lowest = [&] { return LowestMappingOf(target.pid, target.vm_path); };
    while (gate.Poll(MonotonicNs(), lowest, mem) == LiveLayoutGate::State::kPending) {
      if (ProcessGone(target.pid)) return TargetExitedError(target.pid);
      usleep(static_cast<useconds_t>(LiveLayoutGate::kRetryNs / 1000));
    }
    if (gate.state() == LiveLayoutGate::State::kFailed) {
      if (ProcessGone(target.pid)) return TargetExitedError(target.pid);
      return gate.error();
    }
  }
  target.vm_elf.reset();  // everything the run needs from the file is in `prepared` now: its copy is freed

  // Everything the ring delivers goes through the reorder window first. 20 ms of event time is far more than the
  // skew between CPUs (microseconds) and small enough that the file trails the program by a fraction of a second.
  uint64_t origin_ns = 0;
  GcEpoch gc_epoch;  // the stack resolver's cache generation
  bool gc_unseen = false;  // --max-overhead has the GC sites detached
  Reorderer<TraceEvent> reorder(20'000'000);
  // --max-overhead's check (set once the main loop's state exists). The ring callbacks call it too: a burst of stack
  // records can hold Poll for ~100 ms while new frames are symbolized, and the target's traps do not wait for it.
  std::function<void()> budget_tick;
  uint64_t ring_records = 0;
  // Launch mode: the command's VM runs once the first scheduler event arrives (a scheduler event needs the VM's
  // thread structures); only then can its memory be checked against the analysis (LiveLayoutGate), and its events
  // stay in the reorder window until that check has passed.
  bool vm_running = false;
  std::optional<LiveLayoutGate> launch_gate;
  std::function<void()> poll_launch_gate;
  auto saw_record = [&](uint16_t kind) {
    if (kind >= RV_EV_THREAD_STARTED && kind <= RV_EV_THREAD_EXITED) vm_running = true;
    if (poll_launch_gate) poll_launch_gate();
  };
  std::unique_ptr<BpfSession> session;
  {
    SessionOptions so;
    so.ring_buffer_bytes = o.ring_buffer_kb * 1024u;
    so.force_single_links = o.force_single_links;
    so.config.cold_gap_ns = OverheadBudget::kColdGapNs;
    if (prepared->stacks) {
      if (stacks_on) {
        so.config.stack_events = 1u << RV_EV_THREAD_SUSPENDED;
        if (o.stacks.find("ready") != std::string::npos) so.config.stack_events |= 1u << RV_EV_THREAD_READY;
      }
      so.config.sampling = sampling ? 1 : 0;
      // Samples read the GVL's holder and queue where the binary's layout is known: what keeps contention visible
      // while --max-overhead has the scheduler sites detached (model/attribution.h estimates from it there).
      so.config.gvl_readings = sampling && prepared->stacks->offsets.gvl.base != RV_GVL_BASE_NONE ? 1 : 0;
    }
    Result<std::unique_ptr<BpfSession>> s =
        BpfSession::Open(so, [&](const rv_record& r) {
          if (budget_tick && ++ring_records % 64 == 0) budget_tick();  // cheap records: look at the clock sometimes
          gc_epoch.OnRecord(r.kind);
          reorder.Push(FromRecord(r, origin_ns));
          saw_record(r.kind);
        });
    if (!s) return s.error();
    session = std::move(s.value());
  }

  if (launch) {
    Result<HeldChild> c = HeldChild::Spawn(o.command, launch_identity);
    if (!c) return c.error();
    child.emplace(std::move(c.value()));
    target.pid = child->pid();
  }

  std::optional<StackSetup> stack_setup = prepared->stacks;
  if (prepared->stacks_error) {
    // Attach mode reads the VM through /proc/PID/root: a target that died meanwhile is the error to report.
    if (!launch && ProcessGone(target.pid)) return TargetExitedError(target.pid);
    if (!o.quiet) {
      fprintf(stderr, "rvbpfd: warning: no Ruby stacks: %s\n", prepared->stacks_error->ToString().c_str());
    }
  }

  TraceHeader header;
  header.pid = target.pid;
  header.ruby_version = target.ruby_version;
  header.build_id = target.build_id;
  header.main_thread = ThreadIds::kMainThread;
  header.command = o.command;
  header.started_at = IsoUtcNow();
  origin_ns = MonotonicNs();
  header.origin_ns = origin_ns;
  if (stack_setup) {
    header.stacks = StacksModeName(o.stacks);
    if (sampling) {
      header.sample_hz = static_cast<uint32_t>(o.hz);
      header.channels.push_back(std::string(kSourcePerfEvent));
    }
  }
  const std::string output = o.output.empty() ? DefaultOutput(target.pid) : o.output;
  Result<TraceWriter> writer_or = TraceWriter::Create(output, header);
  if (!writer_or) return writer_or.error();
  TraceWriter writer = std::move(writer_or.value());

  // Attach. From here on, a failure abandons the (header-only) file so nothing partial is left behind.
  auto fail = [&](Error e) -> Result<int> {
    writer.Abandon();
    return e;
  };
  Result<uint8_t> bin = session->AddBinary(sites->offsets);
  if (!bin) return fail(bin.error());

  // How samples find their EC (src/stacks/ec_route.h): installed as soon as the VM is mapped and relocated (at once
  // when attaching; after exec in launch mode, retried from the main loop and, while pending, on every stack record,
  // since symbolizing the first stacks can hold the loop for ~100 ms). Until then samples use current_th.
  std::optional<ProcessEcInstaller> ec_installer;
  uint64_t ec_last_poll_ns = 0;
  auto poll_ec_route = [&]() {
    if (!ec_installer || ec_installer->state() != ProcessEcInstaller::State::kPending) return;
    const uint64_t now = MonotonicNs();
    if (now - ec_last_poll_ns < 1'000'000) return;  // at most one /proc/PID/maps scan per ms while pending
    ec_last_poll_ns = now;
    const ProcessEcInstaller::State st = ec_installer->Poll(*session);
    if (st == ProcessEcInstaller::State::kFailed && !o.quiet) {
      fprintf(stderr, "rvbpfd: warning: samples find their thread only through scheduler events: %s\n",
              EscapeControlBytes(ec_installer->error()).c_str());
    }
  };

  // Stack records: symbolized as they come out of the ring (the objects they point to are as fresh as they will ever
  // be), interned into the writer's dictionaries, and pushed through the reorder window like any event.
  std::vector<std::string> site_functions;  // cookie -> enclosing function (for the release-reason rule)
  std::unique_ptr<StackResolver> resolver;
  std::vector<FrameInfo> frame_infos;
  std::vector<uint32_t> frame_ids;
  if (stack_setup) {
    rv_walk_config wc = WalkConfigFor(*stack_setup);
    if (Status st = session->SetWalkConfig(*bin, wc); !st) return fail(st.error());
  }
  if (stack_setup) {
    session->SetStackCallback([&](const rv_record& r, const rv_stack_header& h,
                                  std::span<const rv_ruby_frame> frames, const rv_gvl_reading* gvl) {
      if (budget_tick) budget_tick();
      poll_ec_route();
      saw_record(r.kind);
      TraceEvent e;
      if (r.kind == RV_EV_SAMPLE) {
        e.t_ns = r.ts_ns > origin_ns ? r.ts_ns - origin_ns : 0;
        e.event = EventName::kSample;
        e.source = kSourcePerfEvent;
        e.provenance = Provenance::kObserved;
        e.th = r.th;
        e.native_tid = r.tid;
        e.probe_tid = r.probe_tid;
        if (gvl != nullptr) e.gvl = GvlReadingFromRecord(*gvl);
      } else {
        e = FromRecord(r, origin_ns);
      }
      if (!resolver) {
        // The VM's load address is known once the target has mapped it (launch mode: after exec).
        resolver = MakeStackResolver(target.pid, target.open_path, *stack_setup);
      }
      resolver->set_epoch(gc_epoch.ForStack(gc_unseen));
      resolver->Resolve(frames, &frame_infos);
      if (r.flags & RV_REC_IN_GC) {
        frame_infos.insert(frame_infos.begin(), FrameInfo{std::string(kGcFrameLabel), "", 0, FrameKind::kGc});
      }
      AppendStackEndMarker(h, &frame_infos);
      frame_ids.clear();
      for (const FrameInfo& f : frame_infos) frame_ids.push_back(writer.InternFrame(f));
      e.stack = writer.InternStack(frame_ids);
      if (e.event == EventName::kGvlReleased) {
        const std::string& fn = r.site < site_functions.size() ? site_functions[r.site] : std::string();
        e.reason = std::string(ReleaseReasonTraceName(DeriveReleaseReason(frame_infos, ClassifyReleaseSite(fn))));
        e.reason_provenance = Provenance::kDerived;
      }
      reorder.Push(std::move(e));
      gc_epoch.OnRecord(r.kind);
    });
  }
  // A target in a pid namespace of its own (a container) names threads by that namespace's tids (launch mode: the
  // child shares rvbpfd's).
  Result<TargetPidNamespace> pidns = ReadPidNamespace(target.pid, ProcFs());
  if (!pidns) {
    if (!launch && ProcessGone(target.pid)) return fail(TargetExitedError(target.pid));
    return fail(pidns.error().Wrap("reading the target's pid namespace"));
  }
  if (Status st = session->AddPid(static_cast<uint32_t>(target.pid), pidns->ns, pidns->threads); !st) {
    return fail(st.error());
  }
  if (stack_setup && sampling) {
    ec_installer.emplace(target.pid, target.open_path, stack_setup->ec_route, *bin);
    poll_ec_route();
  }
  SplitSiteSpecs split = SplitSites(*sites, *bin);
  std::vector<SiteSpec>& low = split.low;
  std::vector<SiteSpec>& high = split.high;
  // BpfSession assigns cookies in attach order (low group, then high group), starting at 0 for this session.
  site_functions = split.functions;
  // Attach mode: the VM is mapped already, so the stack resolver (tens of ms for a large static ruby's symbol table)
  // is built before the probes go live rather than inside the first stack record's callback, where it would hold
  // the main loop, and the --max-overhead checks with it, while the target traps.
  if (stack_setup && !launch && !resolver) resolver = MakeStackResolver(target.pid, target.open_path, *stack_setup);
  TargetWatch watch = TargetWatch::ForPid(target.pid);
  session->WakePollOn(watch.fd());  // the main loop sees the exit at once, not at the end of its wait
  const uint64_t attach_start = MonotonicNs();
  std::unique_ptr<SiteGroup> low_group, high_group;
  for (auto* list : {&low, &high}) {
    if (list->empty()) continue;
    Result<std::unique_ptr<SiteGroup>> g = session->Attach(target.open_path, *list, target.pid);
    if (!g) {
      if (!launch && (watch.Exited() || ProcessGone(target.pid))) return fail(TargetExitedError(target.pid));
      return fail(g.error().Wrap("attaching probes"));
    }
    (list == &low ? low_group : high_group) = std::move(g.value());
  }
  if (stack_setup && sampling) {
    if (Status st = session->StartSampling(o.hz); !st) return fail(st.error().Wrap("starting on-CPU sampling"));
  }
  const uint64_t attached_ns = MonotonicNs();
  const double attach_ms = static_cast<double>(attached_ns - attach_start) / 1e6;
  if (!launch && watch.Exited()) return fail(TargetExitedError(target.pid));
  if (!o.quiet) {
    fprintf(stderr, "rvbpfd: attached %zu probes (%s) to pid %d, ruby %s, %s (symbols: %s), in %.0f ms; writing %s\n",
            sites->sites.size(), session->uses_multi_links() ? "multi-uprobe links" : "one link per site",
            target.pid, EscapeControlBytes(target.ruby_version).c_str(), EscapeControlBytes(target.vm_path).c_str(),
            EscapeControlBytes(sites->symbols_source).c_str(), attach_ms, EscapeControlBytes(output).c_str());
  }
  if (child) {
    if (!o.quiet) {
      if (launch_identity) {
        fprintf(stderr, "rvbpfd: running the command as %s (uid %u, gid %u)\n",
                launch_identity->user.empty() ? "?" : EscapeControlBytes(launch_identity->user).c_str(),
                static_cast<unsigned>(launch_identity->uid), static_cast<unsigned>(launch_identity->gid));
      } else if (geteuid() == 0) {
        fprintf(stderr, "rvbpfd: running the command as root (not under sudo and no --user)\n");
      }
    }
    if (Status st = child->Release(); !st) return fail(st.error());
  }
  std::optional<ProcessMemoryReader> gate_mem;
  if (launch) {
    // The command shares rvbpfd's pid namespace: its main thread's tid is its pid as rvbpfd sees it. Under sudo it
    // may run as another user (LiveLayoutGate::Unreadable).
    const int pid = target.pid;
    launch_gate.emplace(
        pid, pid, prepared->live_layout,
        LiveLayoutGate::Unreadable{
            .layout_from_binary = prepared->sites.analysed_with_symtab && prepared->sites.offsets_source == "dwarf",
            .read_errno = [pid](uint64_t addr) { return ProcessReadErrno(pid, addr); }});
    gate_mem.emplace(pid);
    poll_launch_gate = [&]() {
      if (!vm_running || launch_gate->state() != LiveLayoutGate::State::kPending) return;
      auto lowest = [&] { return LowestMappingOf(target.pid, target.open_path); };
      if (launch_gate->Poll(MonotonicNs(), lowest, *gate_mem) == LiveLayoutGate::State::kSkipped && !o.quiet) {
        fprintf(stderr, "rvbpfd: note: the command runs as another user and its memory is not readable without "
                        "CAP_SYS_PTRACE: the live layout check is skipped (the layout is the binary's own DWARF)\n");
      }
    };
  }
  auto layout_checked = [&]() {
    return !launch_gate || launch_gate->state() == LiveLayoutGate::State::kPassed ||
           launch_gate->state() == LiveLayoutGate::State::kSkipped;
  };
  // Launch mode: why nothing is written when the layout check failed or never ran (the command keeps running: not
  // rvbpfd's to kill).
  auto launch_gate_error = [&](const char* why_unchecked) {
    if (launch_gate->state() == LiveLayoutGate::State::kFailed) {
      return Error(launch_gate->error().code(), launch_gate->error().message() + "; the command (pid " +
                                                    std::to_string(target.pid) + ") runs on untraced");
    }
    return Error(ErrorCode::kTargetExited, "the command (pid " + std::to_string(target.pid) + ") " + why_unchecked +
                                               " before its memory could be checked against the layout rvbpfd "
                                               "derived; nothing was recorded");
  };

  // Main loop.
  ThreadIds thread_ids(static_cast<uint32_t>(target.pid));
  ExitedThreads exited_threads;
  auto KeepEvent = [&](const TraceEvent& e) {
    return exited_threads.Keep(e.th, e.event == EventName::kSample, e.event == EventName::kThreadExited);
  };
  std::vector<TraceEvent> ready;
  rv_counters seen{};
  // With a budget, short windows bound what a short run can overspend; estimating only, 1 s windows keep the
  // warning from firing on a brief burst.
  OverheadBudget budget(o.max_overhead_pct,
                        TrapCosts(o.probe_cost_us, o.stepped_probe_cost_us, o.cold_probe_extra_us, o.cycle_cost_us),
                        o.max_overhead_pct > 0 ? OverheadBudget::kDefaultWindowNs : 1'000'000'000);
  // The first window starts when the probes went live, with no trap counted yet (the BPF counters start at 0): the
  // main loop's first check can come 100+ ms later (stack setup), and those traps belong to the budget too.
  budget.Update(attached_ns, TrapCounts{});
  bool floor_warned = false;
  uint64_t last_status = 0;    // monotonic ns of the last status line
  uint64_t status_events = 0;  // seen.events at that line, for the events/s figure
  bool warned = false;
  bool stop_now = false;
  // With a budget the counters are checked when the budget asks (1-5 ms: sooner when its allowance is about to run
  // out at the current trap rate); otherwise every 20 ms, which also bounds how long records wait in the ring (BPF
  // does not wake us per record).
  const int poll_ms = 20;
  const uint64_t deadline = o.duration_s > 0 ? origin_ns + static_cast<uint64_t>(o.duration_s * 1e9) : 0;
  int child_status = 0;
  bool target_exited = false;
  std::string stop_reason = "target_exited";

  auto now_t = [&]() { return MonotonicNs() - origin_ns; };
  // The daemon's own events are stamped "now"; everything the probes recorded before now must be in the reorder
  // window first, or those records would arrive after a newer timestamp and be written out of order.
  auto drain_ring = [&]() {
    DrainRing([&] {
      Result<int> n = session->Poll(0);
      return n ? *n : -1;
    });
  };
  auto check_counters = [&]() {
    rv_counters c = session->ReadCounters();
    if (c.dropped > seen.dropped) {
      gc_epoch.OnLoss();
      drain_ring();
      TraceEvent e;
      e.t_ns = now_t();
      e.event = EventName::kEventsDropped;
      e.source = kSourceDaemon;
      e.count = c.dropped - seen.dropped;
      reorder.Push(std::move(e));
    }
    seen = c;
  };

  // --max-overhead: every trap the target paid (BPF's probe_hits, discarded hits included) x the cost of one, plus
  // the daemon's CPU time to detach and reattach, against the budget (see OverheadBudget). Per-site hits (one batch
  // map read) say what the sites that stay attached cost. Runs from the main loop after Poll and from inside Poll's
  // callbacks (budget_tick), so it cannot drain the ring before stamping its records (as check_counters does); the
  // stamps are chosen instead: tracing_paused once the detach has returned (every trap of the detach tail is older),
  // tracing_resumed before the reattach (every event after it is newer). Records still in the ring are older than
  // both and sort into place within the reorder window.
  auto push_daemon = [&](EventName name, const char* reason, double pct, uint64_t t_ns) {
    TraceEvent e;
    e.t_ns = t_ns;
    e.event = name;
    e.source = kSourceDaemon;
    e.reason = reason;
    e.overhead_pct = pct;
    reorder.Push(std::move(e));
  };
  std::optional<Error> reattach_error;
  bool slow_detach_warned = false;
  uint64_t next_check_ns = 0;
  bool in_check = false;
  auto check_budget = [&]() {
    const uint64_t now = MonotonicNs();
    if (now < next_check_ns || in_check) return;
    in_check = true;
    const std::vector<uint64_t> site_hits = session->ReadSiteHits();
    const TrapCounts traps =
        CountTraps(session->ReadCounters(), site_hits, low_group ? low_group->cookies() : std::vector<uint64_t>{});
    switch (budget.Update(now, traps)) {
      case OverheadBudget::Action::kPause:
        if (high_group && high_group->attached()) {
          const uint64_t cpu0 = ThreadCpuNs();
          const uint64_t wall0 = MonotonicNs();
          session->Detach(*high_group, site_hits);  // ordered by hits: see BpfSession::Detach
          gc_unseen = true;
          budget.Charge(static_cast<double>(ThreadCpuNs() - cpu0));
          const double detach_ms = static_cast<double>(MonotonicNs() - wall0) / 1e6;
          // A detach slower than a budget window means the sites keep trapping (partly unseen) for longer than the
          // budget can make up for: one link per site (kernels before 6.6) pays an RCU grace period per site.
          if (!slow_detach_warned && !o.quiet && detach_ms * 1e6 > static_cast<double>(budget.window_ns())) {
            slow_detach_warned = true;
            fprintf(stderr,
                    "rvbpfd: warning: detaching the high-rate probes took %.0f ms (%s), longer than a %.0f ms budget "
                    "window: --max-overhead %g cannot hold on this kernel%s\n",
                    detach_ms, session->uses_multi_links() ? "multi-uprobe links" : "one link per site",
                    static_cast<double>(budget.window_ns()) / 1e6, o.max_overhead_pct,
                    session->uses_multi_links() ? "" : " (multi-uprobe links, one grace period per group, need Linux "
                                                       "6.6+)");
          }
          budget.Detached(CountTraps(session->ReadCounters(), {}, {}));
          push_daemon(EventName::kTracingPaused, "max-overhead", budget.current_pct(now, traps), now_t());
        }
        break;
      case OverheadBudget::Action::kResume:
        if (high_group && !high_group->attached()) {
          const uint64_t cpu0 = ThreadCpuNs();
          const uint64_t before_t = now_t();
          Status st = session->Reattach(*high_group);
          budget.Charge(static_cast<double>(ThreadCpuNs() - cpu0));
          if (st) {
            gc_unseen = false;
            gc_epoch.OnGcSitesReattached();
            push_daemon(EventName::kTracingResumed, "budget window over", budget.last_window_pct(), before_t);
          } else if (!reattach_error) {
            reattach_error = st.error();
          }
        }
        break;
      case OverheadBudget::Action::kNone:
        break;
    }
    next_check_ns = MonotonicNs() + budget.NextCheckNs(now);
    in_check = false;
  };
  if (o.max_overhead_pct > 0) budget_tick = check_budget;

  for (;;) {
    int timeout_ms = poll_ms;
    if (o.max_overhead_pct > 0) {
      const uint64_t now = MonotonicNs();
      timeout_ms = next_check_ns > now ? static_cast<int>((next_check_ns - now + 999'999) / 1'000'000) : 0;
    }
    // While the launched command's layout is unchecked, records are taken as they come: the check is due as soon as
    // the first scheduler event arrives, while the command is still starting.
    if (!layout_checked()) timeout_ms = std::min(timeout_ms, 1);
    Result<int> n = session->Poll(timeout_ms);
    if (!n) {
      fprintf(stderr, "%s\n", n.error().ToString().c_str());
      stop_reason = "error";
      break;
    }
    check_counters();
    poll_ec_route();
    if (poll_launch_gate) {
      poll_launch_gate();
      if (launch_gate->state() == LiveLayoutGate::State::kFailed) {
        return fail(launch_gate_error(""));
      }
    }
    if (layout_checked()) reorder.PopReady(&ready);
    Status wst = Status::Ok();
    for (TraceEvent& e : ready) {
      if (!KeepEvent(e)) continue;
      thread_ids.Assign(&e);
      if (wst) wst = writer.Write(e);
    }
    ready.clear();
    if (wst) wst = writer.MaybeFlush(std::chrono::steady_clock::now());
    if (!wst) {
      // Disk full or similar: stop rather than keep recording into a file that silently lacks events.
      fprintf(stderr, "%s\n", wst.error().Wrap("writing " + output).ToString().c_str());
      stop_reason = "write error";
      break;
    }
    const uint64_t now = MonotonicNs();

    if (o.max_overhead_pct > 0) {
      check_budget();
      if (reattach_error) {
        if (!(!launch && watch.Exited())) {
          fprintf(stderr, "%s\n", reattach_error->ToString().c_str());
          stop_reason = "error";
          stop_now = true;
        }
        reattach_error.reset();
      }
    } else {
      // Estimate only (1 s windows): the warning below.
      budget.Update(now, CountTraps(seen, {}, {}));
    }
    if (o.max_overhead_pct > 0 && budget.floor_pct() > o.max_overhead_pct && !floor_warned && !o.quiet) {
      floor_warned = true;
      fprintf(stderr, "%srvbpfd: warning: --max-overhead %g%% cannot hold: the probes that stay attached while "
              "paused (thread start/exit) alone cost an estimated %.1f%%\n", o.status_line ? "\r\033[K" : "",
              o.max_overhead_pct, budget.floor_pct());
    }
    if (o.max_overhead_pct <= 0 && budget.last_window_pct() > o.warn_overhead_pct && !warned && !o.quiet) {
      warned = true;
      fprintf(stderr, "%srvbpfd: warning: probes cost the target an estimated %.1f%% of its time (%.0f probe "
              "hits/s); bound it with --max-overhead PERCENT\n", o.status_line ? "\r\033[K" : "",
              budget.last_window_pct(), budget.last_window_pct() * 1e4 / o.probe_cost_us);
    }
    if (o.status_line && now - last_status >= 500'000'000) {
      const double rate = last_status ? static_cast<double>(seen.events - status_events) * 1e9 /
                                            static_cast<double>(now - last_status)
                                      : 0;
      last_status = now;
      status_events = seen.events;
      fprintf(stderr, "\r\033[Krvbpfd: pid %d  %llu events (%.0f/s)  %llu dropped  est. overhead %.1f%%%s",
              target.pid, static_cast<unsigned long long>(seen.events), rate,
              static_cast<unsigned long long>(seen.dropped), budget.last_window_pct(),
              high_group && !high_group->attached() ? "  (high-rate probes paused)" : "");
      fflush(stderr);
    }

    if (child) {
      if (child->Reap(&child_status)) target_exited = true;
    } else if (watch.Exited()) {
      target_exited = true;
    }
    if (target_exited || stop_now) break;
    if (g_stop.load()) {
      stop_reason = "signal";
      break;
    }
    if (deadline && now >= deadline) {
      stop_reason = "duration";
      break;
    }
  }

  // Drain what the ring still holds, then the final drop count. The budget is over: nothing is reattached now.
  budget_tick = nullptr;
  drain_ring();
  check_counters();
  if (!layout_checked()) {
    return fail(launch_gate_error(target_exited                ? "exited"
                                  : stop_reason == "signal"    ? "was still starting when rvbpfd was stopped"
                                                               : "was still starting when the recording ended"));
  }
  reorder.Drain(&ready);
  for (TraceEvent& e : ready) {
    if (!KeepEvent(e)) continue;
    thread_ids.Assign(&e);
    if (Status st = writer.Write(e); !st) return st.error().Wrap("writing " + output);
  }
  ready.clear();
  FinishInfo fin;
  fin.end_t_ns = now_t();
  fin.ring_high_water_bytes = seen.ring_high_water;
  fin.late_events = reorder.late();
  fin.stop_reason = stop_reason;
#define RV_TRAP_FINISH(field, fold, label) fin.field = seen.field;
  RV_TRAP_COUNTERS(RV_TRAP_FINISH)
#undef RV_TRAP_FINISH
  if (stack_setup && sampling && stack_setup->offsets.gvl.base != RV_GVL_BASE_NONE) {
#define RV_GVL_FINISH(field, fold, label) fin.field = seen.field;
    RV_GVL_COUNTERS(RV_GVL_FINISH)
#undef RV_GVL_FINISH
  }
  if (stack_setup && sampling) {
    SampleEcRoutes routes;
#define RV_ROUTE_FINISH(field, fold, label, key) routes.key = seen.field;
    RV_EC_ROUTE_COUNTERS(RV_ROUTE_FINISH)
#undef RV_ROUTE_FINISH
    fin.sample_ec_routes = routes;
  }
  if (o.status_line) fprintf(stderr, "\r\033[K");
  if (Status st = writer.Finish(fin); !st) return st.error();
  if (!o.quiet) {
    // The counters that have a label (include/rvbpfd/counters.h): events and traps on the first line, samples and
    // their EC routes on the second.
    std::string counts;
    const char* sep = "";
#define RV_COUNT_TEXT(field, fold, label, ...)                  \
  if (label[0] != '\0') {                                       \
    counts += sep + std::to_string(seen.field) + " " + label;   \
    sep = ", ";                                                 \
  }
    RV_EVENT_COUNTERS(RV_COUNT_TEXT)
    RV_TRAP_COUNTERS(RV_COUNT_TEXT)
    fprintf(stderr, "rvbpfd: %s; %s; wrote %s\n", stop_reason.c_str(), counts.c_str(),
            EscapeControlBytes(output).c_str());
    if (stack_setup && sampling) {
      counts.clear();
      sep = "";
      RV_SAMPLE_COUNTERS(RV_COUNT_TEXT)
      if (stack_setup->offsets.gvl.base != RV_GVL_BASE_NONE) {
        RV_GVL_COUNTERS(RV_COUNT_TEXT)
      }
      sep = "; EC by ";
#define RV_ROUTE_TEXT(field, fold, label, key)                \
  counts += sep + std::string(label) + " " + std::to_string(seen.field); \
  sep = ", ";
      RV_EC_ROUTE_COUNTERS(RV_ROUTE_TEXT)
#undef RV_ROUTE_TEXT
      fprintf(stderr, "rvbpfd: %s\n", counts.c_str());
    }
#undef RV_COUNT_TEXT
    if (child && target_exited) {
      if (WIFEXITED(child_status)) {
        fprintf(stderr, "rvbpfd: command exited with status %d\n", WEXITSTATUS(child_status));
      } else if (WIFSIGNALED(child_status)) {
        fprintf(stderr, "rvbpfd: command killed by signal %d\n", WTERMSIG(child_status));
      }
    }
  }
  // Releasing a multi-uprobe link waits for an RCU grace period (tens of ms, more on a busy machine): both groups
  // are released at the same time so that they wait for the same one.
  if (low_group && high_group) {
    std::thread release_low([&low_group] { low_group.reset(); });
    high_group.reset();
    release_low.join();
  }
  return 0;
}

}  // namespace rvbpfd
