#include "probe/bpf_session.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/bpf.h>
#include <linux/perf_event.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <unordered_map>

#include "common/capabilities.h"
#include "probe/kernel_layout.h"
#include "rvbpfd.skel.h"

namespace rvbpfd {
namespace {

// BPF_TRACE_UPROBE_MULTI (kernel >= 6.6). Debian 12's uapi headers and libbpf 1.1 predate it, so the value and the
// link_create layout below are spelled out here from the kernel ABI (they are stable uapi).
constexpr uint32_t kBpfTraceUprobeMulti = 48;
// link_create.uprobe_multi.flags (multi_flags below): the link's probes are return probes.
constexpr uint32_t kBpfFUprobeMultiReturn = 1;

struct UprobeMultiLinkAttr {
  uint32_t prog_fd;
  uint32_t target_fd;
  uint32_t attach_type;
  uint32_t flags;
  uint64_t path;
  uint64_t offsets;
  uint64_t ref_ctr_offsets;
  uint64_t cookies;
  uint32_t cnt;
  uint32_t multi_flags;
  uint32_t pid;
};
static_assert(offsetof(UprobeMultiLinkAttr, path) == 16);
static_assert(offsetof(UprobeMultiLinkAttr, cnt) == 48);
static_assert(offsetof(UprobeMultiLinkAttr, pid) == 56);
static_assert(sizeof(UprobeMultiLinkAttr) <= sizeof(union bpf_attr));

// libbpf's own diagnostics are only useful with --verbose; rvbpfd turns failures into one-line errors itself.
bool g_libbpf_verbose = false;
int LibbpfPrint(enum libbpf_print_level level, const char* fmt, va_list args) {
  if (!g_libbpf_verbose && level != LIBBPF_WARN) return 0;
  if (!g_libbpf_verbose) return 0;
  return vfprintf(stderr, fmt, args);
}

Error BpfError(std::string_view step, int err) {
  if (err == EPERM || err == EACCES) {
    return Error(ErrorCode::kNoPrivilege,
                 ErrnoMessage(step, err) + "; " + PrivilegeHint({kCapBpf, kCapPerfmon}));
  }
  return Error(ErrorCode::kBpf, ErrnoMessage(step, err));
}

// A failed load (rvbpfd_bpf__load's negative errno) of `programs` ("the BPF programs", "the sampling program"). From
// BPF_PROG_LOAD, EACCES is the verifier refusing a program, not a permission problem.
Error LoadError(const std::string& programs, int neg_err) {
  if (neg_err == -EACCES) {
    return Error(ErrorCode::kBpf, ErrnoMessage("the kernel's BPF verifier rejected " + programs, EACCES) +
                                      "; rerun with RVBPFD_LIBBPF_DEBUG=1 for the verifier log");
  }
  return BpfError("loading " + programs + " (rvbpfd.bpf.o)", -neg_err);
}

// Whether the kernel has multi-uprobe links, asked the way an attach would: a one-instruction program of the
// uprobe-multi attach type, linked to "/". A kernel that knows the link type gets as far as the path and refuses a
// directory with EBADF; one that does not refuses the attach type itself (EINVAL). Costs two syscalls and no
// verification worth the name, where loading the real program only to find it unusable costs a full verification.
bool KernelHasUprobeMultiLinks() {
  const struct bpf_insn insns[] = {
      {.code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = BPF_REG_0, .src_reg = 0, .off = 0, .imm = 0},  // r0 = 0
      {.code = BPF_JMP | BPF_EXIT, .dst_reg = 0, .src_reg = 0, .off = 0, .imm = 0},                 // exit
  };
  LIBBPF_OPTS(bpf_prog_load_opts, load_opts,
              .expected_attach_type = static_cast<enum bpf_attach_type>(kBpfTraceUprobeMulti));
  const int prog_fd = bpf_prog_load(BPF_PROG_TYPE_KPROBE, "rv_multi_probe", "GPL", insns, 2, &load_opts);
  if (prog_fd < 0) return false;
  const char* path = "/";
  const uint64_t offset = 0, cookie = 0;
  UprobeMultiLinkAttr multi{};
  multi.prog_fd = static_cast<uint32_t>(prog_fd);
  multi.attach_type = kBpfTraceUprobeMulti;
  multi.path = reinterpret_cast<uint64_t>(path);
  multi.offsets = reinterpret_cast<uint64_t>(&offset);
  multi.cookies = reinterpret_cast<uint64_t>(&cookie);
  multi.cnt = 1;
  union bpf_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  std::memcpy(&attr, &multi, sizeof(multi));
  const int link_fd = static_cast<int>(syscall(__NR_bpf, BPF_LINK_CREATE, &attr, sizeof(attr)));
  const int err = errno;
  if (link_fd >= 0) close(link_fd);  // not expected ("/" is no file), but then the link type exists too
  close(prog_fd);
  return link_fd >= 0 || err == EBADF;
}

// The read-only data every instance of the object is loaded with: the run's switches and the kernel's layout.
void SetReadOnlyData(rvbpfd_bpf* skel, const rv_config& config, const rv_kernel_layout& kernel) {
  skel->rodata->rv_cfg = config;
  skel->rodata->rv_kernel = kernel;
}

uint32_t RoundRingSize(uint32_t bytes) {
  const uint32_t page = static_cast<uint32_t>(sysconf(_SC_PAGESIZE));
  uint32_t size = page;
  while (size < bytes && size < (1u << 30)) size <<= 1;
  return size;
}

}  // namespace

SiteGroup::~SiteGroup() {
  Detach();  // no program runs for these cookies any more once their links are closed
  if (cookie_pool_) cookie_pool_->Give(std::span<const uint64_t>(cookies_));
}

void SiteGroup::Detach() {
  if (multi_link_fd_ >= 0) {
    close(multi_link_fd_);
    multi_link_fd_ = -1;
  }
  if (multi_ret_link_fd_ >= 0) {
    close(multi_ret_link_fd_);
    multi_ret_link_fd_ = -1;
  }
  for (bpf_link* link : links_) bpf_link__destroy(link);
  links_.clear();
}

std::vector<size_t> OrderSitesByHits(std::span<const uint64_t> cookies, std::span<const uint64_t> hits,
                                     bool hottest_first) {
  std::vector<size_t> order(cookies.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto hits_of = [&](size_t i) { return cookies[i] < hits.size() ? hits[cookies[i]] : uint64_t{0}; };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return hottest_first ? hits_of(a) > hits_of(b) : hits_of(a) < hits_of(b);
  });
  return order;
}

