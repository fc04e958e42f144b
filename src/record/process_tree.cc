#include "record/process_tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <utility>

#include "common/label_bound.h"
#include "common/text_escape.h"
#include "elf/elf_file.h"
#include "target/pid_namespace.h"
#include "target/target.h"

namespace rvbpfd {
namespace {

// What one /proc read of a followed process may take (a process whose memory is on a stalled mount can hold its
// cmdline read): a read that overruns gives nothing.
constexpr std::chrono::milliseconds kProcReadTimeout{200};
// Inspecting a new image's executable (its ELF headers and the ruby_version string).
constexpr std::chrono::milliseconds kExeInspectTimeout{1000};
constexpr size_t kMaxCmdlineBytes = 4096;
constexpr size_t kMaxCmdlineArgs = 64;
constexpr size_t kMaxMapsBytes = 4u << 20;
// A process /proc says is gone is ended this long after, if its exit record has not come (a record lost to a full
// ring); its record usually follows within one poll.
constexpr uint64_t kGoneGraceNs = 200'000'000;
constexpr uint64_t kLivenessPeriodNs = 100'000'000;

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// Up to `max` bytes of a /proc file (nullopt when it cannot be opened).
std::optional<std::string> ReadProcText(const std::string& path, size_t max) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string out;
  char buf[4096];
  while (out.size() < max) {
    const ssize_t n = read(fd, buf, std::min(sizeof(buf), max - out.size()));
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

std::string CutLabel(std::string s) {
  BoundLabel(&s);
  return s;
}

std::string Base(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

ProcessFollower::ProcessFollower(FollowContext ctx, ProcessInfo root) : ctx_(std::move(ctx)) {
  auto p = std::make_unique<Followed>();
  p->info = std::move(root);
  p->info.id = kRootProcessId;
  p->state = State::kTraced;
  p->main_ruby_thread = ThreadIds::kMainThread;
  live_by_pid_[p->info.pid] = kRootProcessId;
  cache_pid_ = p->info.pid;
  cache_id_ = kRootProcessId;
  procs_.push_back(std::move(p));
  if (procs_[0]->info.command.empty()) procs_[0]->info.command = ReadCommand(procs_[0]->info.pid);
}

void ProcessFollower::WriteRootLine() { ctx_.sink->WriteProcess(procs_[0]->info, ThreadIds::kMainThread); }

uint32_t ProcessFollower::Lookup(uint32_t pid) {
  auto it = live_by_pid_.find(pid);
  if (it == live_by_pid_.end()) return 0;
  Followed* p = ById(it->second);
  // The probes are on the traced VM's file: a record of a new image proves it runs that VM.
  if (p->state == State::kPending) MakeTraced(*p);
  cache_pid_ = pid;
  cache_id_ = it->second;
  return it->second;
}

StackResolver* ProcessFollower::Resolver(uint32_t id) {
  Followed* p = ById(id);
  if (p == nullptr || p->state != State::kTraced || id == kRootProcessId || !ctx_.make_resolver) return nullptr;
  if (!p->resolver) p->resolver = ctx_.make_resolver(static_cast<int>(p->info.pid));
  return p->resolver.get();
}

ProcessFollower::Followed* ProcessFollower::Add(uint32_t pid, std::optional<uint32_t> parent, const char* cause,
                                                uint64_t t_ns) {
  if (auto it = live_by_pid_.find(pid); it != live_by_pid_.end()) {
    // A pid reused while we still thought its process alive (its exit record was lost).
    End(*ById(it->second), t_ns, "exit");
  }
  if (procs_.size() >= kMaxProcesses) {
    ++overflow_;
    (void)ctx_.backend->MarkFollowOnly(pid);  // in the filter still (BPF put it there), but nothing is recorded
    return nullptr;
  }
  auto p = std::make_unique<Followed>();
  p->info.id = static_cast<uint32_t>(procs_.size() + 1);
  p->info.pid = pid;
  p->info.parent = parent;
  p->info.cause = cause;
  p->info.t_ns = t_ns;
  live_by_pid_[pid] = p->info.id;
  if (cache_pid_ == pid) cache_pid_ = 0;
  procs_.push_back(std::move(p));
  return procs_.back().get();
}

namespace {

// pid -> parent pid of every process /proc lists (at most `max`), from /proc/PID/stat's fourth field.
std::unordered_map<uint32_t, std::vector<uint32_t>> ChildrenByParent(size_t max) {
  std::unordered_map<uint32_t, std::vector<uint32_t>> children;
  DIR* dir = opendir("/proc");
  if (dir == nullptr) return children;
  size_t seen = 0;
  while (dirent* ent = readdir(dir)) {
    char* end = nullptr;
    const unsigned long pid = strtoul(ent->d_name, &end, 10);
    if (end == ent->d_name || *end != '\0' || pid == 0 || pid > UINT32_MAX) continue;
    if (++seen > max) break;
    std::optional<std::string> stat = ReadProcText("/proc/" + std::to_string(pid) + "/stat", 1024);
    if (!stat) continue;
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so the fields start after the last ')'.
    const size_t close = stat->rfind(')');
    if (close == std::string::npos) continue;
    unsigned long ppid = 0;
    char state = 0;
    if (sscanf(stat->c_str() + close + 1, " %c %lu", &state, &ppid) != 2) continue;
    children[static_cast<uint32_t>(ppid)].push_back(static_cast<uint32_t>(pid));
  }
  closedir(dir);
  return children;
}

}  // namespace

size_t ProcessFollower::AdoptDescendants() {
  constexpr size_t kMaxProcScan = 1 << 20;
  const uint32_t root_pid = procs_[0]->info.pid;
  DeadlineResult<std::unordered_map<uint32_t, std::vector<uint32_t>>> tree =
      worker_->Run<std::unordered_map<uint32_t, std::vector<uint32_t>>>(
          std::chrono::milliseconds(5000), [] { return ChildrenByParent(kMaxProcScan); });
  if (!tree.value) return 0;
  size_t adopted = 0;
  std::deque<uint32_t> queue{root_pid};
  while (!queue.empty() && procs_.size() < kMaxProcesses) {
    const uint32_t parent_pid = queue.front();
    queue.pop_front();
    auto kids = tree.value->find(parent_pid);
    if (kids == tree.value->end()) continue;
    for (uint32_t pid : kids->second) {
      auto parent = live_by_pid_.find(parent_pid);
      if (parent == live_by_pid_.end() || live_by_pid_.contains(pid)) continue;
      Result<TargetPidNamespace> ns = ReadPidNamespace(static_cast<int>(pid), ProcFs());
      if (!ns || !ctx_.backend->AddPid(pid, ns->ns, ns->threads)) continue;  // gone meanwhile
      Followed* p = Add(pid, parent->second, "", 0);
      if (p == nullptr) break;
      p->info.command = ReadCommand(pid);
      InspectExe(*p);
      p->pending_since_ns = 0;  // long since exec'd: decided now
      DecidePending(*p, /*exited=*/false);
      if (p->state == State::kTraced && ctx_.sampling && ctx_.stack_setup) ctx_.backend->PollEc(*p->ec);
      ++adopted;
      queue.push_back(pid);
    }
  }
  return adopted;
}

void ProcessFollower::OnProcRecord(const rv_record& r) {
  const uint64_t t = T(r.ts_ns);
  switch (r.kind) {
    case RV_EV_PROC_FORK:
      OnFork(r.pid, r.serial, t);
      break;
    case RV_EV_PROC_EXEC: {
      if (ctx_.root_launching && r.pid == procs_[0]->info.pid && !procs_[0]->ended && ctx_.root_launching()) {
        break;  // the launch's own exec: the command starts
      }
      char comm[13] = {};
      std::memcpy(comm, &r.th, 8);
      std::memcpy(comm + 8, &r.serial, 4);
      OnExec(r.pid, t, std::string(comm, strnlen(comm, 12)));
      break;
    }
    case RV_EV_PROC_EXIT:
      if (auto it = live_by_pid_.find(r.pid); it != live_by_pid_.end()) {
        End(*ById(it->second), t, "exit",
            (r.flags & RV_REC_EXIT_STATUS) ? std::optional<int>(static_cast<int>(r.serial)) : std::nullopt);
      }
      break;
    default:
      break;
  }
}

void ProcessFollower::OnFork(uint32_t child, uint32_t parent_pid, uint64_t t_ns) {
  Followed* parent = nullptr;
  if (auto it = live_by_pid_.find(parent_pid); it != live_by_pid_.end()) parent = ById(it->second);
  Followed* c = Add(child, parent ? std::optional<uint32_t>(parent->info.id) : std::nullopt, "fork", t_ns);
  if (c == nullptr) return;
  if (parent == nullptr) {
    // A parent we no longer follow (its record was lost): what the child runs is decided as for a new image.
    c->pending_since_ns = NowNs();
    return;
  }
  // A forked child runs its parent's image: its argv is the parent's (fork copies the memory that holds it).
  c->info.command = parent->info.command;
  switch (parent->state) {
    case State::kTraced:
      MakeTraced(*c);
      break;
    case State::kPending:
      c->pending_since_ns = parent->pending_since_ns;
      c->exe = parent->exe;
      c->exe_is_ruby = parent->exe_is_ruby;
      c->comm = parent->comm;
      break;
    case State::kSkipped:
      c->state = State::kSkipped;  // BPF gave it its parent's follow-only flag
      c->info.skipped = parent->info.skipped;
      QueueLine(Line{c->info.t_ns, c->info.id, std::nullopt});
      break;
  }
}

void ProcessFollower::OnExec(uint32_t pid, uint64_t t_ns, const std::string& comm) {
  std::optional<uint32_t> old_id;
  if (auto it = live_by_pid_.find(pid); it != live_by_pid_.end()) {
    Followed& old = *ById(it->second);
    old_id = old.info.id;
    End(old, t_ns, "exec");
  }
  Followed* p = Add(pid, old_id, "exec", t_ns);
  if (p == nullptr) return;
  p->pending_since_ns = NowNs();
  p->comm = EscapeControlBytes(comm);
  p->info.command = ReadCommand(pid);
  InspectExe(*p);
  // A static ruby is its own VM file: mapped already.
  if (LowestMappingOf(static_cast<int>(pid), ctx_.vm_open_path)) MakeTraced(*p);
}

void ProcessFollower::InspectExe(Followed& p) {
  const std::string exe_link = "/proc/" + std::to_string(p.info.pid) + "/exe";
  DeadlineResult<std::pair<std::string, bool>> exe = worker_->Run<std::pair<std::string, bool>>(
      kExeInspectTimeout, [exe_link]() -> std::pair<std::string, bool> {
        char buf[4096];
        const ssize_t n = readlink(exe_link.c_str(), buf, sizeof(buf) - 1);
        std::string path = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
        Result<ElfFile> elf = ElfFile::Open(exe_link);
        return {path, elf.ok() && ReadRubyVersion(*elf).has_value()};
      });
  if (exe.value) {
    p.exe = CutLabel(exe.value->first);
    p.exe_is_ruby = exe.value->second;
  }
}

void ProcessFollower::End(Followed& p, uint64_t t_ns, const char* how, std::optional<int> wait_status) {
  if (p.ended) return;
  if (p.state == State::kPending) DecidePending(p, /*exited=*/true);
  p.ended = true;
  if (auto it = live_by_pid_.find(p.info.pid); it != live_by_pid_.end() && it->second == p.info.id) {
    live_by_pid_.erase(it);
  }
  if (cache_pid_ == p.info.pid) cache_pid_ = 0;
  ProcessEnd end{.id = p.info.id, .t_ns = t_ns, .how = how};
  if (wait_status) SetExitStatus(&end, *wait_status);
  QueueLine(Line{t_ns, p.info.id, std::move(end)});
  // Its stacks were all resolved as their records arrived: the image's symbolization state goes with it.
  p.resolver.reset();
  p.ec.reset();
}

void ProcessFollower::MakeTraced(Followed& p) {
  p.state = State::kTraced;
  p.info.ruby_version = ctx_.ruby_version;
  p.info.build_id = ctx_.build_id;
  p.main_ruby_thread = (*next_thread_)++;
  const int pid = static_cast<int>(p.info.pid);
  p.ids = std::make_unique<ThreadIds>(p.info.pid, p.main_ruby_thread, next_thread_);
  ThreadInfoTracker::Sources sources = ProcThreadInfoSources(pid, ProcFs(), ctx_.own_pidns, worker_);
  if (ctx_.stack_setup && ctx_.stack_setup->offsets.thread_name != RubyOffsets::kNoThreadName) {
    p.name_mem = std::make_unique<ProcessMemoryReader>(pid);
    ProcessMemoryReader* mem = p.name_mem.get();
    const RubyOffsets offsets = ctx_.stack_setup->offsets;
    sources.ruby_name = [mem, offsets](uint64_t th) { return ReadRubyThreadName(*mem, offsets, th); };
  }
  p.thread_info = std::make_unique<ThreadInfoTracker>(std::move(sources));
  // A forked child has its parent's route already (BPF copied it); a new image gets its own.
  if (ctx_.sampling && ctx_.stack_setup) p.ec.emplace(pid, ctx_.vm_open_path, ctx_.stack_setup->ec_route, ctx_.bin);
  QueueLine(Line{p.info.t_ns, p.info.id, std::nullopt});
}

void ProcessFollower::MakeSkipped(Followed& p, std::string why) {
  p.state = State::kSkipped;
  p.info.skipped = CutLabel(why);
  p.info.ruby_version.clear();
  p.info.build_id.clear();
  if (!p.ended) (void)ctx_.backend->MarkFollowOnly(p.info.pid);  // fails only once it has exited
  if (!ctx_.quiet) {
    fprintf(stderr, "rvbpfd: process %u (pid %u) is not traced: %s\n", p.info.id, p.info.pid,
            EscapeControlBytes(p.info.skipped).c_str());
  }
  QueueLine(Line{p.info.t_ns, p.info.id, std::nullopt});
}

void ProcessFollower::DecidePending(Followed& p, bool exited) {
  const int pid = static_cast<int>(p.info.pid);
  if (!exited && LowestMappingOf(pid, ctx_.vm_open_path)) {
    MakeTraced(p);
    return;
  }
  if (!exited) {
    // A shared libruby of another Ruby: the new image is Ruby, but not the binary the probes are on.
    const std::string maps_path = "/proc/" + std::to_string(pid) + "/maps";
    DeadlineResult<std::optional<std::string>> maps = worker_->Run<std::optional<std::string>>(
        kProcReadTimeout, [maps_path] { return ReadProcText(maps_path, kMaxMapsBytes); });
    if (maps.value && *maps.value) {
      for (const MapsEntry& m : ParseMaps(**maps.value)) {
        if (!m.path.empty() && IsLibrubyName(Base(m.path))) {
          MakeSkipped(p, "another Ruby VM binary: " + m.path + ": not followed");
          return;
        }
      }
    }
  }
  if (p.exe_is_ruby) {
    MakeSkipped(p, "another Ruby VM binary: " + p.exe + ": not followed");
    return;
  }
  if (exited || NowNs() - p.pending_since_ns >= kExecDecisionNs) {
    // A process gone before its executable could be read is named by its comm (the file's base name, cut to 12).
    MakeSkipped(p, p.exe.empty() ? "not Ruby (exited before it could be inspected): " + p.comm : "not Ruby: " + p.exe);
  }
}

std::vector<std::string> ProcessFollower::ReadCommand(uint32_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/cmdline";
  DeadlineResult<std::optional<std::string>> text = worker_->Run<std::optional<std::string>>(
      kProcReadTimeout, [path] { return ReadProcText(path, kMaxCmdlineBytes); });
  std::vector<std::string> args;
  if (!text.value || !*text.value) return args;
  const std::string& s = **text.value;
  size_t pos = 0;
  while (pos < s.size() && args.size() < kMaxCmdlineArgs) {
    size_t nul = s.find('\0', pos);
    if (nul == std::string::npos) nul = s.size();
    args.push_back(CutLabel(s.substr(pos, nul - pos)));
    pos = nul + 1;
  }
  return args;
}

Status ProcessFollower::Write(TraceEvent& e) {
  Followed* p = ById(e.process);
  if (p == nullptr || !p->ids) return Status::Ok();  // not traced: nothing of it is written
  if (!p->exited.Keep(e.th, e.event == EventName::kSample, e.event == EventName::kThreadExited)) return Status::Ok();
  p->ids->Assign(&e);
  if (e.ruby_thread) {
    if (std::optional<ThreadInfo> info = p->thread_info->Observe(e)) {
      ctx_.sink->SetThreadInfo(*e.ruby_thread, *info, e.t_ns);
    }
  }
  return ctx_.sink->Write(e);
}

void ProcessFollower::QueueLine(Line line) {
  auto at = std::upper_bound(lines_.begin(), lines_.end(), line.t_ns,
                             [](uint64_t t, const Line& l) { return t < l.t_ns; });
  lines_.insert(at, std::move(line));
}

void ProcessFollower::WriteLinesThrough(uint64_t t_ns, uint32_t id) {
  size_t n = 0;
  while (n < lines_.size() && lines_[n].t_ns <= t_ns) ++n;
  // The event's own process line, queued later than the event's time (a new image decided late): written first.
  for (size_t i = n; i < lines_.size(); ++i) {
    if (!lines_[i].end && lines_[i].id == id) n = i + 1;
  }
  for (size_t i = 0; i < n; ++i) WriteLine(lines_[i]);
  lines_.erase(lines_.begin(), lines_.begin() + static_cast<std::ptrdiff_t>(n));
}

void ProcessFollower::WriteLine(const Line& line) {
  if (line.end) {
    ProcessEnd end = *line.end;
    // The root's reaped status (launch mode) is the one its parent saw: it wins over the exit record's.
    if (end.id == kRootProcessId && end.how == "exit" && ctx_.root_wait_status) {
      if (std::optional<int> status = ctx_.root_wait_status()) {
        end.exit_code.reset();
        end.signal.reset();
        SetExitStatus(&end, *status);
      }
    }
    ctx_.sink->WriteProcessEnd(end);
    return;
  }
  const Followed* p = ById(line.id);
  if (p == nullptr) return;
  ctx_.sink->WriteProcess(p->info, p->state == State::kTraced ? std::optional<uint32_t>(p->main_ruby_thread)
                                                               : std::nullopt);
}

void ProcessFollower::Poll(uint64_t now_t_ns) {
  const uint64_t now = NowNs();
  for (size_t i = 1; i < procs_.size(); ++i) {
    Followed& p = *procs_[i];
    if (p.ended) continue;
    if (p.state == State::kPending) DecidePending(p, /*exited=*/false);
    if (p.ec && p.ec->state() == ProcessEcInstaller::State::kPending) ctx_.backend->PollEc(*p.ec);
  }
  if (now - last_liveness_ns_ < kLivenessPeriodNs) return;
  last_liveness_ns_ = now;
  std::vector<uint32_t> gone;
  for (const auto& [pid, id] : live_by_pid_) {
    if (id == kRootProcessId) continue;  // the recording watches its target itself
    Followed& p = *ById(id);
    if (!ProcessEnding(ProcFs(), static_cast<int>(pid))) {
      p.gone_seen_ns = 0;
    } else if (p.gone_seen_ns == 0) {
      p.gone_seen_ns = now;
    } else if (now - p.gone_seen_ns >= kGoneGraceNs) {
      gone.push_back(id);
    }
  }
  for (uint32_t id : gone) End(*ById(id), now_t_ns, "exit");
}

bool ProcessFollower::OthersEnded() const {
  for (size_t i = 1; i < procs_.size(); ++i) {
    if (!procs_[i]->ended) return false;
  }
  return true;
}

void ProcessFollower::Finish() {
  for (const Line& line : lines_) WriteLine(line);
  lines_.clear();
  if (ctx_.quiet) return;
  size_t traced = 0;
  for (const auto& p : procs_) traced += p->state == State::kTraced ? 1 : 0;
  fprintf(stderr, "rvbpfd: followed %zu process%s (%zu traced, %zu not traced)", procs_.size(),
          procs_.size() == 1 ? "" : "es", traced, procs_.size() - traced);
  if (overflow_ > 0) fprintf(stderr, "; %zu more past the limit of %zu were not followed", overflow_, kMaxProcesses);
  fprintf(stderr, "\n");
}

}  // namespace rvbpfd
