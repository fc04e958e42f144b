// A ProbeBackend for unit tests of the fleet agent and the recorder: it records what was asked of BPF (groups and
// their cookies, detach order, pids, wake fds, releases) and delivers injected records from Consume (Poll), without
// BPF or root.
#ifndef RVBPFD_TESTS_PROBE_FAKE_PROBE_BACKEND_H_
#define RVBPFD_TESTS_PROBE_FAKE_PROBE_BACKEND_H_

#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "probe/bpf_session.h"
#include "probe/id_pool.h"
#include "probe/probe_backend.h"

namespace rvbpfd::testing {

class FakeProbeBackend : public ProbeBackend {
 public:
  struct Group {
    std::string path;
    std::vector<SiteSpec> sites;
    bool attached = true;
    int attaches = 1;
    int pid = -1;                   // AttachGroup's pid
    std::vector<uint64_t> cookies;  // one per site, assigned in attach order across groups (as BpfSession does)
    bool released = false;
  };
  // One DetachGroup: the group and the file offsets of its sites in the order they were detached (hottest first by
  // the hits it was given, as BpfSession::Detach orders single-site links).
  struct Detach {
    int group;
    std::vector<uint64_t> order;
    std::vector<uint64_t> site_hits;  // the hits it was given
  };

  void SetHandlers(RecordHandler on_record, StackHandler on_stack) override {
    on_record_ = std::move(on_record);
    on_stack_ = std::move(on_stack);
  }
  // Indexes and cookies as BpfSession hands them out: lowest free first, within the BPF arrays' limits.
  Result<uint8_t> AddBinary(const rv_offsets&) override {
    std::optional<std::vector<uint32_t>> id = binary_ids_.Take(1);
    if (!id) return Error(ErrorCode::kBpf, "too many distinct Ruby VM binaries probed at once");
    ++binaries;
    return static_cast<uint8_t>(id->front());
  }
  Status RemoveBinary(uint8_t binary) override {
    removed_binaries.push_back(binary);
    binary_ids_.GiveOne(binary);
    return Status::Ok();
  }
  BpfSession::SlotUsage slot_usage() const override {
    return {binary_ids_.in_use(), binary_ids_.limit(), cookie_ids_.in_use(), cookie_ids_.limit()};
  }
  Status SetWalkConfig(uint8_t, const rv_walk_config&) override { return Status::Ok(); }
  using ProbeBackend::AttachGroup;
  Result<int> AttachGroup(const std::string& path, const std::vector<SiteSpec>& sites, int pid) override {
    Group g{path, sites};
    g.pid = pid;
    if (attach_calls++ == refuse_attach_call) return Error(ErrorCode::kBpf, "attach refused (test)");
    std::optional<std::vector<uint32_t>> cookies = cookie_ids_.Take(sites.size());
    if (!cookies) return Error(ErrorCode::kBpf, "too many probe sites attached at once");
    g.cookies.assign(cookies->begin(), cookies->end());
    groups.push_back(std::move(g));
    return static_cast<int>(groups.size() - 1);
  }
  void DetachGroup(int g, std::span<const uint64_t> site_hits) override {
    if (g < 0) return;
    Group& grp = groups.at(static_cast<size_t>(g));
    if (grp.attached) {
      Detach d{g, {}, std::vector<uint64_t>(site_hits.begin(), site_hits.end())};
      for (size_t i : OrderSitesByHits(grp.cookies, site_hits, /*hottest_first=*/true)) {
        d.order.push_back(grp.sites[i].file_offset);
      }
      detaches.push_back(std::move(d));
    }
    grp.attached = false;
  }
  void DetachGroup(int g) override { DetachGroup(g, ReadSiteHits()); }
  Status ReattachGroup(int g, const std::string& path) override {
    Group& grp = groups.at(static_cast<size_t>(g));
    if (!grp.attached) {
      grp.attached = true;
      grp.path = path;
      ++grp.attaches;
    }
    return Status::Ok();
  }
  bool GroupAttached(int g) const override { return g >= 0 && groups.at(static_cast<size_t>(g)).attached; }
  std::vector<uint64_t> GroupCookies(int g) const override {
    if (g < 0 || static_cast<size_t>(g) >= groups.size() || groups[static_cast<size_t>(g)].released) return {};
    return groups[static_cast<size_t>(g)].cookies;
  }
  // May run on two threads at once (for two groups), as the interface allows.
  void ReleaseGroup(int g) override {
    std::lock_guard<std::mutex> l(release_mu_);
    if (g < 0 || static_cast<size_t>(g) >= groups.size()) return;
    Group& grp = groups[static_cast<size_t>(g)];
    if (!grp.released) cookie_ids_.Give(std::span<const uint64_t>(grp.cookies));
    grp.attached = false;
    grp.released = true;
    released.push_back(g);
  }
  Status AddPid(uint32_t pid, const rv_pidns& ns, std::span<const std::pair<uint32_t, uint32_t>> threads) override {
    pids.insert(pid);
    pidns[pid] = ns;
    ns_threads[pid].assign(threads.begin(), threads.end());
    pid_traps[pid] = {};  // as BPF: the count starts over
    return Status::Ok();
  }
  Status RemovePid(uint32_t pid) override {
    pids.erase(pid);
    pid_traps.erase(pid);
    return Status::Ok();
  }
  Status StartSampling(int hz) override {
    sampling_hz = hz;
    return Status::Ok();
  }
  // The first ec_pending_polls polls leave their installer pending (the VM not relocated yet); then every installer is
  // installed, or refused with ec_refusal when it is set (as BPF refuses a full proc_ec map).
  ProcessEcInstaller::State PollEc(ProcessEcInstaller& installer) override {
    ++ec_polls;
    if (ec_polls <= ec_pending_polls) return installer.state();
    if (ec_refusal) return installer.Failed(*ec_refusal);
    return installer.Installed();
  }
  Status WatchProcesses() override {
    watching = true;
    return Status::Ok();
  }
  // Calls before_poll(timeout_ms) (the test's script: advance its clock, inject, change counters), never waiting.
  // Woken when at least wake_at_queued records are queued (BPF's quarter-full wakeup; SIZE_MAX: never).
  Result<bool> Wait(int timeout_ms) override {
    ++polls;
    if (before_poll) before_poll(timeout_ms);
    return queue_.size() >= wake_at_queued;
  }
  // Delivers everything queued.
  Result<int> Consume() override {
    ++consumes;
    int n = 0;
    std::vector<Queued> q;
    q.swap(queue_);
    for (Queued& r : q) {
      if (r.has_stack && on_stack_) {
        rv_stack_header h{};
        h.nframes = static_cast<uint32_t>(r.frames.size());
        h.flags = r.header_flags;
        on_stack_(r.rec, h, r.frames, r.gvl ? &*r.gvl : nullptr);
      } else if (!r.has_stack || r.rec.kind != RV_EV_SAMPLE) {
        on_record_(r.rec);
      }
      ++n;
    }
    return n;
  }
  void WakePollOn(int fd) override { wake_fds.push_back(fd); }
  rv_counters ReadCounters() const override { return counters; }
  std::vector<uint64_t> ReadSiteHits() const override { return site_hits; }
  std::optional<rv_pid_traps> PidTraps(uint32_t pid) const override {
    if (!pids.count(pid)) return std::nullopt;
    auto it = pid_traps.find(pid);
    return it == pid_traps.end() ? rv_pid_traps{} : it->second;
  }
  bool uses_multi_links() const override { return multi_links; }

