// `rvbpfd agent`: runs the fleet agent (agent.h) with the real BPF backend, sinks and metrics endpoint until SIGINT
// or SIGTERM. SIGHUP reloads the configuration; SIGINT/SIGTERM cut the last partial interval, submit it and flush
// the sinks (at most kShutdownFlush) before exiting 0.
#ifndef RVBPFD_SRC_AGENT_AGENT_MAIN_H_
#define RVBPFD_SRC_AGENT_AGENT_MAIN_H_

#include <chrono>
#include <functional>

#include "common/error.h"
#include "ops/agent_config.h"

namespace rvbpfd {

inline constexpr std::chrono::milliseconds kShutdownFlush{5000};

// `config` is validated. `reload` rebuilds the configuration on SIGHUP (defaults, the config file, then the
// command-line flags) and validates it; its errors are logged and counted, the agent keeps running as it was.
// Returns the exit status; errors before the agent runs (privileges, BPF, sinks, the metrics socket) are returned.
Result<int> RunAgent(const AgentConfig& config, std::function<Result<AgentConfig>()> reload);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_AGENT_AGENT_MAIN_H_
