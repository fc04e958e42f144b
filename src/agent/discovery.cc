#include "agent/discovery.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/deadline.h"
#include "common/target_file.h"
#include "target/target.h"

namespace rvbpfd {
namespace {

// A maps file larger than this is not read for the pre-filter (DiscoverTarget has its own bound).
constexpr size_t kMaxMapsBytes = 64u << 20;

// Reads a /proc file whole (st_size is 0 there). False when it cannot be opened.
bool ReadSmallFile(const std::string& path, std::string* out, size_t cap) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return false;
  out->clear();
  char buf[65536];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out->append(buf, static_cast<size_t>(n));
    if (out->size() > cap) break;
  }
  close(fd);
  return true;
}

bool IsLibrubyBase(std::string_view base) {
  if (base.rfind("libruby.so", 0) == 0) return true;
  return base.rfind("libruby-", 0) == 0 && base.find(".so") != std::string_view::npos;
}

// Identity of a target's file, resolved inside its root (an absolute symlink there must not name a host file).
std::optional<std::tuple<uint64_t, uint64_t, uint64_t, int64_t>> StatKey(const std::string& path) {
  struct stat st;
  if (StatInRoot(path, &st) != 0) return std::nullopt;
  return std::make_tuple(static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
                         static_cast<uint64_t>(st.st_size),
                         static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec);
}

bool MapsNameLibruby(const std::string& maps_text) {
  // Same names as src/target's IsLibrubyName: libruby.so*, libruby-X.Y.so*.
  for (size_t pos = maps_text.find("/libruby"); pos != std::string::npos; pos = maps_text.find("/libruby", pos + 1)) {
    const size_t end = maps_text.find('\n', pos);
    std::string_view base(maps_text.data() + pos + 1, (end == std::string::npos ? maps_text.size() : end) - pos - 1);
    if (base.rfind("libruby.so", 0) == 0) return true;
    if (base.rfind("libruby-", 0) == 0 && base.find(".so") != std::string_view::npos) return true;
  }
  return false;
}

}  // namespace

void ExecRetrySchedule::Add(int pid, uint64_t exec_ns) {
  if (pending_.size() >= kMaxPending && pending_.count(pid) == 0) {
    // Give up the entry with the oldest exec: under an exec storm the newest processes are the likeliest to live.
    auto oldest = pending_.begin();
    for (auto it = pending_.begin(); it != pending_.end(); ++it) {
      if (it->second.exec_ns < oldest->second.exec_ns) oldest = it;
    }
    pending_.erase(oldest);
    ++given_up_;
  }
  pending_[pid] = Entry{exec_ns, 0};
}