  // Hits of a process that became no record (BPF discarded them), e.g. rb_mutex_lock entered by IO#write.
  void DiscardedTraps(uint32_t pid, uint64_t n) {
    if (pids.count(pid)) pid_traps[pid].traps += n;
  }
  // Hits (already counted) that BPF found cold: no trap on their CPU for rv_config.cold_gap_ns before them.
  void ColdTraps(uint32_t pid, uint64_t n) {
    if (pids.count(pid)) pid_traps[pid].cold += n;
  }
  // Hits of a single-stepped site (counted as traps too).
  void SteppedTraps(uint32_t pid, uint64_t n) {
    if (pids.count(pid)) {
      pid_traps[pid].traps += n;
      pid_traps[pid].stepped += n;
    }
  }

  // Injection.
  // A record as BPF fills it, its trap counted as BPF counts it: a scheduler event is one trap of a watched process;
  // exec/exit/fork records are not.
  rv_record Counted(uint64_t ts, uint32_t pid, uint16_t kind, uint64_t th, uint32_t tid) {
    if (kind < RV_EV_KIND_COUNT && pids.count(pid)) ++pid_traps[pid].traps;
    rv_record r{};
    r.ts_ns = ts;
    r.pid = pid;
    r.kind = kind;
    r.th = th;
    r.tid = tid;
    return r;
  }
  // A record without a stack. tid: the host tid of the thread the record is about (0: unknown).
  void Record(uint64_t ts, uint32_t pid, uint16_t kind, uint64_t th = 0, uint32_t tid = 0) {
    queue_.push_back(Queued{Counted(ts, pid, kind, th, tid), false, {}});
  }
  // A sample (or stacked event) whose frames are the given addresses.
  // `gvl`: the GVL reading the sample carries (RV_REC_HAS_GVL), or a READY's holder (RV_REC_HAS_HOLDER: only
  // `holder` counts, and the frames are the holder's), none by default.
  void Stack(uint64_t ts, uint32_t pid, uint16_t kind, uint64_t th, std::vector<uint64_t> addrs,
             uint32_t flags = 0, uint32_t tid = 0, std::optional<rv_gvl_reading> gvl = std::nullopt) {
    rv_record r = Counted(ts, pid, kind, th, tid);
    const uint32_t with = kind == RV_EV_THREAD_READY ? RV_REC_HAS_HOLDER : RV_REC_HAS_GVL;
    r.flags = flags | RV_REC_HAS_STACK | (gvl ? with : 0u);
    std::vector<rv_ruby_frame> frames;
    for (uint64_t a : addrs) {
      rv_ruby_frame f{};
      f.addr = a;
      frames.push_back(f);
    }
    queue_.push_back(Queued{r, true, frames, gvl});
  }
  // A stacked record with the walker's frames as given (newest first) and the walk's header flags
  // (RV_STACK_F_TRUNCATED, RV_STACK_F_NO_EC); `flags` are the record's (RV_REC_IN_GC, ...).
  void StackFrames(uint64_t ts, uint32_t pid, uint16_t kind, uint64_t th, std::vector<rv_ruby_frame> frames,
                   uint32_t flags = 0, uint32_t header_flags = 0) {
    rv_record r = Counted(ts, pid, kind, th, 0);
    r.flags = flags | RV_REC_HAS_STACK;
    queue_.push_back(Queued{r, true, std::move(frames), std::nullopt, header_flags});
  }
  size_t attached_groups() const {
    size_t n = 0;
    for (const Group& g : groups) n += g.attached ? 1 : 0;
    return n;
  }

