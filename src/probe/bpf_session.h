// BpfSession owns the loaded BPF object (skeleton), its maps, the uprobe links and the ring buffer reader.
//
// Threading: a BpfSession is used from one thread (the daemon's main loop); the ring buffer callback runs on that
// thread inside Poll().
#ifndef RVBPFD_SRC_PROBE_BPF_SESSION_H_
#define RVBPFD_SRC_PROBE_BPF_SESSION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/error.h"
#include "probe/id_pool.h"
#include "probe/target_slots.h"
#include "rvbpfd/abi.h"

struct rvbpfd_bpf;
struct ring_buffer;
struct bpf_link;

namespace rvbpfd {

struct SessionOptions {
  // Ring buffer size in bytes; rounded up to a power of two and at least one page. 4 MiB holds ~100k records
  // (40 bytes + 8 bytes header each), i.e. ~1 s of the heaviest transition rate we measured.
  uint32_t ring_buffer_bytes = 4u << 20;
  // Force one link per site even when the kernel has multi-uprobe links (tests the fallback path).
  bool force_single_links = false;
  // Load the process lifecycle tracepoints (exec, exit of a watched process) for the fleet agent; the
  // single-process recorder leaves them out of the kernel entirely. WatchProcesses() attaches them.
  bool watch_processes = false;
  // The programs' switches (which events carry stacks, sampling, exec watching, the cold-hit gap), fixed at load:
  // they become read-only data the verifier folds into the programs. Without `sampling` the sampling program is not
  // loaded at all (StartSampling then fails).
  rv_config config{};
  // Where the kernel's task_struct layout is cached by kernel build ID (probe/kernel_layout.h); "": no cache. Only
  // sampling and watch_processes need that layout.
  std::string cache_dir;
};

// One site to attach: its file offset in the VM binary and what the BPF program needs to know about it.
struct SiteSpec {
  uint64_t file_offset;
  rv_site site;
  // A return probe (uretprobe) on the function starting at file_offset, instead of a probe on the instruction. Used
  // only for functions that never block or switch native threads (the GC fallback sites, src/sites): under M:N a
  // function that returns on another native thread makes the kernel SIGILL the target.
  bool return_probe = false;
};

// Indexes 0..cookies.size()-1 ordered by hits[cookie] (cookies beyond `hits` count as 0), ascending (coldest first)
// or descending; ties keep their order. How BpfSession::Detach / Reattach order a group's sites.
std::vector<size_t> OrderSitesByHits(std::span<const uint64_t> cookies, std::span<const uint64_t> hits,
                                     bool hottest_first);

// A set of uprobes attached together (one multi-uprobe link, or one link per site on older kernels). Detaching and
// reattaching a group is how --max-overhead pauses the high-rate sites. Destroying it detaches it and returns its
// cookies to the session, which hands them to a later group.
class SiteGroup {
 public:
  ~SiteGroup();
  SiteGroup(const SiteGroup&) = delete;
  SiteGroup& operator=(const SiteGroup&) = delete;
  bool attached() const { return multi_link_fd_ >= 0 || multi_ret_link_fd_ >= 0 || !links_.empty(); }
  size_t size() const { return offsets_.size(); }
  // The BPF cookies of the group's sites (indexes into BpfSession::ReadSiteHits).
  const std::vector<uint64_t>& cookies() const { return cookies_; }

 private:
  friend class BpfSession;
  SiteGroup() = default;
  void Detach();