std::vector<ExecRetrySchedule::Due> ExecRetrySchedule::TakeDue(uint64_t now_ns) {
  std::vector<Due> due;
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (DueAt(it->second) <= now_ns) {
      due.push_back(Due{it->first, it->second.attempt, it->second.exec_ns});
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
  std::sort(due.begin(), due.end(), [](const Due& a, const Due& b) {
    return a.exec_ns != b.exec_ns ? a.exec_ns < b.exec_ns : a.pid < b.pid;
  });
  return due;
}

bool ExecRetrySchedule::Retry(const Due& due) {
  const size_t next = static_cast<size_t>(due.attempt) + 1;
  if (next >= kDelaysNs.size()) {
    ++given_up_;
    return false;
  }
  pending_[due.pid] = Entry{due.exec_ns, static_cast<int>(next)};
  return true;
}

void ExecRetrySchedule::Remove(int pid) { pending_.erase(pid); }

std::optional<uint64_t> ExecRetrySchedule::next_due_ns() const {
  std::optional<uint64_t> best;
  for (const auto& [pid, e] : pending_) {
    if (!best || DueAt(e) < *best) best = DueAt(e);
  }
  return best;
}

ProcessInspector::ProcessInspector(std::shared_ptr<const ProcFs> procfs, std::chrono::milliseconds timeout)
    : state_(std::make_shared<State>()), timeout_(timeout) {
  state_->procfs = std::move(procfs);
}

Inspection ProcessInspector::Inspect(int pid) {
  DeadlineResult<Inspection> r = worker_.Run<Inspection>(
      timeout_,
      [state = state_, pid] {
        Inspection i = state->InspectNow(pid);
        if (i.outcome == InspectOutcome::kRuby) i.labels = ReadProcessLabels(state->procfs->root(), pid);
        return i;
      },
      cancel_);
  if (r.status == DeadlineStatus::kDone) return std::move(*r.value);
  Inspection out;
  out.outcome = InspectOutcome::kSkip;
  const std::string p = "pid " + std::to_string(pid);
  switch (r.status) {
    case DeadlineStatus::kTimedOut:
      ++timed_out_;
      out.error = Error(ErrorCode::kIo, "inspecting " + p + " took more than " + std::to_string(timeout_.count()) +
                                            " ms (its files stall reads); skipped");
      break;
    case DeadlineStatus::kTooManyStuck:
      ++timed_out_;
      out.error = Error(ErrorCode::kIo, "not inspecting " + p + ": " + std::to_string(kMaxStuck) +
                                            " earlier inspections are still stuck in reads");
      break;
    case DeadlineStatus::kCancelled:
      break;  // the agent is stopping: a skip without an error, nothing to log for each pid left in a scan
    default:
      out.error = Error(ErrorCode::kInternal, "inspecting " + p + " failed: " + r.what);
      break;
  }
  return out;
}

Inspection ProcessInspector::State::InspectNow(int pid) {
  Inspection out;
  std::string maps;
  if (!ReadSmallFile(procfs->PidPath(pid, "maps"), &maps, kMaxMapsBytes)) {
    out.outcome = (errno == ENOENT || errno == ESRCH) ? InspectOutcome::kGone : InspectOutcome::kNotRuby;
    return out;
  }
  if (maps.empty()) {  // a kernel thread or a zombie
    out.outcome = !ProcessEnding(*procfs, pid) ? InspectOutcome::kNotRuby : InspectOutcome::kGone;
    return out;
  }
  std::optional<std::pair<uint64_t, uint64_t>> exe_key;
  if (!MapsNameLibruby(maps)) {
    struct stat st;
    if (stat(procfs->PidPath(pid, "exe").c_str(), &st) != 0) {
      out.outcome = !ProcessEnding(*procfs, pid) ? InspectOutcome::kNotRuby : InspectOutcome::kGone;
      return out;
    }
    exe_key = std::make_pair(static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino));
    std::lock_guard<std::mutex> lock(mu);
    if (non_vm_exes.count(*exe_key) != 0) return out;  // kNotRuby without opening the ELF again
  }
  if (std::optional<Inspection> cached = FromVmCache(pid, ParseMaps(maps))) return std::move(*cached);
  ++full_inspections;
  Result<RubyTarget> t = DiscoverTarget(pid, *procfs);
  if (t) {
    RememberVm(*t);
    out.outcome = InspectOutcome::kRuby;
    out.target = std::move(t.value());
    return out;
  }
  switch (t.error().code()) {
    case ErrorCode::kNoSuchProcess:
      out.outcome = InspectOutcome::kGone;
      break;
    case ErrorCode::kNotRuby:
      out.outcome = !ProcessEnding(*procfs, pid) ? InspectOutcome::kNotRuby : InspectOutcome::kGone;
      if (exe_key && out.outcome == InspectOutcome::kNotRuby) {
        std::lock_guard<std::mutex> lock(mu);
        if (non_vm_exes.size() >= kMaxNonVmCache) non_vm_exes.clear();
        non_vm_exes.insert(*exe_key);
      }
      break;
    default:
      // Unsupported version, no symbols, unreadable: nothing a later look would change, unless the process is gone.
      out.outcome = !ProcessEnding(*procfs, pid) ? InspectOutcome::kSkip : InspectOutcome::kGone;
      out.error = t.error();
      break;
  }
  return out;
}

