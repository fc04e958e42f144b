#include "agent/agent_env.h"

#include <time.h>
#include <unistd.h>

#include "session/stack_resolver.h"
#include "session/vm_binary.h"
#include "sink/dir_sink.h"
#include "sink/push_sink.h"
#include "stacks/ec_route.h"
#include "stacks/memory_reader.h"

namespace rvbpfd {
namespace {

class ResolverFrameSource : public FrameSource {
 public:
  explicit ResolverFrameSource(std::unique_ptr<StackResolver> resolver) : resolver_(std::move(resolver)) {}
  void Resolve(std::span<const rv_ruby_frame> frames, uint64_t gc_epoch, std::vector<FrameInfo>* out) override {
    resolver_->set_epoch(gc_epoch);
    resolver_->Resolve(frames, out);
  }
  SharedStack ResolveStack(std::span<const rv_ruby_frame> frames, uint64_t gc_epoch, StackEnd end) override {
    resolver_->set_epoch(gc_epoch);
    return resolver_->ResolveStack(frames, end);
  }
  void SetMemoryAccount(MemoryBudget::Account* account) override { resolver_->set_memory_account(account); }
  void ClearCache() override { resolver_->ClearCache(); }
  size_t cache_bytes() const override { return resolver_->cache_bytes(); }

 private:
  std::unique_ptr<StackResolver> resolver_;
};

}  // namespace

SharedStack FrameSource::ResolveStack(std::span<const rv_ruby_frame> frames, uint64_t gc_epoch, StackEnd end) {
  std::vector<FrameInfo> named;
  Resolve(frames, gc_epoch, &named);
  auto out = std::make_shared<std::vector<SharedFrame>>();
  out->reserve(named.size() + 1);
  for (FrameInfo& f : named) out->push_back(std::make_shared<const FrameInfo>(std::move(f)));
  if (end != StackEnd::kWhole) out->push_back(StackEndFrame(end));
  return out;
}

std::unique_ptr<FrameSource> MakeResolverFrameSource(std::unique_ptr<StackResolver> resolver) {
  return std::make_unique<ResolverFrameSource>(std::move(resolver));
}

uint64_t SystemAgentClock::MonotonicNs() const {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

int64_t SystemAgentClock::RealtimeNs() const {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000ll + ts.tv_nsec;
}

std::unique_ptr<FrameSource> MakeProcessFrameSource(int pid, const RubyTarget& target, const ProbeSet& set,
                                                    const std::string& proc_root) {
  (void)proc_root;
  if (!set.stacks) return nullptr;
  // C function names need the runtime address of ruby_global_symbols: its ELF vaddr plus the load bias, which the
  // lowest mapping of the VM (from discovery) and the ELF's lowest PT_LOAD (from the binary's EC route) give without
  // reading the ELF again per process.
  uint64_t gsym = 0, vm_ptr = 0;
  if (target.vm_load_start != 0) {
    const uint64_t bias = EcRouteLoadBias(set.stacks->ec_route, target.vm_load_start);
    if (set.stacks->global_symbols_vaddr != 0) gsym = set.stacks->global_symbols_vaddr + bias;
    if (set.stacks->current_vm_ptr_vaddr != 0) vm_ptr = set.stacks->current_vm_ptr_vaddr + bias;
  }
  return MakeResolverFrameSource(std::make_unique<StackResolver>(std::make_unique<ProcessMemoryReader>(pid),
                                                                 set.stacks->offsets, gsym, vm_ptr));
}

Result<AgentSinks> MakeAgentSinks(const AgentConfig& config) {
  AgentSinks sinks;
  if (!config.output_dir.empty()) {
    Result<std::unique_ptr<DirSink>> d = DirSink::Create(config.output_dir, config.output_max_mb << 20,
                                                         /*max_queue=*/256, config.output_service_max_mb << 20);
    if (!d) return d.error();
    sinks.dir = std::move(d.value());
  }
  if (!config.push_url.empty()) {
    PushSinkOptions o;
    o.url = config.push_url;
    o.max_queue = config.push_queue;
    // Agents restarted together (a DaemonSet rollout) must not retry in lockstep: seed the jitter per process.
    timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    o.jitter_seed = (static_cast<uint64_t>(getpid()) << 32) ^ static_cast<uint64_t>(ts.tv_nsec) ^
                    static_cast<uint64_t>(ts.tv_sec);
    Result<std::unique_ptr<PushSink>> p = PushSink::Create(std::move(o));
    if (!p) return p.error();
    sinks.push = std::move(p.value());
  }
  return sinks;
}

}  // namespace rvbpfd