  std::string path_;
  int pid_ = -1;
  std::vector<uint64_t> offsets_;
  std::vector<uint64_t> cookies_;
  std::vector<bool> return_probe_;  // per site (SiteSpec::return_probe)
  int multi_link_fd_ = -1;
  int multi_ret_link_fd_ = -1;  // the group's return probes, when it has any (a multi link is all entry or all return)
  std::vector<bpf_link*> links_;      // single-site links, parallel to offsets_ (when attached that way)
  std::vector<uint64_t> hits_;        // ReadSiteHits at the last Detach, by cookie (empty: keep the given order)
  std::shared_ptr<IdPool> cookie_pool_;  // where cookies_ go back once the links are gone
};

class BpfSession {
 public:
  using RecordCallback = std::function<void(const rv_record&)>;
  // A record that carries a stack (RV_REC_HAS_STACK: gvl_released with --stacks, samples). `frames` points into the
  // ring buffer and is valid only during the call; `gvl` is a sample's GVL reading (RV_REC_HAS_GVL), or a contended
  // READY's holder (RV_REC_HAS_HOLDER: only `holder` is set, and the stack is the holder's), else nullptr.
  using StackCallback = std::function<void(const rv_record&, const rv_stack_header&,
                                           std::span<const rv_ruby_frame> frames, const rv_gvl_reading* gvl)>;

  // Loads the BPF object. Errors: kNoPrivilege (EPERM/EACCES: needs root or CAP_BPF+CAP_PERFMON), kBpf otherwise.
  // With rv_config.sampling, the sampler is verified on a thread of its own, in parallel with the uprobe program and
  // while the caller attaches the uprobes (rather than after the uprobe program); StartSampling waits for it and
  // reports its load error.
  static Result<std::unique_ptr<BpfSession>> Open(const SessionOptions& options, RecordCallback on_record);
  ~BpfSession();
  BpfSession(const BpfSession&) = delete;
  BpfSession& operator=(const BpfSession&) = delete;

  // Registers a VM binary's struct offsets; returns its index for rv_site.binary (the lowest free one: indexes come
  // back through RemoveBinary). Its walker layout starts invalid (no stacks) until SetWalkConfig.
  Result<uint8_t> AddBinary(const rv_offsets& offsets);
  // Frees an index of AddBinary once no group of that binary is attached (its groups released): its walker layout
  // is made invalid at once, so nothing walks with it until a later AddBinary reuses the index.
  Status RemoveBinary(uint8_t binary);
  // Indexes and cookies in use, and how many there are: what a long-running agent recycles.
  struct SlotUsage {
    size_t binaries = 0, binaries_limit = 0, cookies = 0, cookies_limit = 0;
  };
  SlotUsage slot_usage() const;
  // Per-binary walker layout (index from AddBinary). Without it no stacks are taken for that binary.
  Status SetWalkConfig(uint8_t binary, const rv_walk_config& config);
  // Records with a stack go to `on_stack` instead of the record callback (without one, the stack is ignored and
  // samples are dropped).
  void SetStackCallback(StackCallback on_stack) { on_stack_ = std::move(on_stack); }
  // Opens a software cpu-clock perf event on every online CPU firing `hz` times per second of CPU time and attaches
  // the sampling program to each (first waiting for its load, above). The BPF side keeps only the targets' threads
  // (pid filter).
  Status StartSampling(int hz);
  // How samples of process `pid` find their EC (proc_ec map, bpf/ruby_ec.h; src/stacks/ec_route.h computes it).
  // Without it that process's samples use only current_th. RemovePid removes it too.
  Status SetProcEc(uint32_t pid, const rv_proc_ec& route);
  // Adds a process to the BPF pid filter, its trap count from zero (also when it was in it already). `pidns`: its pid
  // namespace when it is not the host's (zero otherwise), so BPF translates the namespace tids its VM writes
  // (rv_pidns); `threads`: the (namespace tid, host tid) pairs of its threads known now, for events about a thread
  // that has not hit a probe itself since (others are learned by BPF).
  Status AddPid(uint32_t pid, const rv_pidns& pidns = {}, std::span<const std::pair<uint32_t, uint32_t>> threads = {});
  // Removes it from the filter, with its EC route and its namespace tids.
  Status RemovePid(uint32_t pid);
  // Marks pid's filter entry RV_TARGET_FOLLOW_ONLY (a followed process that is not traced: its forks and execs are
  // still reported, nothing else). Fails with kNoSuchProcess when pid is not in the filter (it exited).
  Status MarkFollowOnly(uint32_t pid);

