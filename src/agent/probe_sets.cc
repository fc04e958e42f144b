#include "agent/probe_sets.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <utility>

#include "common/deadline.h"
#include "common/target_file.h"
#include "elf/debug_lookup.h"

namespace rvbpfd {
namespace {

double MsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

// Opens the binary O_PATH (no read access needed, nothing executed) and checks it is still the file `key` names.
Result<UniqueFd> OpenBinary(const std::string& path, const BinaryKey& key) {
  // Resolved inside the process's root: the probes go on the file the process maps, never on a host file an absolute
  // symlink in its root names.
  Result<FileFd> opened = OpenPathInRoot(path);
  if (!opened) return opened.error();
  UniqueFd fd(opened->Release());
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return Error(ErrorCode::kIo, ErrnoMessage("fstat " + path, errno));
  if (static_cast<uint64_t>(st.st_dev) != key.dev || static_cast<uint64_t>(st.st_ino) != key.ino) {
    return Error(ErrorCode::kIo, path + " was replaced while it was being probed");
  }
  return fd;
}

}  // namespace

void UniqueFd::Reset() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

ProbeSetManager::ProbeSetManager(ProbeBackend* backend, BinaryPreparer preparer, double max_overhead_pct,
                                 TrapCosts costs, uint64_t budget_window_ns,
                                 std::chrono::milliseconds prepare_timeout,
                                 std::function<bool(uint8_t event)> attaches)
    : backend_(backend),
      preparer_(std::move(preparer)),
      max_overhead_pct_(max_overhead_pct),
      costs_(costs),
      budget_window_ns_(budget_window_ns),
      prepare_timeout_(prepare_timeout),
      attaches_(std::move(attaches)) {}

Status ProbeSetManager::AttachSet(ProbeSet& set, const std::string& via_path) {
  Result<UniqueFd> fd = OpenBinary(via_path, set.key);
  if (!fd) return fd.error();
  set.file = std::move(fd.value());
  const auto start = std::chrono::steady_clock::now();
  for (int group : {set.low_group, set.high_group}) {
    if (group < 0) continue;
    if (Status st = backend_->ReattachGroup(group, set.attach_path()); !st) {
      backend_->DetachGroup(set.low_group);
      backend_->DetachGroup(set.high_group);
      set.file.Reset();
      return st.error();
    }
  }
  set.attach_ms = MsSince(start);
  set.paused = false;
  set.budget = std::make_unique<OverheadBudget>(max_overhead_pct_, costs_, budget_window_ns_);
  set.budget_traps = {};
  return Status::Ok();
}

Result<ProbeSetManager::Acquired> ProbeSetManager::Acquire(int pid, const RubyTarget& target, bool* first_failure) {
  if (first_failure) *first_failure = false;
  Result<BinaryKey> key = KeyOf(target);
  if (!key) return key.error();
  if (auto f = failed_.find(*key); f != failed_.end()) {
    if (std::chrono::steady_clock::now() - f->second.at < kFailedTtl) return f->second.error;
    failed_.erase(f);  // long enough ago: try again (a fixed analysis, a debug file installed since)
  }

  if (auto it = sets_.find(*key); it != sets_.end()) {
    ProbeSet& set = *it->second;
    if (set.active()) {
      set.pids.insert(pid);
      return Acquired{&set, false};
    }
    if (Status s = AttachSet(set, target.vm_host_path); !s) return s.error();
    set.pids.insert(pid);
    return Acquired{&set, true};
  }

  Result<PreparedBinary> prepared = PrepareBounded(target, *key, first_failure);
  if (!prepared) return prepared.error();
  Result<ProbeSet*> set = AddPrepared(pid, target, *key, std::move(prepared.value()));
  if (!set) return set.error();
  return Acquired{*set, true};
}

Result<BinaryKey> ProbeSetManager::KeyOf(const RubyTarget& target) {
  // The binary's file may lie on a mount that stopped answering since discovery: its stat is bounded too.
  struct StatAnswer {
    int err = 0;
    struct stat st {};
  };
  DeadlineResult<StatAnswer> stat_r = RunWithDeadline<StatAnswer>(
      kDiscoverTimeout,
      [path = target.vm_host_path] {
        StatAnswer a;
        a.err = StatInRoot(path, &a.st);
        return a;
      },
      cancel_);
  if (stat_r.status != DeadlineStatus::kDone) {
    return Error(ErrorCode::kIo, "stat " + target.vm_host_path + " did not answer within " +
                                     std::to_string(kDiscoverTimeout.count()) + " ms or was stopped; not probing it");
  }
  const struct stat& st = stat_r.value->st;
  if (const int err = stat_r.value->err; err != 0) {
    return Error(err == ENOENT || err == ESRCH ? ErrorCode::kNoSuchProcess : ErrorCode::kIo,
                 ErrnoMessage("stat " + target.vm_host_path, err));
  }
  return BinaryKey{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino), target.build_id,
                   DebugFileIdentity(target.vm_host_path, target.build_id)};
}

