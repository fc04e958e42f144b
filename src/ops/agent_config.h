// The fleet agent's configuration (`rvbpfd agent`): defaults, the JSON config file, validation, and what a SIGHUP
// reload may change while the agent runs.
//
// The config file is one JSON object whose keys are the long flag names without "--" ("interval", "push-url", ...);
// see docs/deploy.md. Precedence is the caller's (the agent applies the file over the defaults, then its command-line
// flags over the file). Nothing here touches global state: every function is pure and thread-compatible.
#ifndef RVBPFD_SRC_OPS_AGENT_CONFIG_H_
#define RVBPFD_SRC_OPS_AGENT_CONFIG_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace rvbpfd {

// The agent's default memory budget: 192 MiB, a margin of 64 MiB under the shipped units' limit (MemoryMax=256M in
// deploy/systemd, 256Mi in deploy/kubernetes) for what the budget does not hold (the binary, its libraries, the BPF
// maps, the sinks' queues, the analysis of a new binary).
inline constexpr uint64_t kDefaultMemoryBudget = uint64_t{192} << 20;
inline constexpr uint64_t kMinMemoryBudget = uint64_t{4} << 20;

struct AgentConfig {
  double interval_s = 15;            // --interval: profile period (s), >= 1
  int hz = 19;                       // --hz: CPU samples per second per thread (fleet default), 1..1000
  std::string stacks = "release";    // --stacks: release | release,ready | off
  double max_overhead_pct = 5;       // --max-overhead (fleet default 5%); 0 = never pause tracing
  std::string output_dir;            // --output-dir ("" = off)
  uint64_t output_max_mb = 1024;     // --output-max-mb: cap of the rotated files' total size (MiB)
  uint64_t output_service_max_mb = 0;  // --output-service-max-mb: cap of one service's files (MiB; 0 = none)
  std::string push_url;              // --push-url ("" = off), Pyroscope base URL e.g. http://127.0.0.1:4040
  size_t push_queue = 256;           // --push-queue: uploads kept while the backend is down
  std::string metrics_listen = "127.0.0.1:9464";  // --metrics-listen ("" or "off" = no endpoint)
  std::vector<std::string> include;  // --include RULE (repeatable): comm:NAME | cgroup:PREFIX | label:KEY=VALUE
  std::vector<std::string> exclude;  // --exclude RULE (repeatable), same syntax; exclude wins
  std::vector<std::string> service_pins;  // --service-pin CGROUP_PREFIX=SERVICE (repeatable): the operator's names
  bool ignore_env_service = false;        // --ignore-env-service: RVBPF_SERVICE/OTEL_SERVICE_NAME are not used
  std::string log_format = "json";   // --log-format json|text
  std::string host;                  // --host: host label ("" = gethostname)
  uint32_t ring_buffer_kb = 8192;    // --ring-buffer-kb
  uint64_t memory_budget = kDefaultMemoryBudget;  // --memory-budget: bytes of the per-process caches (docs/deploy.md)
  std::string cache_dir = "/var/cache/rvbpfd/sites";
  std::string config_file;           // --config FILE (JSON object, keys = the long flag names without "--")
  std::string proc_root = "/proc";   // tests only

  bool operator==(const AgentConfig&) const = default;
};

// Limits checked by ValidateAgentConfig (documented in docs/deploy.md).
inline constexpr double kMinIntervalS = 1;
inline constexpr double kMaxIntervalS = 3600;
inline constexpr int kMaxAgentHz = 1000;
inline constexpr size_t kMaxPushQueue = 65536;
inline constexpr uint64_t kMaxOutputMb = uint64_t{1} << 20;  // 1 TiB
inline constexpr uint32_t kMinRingBufferKb = 4;
inline constexpr uint32_t kMaxRingBufferKb = 1u << 20;        // 1 GiB
inline constexpr size_t kMaxConfigFileBytes = 1 << 20;        // 1 MiB

// The config file's keys in their documented order ("interval", "hz", ..., "cache-dir").
const std::vector<std::string_view>& AgentConfigKeys();

// Parses a JSON config file's text over `base` (unknown keys and bad types are errors naming the key). `source` names
// the text in errors (the file path). Errors are kUsage: "config <source>: key \"hz\": expected an integer, got
// string". Keys absent from the text keep base's values; "include"/"exclude" replace base's lists.
// Ranges are not checked here (ValidateAgentConfig does, after the command-line flags were applied).
Result<AgentConfig> ApplyConfigJson(const AgentConfig& base, std::string_view json_text,
                                    std::string_view source = "text");
// Reads the file (at most kMaxConfigFileBytes) and applies it; kIo errors name the path. The result's config_file is
// `path`.
Result<AgentConfig> ApplyConfigFile(const AgentConfig& base, const std::string& path);

// The file keys of `config` as a JSON object (compact, keys in AgentConfigKeys() order); ApplyConfigJson of it over
// any base gives back `config` (apart from config_file and proc_root). Used to log the effective configuration.
std::string AgentConfigToJson(const AgentConfig& config);

// "192M", "64MiB", "1G", "4096K", "1048576": bytes with an optional K/M/G/T suffix (binary multiples; "B", "iB",
// "IB" after it and case are ignored). Errors name what is wrong, for the caller's message.
Result<uint64_t> ParseByteSize(std::string_view text);

// Checks ranges and syntax: memory-budget >= 4 MiB, interval 1..3600 s, hz 1..1000, max-overhead 0..100, stacks, log-format, push-url
// (http:// or https:// with a host), push-queue 1..65536, output-max-mb 1..2^20, output-service-max-mb 0..2^20,
// ring-buffer-kb 4..2^20, the include/exclude rules (ProcessFilter syntax), the service pins (ServiceNamePolicy)
// and metrics-listen (ParseListenAddress). Errors are kUsage and name the
// key and its flag.
Status ValidateAgentConfig(const AgentConfig& config);

// metrics-listen: "" or "off" disables the endpoint.
bool MetricsDisabled(const std::string& metrics_listen);

// What a SIGHUP reload does with a freshly loaded (and validated) config.
//
// Reloadable without restart: include, exclude, push-url, push-queue, output-dir, output-max-mb,
// output-service-max-mb, interval, log-format, service-pin and ignore-env-service (these two name the processes
// found after the reload). Everything else needs a restart: hz, stacks, ring-buffer-kb, memory-budget (BPF programs and maps are sized at start),
// metrics-listen (the socket is bound at start), cache-dir, max-overhead (the overhead budget is set when the
// probes are attached) and host (the host label is resolved once at start). For those the reload keeps the running
// value and the agent logs a warning naming each key in needs_restart.
struct ReloadPlan {
  AgentConfig next;                        // the config to run with: loaded's reloadable values, running's others
  std::vector<std::string> changed;        // keys whose value differs, in AgentConfigKeys() order
  std::vector<std::string> applied;        // changed keys taken from `loaded`
  std::vector<std::string> needs_restart;  // changed keys kept at the running value
  bool any_applied() const { return !applied.empty(); }
};
// `next` keeps running's config_file and proc_root.
ReloadPlan PlanReload(const AgentConfig& running, const AgentConfig& loaded);
// True for the keys listed as reloadable above.
bool IsReloadableKey(std::string_view key);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_OPS_AGENT_CONFIG_H_