  // Writes the sites into the sites map (assigning the lowest free cookies, their hit counts from zero) and attaches
  // uprobes at their file offsets in `path`.
  // pid > 0 restricts the uprobes to that process in the kernel as well; -1 attaches for every process mapping the
  // file (the BPF pid filter still applies).
  Result<std::unique_ptr<SiteGroup>> Attach(const std::string& path, const std::vector<SiteSpec>& sites, int pid);
  // Detaches a group's uprobes (the target stops paying for the traps) and attaches them again.
  //
  // Order matters, because a detaching site stops running BPF before its breakpoint is gone: the kernel removes a
  // uprobe's consumer first and then its breakpoints, after an RCU grace period (milliseconds to tens of ms on a
  // busy VM) for the first uprobe of a multi link and for every single-site link. Meanwhile that site traps at full
  // cost and unseen by the trap counters. `site_hits` (ReadSiteHits, by cookie) orders the work: single-site links
  // are destroyed hottest first (the hot breakpoints go before the long tail of grace periods, which bounds the
  // unseen traps of a trap-bound target; docs/design.md has the measurement), and the next Reattach puts the coldest
  // site first in a multi link (the one whose grace period is spent unseen).
  void Detach(SiteGroup& group, std::span<const uint64_t> site_hits = {});
  Status Reattach(SiteGroup& group);
  // The same at another path to the same file (the fleet agent attaches through /proc/self/fd/N of an O_PATH fd it
  // holds, since the /proc/PID/root path of the process that brought the binary dies with that process).
  Status Reattach(SiteGroup& group, const std::string& path);
  // Attaches the exec, exit and fork tracepoints (needs SessionOptions::watch_processes). Exec records also need
  // rv_config.watch_exec. Records arrive through the record callback with kind RV_EV_PROC_EXEC / _EXIT / _FORK.
  Status WatchProcesses();

  // Drains the ring buffer, waiting at most timeout_ms for data (Wait, then Consume). Returns records consumed or a
  // kBpf error.
  Result<int> Poll(int timeout_ms);
  // Waits at most timeout_ms for BPF to wake the ring (it does so only once the ring is a quarter full,
  // bpf/rvbpfd.bpf.c) or for the WakePollOn fd; consumes nothing. True when either woke it: the ring then stays
  // readable until it is consumed.
  Result<bool> Wait(int timeout_ms);
  // Hands the records the ring holds now to the handlers, without waiting, for at most kMaxConsumeNs (then the rest
  // stays for the next call). Returns records consumed.
  Result<int> Consume();
  // Poll also ends its wait as soon as `fd` is readable (the target's pidfd: its exit is seen at once rather than at
  // the end of a wait). Not owned; -1 removes it.
  void WakePollOn(int fd) { wake_fd_ = fd; }
  // ProbeBackend::SetHeldPid.
  Status SetHeldPid(uint32_t pid);
  // Folds the per-CPU counters (each as include/rvbpfd/counters.h says: a sum or a maximum).
  rv_counters ReadCounters() const;
  // Events lost to a full ring so far (ReadCounters().dropped, counted apart): read from the drop_count map's shared
  // page, so no syscall, when the kernel let it be mapped; else through ReadCounters.
  uint64_t EventsDropped() const;
  bool drop_count_mapped() const { return drop_page_ != nullptr; }
  // Probe hits per cookie (index = cookie, for every cookie assigned so far), summed over CPUs; hits include those
  // BPF discarded. Empty when the map cannot be read.
  std::vector<uint64_t> ReadSiteHits() const;
  // Uprobe hits of each process added and not removed since, counted from its AddPid (discarded hits included; none
  // after BPF took it out of the filter at its exit), with how many were cold (rv_config.cold_gap_ns) or stepped and
  // the ns its stacks took: what each process has paid. Read from the pid_traps map's shared pages: no syscall, no
  // allocation. nullopt for a pid not in the filter.
  std::optional<rv_pid_traps> PidTraps(uint32_t pid) const;
  bool uses_multi_links() const { return multi_supported_; }