Result<PreparedBinary> ProbeSetManager::PrepareBounded(const RubyTarget& target, const BinaryKey& key,
                                                       bool* first_failure) {
  DeadlineResult<Result<PreparedBinary>> bounded = RunWithDeadline<Result<PreparedBinary>>(
      prepare_timeout_,
      [prep = preparer_, path = target.vm_host_path, version = target.ruby_version, parsed = target.vm_elf,
       handle = target.vm_fd] { return prep(path, version, parsed, handle); },
      cancel_);
  if (bounded.status == DeadlineStatus::kCancelled) {
    return Error(ErrorCode::kIo, "preparing " + target.vm_path + ": stopped by a signal");
  }
  if (bounded.status != DeadlineStatus::kDone) {
    ++prepare_timeouts_;
    Error e(ErrorCode::kIo, "preparing " + target.vm_path + " took more than " +
                                std::to_string(prepare_timeout_.count()) + " ms (its reads stall or its analysis runs "
                                "away); not probing it");
    if (bounded.status == DeadlineStatus::kTooManyStuck) {
      e = Error(ErrorCode::kIo, "not preparing " + target.vm_path + ": " + std::to_string(kMaxStuck) +
                                    " earlier preparations or inspections are still stuck in reads");
    } else if (bounded.status == DeadlineStatus::kThrew) {
      e = Error(ErrorCode::kInternal, "preparing " + target.vm_path + " failed: " + bounded.what);
    }
    // Remembered for this file: the next process of the same binary is refused at once, not made to wait again.
    if (bounded.status != DeadlineStatus::kTooManyStuck) RememberFailure(key, e);
    if (first_failure) *first_failure = true;
    return e;
  }
  Result<PreparedBinary>& prepared = *bounded.value;
  if (!prepared) {
    const ErrorCode code = prepared.error().code();
    // The site finder's own time cap (FindSites): counted with the preparations abandoned at the agent's bound.
    if (IsSiteAnalysisTimeout(prepared.error())) ++prepare_timeouts_;
    // Facts of the file (no symbols, a version without scheduler events) do not change: remember them. Anything
    // else (the process died mid-read, I/O) is retried with the next process of this binary.
    if (code == ErrorCode::kNoSymbols || code == ErrorCode::kUnsupportedVersion || code == ErrorCode::kNotRuby) {
      RememberFailure(key, prepared.error());
      if (first_failure) *first_failure = true;
    }
  }
  return std::move(prepared);
}

Result<ProbeSet*> ProbeSetManager::AddPrepared(int pid, const RubyTarget& target, const BinaryKey& key,
                                               PreparedBinary prepared) {
  auto set = std::make_unique<ProbeSet>();
  set->key = key;
  set->vm_path = target.vm_path;
  set->ruby_version = target.ruby_version;
  set->stacks = prepared.stacks;
  set->layout = prepared.live_layout;
  if (attaches_) {
    std::erase_if(prepared.sites.sites, [this](const ProbeSite& s) { return !attaches_(s.event); });
  }
  set->site_count = prepared.sites.sites.size();
  if (!MakeRoom(set->site_count)) {
    return Error(ErrorCode::kBpf, "no BPF slots free for " + target.vm_path + " (" + std::to_string(set->site_count) +
                                      " sites): every probed binary still has processes");
  }
  Result<UniqueFd> fd = OpenBinary(target.vm_host_path, key);
  if (!fd) return fd.error();
  set->file = std::move(fd.value());
  Result<uint8_t> bin = backend_->AddBinary(prepared.sites.offsets);
  if (!bin) return bin.error();
  set->binary = *bin;
  if (set->stacks) {
    if (Status s = backend_->SetWalkConfig(set->binary, WalkConfigFor(*set->stacks)); !s) {
      Recycle(*set);
      return s.error();
    }
  }
  if (Status s = AttachNew(*set, SplitSites(prepared.sites, set->binary), target.vm_path); !s) return s.error();
  set->budget = std::make_unique<OverheadBudget>(max_overhead_pct_, costs_, budget_window_ns_);
  set->pids.insert(pid);
  ProbeSet* raw = set.get();
  sets_.emplace(key, std::move(set));
  return raw;
}

