#include "record/recorder.h"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>

#include "elf/elf_file.h"
#include "probe/bpf_session.h"
#include "record/launch.h"
#include "record/overhead_budget.h"
#include "sites/sites.h"
#include "target/target.h"
#include "trace/event.h"
#include "trace/reorder.h"
#include "trace/thread_ids.h"
#include "trace/writer.h"

namespace rvbpfd {
namespace {

std::atomic<bool> g_stop{false};

void OnSignal(int) { g_stop.store(true); }

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

// Scheduler events that fire on every GVL hand-off: the sites --max-overhead detaches. The rest (thread start/exit,
// GC, sleep, mutex) are rare enough to stay attached, so a paused window still shows threads and GC.
bool IsHighRate(uint8_t event) {
  return event == RV_EV_THREAD_READY || event == RV_EV_THREAD_RESUMED || event == RV_EV_THREAD_SUSPENDED;
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
  std::string vm_path;  // path the daemon attaches to (host view)
  std::string ruby_version;
  std::string build_id;
};

Result<std::string> ReadRubyVersionFromElf(const ElfFile& elf) {
  auto sym = elf.FindSymbol("ruby_version");
  if (!sym || sym->shndx == 0) return Error(ErrorCode::kNotRuby, elf.path() + " defines no ruby_version");
  auto s = elf.CStringAt(sym->value, 32);
  if (!s) return Error(ErrorCode::kNotRuby, elf.path() + ": ruby_version is unreadable");
  return *s;
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
  if (launch) {
    const char* path_env = getenv("PATH");
    const char* ld_path = getenv("LD_LIBRARY_PATH");
    Result<LaunchPlan> plan = PlanLaunch(o.command, path_env ? path_env : "/usr/bin:/bin", ld_path ? ld_path : "");
    if (!plan) return plan.error();
    Result<ElfFile> vm = ElfFile::Open(plan->vm_path);
    if (!vm) return Error(ErrorCode::kNotRuby, vm.error().message());
    Result<std::string> version = ReadRubyVersionFromElf(*vm);
    if (!version) return version.error();
    target.vm_path = plan->vm_path;
    target.ruby_version = *version;
    target.build_id = vm->build_id();
  } else {
    Result<RubyTarget> t = DiscoverTarget(o.pid, ProcFs());
    if (!t) {
      // A target that dies while we read its maps or ELF shows up as a vanished file: say what happened.
      if (t.error().code() != ErrorCode::kNoSuchProcess && ProcessGone(o.pid)) return TargetExitedError(o.pid);
      return t.error();
    }
    target.pid = o.pid;
    target.vm_path = t->vm_host_path;
    target.ruby_version = t->ruby_version;
    target.build_id = t->build_id;
  }

  Result<SiteSet> sites = LoadOrFindSites(target.vm_path, target.ruby_version, o.cache_dir);
  if (!sites) {
    if (!launch && ProcessGone(target.pid)) return TargetExitedError(target.pid);
    return sites.error();
  }

  // Everything the ring delivers goes through the reorder window first. 20 ms of event time is far more than the
  // skew between CPUs (microseconds) and small enough that the file trails the program by a fraction of a second.
  uint64_t origin_ns = 0;
  Reorderer reorder(20'000'000);
  std::unique_ptr<BpfSession> session;
  {
    SessionOptions so;
    so.ring_buffer_bytes = o.ring_buffer_kb * 1024u;
    so.force_single_links = o.force_single_links;
    Result<std::unique_ptr<BpfSession>> s =
        BpfSession::Open(so, [&](const rv_record& r) { reorder.Push(FromRecord(r, origin_ns)); });
    if (!s) return s.error();
    session = std::move(s.value());
  }

  if (launch) {
    Result<HeldChild> c = HeldChild::Spawn(o.command);
    if (!c) return c.error();
    child.emplace(std::move(c.value()));
    target.pid = child->pid();
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
  if (Status st = session->AddPid(static_cast<uint32_t>(target.pid)); !st) return fail(st.error());
  std::vector<SiteSpec> low, high;
  for (const ProbeSite& ps : sites->sites) {
    SiteSpec spec{ps.file_offset, rv_site{ps.event, ps.th.kind, ps.th.reg, *bin, ps.th.offset, ps.vaddr,
                                          ps.exclude_caller_start, ps.exclude_caller_end}};
    (IsHighRate(ps.event) ? high : low).push_back(spec);
  }
  TargetWatch watch = TargetWatch::ForPid(target.pid);
  const uint64_t attach_start = MonotonicNs();
  std::unique_ptr<SiteGroup> low_group, high_group;
  for (auto* list : {&low, &high}) {
    if (list->empty()) continue;
    Result<std::unique_ptr<SiteGroup>> g = session->Attach(target.vm_path, *list, target.pid);
    if (!g) {
      if (!launch && (watch.Exited() || ProcessGone(target.pid))) return fail(TargetExitedError(target.pid));
      return fail(g.error().Wrap("attaching probes"));
    }
    (list == &low ? low_group : high_group) = std::move(g.value());
  }
  const double attach_ms = static_cast<double>(MonotonicNs() - attach_start) / 1e6;
  if (!launch && watch.Exited()) return fail(TargetExitedError(target.pid));
  if (!o.quiet) {
    fprintf(stderr, "rvbpfd: attached %zu probes (%s) to pid %d, ruby %s, %s, in %.0f ms; writing %s\n",
            sites->sites.size(), session->uses_multi_links() ? "multi-uprobe links" : "one link per site",
            target.pid, target.ruby_version.c_str(), target.vm_path.c_str(), attach_ms, output.c_str());
  }
  if (child) {
    if (Status st = child->Release(); !st) return fail(st.error());
  }

  // Main loop.
  ThreadIds thread_ids(static_cast<uint32_t>(target.pid));
  std::vector<TraceEvent> ready;
  rv_counters seen{};
  OverheadBudget budget(o.max_overhead_pct, o.probe_cost_us);
  uint64_t last_status = 0;
  bool warned = false;
  bool stop_now = false;
  // With a budget the counters are checked every 5 ms, so a burst overshoots it by at most ~5 ms of traps;
  // otherwise every 20 ms, which also bounds how long records wait in the ring (BPF does not wake us per record).
  const int poll_ms = o.max_overhead_pct > 0 ? 5 : 20;
  const uint64_t deadline = o.duration_s > 0 ? origin_ns + static_cast<uint64_t>(o.duration_s * 1e9) : 0;
  int child_status = 0;
  bool target_exited = false;
  std::string stop_reason = "target_exited";

  auto now_t = [&]() { return MonotonicNs() - origin_ns; };
  // The daemon's own events are stamped "now"; everything the probes recorded before now must be in the reorder
  // window first, or those records would arrive after a newer timestamp and be written out of order.
  auto drain_ring = [&]() {
    for (int i = 0; i < 64; ++i) {
      Result<int> n = session->Poll(0);
      if (!n || *n == 0) break;
    }
  };
  auto emit_daemon = [&](EventName name, std::string reason, double pct) {
    drain_ring();
    TraceEvent e;
    e.t_ns = now_t();
    e.event = name;
    e.source = kSourceDaemon;
    e.reason = std::move(reason);
    e.overhead_pct = pct;
    reorder.Push(std::move(e));
  };
  auto check_counters = [&]() {
    rv_counters c = session->ReadCounters();
    if (c.dropped > seen.dropped) {
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

  for (;;) {
    Result<int> n = session->Poll(poll_ms);
    if (!n) {
      fprintf(stderr, "%s\n", n.error().ToString().c_str());
      stop_reason = "error";
      break;
    }
    check_counters();
    reorder.PopReady(&ready);
    Status wst = Status::Ok();
    for (TraceEvent& e : ready) {
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

    // Overhead: probe hits x cost of one trap, against the --max-overhead budget (see OverheadBudget).
    const uint64_t hits = seen.events + seen.dropped;
    switch (budget.Update(now, hits)) {
      case OverheadBudget::Action::kPause:
        if (high_group && high_group->attached()) {
          session->Detach(*high_group);
          emit_daemon(EventName::kTracingPaused, "max-overhead", budget.current_pct(now, hits));
        }
        break;
      case OverheadBudget::Action::kResume:
        if (high_group && !high_group->attached()) {
          if (Status st = session->Reattach(*high_group); st) {
            emit_daemon(EventName::kTracingResumed, "budget window over", budget.last_window_pct());
          } else if (!(!launch && watch.Exited())) {
            fprintf(stderr, "%s\n", st.error().ToString().c_str());
            stop_reason = "error";
            stop_now = true;
          }
        }
        break;
      case OverheadBudget::Action::kNone:
        break;
    }
    if (o.max_overhead_pct <= 0 && budget.last_window_pct() > o.warn_overhead_pct && !warned && !o.quiet) {
      warned = true;
      fprintf(stderr, "%srvbpfd: warning: probes cost the target an estimated %.1f%% of its time (%.0f probe "
              "hits/s); bound it with --max-overhead PERCENT\n", o.status_line ? "\r\033[K" : "",
              budget.last_window_pct(), budget.last_window_pct() * 1e4 / o.probe_cost_us);
    }
    if (o.status_line && now - last_status >= 500'000'000) {
      last_status = now;
      fprintf(stderr, "\r\033[Krvbpfd: pid %d  %llu events  %llu dropped  est. overhead %.1f%%%s", target.pid,
              static_cast<unsigned long long>(seen.events), static_cast<unsigned long long>(seen.dropped),
              budget.last_window_pct(), high_group && !high_group->attached() ? "  (high-rate probes paused)" : "");
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

  // Drain what the ring still holds, then the final drop count.
  drain_ring();
  check_counters();
  reorder.Drain(&ready);
  for (TraceEvent& e : ready) {
    thread_ids.Assign(&e);
    if (Status st = writer.Write(e); !st) return st.error().Wrap("writing " + output);
  }
  ready.clear();
  FinishInfo fin;
  fin.end_t_ns = now_t();
  fin.ring_high_water_bytes = seen.ring_high_water;
  fin.late_events = reorder.late();
  fin.stop_reason = stop_reason;
  if (o.status_line) fprintf(stderr, "\r\033[K");
  if (Status st = writer.Finish(fin); !st) return st.error();
  if (!o.quiet) {
    fprintf(stderr, "rvbpfd: %s; %llu events, %llu dropped; wrote %s\n", stop_reason.c_str(),
            static_cast<unsigned long long>(seen.events), static_cast<unsigned long long>(seen.dropped),
            output.c_str());
    if (child && target_exited) {
      if (WIFEXITED(child_status)) {
        fprintf(stderr, "rvbpfd: command exited with status %d\n", WEXITSTATUS(child_status));
      } else if (WIFSIGNALED(child_status)) {
        fprintf(stderr, "rvbpfd: command killed by signal %d\n", WTERMSIG(child_status));
      }
    }
  }
  return 0;
}

}  // namespace rvbpfd
