// The fleet agent's own metrics: a thread-safe registry rendered in the Prometheus text exposition format 0.0.4, a
// small HTTP server for GET /metrics, and the agent's CPU time and RSS from /proc/self.
#ifndef RVBPFD_SRC_OPS_METRICS_H_
#define RVBPFD_SRC_OPS_METRICS_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/error.h"

namespace rvbpfd {

// The metric names the agent exports (docs/deploy.md lists them with their labels).
inline constexpr std::string_view kMetricProcessesWatched = "rvbpfd_processes_watched";      // gauge
inline constexpr std::string_view kMetricBinariesProbed = "rvbpfd_binaries_probed";          // gauge
inline constexpr std::string_view kMetricBpfSlots = "rvbpfd_bpf_slots_in_use";               // gauge{kind}
inline constexpr std::string_view kMetricBpfSlotsLimit = "rvbpfd_bpf_slots_limit";           // gauge{kind}
inline constexpr std::string_view kMetricProbeSetsRecycled = "rvbpfd_probe_sets_recycled_total";  // counter
inline constexpr std::string_view kMetricBinariesFailed = "rvbpfd_binaries_unprobeable";     // gauge
inline constexpr std::string_view kMetricEvents = "rvbpfd_events_total";                     // counter
inline constexpr std::string_view kMetricSamples = "rvbpfd_samples_total";                   // counter
inline constexpr std::string_view kMetricGvlReadings = "rvbpfd_gvl_readings_total";          // counter
inline constexpr std::string_view kMetricDropped = "rvbpfd_dropped_total";                   // counter{reason}
inline constexpr std::string_view kMetricProfilesBuilt = "rvbpfd_profiles_built_total";      // counter
inline constexpr std::string_view kMetricPushDelivered = "rvbpfd_push_delivered_total";      // counter
inline constexpr std::string_view kMetricPushFailures = "rvbpfd_push_failures_total";        // counter
inline constexpr std::string_view kMetricPushRetries = "rvbpfd_push_retries_total";          // counter
inline constexpr std::string_view kMetricPushQueueLength = "rvbpfd_push_queue_length";       // gauge
inline constexpr std::string_view kMetricAgentCpuSeconds = "rvbpfd_agent_cpu_seconds_total"; // counter
inline constexpr std::string_view kMetricAgentRssBytes = "rvbpfd_agent_rss_bytes";           // gauge
inline constexpr std::string_view kMetricProcessesSkipped = "rvbpfd_processes_skipped_total";  // counter{reason}
inline constexpr std::string_view kMetricMemoryBudget = "rvbpfd_memory_budget_bytes";    // gauge
inline constexpr std::string_view kMetricMemoryHeld = "rvbpfd_memory_held_bytes";        // gauge
inline constexpr std::string_view kMetricMemoryEvictions = "rvbpfd_memory_evictions_total";  // counter
inline constexpr std::string_view kMetricMemoryEvictedBytes = "rvbpfd_memory_evicted_bytes_total";  // counter
inline constexpr std::string_view kMetricMemoryRefused = "rvbpfd_memory_refused_total";  // counter
inline constexpr std::string_view kMetricConfigReloads = "rvbpfd_config_reloads_total";      // counter{result}
// Values of rvbpfd_dropped_total's "reason" label; the BPF loss counters' reasons (ring_full_events,
// ring_full_samples) are declared with the counters (include/rvbpfd/counters.h).
inline constexpr std::string_view kDropQueueFull = "queue_full";
inline constexpr std::string_view kDropUnsymbolized = "unsymbolized";

using MetricLabels = std::map<std::string, std::string>;

// Thread-safe (one mutex). A metric name's type and help text are fixed by its first write; a later write with the
// other type, an invalid metric name ([a-zA-Z_:][a-zA-Z0-9_:]*) or an invalid label name ([a-zA-Z_][a-zA-Z0-9_]*,
// not starting with "__") is a caller bug: it is ignored and counted in rejected_writes().
class MetricsRegistry {
 public:
  // Sets a counter to an absolute value (the agent mirrors counters kept elsewhere, e.g. SinkStats).
  void SetCounter(std::string_view name, std::string_view help, const MetricLabels& labels, double value);
  void SetGauge(std::string_view name, std::string_view help, const MetricLabels& labels, double value);
  // Adds `delta` (>= 0; a negative or NaN delta is rejected) to a counter, creating it at 0.
  void AddCounter(std::string_view name, std::string_view help, const MetricLabels& labels, double delta);
  // A collector writes metrics that are cheap to read where they are rendered and costly to keep fresh (the agent's
  // own CPU and RSS, from /proc/self): every RenderPrometheus runs each collector first, in the order added, on the
  // rendering thread and without the registry's lock held (it writes through the Set/Add methods). So it must be
  // thread-safe and must not render.
  using Collector = std::function<void(MetricsRegistry&)>;
  void AddCollector(Collector collect);
  // Runs the collectors, then renders the text exposition format 0.0.4: per name (sorted) "# HELP", "# TYPE", then
  // one line per label set (sorted), label values escaped (\\, \", \n). Empty string when nothing was written.
  std::string RenderPrometheus();
  size_t rejected_writes() const;

