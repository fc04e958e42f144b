// `rvbpfd agent`: fleet mode's flags, merged over its --config file.
#include <string>

#include "agent/agent_main.h"
#include "cli/commands.h"
#include "ops/agent_config.h"

namespace rvbpfd::cli {

void AddAgentCommand(CLI::App& app, AgentCommand* command) {
  CLI::App* agent = command->app =
      app.add_subcommand("agent",
                         "Fleet mode: profile every CRuby process on this host continuously and ship pprof profiles to "
                         "--output-dir and/or a Pyroscope-compatible --push-url (docs/deploy.md)");
  agent->add_option("--config", command->flags.config_file,
                    "JSON config file whose keys are these flags' long names without \"--\"; reloaded on SIGHUP");
  command->options.push_back(
      agent->add_option("--interval", command->flags.interval_s, "Profile period in seconds (default 15)"));
  command->options.push_back(
      agent->add_option("--hz", command->flags.hz, "On-CPU samples per second of CPU time per thread (default 19)"));
  command->options.push_back(agent->add_option("--stacks", command->flags.stacks,
                                               "Stacks on gvl_released: release (default), release,ready, off"));
  command->options.push_back(
      agent->add_option("--max-overhead", command->flags.max_overhead_pct,
                        "Bound each probed process's estimated time in probe traps to PERCENT of "
                        "each budget window by pausing the high-rate probes (GVL, GC, sleep, "
                        "Mutex#lock; default 5; 0: never pause)"));
  command->options.push_back(agent->add_option("--output-dir", command->flags.output_dir,
                                               "Write profiles as <dir>/<service>/<type>-<pid>-<from>-<until>.pb.gz"));
  command->options.push_back(
      agent->add_option("--output-max-mb", command->flags.output_max_mb,
                        "Cap of --output-dir's total size in MiB; past it the service holding the "
                        "most bytes loses its oldest file (default 1024)"));
  command->options.push_back(agent->add_option("--output-service-max-mb", command->flags.output_service_max_mb,
                                               "Cap of one service's files in --output-dir, MiB; its oldest go first "
                                               "(default 0: only --output-max-mb)"));
  command->options.push_back(agent->add_option("--push-url", command->flags.push_url,
                                               "Pyroscope base URL to push profiles to (its push API, many a request; "
                                               "/ingest, one a request, if it has none), e.g. http://pyroscope:4040"));
  command->options.push_back(agent->add_option("--push-queue", command->flags.push_queue,
                                               "Profiles kept while the push backend is down; beyond it the oldest are "
                                               "dropped (default 256)"));
  command->options.push_back(agent->add_option("--metrics-listen", command->flags.metrics_listen,
                                               "Prometheus /metrics endpoint, ADDR:PORT (default 127.0.0.1:9464; off: "
                                               "none)"));
  command->options.push_back(agent->add_option("--include", command->flags.include,
                                               "Only processes matching RULE: comm:GLOB, cgroup:PREFIX, "
                                               "label:service=GLOB, label:container=GLOB (repeatable)"));
  command->options.push_back(agent->add_option("--exclude", command->flags.exclude,
                                               "Never processes matching RULE (same syntax, repeatable; wins over "
                                               "--include)"));
  command->options.push_back(
      agent->add_option("--service-pin", command->flags.service_pins,
                        "CGROUP_PREFIX=SERVICE: processes whose cgroup path starts with the prefix "
                        "are that service, whatever their environment says (repeatable; the "
                        "longest prefix wins)"));
  command->options.push_back(
      agent->add_flag("--ignore-env-service", command->flags.ignore_env_service,
                      "Do not take service names from a process's RVBPF_SERVICE or "
                      "OTEL_SERVICE_NAME (its own claim): use --service-pin or the command name"));
  command->options.push_back(agent->add_option("--log-format", command->flags.log_format,
                                               "Structured logs on stderr: json (default) or text"));
  command->options.push_back(
      agent->add_option("--host", command->flags.host, "The host label (default: the hostname)"));
  command->options.push_back(agent->add_option("--ring-buffer-kb", command->flags.ring_buffer_kb,
                                               "BPF ring buffer size in KiB (default 8192)"));
  command->options.push_back(agent->add_option(
      "--cache-dir", command->flags.cache_dir,
      "Where probe sites are cached by content hash (default /var/cache/rvbpfd/sites); it and the directories above "
      "it must be root's and not writable by others (exit 13)"));
  command->options.push_back(agent->add_option(
      "--memory-budget", command->memory_budget,
      "Bytes the per-process caches (frame names, stack tables) may hold together, with a K/M/G suffix (default 192M, "
      "under the shipped units' 256M limit); each process gets a fair share, and the caches of the process holding "
      "the most are evicted first (frames are named again later); docs/deploy.md \"Budgets\""));
}

int RunAgentCommand(const AgentCommand& command) {
  // Defaults, then the config file, then the flags given on the command line. SIGHUP runs the same again.
  auto build_config = [&command]() -> Result<AgentConfig> {
    AgentConfig config;
    if (!command.flags.config_file.empty()) {
      Result<AgentConfig> f = ApplyConfigFile(config, command.flags.config_file);
      if (!f) return f.error();
      config = std::move(f.value());
    }
    const AgentConfig& flags_only = command.flags;
    for (CLI::Option* opt : command.options) {
      if (opt->count() == 0) continue;
      const std::string name = opt->get_name();
      if (name == "--interval")
        config.interval_s = flags_only.interval_s;
      else if (name == "--hz")
        config.hz = flags_only.hz;
      else if (name == "--stacks")
        config.stacks = flags_only.stacks;
      else if (name == "--max-overhead")
        config.max_overhead_pct = flags_only.max_overhead_pct;
      else if (name == "--output-dir")
        config.output_dir = flags_only.output_dir;
      else if (name == "--output-max-mb")
        config.output_max_mb = flags_only.output_max_mb;
      else if (name == "--output-service-max-mb")
        config.output_service_max_mb = flags_only.output_service_max_mb;
      else if (name == "--push-url")
        config.push_url = flags_only.push_url;
      else if (name == "--push-queue")
        config.push_queue = flags_only.push_queue;
      else if (name == "--metrics-listen")
        config.metrics_listen = flags_only.metrics_listen;
      else if (name == "--include")
        config.include = flags_only.include;
      else if (name == "--exclude")
        config.exclude = flags_only.exclude;
      else if (name == "--service-pin")
        config.service_pins = flags_only.service_pins;
      else if (name == "--ignore-env-service")
        config.ignore_env_service = flags_only.ignore_env_service;
      else if (name == "--log-format")
        config.log_format = flags_only.log_format;
      else if (name == "--host")
        config.host = flags_only.host;
      else if (name == "--ring-buffer-kb")
        config.ring_buffer_kb = flags_only.ring_buffer_kb;
      else if (name == "--cache-dir")
        config.cache_dir = flags_only.cache_dir;
      else if (name == "--memory-budget") {
        Result<uint64_t> bytes = ParseByteSize(command.memory_budget);
        if (!bytes) return Error(ErrorCode::kUsage, "--memory-budget: " + bytes.error().message());
        config.memory_budget = *bytes;
      }
    }
    config.config_file = command.flags.config_file;
    if (Status st = ValidateAgentConfig(config); !st) return st.error();
    if (config.output_dir.empty() && config.push_url.empty()) {
      return Error(ErrorCode::kUsage,
                   "agent needs somewhere to send profiles: give --output-dir DIR and/or "
                   "--push-url URL (or output-dir/push-url in the --config file)");
    }
    return config;
  };
  Result<AgentConfig> config = build_config();
  if (!config) return Fail(config.error());
  Result<int> r = RunAgent(*config, build_config);
  if (!r) return Fail(r.error());
  return *r;
}

}  // namespace rvbpfd::cli
