#include "agent/agent_main.h"

#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>

#include "agent/agent.h"
#include "common/cache_file.h"
#include "common/capabilities.h"
#include "common/url_redact.h"
#include "ops/log.h"
#include "ops/metrics.h"
#include "probe/probe_backend.h"
#include "session/isolated_prepare.h"
#include "session/vm_binary.h"

namespace rvbpfd {
namespace {

std::atomic<bool> g_stop{false};
std::atomic<bool> g_reload{false};

void OnStopSignal(int) { g_stop.store(true); }
void OnReloadSignal(int) { g_reload.store(true); }

void InstallSignals() {
  struct sigaction sa {};
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a signal cuts the ring poll short
  sa.sa_handler = OnStopSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sa.sa_handler = OnReloadSignal;
  sigaction(SIGHUP, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

}  // namespace

Result<int> RunAgent(const AgentConfig& config, std::function<Result<AgentConfig>()> reload) {
  g_stop.store(false);
  g_reload.store(false);
  InstallSignals();
  Logger& log = AgentLog();
  if (Result<LogFormat> f = ParseLogFormat(config.log_format); f) SetLogFormat(*f);

  // The agent profiles every user's processes: without ptrace access it could attach none of theirs, so a missing
  // CAP_SYS_PTRACE is an error at start rather than a skip per process. (CAP_BPF and CAP_PERFMON are checked by
  // loading the BPF programs below; CAP_DAC_READ_SEARCH only improves service names, docs/deploy.md.)
  if (std::optional<uint64_t> caps = EffectiveCapabilities();
      caps && !MissingCapabilities(*caps, {kCapSysPtrace}).empty()) {
    return Error(ErrorCode::kNoPrivilege,
                 "agent: reading other users' processes (/proc/PID/maps, process_vm_readv): " +
                     PrivilegeHint({kCapSysPtrace}, caps));
  }
  // The cache says where probes go into every user's process: a cache-dir others can write is refused when the
  // operator named it, and unused (with a warning: profiling goes on, uncached) when it is the default.
  SetCacheWarningSink([&log](const std::string& line) { log.Warn("cache not used", {{"reason", line}}); });
  if (Status st = CheckCacheDir(config.cache_dir); !st) {
    if (config.cache_dir != AgentConfig().cache_dir || st.error().code() != ErrorCode::kUntrustedPath) {
      return st.error().Wrap("agent: --cache-dir");
    }
    log.Warn("cache not used", {{"reason", st.error().message()}});
  }
  MetricsRegistry metrics;
  std::unique_ptr<MetricsServer> server;
  if (!MetricsDisabled(config.metrics_listen)) {
    Result<std::unique_ptr<MetricsServer>> s = MetricsServer::Start(config.metrics_listen, &metrics);
    if (!s) return s.error().Wrap("starting the metrics endpoint (--metrics-listen)");
    server = std::move(s.value());
  }
  Result<std::unique_ptr<BpfProbeBackend>> backend =
      BpfProbeBackend::Open(config.ring_buffer_kb * 1024u, Agent::ProbeConfig(config), config.cache_dir);
  if (!backend) return backend.error();

  SystemAgentClock clock;
  AgentEnv env;
  env.backend = backend->get();
  env.clock = &clock;
  const std::string cache_dir = config.cache_dir;
  const bool want_stacks = config.stacks != "off" || config.hz > 0;
  env.preparer = [cache_dir, want_stacks](const std::string& path, const std::string& version,
                                          std::shared_ptr<ElfFile> parsed,
                                          std::shared_ptr<const FileFd> handle) -> Result<PreparedBinary> {
    // A child process analyses the binary first and fills the caches (session/isolated_prepare.h): its debug
    // sections are copied and parsed there, so neither their memory nor a parser's crash on a hostile file reaches
    // the agent. Killed before ProbeSetManager's own bound gives up on this thread.
    PrepareChildRequest child;
    child.handle = handle.get();
    child.path = parsed ? parsed->path() : path;
    child.origin_path = parsed ? parsed->origin_path() : "";
    child.ruby_version = version;
    child.cache_dir = cache_dir;
    child.want_stacks = want_stacks;
    child.timeout = ProbeSetManager::kDefaultPrepareTimeout * 9 / 10;
    const PrepareChildOutcome outcome = WarmBinaryCaches(child);
    if (outcome.state == PrepareChildOutcome::State::kFailed) return outcome.error;
    if (outcome.state == PrepareChildOutcome::State::kNotStarted) {
      // Logger is thread-safe; this runs on the preparation thread.
      AgentLog().Warn("analysing a VM binary in the agent itself", {{"error", outcome.error.message()}});
    }
    // Warmed: what follows reads the caches. Not started: the analysis runs here, as it would without a child.
    // Discovery parsed the file already: analysing that copy keeps one parse (and one copy in memory) per binary.
    return parsed ? PrepareVmBinary(*parsed, version, cache_dir, want_stacks)
                  : PrepareVmBinary(path, version, cache_dir, want_stacks);
  };
  const std::string proc_root = config.proc_root;
  env.frame_source = [proc_root](int pid, const RubyTarget& target, const ProbeSet& set) {
    return MakeProcessFrameSource(pid, target, set, proc_root);
  };
  env.make_sinks = MakeAgentSinks;
  // pidfds name processes of the agent's own pid namespace: only when --proc-root is that namespace's /proc.
  if (proc_root == "/proc") {
    env.open_exit_fd = [](int pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); };
  }
  env.metrics = &metrics;
  env.log = &log;
  env.stop_requested = &g_stop;

  Result<std::unique_ptr<Agent>> agent_or = Agent::Create(config, env);
  if (!agent_or) return agent_or.error();
  Agent& agent = **agent_or;
  if (Status st = agent.Start(); !st) return st.error();
  AgentConfig shown = config;  // the log must not carry --push-url's credentials
  shown.push_url = RedactUrl(shown.push_url);
  log.Info("agent started", {{"pid", static_cast<int64_t>(getpid())},
                             {"host", agent.host()},
                             {"config", AgentConfigToJson(shown)},
                             {"metrics_port", static_cast<int64_t>(server ? server->port() : 0)},
                             {"multi_uprobe_links", (*backend)->uses_multi_links()},
                             {"processes", static_cast<uint64_t>(agent.watched_pids().size())}});

  int status = 0;
  while (!g_stop.load()) {
    if (g_reload.exchange(false)) {
      Result<AgentConfig> next = reload();
      Status st = next ? agent.Reload(*next) : Status(next.error());
      metrics.AddCounter(kMetricConfigReloads, "Configuration reloads (SIGHUP), by result",
                         {{"result", st ? "ok" : "error"}}, 1);
      if (!st) log.Error("config reload failed; keeping the running configuration", {{"error", st.error().message()}});
    }
    if (Status st = agent.RunOnce(); !st) {
      log.Error("agent stopped on an error", {{"error", st.error().message()}});
      status = 1;
      break;
    }
  }
  const bool flushed = agent.Shutdown(kShutdownFlush);
  const ProfileSink* push = agent.push_sink();
  log.Info("agent stopped", {{"flushed", flushed},
                             {"profiles_built", agent.profiles_built()},
                             {"push_delivered", push ? push->stats().delivered : uint64_t{0}},
                             {"push_queued", push ? push->stats().queued : uint64_t{0}}});
  return status;
}

}  // namespace rvbpfd