std::optional<Inspection> ProcessInspector::State::FromVmCache(int pid, const std::vector<MapsEntry>& maps) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (vm_cache.empty()) return std::nullopt;
  }
  // The VM candidate, in DiscoverTarget's order: a mapped libruby, else the executable.
  std::string path;
  for (const MapsEntry& e : maps) {
    if (e.path.empty() || e.path[0] != '/') continue;
    const size_t slash = e.path.rfind('/');
    if (IsLibrubyBase(std::string_view(e.path).substr(slash + 1))) {
      if (e.deleted) return std::nullopt;  // DiscoverTarget knows how to reach deleted files
      path = e.path;
      break;
    }
  }
  if (path.empty()) {
    char exe[4096];
    const ssize_t n = readlink(procfs->PidPath(pid, "exe").c_str(), exe, sizeof(exe) - 1);
    if (n <= 0) return std::nullopt;
    path.assign(exe, static_cast<size_t>(n));
    if (path.ends_with(" (deleted)")) return std::nullopt;
  }
  const std::string host = procfs->PidPath(pid, "root") + path;
  std::optional<std::tuple<uint64_t, uint64_t, uint64_t, int64_t>> key = StatKey(host);
  if (!key) return std::nullopt;
  VmFacts facts;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = vm_cache.find(FileKey{std::get<0>(*key), std::get<1>(*key), std::get<2>(*key), std::get<3>(*key)});
    if (it == vm_cache.end()) return std::nullopt;
    facts = it->second;
  }
  Inspection out;
  out.outcome = InspectOutcome::kRuby;
  RubyTarget& t = out.target;
  t.pid = pid;
  t.vm_path = path;
  t.vm_host_path = host;
  t.vm_is_shared_library = facts.shared;
  t.build_id = facts.build_id;
  t.ruby_version = facts.ruby_version;
  t.major = facts.major;
  t.minor = facts.minor;
  t.teeny = facts.teeny;
  t.ns_pid = ReadNsPid(*procfs, pid);
  for (const MapsEntry& e : maps) {
    if (e.path == path && (t.vm_load_start == 0 || e.start < t.vm_load_start)) t.vm_load_start = e.start;
  }
  std::string comm;
  if (ReadSmallFile(procfs->PidPath(pid, "comm"), &comm, 256)) {
    while (!comm.empty() && comm.back() == '\n') comm.pop_back();
    t.comm = comm;
  }
  return out;
}

void ProcessInspector::State::RememberVm(const RubyTarget& t) {
  std::optional<std::tuple<uint64_t, uint64_t, uint64_t, int64_t>> key = StatKey(t.vm_host_path);
  if (!key) return;
  std::lock_guard<std::mutex> lock(mu);
  if (vm_cache.size() >= kMaxVmCache) vm_cache.clear();
  VmFacts f;
  f.shared = t.vm_is_shared_library;
  f.build_id = t.build_id;
  f.ruby_version = t.ruby_version;
  f.major = t.major;
  f.minor = t.minor;
  f.teeny = t.teeny;
  vm_cache[FileKey{std::get<0>(*key), std::get<1>(*key), std::get<2>(*key), std::get<3>(*key)}] = std::move(f);
}

std::vector<int> ListPids(const std::string& proc_root) {
  std::vector<int> pids;
  DIR* d = opendir(proc_root.c_str());
  if (!d) return pids;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    long v = strtol(e->d_name, &end, 10);
    if (end != e->d_name && *end == '\0' && v > 0 && v <= 0x7fffffff) pids.push_back(static_cast<int>(v));
  }
  closedir(d);
  std::sort(pids.begin(), pids.end());
  return pids;
}

std::vector<int> ListChildren(const std::string& proc_root, int pid) {
  std::vector<int> kids;
  const std::string task_dir = proc_root + "/" + std::to_string(pid) + "/task";
  for (int tid : ListPids(task_dir)) {
    std::string text;
    if (!ReadSmallFile(task_dir + "/" + std::to_string(tid) + "/children", &text, 1 << 20)) continue;
    const char* p = text.c_str();
    char* end = nullptr;
    for (long v = strtol(p, &end, 10); end != p; p = end, v = strtol(p, &end, 10)) {
      if (v > 0 && v <= 0x7fffffff) kids.push_back(static_cast<int>(v));
    }
  }
  std::sort(kids.begin(), kids.end());
  kids.erase(std::unique(kids.begin(), kids.end()), kids.end());
  return kids;
}

bool ProcessAlive(const std::string& proc_root, int pid) { return !ProcessEnding(ProcFs(proc_root), pid); }

}  // namespace rvbpfd