void BpfSession::Detach(SiteGroup& group, std::span<const uint64_t> site_hits) {
  if (!site_hits.empty()) group.hits_.assign(site_hits.begin(), site_hits.end());
  if (group.links_.size() == group.offsets_.size() && !group.hits_.empty()) {
    std::vector<bpf_link*> ordered;
    for (size_t i : OrderSitesByHits(group.cookies_, group.hits_, /*hottest_first=*/true)) {
      ordered.push_back(group.links_[i]);
    }
    group.links_ = std::move(ordered);  // SiteGroup::Detach destroys them in this order
  }
  group.Detach();
}

Result<std::unique_ptr<BpfSession>> BpfSession::Open(const SessionOptions& options, RecordCallback on_record) {
  g_libbpf_verbose = getenv("RVBPFD_LIBBPF_DEBUG") != nullptr;
  libbpf_set_print(LibbpfPrint);
  std::unique_ptr<BpfSession> session(new BpfSession());
  session->on_record_ = std::move(on_record);
  session->force_single_ = options.force_single_links;
  session->watch_processes_ = options.watch_processes;
  session->ncpus_ = libbpf_num_possible_cpus();
  if (session->ncpus_ <= 0) return BpfError("counting possible CPUs", -session->ncpus_);

  // The task_struct offsets that the sampler and the fork tracepoint read (rv_kernel_layout); the uprobes read none.
  if (options.config.sampling || options.watch_processes) {
    Result<rv_kernel_layout> layout = LoadKernelLayout(options.cache_dir);
    if (!layout.ok()) return layout.error();
    session->kernel_layout_ = *layout;
  }

  // The maps first, once: an instance of the object with no program to load creates them (no verification). The
  // programs are other instances on those maps (ShareMaps), so the sampler verifies on a thread of its own while the
  // uprobe program does on this one.
  rvbpfd_bpf* maps = rvbpfd_bpf__open();
  if (!maps) return BpfError("opening the BPF object", errno);
  session->maps_skel_ = maps;
  bpf_map__set_max_entries(maps->maps.events, RoundRingSize(options.ring_buffer_bytes));
  // Two stack scratch slots per possible CPU, uprobes and samples apart (bpf/rvbpfd.bpf.c says why).
  bpf_map__set_max_entries(maps->maps.stack_scratch, 2 * static_cast<uint32_t>(session->ncpus_));
  SetReadOnlyData(maps, options.config, session->kernel_layout_);
  bpf_program* prog;
  bpf_object__for_each_program(prog, maps->obj) bpf_program__set_autoload(prog, false);
  if (int err = rvbpfd_bpf__load(maps); err != 0) return BpfError("creating the BPF maps (rvbpfd.bpf.o)", -err);
  {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void* p = mmap(nullptr, page, PROT_READ, MAP_SHARED, bpf_map__fd(maps->maps.drop_count), 0);
    if (p != MAP_FAILED) {
      session->drop_page_ = p;
      session->drop_page_bytes_ = page;
    }
    // Writable: AddPid zeroes a slot before it hands it to a process.
    const size_t traps_bytes = (sizeof(rv_pid_traps) * RV_MAX_TARGETS + page - 1) / page * page;
    void* t = mmap(nullptr, traps_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, bpf_map__fd(maps->maps.pid_traps), 0);
    if (t == MAP_FAILED) return BpfError("mapping the per-process trap counts (pid_traps map)", errno);
    session->traps_pages_ = static_cast<rv_pid_traps*>(t);
    session->traps_pages_bytes_ = traps_bytes;
  }
  if (options.config.sampling) {
    if (Status st = session->StartSamplerLoad(options); !st) return st.error();
  }

  // Only the programs this run uses are loaded (each costs a verification): one of the two uprobe flavours, the
  // sampler only when sampling, the lifecycle tracepoints only for the agent. The multi-uprobe flavour where the
  // kernel has its links; should its load still fail, the object is loaded again with the per-site flavour.
  const bool multi_links = !options.force_single_links && KernelHasUprobeMultiLinks();
  for (int attempt = 0; attempt < 2; ++attempt) {
    const bool want_multi = attempt == 0 && multi_links;
    rvbpfd_bpf* skel = rvbpfd_bpf__open();
    if (!skel) return BpfError("opening the BPF object", errno);
    if (Status st = session->ShareMaps(skel); !st) {
      rvbpfd_bpf__destroy(skel);
      return st.error();
    }
    SetReadOnlyData(skel, options.config, session->kernel_layout_);
    if (!options.watch_processes) {
      bpf_program__set_autoload(skel->progs.rv_proc_exec, false);
      bpf_program__set_autoload(skel->progs.rv_proc_exit, false);
      bpf_program__set_autoload(skel->progs.rv_proc_fork, false);
    }
    bpf_program__set_autoload(skel->progs.rv_sample, false);  // its own instance (StartSamplerLoad)
    if (want_multi) {
      bpf_program__set_expected_attach_type(skel->progs.rv_site_multi,
                                            static_cast<enum bpf_attach_type>(kBpfTraceUprobeMulti));
      bpf_program__set_autoload(skel->progs.rv_site_single, false);
    } else {
      bpf_program__set_autoload(skel->progs.rv_site_multi, false);
    }
    int err = rvbpfd_bpf__load(skel);
    if (err == 0) {
      session->skel_ = skel;
      session->multi_supported_ = want_multi;
      break;
    }
    rvbpfd_bpf__destroy(skel);
    if (err == -EACCES || err == -EPERM || !want_multi) return LoadError("the BPF programs", err);
  }
  if (!session->skel_) return Error(ErrorCode::kBpf, "loading the BPF programs failed");

  session->ring_ = ring_buffer__new(bpf_map__fd(session->skel_->maps.events), &BpfSession::OnSample, session.get(),
                                    nullptr);
  if (!session->ring_) return BpfError("opening the BPF ring buffer", errno);
  return session;
}