  std::vector<Group> groups;
  std::vector<Detach> detaches;  // every DetachGroup of an attached group, in call order
  std::vector<int> released;     // ReleaseGroup's groups, in call order
  std::vector<int> wake_fds;     // every WakePollOn's fd
  std::set<uint32_t> pids;
  std::map<uint32_t, rv_pid_traps> pid_traps;  // uprobe hits per watched pid
  std::map<uint32_t, rv_pidns> pidns;                                            // AddPid's namespace, per pid
  std::map<uint32_t, std::vector<std::pair<uint32_t, uint32_t>>> ns_threads;  // AddPid's (ns tid, host tid)
  rv_counters counters{};
  std::vector<uint64_t> site_hits;  // ReadSiteHits, by cookie
  std::function<void(int timeout_ms)> before_poll;
  bool multi_links = true;
  int binaries = 0;                       // AddBinary calls that succeeded
  int attach_calls = 0;                   // AttachGroup calls
  int refuse_attach_call = -1;            // the AttachGroup call (counting from 0) that fails; -1: none
  std::vector<uint8_t> removed_binaries;  // RemoveBinary's indexes, in call order
  int sampling_hz = 0;
  int ec_polls = 0;
  int ec_pending_polls = 0;
  std::optional<std::string> ec_refusal;
  int polls = 0;     // Wait calls (one per Poll)
  int consumes = 0;  // Consume calls (one per Poll)
  size_t wake_at_queued = 1;  // Wait is woken with this many records queued (SIZE_MAX: never)
  bool watching = false;

 private:
  struct Queued {
    rv_record rec;
    bool has_stack;
    std::vector<rv_ruby_frame> frames;
    std::optional<rv_gvl_reading> gvl;
    uint32_t header_flags = 0;  // rv_stack_header.flags
  };
  RecordHandler on_record_;
  StackHandler on_stack_;
  std::vector<Queued> queue_;
  IdPool binary_ids_{RV_MAX_BINARIES};
  IdPool cookie_ids_{RV_MAX_SITES};
  std::mutex release_mu_;
};

}  // namespace rvbpfd::testing

#endif  // RVBPFD_TESTS_PROBE_FAKE_PROBE_BACKEND_H_