 private:
  enum class Type { kCounter, kGauge };
  struct Family {
    Type type;
    std::string help;
    std::map<MetricLabels, double> series;
  };
  // Returns the family to write, or nullptr (and counts a rejected write) when the write is invalid. mu_ held.
  Family* FamilyFor(std::string_view name, std::string_view help, Type type, const MetricLabels& labels);

  mutable std::mutex mu_;
  std::map<std::string, Family, std::less<>> families_;
  std::vector<Collector> collectors_;
  size_t rejected_writes_ = 0;
};

// "A.B.C.D:PORT" (IPv4 literal; "localhost:PORT" means 127.0.0.1), PORT 0..65535 (0 = any free port).
struct ListenAddress {
  uint32_t ipv4_host_order = 0;
  uint16_t port = 0;
  bool loopback() const { return (ipv4_host_order >> 24) == 127; }
};
// Errors (kUsage) say what the accepted form is. Hostnames other than localhost are refused (no DNS at startup).
Result<ListenAddress> ParseListenAddress(std::string_view listen);

struct MetricsServerOptions {
  // A connection that has not sent a complete request head, or not taken the whole response, within this time is
  // closed, so a silent or slow client holds a connection slot for at most this long.
  std::chrono::milliseconds connection_timeout{2000};
  size_t max_request_bytes = 8192;  // request head cap; a longer head gets 431 and is closed
  size_t max_connections = 16;      // when full, the oldest connection is closed to accept a new one
};

// Serves GET (and HEAD) /metrics from its own thread: one poll() loop over the listening socket, the open
// connections (non-blocking, each with a deadline) and an eventfd that the destructor signals. Every response
// closes its connection. Other paths get 404, other methods 405, malformed requests 400. The registry must outlive
// the server; the server thread renders it (RenderPrometheus, which runs its collectors there).
class MetricsServer {
 public:
  static Result<std::unique_ptr<MetricsServer>> Start(const std::string& listen, MetricsRegistry* registry);
  static Result<std::unique_ptr<MetricsServer>> Start(const std::string& listen, MetricsRegistry* registry,
                                                      const MetricsServerOptions& options);
  ~MetricsServer();  // wakes the thread, joins it, closes every fd
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  uint16_t port() const { return port_; }  // the bound port (listen "127.0.0.1:0" picks one)
  // Requests answered so far (any status), for tests and the agent's own accounting. Thread-safe.
  uint64_t requests_served() const;

 private:
  MetricsServer() = default;
  void Run();

  MetricsRegistry* registry_ = nullptr;
  MetricsServerOptions options_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: the destructor writes 1 to stop the loop
  uint16_t port_ = 0;
  mutable std::mutex stats_mu_;
  uint64_t requests_served_ = 0;
  std::thread thread_;
};

// Agent's own CPU seconds and RSS bytes from /proc/self/stat, /proc/self/status (injectable proc root).
struct SelfUsage {
  double cpu_seconds = 0;       // utime + stime of all threads (s)
  uint64_t rss_bytes = 0;       // VmRSS
  uint64_t rss_peak_bytes = 0;  // VmHWM
};
// Errors: kIo naming the file when it is unreadable or lacks the fields.
Result<SelfUsage> ReadSelfUsage(const std::string& proc_root = "/proc");
// Writes rvbpfd_agent_cpu_seconds_total and rvbpfd_agent_rss_bytes.
void ExportSelfUsage(const SelfUsage& usage, MetricsRegistry* registry);
// A collector (MetricsRegistry::AddCollector) that exports `read`'s usage at each render (nothing when it fails):
// the figures are those of the scrape's moment, and nobody reads /proc/self when nobody scrapes.
MetricsRegistry::Collector SelfUsageCollector(std::function<Result<SelfUsage>()> read);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_OPS_METRICS_H_