Status BpfSession::ShareMaps(rvbpfd_bpf* into) {
  bpf_map* map;
  bpf_object__for_each_map(map, into->obj) {
    if (bpf_map__is_internal(map)) continue;  // .rodata: each instance has its own, with the same values
    const bpf_map* shared = bpf_object__find_map_by_name(maps_skel_->obj, bpf_map__name(map));
    if (shared == nullptr) {
      return Error(ErrorCode::kInternal, std::string("the BPF map ") + bpf_map__name(map) + " has no shared instance");
    }
    if (int err = bpf_map__reuse_fd(map, bpf_map__fd(shared)); err != 0) {
      return BpfError(std::string("sharing the BPF map ") + bpf_map__name(map), -err);
    }
  }
  return Status::Ok();
}

Status BpfSession::StartSamplerLoad(const SessionOptions& options) {
  rvbpfd_bpf* s = rvbpfd_bpf__open();
  if (!s) return BpfError("opening the BPF object for the sampler", errno);
  sampler_skel_ = s;
  if (Status st = ShareMaps(s); !st) return st;
  SetReadOnlyData(s, options.config, kernel_layout_);
  bpf_program* prog;
  bpf_object__for_each_program(prog, s->obj) bpf_program__set_autoload(prog, prog == s->progs.rv_sample);
  sampler_loader_ = std::thread([this, s] { sampler_load_err_ = rvbpfd_bpf__load(s); });
  return Status::Ok();
}

void BpfSession::FinishSamplerLoad() {
  if (!sampler_loader_.joinable()) return;
  sampler_loader_.join();
  if (sampler_load_err_ != 0) sampler_status_ = LoadError("the sampling program", sampler_load_err_);
}

