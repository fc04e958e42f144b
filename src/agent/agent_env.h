// What the fleet agent's core (agent.h) depends on, injectable: the probe backend, the clocks, how a binary is
// prepared, how frames of a process are named, and the sinks. RunAgent (agent_main.h) wires the real ones; the unit
// tests wire fakes, so the agent's decisions run without BPF, root or a network.
#ifndef RVBPFD_SRC_AGENT_AGENT_ENV_H_
#define RVBPFD_SRC_AGENT_AGENT_ENV_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "agent/probe_sets.h"
#include "common/error.h"
#include "common/memory_budget.h"
#include "ops/agent_config.h"
#include "ops/log.h"
#include "ops/metrics.h"
#include "probe/probe_backend.h"
#include "session/stack_resolver.h"
#include "sink/sink.h"
#include "stacks/memory_reader.h"
#include "target/target.h"
#include "trace/stacks.h"

namespace rvbpfd {

// CLOCK_MONOTONIC (the clock of BPF's record timestamps) and CLOCK_REALTIME, in ns.
class AgentClock {
 public:
  virtual ~AgentClock() = default;
  virtual uint64_t MonotonicNs() const = 0;
  virtual int64_t RealtimeNs() const = 0;
};

class SystemAgentClock : public AgentClock {
 public:
  uint64_t MonotonicNs() const override;
  int64_t RealtimeNs() const override;
};

// Names the walker frames of one process (leaf first out). `gc_epoch` counts the process's GC_ENTER records and
// drops: cached names are revalidated after a GC (StackResolver's rule).
class FrameSource {
 public:
  virtual ~FrameSource() = default;
  virtual void Resolve(std::span<const rv_ruby_frame> frames, uint64_t gc_epoch, std::vector<FrameInfo>* out) = 0;
  // The same stack as one shared immutable object with `end`'s marker frame (StackEndFrame) at its oldest end: what
  // the agent's per-record path uses (no string copies, and one object for a repeated stack, when the source caches).
  // Never null. The default wraps Resolve's result.
  virtual SharedStack ResolveStack(std::span<const rv_ruby_frame> frames, uint64_t gc_epoch, StackEnd end);
  // The agent's memory budget: the source charges the bytes it caches to `account` (set before the first Resolve,
  // outlives the source) and ClearCache frees them. Sources that cache nothing ignore both.
  virtual void SetMemoryAccount(MemoryBudget::Account* account) { (void)account; }
  virtual void ClearCache() {}
  virtual size_t cache_bytes() const { return 0; }  // what it holds now (what it charged)
};

// The FrameSource over a StackResolver (MakeProcessFrameSource's, with any memory reader).
std::unique_ptr<FrameSource> MakeResolverFrameSource(std::unique_ptr<StackResolver> resolver);

// The real one: StackResolver over the process's memory (process_vm_readv), ruby_global_symbols located through its
// maps.
std::unique_ptr<FrameSource> MakeProcessFrameSource(int pid, const RubyTarget& target, const ProbeSet& set,
                                                    const std::string& proc_root);

struct AgentSinks {
  std::unique_ptr<ProfileSink> dir;   // --output-dir
  std::unique_ptr<ProfileSink> push;  // --push-url
};
// DirSink/PushSink for the config's output-dir / push-url (either may be empty).
Result<AgentSinks> MakeAgentSinks(const AgentConfig& config);

struct AgentEnv {
  ProbeBackend* backend = nullptr;
  const AgentClock* clock = nullptr;
  BinaryPreparer preparer;
  std::function<std::unique_ptr<FrameSource>(int pid, const RubyTarget& target, const ProbeSet& set)> frame_source;
  std::function<Result<AgentSinks>(const AgentConfig& config)> make_sinks;
  MetricsRegistry* metrics = nullptr;  // may be null
  Logger* log = nullptr;               // null: AgentLog()
  // Reads the agent's own CPU and RSS, at each render of `metrics` (null: ReadSelfUsage("/proc")).
  std::function<Result<SelfUsage>()> self_usage;
  // The memory of a process, for the check of its live layout before it is watched (null: process_vm_readv).
  std::function<std::unique_ptr<MemoryReader>(int pid)> memory;
  // A descriptor that becomes readable once process `pid` has exited (RunAgent: pidfd_open), or -1 (then its
  // liveness is read from /proc/PID/stat). The agent owns it. Null: no descriptors, /proc only (the unit tests' pids
  // are fake and must never name a real process).
  std::function<int(int pid)> open_exit_fd;
  // Exit descriptors held at most: a host with more Ruby processes checks the rest in /proc, so the default limit of
  // 1024 open files still leaves room for the ring, the sockets and the files the agent opens.
  size_t max_exit_fds = 512;
  // How often the ring is read when BPF does not wake the agent (null: Agent::kDrainPeriodNs; 0: at every RunOnce).
  std::optional<uint64_t> drain_period_ns;
  // Set by the agent's stop signal (may be null): a wait for an inspection or a preparation of a process whose files
  // stall ends at once when it is set, so SIGTERM stops the agent within its poll period, not that wait's bound.
  const std::atomic<bool>* stop_requested = nullptr;
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_AGENT_AGENT_ENV_H_