 private:
  BpfSession() = default;
  Status AttachGroup(SiteGroup& group);
  // Deletes pid's entries of the ns_tids map.
  Status ForgetNamespaceTids(uint32_t pid);
  static int OnSample(void* ctx, void* data, size_t size);
  // Makes every map of `into` (an instance of the object not loaded yet) maps_skel_'s, but for its .rodata.
  Status ShareMaps(rvbpfd_bpf* into);
  // Opens the sampler's instance on the shared maps and starts its load on sampler_loader_.
  Status StartSamplerLoad(const SessionOptions& options);
  // Joins sampler_loader_ (once) and turns its result into sampler_status_.
  void FinishSamplerLoad();

  // Three instances of the one BPF object: maps_skel_ loads no program and owns the maps; skel_ (the uprobe flavour
  // and the lifecycle tracepoints) and sampler_skel_ (only rv_sample; null without sampling) load their programs on
  // those maps. skel_->maps.* are the same maps as maps_skel_'s (duplicated fds).
  rvbpfd_bpf* maps_skel_ = nullptr;
  rvbpfd_bpf* skel_ = nullptr;
  rvbpfd_bpf* sampler_skel_ = nullptr;
  std::thread sampler_loader_;          // loading sampler_skel_ (rvbpfd_bpf__load), until FinishSamplerLoad
  int sampler_load_err_ = 0;            // its result (negative errno), written by sampler_loader_
  Status sampler_status_;
  ring_buffer* ring_ = nullptr;
  // libbpf's consume reads for as long as BPF refills the ring: on a loaded host (or with records slow to handle, deep
  // stacks of new frames) one call could last for good, and its caller's timed work (cuts, metrics, signals) with
  // it. Consume stops after kMaxConsumeNs (checked after every record: one deep stack of new frames can take long to
  // name); the rest stays in the ring for
  // the next call.
  static constexpr uint64_t kMaxConsumeNs = 100'000'000;
  static constexpr uint32_t kConsumeCheckEvery = 1;
  uint64_t consume_deadline_ns_ = 0;
  uint32_t consume_records_ = 0;
  bool ConsumeTimeUp();
  RecordCallback on_record_;
  StackCallback on_stack_;
  std::vector<bpf_link*> perf_links_;  // owned, one per CPU; each owns its cpu-clock perf event fd
  std::vector<bpf_link*> proc_links_;  // owned: the lifecycle tracepoints (WatchProcesses)
  bool watch_processes_ = false;
  bool multi_supported_ = false;
  bool force_single_ = false;
  // Site cookies, shared with the groups that return theirs when they go (possibly after the session: hence shared).
  std::shared_ptr<IdPool> cookies_ = std::make_shared<IdPool>(RV_MAX_SITES);
  IdPool binaries_{RV_MAX_BINARIES};
  int ncpus_ = 1;
  int wake_fd_ = -1;  // WakePollOn
  // The drop_count map's page, mapped read-only (the BPF programs add to it); null when mmap failed.
  void* drop_page_ = nullptr;
  size_t drop_page_bytes_ = 0;
  // The pid_traps map's pages, mapped read-write (Open fails without them); target_slots_ says whose each slot is.
  rv_pid_traps* traps_pages_ = nullptr;
  size_t traps_pages_bytes_ = 0;
  TargetSlots target_slots_{RV_MAX_TARGETS};
  rv_kernel_layout kernel_layout_{};  // zero unless sampling or watch_processes (Open)
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_PROBE_BPF_SESSION_H_