BpfSession::~BpfSession() {
  FinishSamplerLoad();
  for (bpf_link* link : proc_links_) bpf_link__destroy(link);
  for (bpf_link* link : perf_links_) bpf_link__destroy(link);
  if (ring_) ring_buffer__free(ring_);
  if (sampler_skel_) rvbpfd_bpf__destroy(sampler_skel_);
  if (skel_) rvbpfd_bpf__destroy(skel_);
  if (drop_page_ != nullptr) munmap(drop_page_, drop_page_bytes_);
  if (traps_pages_ != nullptr) munmap(traps_pages_, traps_pages_bytes_);
  if (maps_skel_) rvbpfd_bpf__destroy(maps_skel_);
}

namespace {
uint64_t CoarseMonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}
}  // namespace

bool BpfSession::ConsumeTimeUp() {
  return ++consume_records_ % kConsumeCheckEvery == 0 && CoarseMonotonicNs() > consume_deadline_ns_;
}

int BpfSession::OnSample(void* ctx, void* data, size_t size) {
  auto* self = static_cast<BpfSession*>(ctx);
  // After the record is handled: a negative return makes libbpf keep this record consumed and stop (Consume).
  const int done = self->ConsumeTimeUp() ? -ECANCELED : 0;
  if (size < sizeof(rv_record)) return done;  // never produced by our program; ignore rather than misread
  rv_record rec;
  std::memcpy(&rec, data, sizeof(rec));
  if (rec.flags & RV_REC_HAS_STACK) {
    // A sample's GVL reading sits between the record and the stack header (struct rv_sample_record), a contended
    // READY's holder likewise (struct rv_holder_record: the stack is the holder's); the callback gets the holder as
    // a reading that names it alone.
    const bool has_gvl = rec.kind == RV_EV_SAMPLE && (rec.flags & RV_REC_HAS_GVL) != 0;
    const bool has_holder = rec.kind == RV_EV_THREAD_READY && (rec.flags & RV_REC_HAS_HOLDER) != 0;
    const size_t gvl_bytes = has_gvl ? sizeof(rv_gvl_reading) : has_holder ? sizeof(rv_holder_info) : 0;
    const size_t fixed = sizeof(rv_record) + gvl_bytes + sizeof(rv_stack_header);
    if (size >= fixed && self->on_stack_) {
      const auto* bytes = static_cast<const uint8_t*>(data);
      rv_gvl_reading gvl{};
      if (has_gvl) std::memcpy(&gvl, bytes + sizeof(rv_record), sizeof(gvl));
      if (has_holder) {
        rv_holder_info holder;
        std::memcpy(&holder, bytes + sizeof(rv_record), sizeof(holder));
        gvl.holder = holder.holder;
      }
      rv_stack_header hdr;
      std::memcpy(&hdr, bytes + sizeof(rv_record) + gvl_bytes, sizeof(hdr));
      // Trust the entry size over the header's count: never read past what the ring holds.
      const size_t n = std::min<size_t>(hdr.nframes, (size - fixed) / sizeof(rv_ruby_frame));
      // Ring entries are 8-byte aligned and the frames start at offset 56 (336 after a GVL reading, 72 after a
      // holder), so they can be viewed in place.
      const auto* frames = reinterpret_cast<const rv_ruby_frame*>(bytes + fixed);
      self->on_stack_(rec, hdr, std::span<const rv_ruby_frame>(frames, n), has_gvl || has_holder ? &gvl : nullptr);
      return done;
    }
    if (rec.kind == RV_EV_SAMPLE) return done;  // nobody wants samples
  }
  self->on_record_(rec);
  return done;
}

Status BpfSession::SetWalkConfig(uint8_t binary, const rv_walk_config& config) {
  uint32_t key = binary;
  if (bpf_map_update_elem(bpf_map__fd(skel_->maps.walk_config), &key, &config, BPF_ANY) != 0) {
    return BpfError("writing the stack walker offsets map", errno);
  }
  return Status::Ok();
}