Status ProbeSetManager::AttachNew(ProbeSet& set, const SplitSiteSpecs& split, const std::string& vm_path) {
  const auto start = std::chrono::steady_clock::now();
  // Low first, then high (SplitSites' order).
  for (auto [specs, group] : {std::pair{&split.low, &set.low_group}, std::pair{&split.high, &set.high_group}}) {
    if (specs->empty()) continue;
    Result<int> g = backend_->AttachGroup(set.attach_path(), *specs);
    if (!g) {
      Recycle(set);  // a failed attach gives back what it took
      return g.error().Wrap("attaching probes to " + vm_path);
    }
    *group = *g;
  }
  set.attach_ms = MsSince(start);
  return Status::Ok();
}

bool ProbeSetManager::MakeRoom(size_t sites) {
  for (;;) {
    const BpfSession::SlotUsage u = backend_->slot_usage();
    if (u.binaries < u.binaries_limit && u.cookies + sites <= u.cookies_limit) return true;
    auto lru = sets_.end();
    for (auto it = sets_.begin(); it != sets_.end(); ++it) {
      if (it->second->active()) continue;
      if (lru == sets_.end() || it->second->dormant_since < lru->second->dormant_since) lru = it;
    }
    if (lru == sets_.end()) return false;
    Recycle(*lru->second);
    sets_.erase(lru);
    ++recycled_sets_;
  }
}

void ProbeSetManager::Recycle(ProbeSet& set) {
  for (int* group : {&set.low_group, &set.high_group}) {
    if (*group >= 0) backend_->ReleaseGroup(std::exchange(*group, -1));
  }
  // Nothing of it is attached any more: its walker layout can go, and its index to the next binary.
  (void)backend_->RemoveBinary(set.binary);
  set.file.Reset();
}

void ProbeSetManager::Expire(std::chrono::steady_clock::time_point now) {
  for (auto it = sets_.begin(); it != sets_.end();) {
    if (!it->second->active() && now - it->second->dormant_since >= kDormantTtl) {
      Recycle(*it->second);
      it = sets_.erase(it);
      ++recycled_sets_;
    } else {
      ++it;
    }
  }
  std::erase_if(failed_, [now](const auto& kv) { return now - kv.second.at >= kFailedTtl; });
}

void ProbeSetManager::RememberFailure(const BinaryKey& key, const Error& e) {
  if (failed_.size() >= max_failed_ && !failed_.contains(key)) {
    auto oldest = std::min_element(failed_.begin(), failed_.end(),
                                   [](const auto& a, const auto& b) { return a.second.at < b.second.at; });
    failed_.erase(oldest);
  }
  failed_.insert_or_assign(key, Failure{e, std::chrono::steady_clock::now()});
}

void ProbeSetManager::Release(int pid, ProbeSet* set) {
  if (set == nullptr || set->pids.erase(pid) == 0 || set->active()) return;
  backend_->DetachGroup(set->low_group);
  backend_->DetachGroup(set->high_group);
  set->file.Reset();
  set->paused = false;
  set->dormant_since = std::chrono::steady_clock::now();
}

size_t ProbeSetManager::active_sets() const {
  size_t n = 0;
  for (const auto& [key, set] : sets_) n += set->active() ? 1 : 0;
  return n;
}

const ProbeSet* ProbeSetManager::Find(const BinaryKey& key) const {
  auto it = sets_.find(key);
  return it == sets_.end() ? nullptr : it->second.get();
}

std::vector<ProbeSet*> ProbeSetManager::ActiveSets() {
  std::vector<ProbeSet*> out;
  for (auto& [key, set] : sets_) {
    if (set->active()) out.push_back(set.get());
  }
  return out;
}

}  // namespace rvbpfd