Status BpfSession::StartSampling(int hz) {
  if (hz <= 0 || hz > 10000) return Error(ErrorCode::kInternal, "sampling frequency out of range");
  if (sampler_skel_ == nullptr) {
    return Error(ErrorCode::kInternal, "the session was opened without rv_config.sampling: no sampling program");
  }
  FinishSamplerLoad();
  if (!sampler_status_) return sampler_status_;
  const long ncpu = sysconf(_SC_NPROCESSORS_CONF);
  for (long cpu = 0; cpu < ncpu; ++cpu) {
    perf_event_attr attr{};
    attr.size = sizeof(attr);
    attr.type = PERF_TYPE_SOFTWARE;
    attr.config = PERF_COUNT_SW_CPU_CLOCK;
    // cpu-clock counts nanoseconds of CPU time, so a fixed period of 1e9/hz ns samples a busy CPU exactly hz times a
    // second (a frequency-mode event would let the kernel adapt the period).
    attr.sample_period = 1'000'000'000ull / static_cast<uint64_t>(hz);
    attr.disabled = 0;
    int fd = static_cast<int>(syscall(__NR_perf_event_open, &attr, -1, static_cast<int>(cpu), -1, PERF_FLAG_FD_CLOEXEC));
    if (fd < 0) {
      if (errno == ENODEV) continue;  // offline CPU
      return BpfError("opening a cpu-clock perf event on CPU " + std::to_string(cpu), errno);
    }
    bpf_link* link = bpf_program__attach_perf_event(sampler_skel_->progs.rv_sample, fd);
    if (!link) {
      const int err = errno;
      close(fd);
      return BpfError("attaching the sampling program on CPU " + std::to_string(cpu), err);
    }
    perf_links_.push_back(link);  // the link owns the event's fd: destroying it closes the fd too
  }
  if (perf_links_.empty()) return Error(ErrorCode::kBpf, "no CPU accepted a cpu-clock perf event");
  return Status::Ok();
}

Result<uint8_t> BpfSession::AddBinary(const rv_offsets& offsets) {
  std::optional<std::vector<uint32_t>> id = binaries_.Take(1);
  if (!id) {
    return Error(ErrorCode::kBpf, "too many distinct Ruby VM binaries probed at once (limit " +
                                      std::to_string(RV_MAX_BINARIES) + ")");
  }
  uint32_t key = id->front();
  const rv_walk_config no_stacks{};  // valid = 0: a reused index must not walk with its last binary's layout
  if (bpf_map_update_elem(bpf_map__fd(skel_->maps.walk_config), &key, &no_stacks, BPF_ANY) != 0 ||
      bpf_map_update_elem(bpf_map__fd(skel_->maps.offsets), &key, &offsets, BPF_ANY) != 0) {
    const int err = errno;
    binaries_.GiveOne(key);
    return BpfError("writing the struct offsets map", err);
  }
  return static_cast<uint8_t>(key);
}

Status BpfSession::RemoveBinary(uint8_t binary) {
  uint32_t key = binary;
  const rv_walk_config no_stacks{};
  if (bpf_map_update_elem(bpf_map__fd(skel_->maps.walk_config), &key, &no_stacks, BPF_ANY) != 0) {
    return BpfError("clearing the stack walker offsets of a released binary", errno);
  }
  binaries_.GiveOne(key);
  return Status::Ok();
}

BpfSession::SlotUsage BpfSession::slot_usage() const {
  return SlotUsage{binaries_.in_use(), binaries_.limit(), cookies_->in_use(), cookies_->limit()};
}

Status BpfSession::AddPid(uint32_t pid, const rv_pidns& pidns,
                          std::span<const std::pair<uint32_t, uint32_t>> threads) {
  // A reused pid must not inherit another process's namespace tids.
  if (Status st = ForgetNamespaceTids(pid); !st) return st;
  if (pidns.ino != 0) {
    const int fd = bpf_map__fd(skel_->maps.ns_tids);
    for (const auto& [ns_tid, host_tid] : threads) {
      const rv_ns_tid_key key{pid, ns_tid};
      if (bpf_map_update_elem(fd, &key, &host_tid, BPF_ANY) != 0) {
        return BpfError("seeding the namespace tids of pid " + std::to_string(pid), errno);
      }
    }
  }
  const int fd = bpf_map__fd(skel_->maps.target_pids);
  const bool had_slot = target_slots_.assigned().contains(pid);
  std::optional<uint32_t> slot = target_slots_.Assign(pid);
  if (!slot) {
    // Every slot taken: free those of processes BPF took out of the filter at their exit and nobody removed since.
    target_slots_.ReleaseIf([fd](uint32_t p) {
      rv_target t;
      return bpf_map_lookup_elem(fd, &p, &t) != 0 && errno == ENOENT;
    });
    slot = target_slots_.Assign(pid);
  }
  if (!slot) {
    return BpfError("adding pid " + std::to_string(pid) + " to the BPF pid filter (" +
                        std::to_string(RV_MAX_TARGETS) + " processes already recorded)",
                    ENOSPC);
  }
  // Its count starts over, before BPF can find the slot through the filter.
  rv_pid_traps& traps = traps_pages_[*slot];
  __atomic_store_n(&traps.traps, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&traps.cold, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&traps.stepped, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&traps.stack_ns, 0, __ATOMIC_RELAXED);
  const rv_target target{*slot, 0, pidns};
  if (bpf_map_update_elem(fd, &pid, &target, BPF_ANY) != 0) {
    const int err = errno;
    if (!had_slot) target_slots_.Release(pid);  // a slot it had may still be named by its filter entry
    return BpfError("adding pid " + std::to_string(pid) + " to the BPF pid filter", err);
  }
  return Status::Ok();
}

Status BpfSession::ForgetNamespaceTids(uint32_t pid) {
  const int fd = bpf_map__fd(skel_->maps.ns_tids);
  std::vector<rv_ns_tid_key> mine;
  rv_ns_tid_key key{}, next{};
  const rv_ns_tid_key* prev = nullptr;
  // One pass over the keys (BPF may add entries meanwhile; those of a pid not in the filter are never added).
  for (size_t n = 0; n <= bpf_map__max_entries(skel_->maps.ns_tids); ++n) {
    if (bpf_map_get_next_key(fd, prev, &next) != 0) break;
    if (next.tgid == pid) mine.push_back(next);
    key = next;
    prev = &key;
  }
  for (const rv_ns_tid_key& k : mine) {
    if (bpf_map_delete_elem(fd, &k) != 0 && errno != ENOENT) {
      return BpfError("removing the namespace tids of pid " + std::to_string(pid), errno);
    }
  }
  return Status::Ok();
}

Status BpfSession::RemovePid(uint32_t pid) {
  if (bpf_map_delete_elem(bpf_map__fd(skel_->maps.target_pids), &pid) != 0 && errno != ENOENT) {
    return BpfError("removing pid " + std::to_string(pid) + " from the BPF pid filter", errno);
  }
  target_slots_.Release(pid);
  // A reused pid must not inherit this process's EC route.
  if (bpf_map_delete_elem(bpf_map__fd(skel_->maps.proc_ec), &pid) != 0 && errno != ENOENT) {
    return BpfError("removing pid " + std::to_string(pid) + " from the BPF proc_ec map", errno);
  }
  return ForgetNamespaceTids(pid);
}

Status BpfSession::MarkFollowOnly(uint32_t pid) {
  const int fd = bpf_map__fd(skel_->maps.target_pids);
  rv_target target;
  if (bpf_map_lookup_elem(fd, &pid, &target) != 0) {
    return Error(ErrorCode::kNoSuchProcess, "pid " + std::to_string(pid) + " is not in the BPF pid filter");
  }
  target.flags |= RV_TARGET_FOLLOW_ONLY;
  // BPF_EXIST: a process that exited meanwhile (BPF removed it) is not put back.
  if (bpf_map_update_elem(fd, &pid, &target, BPF_EXIST) != 0) {
    return BpfError("marking pid " + std::to_string(pid) + " follow-only in the BPF pid filter", errno);
  }
  return Status::Ok();
}

Status BpfSession::SetProcEc(uint32_t pid, const rv_proc_ec& route) {
  if (bpf_map_update_elem(bpf_map__fd(skel_->maps.proc_ec), &pid, &route, BPF_ANY) != 0) {
    return BpfError("setting the EC route of pid " + std::to_string(pid), errno);
  }
  return Status::Ok();
}

Result<std::unique_ptr<SiteGroup>> BpfSession::Attach(const std::string& path, const std::vector<SiteSpec>& sites,
                                                      int pid) {
  if (sites.empty()) return Error(ErrorCode::kInternal, "no probe sites to attach in " + path);
  std::optional<std::vector<uint32_t>> cookies = cookies_->Take(sites.size());
  if (!cookies) {
    return Error(ErrorCode::kBpf, "too many probe sites attached at once (limit " + std::to_string(RV_MAX_SITES) +
                                      ", " + std::to_string(cookies_->in_use()) + " in use)");
  }
  std::unique_ptr<SiteGroup> group(new SiteGroup());
  group->cookies_.assign(cookies->begin(), cookies->end());
  group->cookie_pool_ = cookies_;  // from here on, a failure returns them with the group
  group->path_ = path;
  group->pid_ = pid;
  const int sites_fd = bpf_map__fd(skel_->maps.sites);
  const int hits_fd = bpf_map__fd(skel_->maps.site_hits);
  const std::vector<uint64_t> no_hits(static_cast<size_t>(ncpus_), 0);  // one per possible CPU
  for (size_t i = 0; i < sites.size(); ++i) {
    const uint32_t cookie = (*cookies)[i];
    if (bpf_map_update_elem(sites_fd, &cookie, &sites[i].site, BPF_ANY) != 0) {
      return BpfError("writing the probe sites map", errno);
    }
    // A reused cookie's count starts over: the budget and the detach order read hits by cookie.
    if (bpf_map_update_elem(hits_fd, &cookie, no_hits.data(), BPF_ANY) != 0) {
      return BpfError("clearing the probe hits map", errno);
    }
    group->offsets_.push_back(sites[i].file_offset);
    group->return_probe_.push_back(sites[i].return_probe);
  }
  Status st = AttachGroup(*group);
  if (!st) return st.error();
  return group;
}

Status BpfSession::Reattach(SiteGroup& group) {
  if (group.attached()) return Status::Ok();
  return AttachGroup(group);
}

Status BpfSession::Reattach(SiteGroup& group, const std::string& path) {
  if (group.attached()) return Status::Ok();
  group.path_ = path;
  return AttachGroup(group);
}

Status BpfSession::WatchProcesses() {
  if (!watch_processes_) return Error(ErrorCode::kInternal, "the session was opened without watch_processes");
  if (!proc_links_.empty()) return Status::Ok();
  for (bpf_program* prog : {skel_->progs.rv_proc_exec, skel_->progs.rv_proc_exit, skel_->progs.rv_proc_fork}) {
    bpf_link* link = bpf_program__attach(prog);
    if (!link) {
      const int err = errno;
      for (bpf_link* l : proc_links_) bpf_link__destroy(l);
      proc_links_.clear();
      return BpfError(std::string("attaching the ") + bpf_program__name(prog) +
                          " raw tracepoint (sched_process_exec, sched_process_exit, sched_process_fork)",
                      err);
    }
    proc_links_.push_back(link);
  }
  return Status::Ok();
}

Status BpfSession::AttachGroup(SiteGroup& group) {
  if (multi_supported_ && !force_single_) {
    // A multi link is all entry probes or all return probes (BPF_F_UPROBE_MULTI_RETURN is per link): one of each.
    int err = 0;
    // Coldest site first (see Detach): its uprobe is the one whose breakpoints outlive its consumer the longest.
    const std::vector<size_t> order = OrderSitesByHits(group.cookies_, group.hits_, /*hottest_first=*/false);
    for (bool ret : {false, true}) {
      std::vector<uint64_t> offsets, cookies;
      for (size_t i : order) {
        if (group.return_probe_[i] != ret) continue;
        offsets.push_back(group.offsets_[i]);
        cookies.push_back(group.cookies_[i]);
      }
      if (offsets.empty()) continue;
      union bpf_attr attr;
      std::memset(&attr, 0, sizeof(attr));
      UprobeMultiLinkAttr multi{};
      multi.prog_fd = static_cast<uint32_t>(bpf_program__fd(skel_->progs.rv_site_multi));
      multi.attach_type = kBpfTraceUprobeMulti;
      multi.multi_flags = ret ? kBpfFUprobeMultiReturn : 0;
      multi.path = reinterpret_cast<uint64_t>(group.path_.c_str());
      multi.offsets = reinterpret_cast<uint64_t>(offsets.data());
      multi.cookies = reinterpret_cast<uint64_t>(cookies.data());
      multi.cnt = static_cast<uint32_t>(offsets.size());
      multi.pid = group.pid_ > 0 ? static_cast<uint32_t>(group.pid_) : 0;
      std::memcpy(&attr, &multi, sizeof(multi));
      int fd = static_cast<int>(syscall(__NR_bpf, BPF_LINK_CREATE, &attr, sizeof(attr)));
      if (fd < 0) {
        err = errno;
        group.Detach();
        break;
      }
      (ret ? group.multi_ret_link_fd_ : group.multi_link_fd_) = fd;
    }
    if (err == 0) return Status::Ok();
    // Only the multi-uprobe program is loaded (Open asked the kernel for its links): no per-site fallback here.
    std::string what = "attaching " + std::to_string(group.offsets_.size()) + " uprobes to " + group.path_;
    if (err == EINVAL || err == EOPNOTSUPP) what += " with a multi-uprobe link (--single-links uses one per site)";
    return BpfError(what, err);
  }
  for (size_t i = 0; i < group.offsets_.size(); ++i) {
    const bool ret = group.return_probe_[i];
    LIBBPF_OPTS(bpf_uprobe_opts, opts, .bpf_cookie = group.cookies_[i], .retprobe = ret);
    bpf_link* link = bpf_program__attach_uprobe_opts(skel_->progs.rv_site_single, group.pid_ > 0 ? group.pid_ : -1,
                                                     group.path_.c_str(), group.offsets_[i], &opts);
    if (!link) {
      const int err = errno;
      group.Detach();
      char hex[32];
      snprintf(hex, sizeof(hex), "0x%llx", static_cast<unsigned long long>(group.offsets_[i]));
      return BpfError(std::string("attaching a ") + (ret ? "return probe" : "uprobe") + " at " + group.path_ + "+" +
                          hex,
                      err);
    }
    group.links_.push_back(link);
  }
  return Status::Ok();
}

Status BpfSession::SetHeldPid(uint32_t pid) {
  const uint32_t key = 0;
  const rv_held value{0, pid, 0};
  if (bpf_map_update_elem(bpf_map__fd(maps_skel_->maps.held), &key, &value, BPF_ANY) != 0) {
    return BpfError("setting the held process (held map)", errno);
  }
  return Status::Ok();
}

Result<int> BpfSession::Poll(int timeout_ms) {
  // BPF wakes the epoll only when the ring is a quarter full, so the wait is mostly a timed sleep and the records are
  // taken by Consume, which reads whatever is there without waiting for a wakeup.
  if (Result<bool> woke = Wait(timeout_ms); !woke) return woke.error();
  return Consume();
}

Result<bool> BpfSession::Wait(int timeout_ms) {
  // The ring's epoll fd is itself pollable: one wait for the ring and the wake fd.
  pollfd fds[2] = {{ring_buffer__epoll_fd(ring_), POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  const int n = poll(fds, wake_fd_ >= 0 ? 2 : 1, timeout_ms);
  if (n < 0) {
    if (errno == EINTR) return false;
    return BpfError("polling the BPF ring buffer", errno);
  }
  return n > 0;
}

Result<int> BpfSession::Consume() {
  consume_deadline_ns_ = CoarseMonotonicNs() + kMaxConsumeNs;
  consume_records_ = 0;
  const int m = ring_buffer__consume(ring_);
  // Stopped at the time bound: what was read counts; the ring holds more (callers read again).
  if (m == -ECANCELED) return static_cast<int>(std::max<uint32_t>(consume_records_, 1));
  if (m < 0) return BpfError("reading the BPF ring buffer", -m);
  return m;
}

rv_counters BpfSession::ReadCounters() const {
  rv_counters total{};
  std::vector<rv_counters> per_cpu(static_cast<size_t>(ncpus_));
  uint32_t zero = 0;
  if (bpf_map_lookup_elem(bpf_map__fd(skel_->maps.counters), &zero, per_cpu.data()) != 0) return total;
  for (const rv_counters& c : per_cpu) {
#define RV_FOLD_SUM(a, b) ((a) + (b))
#define RV_FOLD_MAX(a, b) std::max((a), (b))
#define RV_FOLD_COUNTER(field, fold, label, ...) total.field = fold(total.field, c.field);
    RV_COUNTERS(RV_FOLD_COUNTER)
#undef RV_FOLD_COUNTER
#undef RV_FOLD_MAX
#undef RV_FOLD_SUM
  }
  return total;
}

uint64_t BpfSession::EventsDropped() const {
  if (drop_page_ == nullptr) return ReadCounters().dropped;
  // Written by BPF programs on any CPU with atomic adds: an atomic load sees each add whole.
  return __atomic_load_n(static_cast<const uint64_t*>(drop_page_), __ATOMIC_RELAXED);
}

std::optional<rv_pid_traps> BpfSession::PidTraps(uint32_t pid) const {
  const auto it = target_slots_.assigned().find(pid);
  if (it == target_slots_.assigned().end()) return std::nullopt;
  // BPF programs add on any CPU with atomic adds: an atomic load sees each add whole.
  const rv_pid_traps& t = traps_pages_[it->second];
  return rv_pid_traps{__atomic_load_n(&t.traps, __ATOMIC_RELAXED), __atomic_load_n(&t.cold, __ATOMIC_RELAXED),
                      __atomic_load_n(&t.stepped, __ATOMIC_RELAXED), __atomic_load_n(&t.stack_ns, __ATOMIC_RELAXED)};
}

std::vector<uint64_t> BpfSession::ReadSiteHits() const {
  // The recorder reads this at every budget check (every 1-5 ms), so one batch syscall for all assigned cookies;
  // one lookup per cookie only if the kernel refuses batches.
  const uint32_t n = cookies_->high_water();
  const size_t ncpu = static_cast<size_t>(ncpus_);
  std::vector<uint64_t> hits(n, 0);
  if (n == 0) return hits;
  const int fd = bpf_map__fd(skel_->maps.site_hits);
  std::vector<uint32_t> keys(n);
  std::vector<uint64_t> values(n * ncpu);  // per key, one u64 per possible CPU
  uint32_t out_batch = 0, count = n;
  LIBBPF_OPTS(bpf_map_batch_opts, opts);
  const int err = bpf_map_lookup_batch(fd, nullptr, &out_batch, keys.data(), values.data(), &count, &opts);
  if ((err == 0 || err == -ENOENT) && count == n) {
    for (uint32_t i = 0; i < count; ++i) {
      if (keys[i] >= n) continue;
      for (size_t c = 0; c < ncpu; ++c) hits[keys[i]] += values[i * ncpu + c];
    }
    return hits;
  }
  std::vector<uint64_t> per_cpu(ncpu);
  for (uint32_t cookie = 0; cookie < n; ++cookie) {
    if (bpf_map_lookup_elem(fd, &cookie, per_cpu.data()) != 0) return {};
    for (uint64_t v : per_cpu) hits[cookie] += v;
  }
  return hits;
}

}  // namespace rvbpfd
