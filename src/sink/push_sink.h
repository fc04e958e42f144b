// PushSink: delivers profiles to Grafana Pyroscope (or anything speaking its HTTP ingest API, e.g. Grafana Alloy's
// pyroscope.receive_http) at --push-url.
//
// The request (Pyroscope server HTTP API, "Ingestion", format pprof; checked against grafana/pyroscope's
// pkg/ingester/pyroscope/ingest_handler.go and pkg/og/convert/pprof/profile.go):
//
//   POST <base>/ingest?name=<app>{<k>=<v>,...}&from=<unix s>&until=<unix s>&format=pprof&spyName=rvbpfd
//   Content-Type: application/octet-stream
//   <body: the gzipped pprof Profile, as is>
//
//   - The body is the raw pprof, NOT multipart/form-data: with format=pprof the server reads the whole body as the
//     profile (it only looks for a multipart "profile" part when no format is given), and it gunzips it itself.
//   - `name` carries the application (service) name and the series labels in braces, labels sorted by name.
//     Pyroscope makes the part before "{" the series' service_name label. No profile-type suffix is appended: for
//     pprof the name is only the prefix, and Pyroscope derives the profile type (__name__) from the pprof's own
//     sample types (a sample type containing "cpu" gives process_cpu, otherwise the last sample type's name).
//     So the suffix a Pyroscope UI shows for our five profile types comes from the profile the agent built:
//       cpu       -> process_cpu  (samples/count + cpu/nanoseconds sample types; period cpu/nanoseconds)
//       gvl_wait  -> gvl_wait     (nanoseconds waiting for the GVL, by stack)
//       gvl_held  -> gvl_held     (nanoseconds holding the GVL, by stack)
//       gc        -> gc           (nanoseconds in GC, by stack)
//       gvl_blame -> gvl_blame    (nanoseconds others waited for the GVL, by the holder's stack; its samples carry
//                                  the labels holder, waiter and blame_source, which Pyroscope keeps as series
//                                  labels, so a query can select e.g. {holder="Thread #2"})
//     which requires each of those profiles to name its last sample type after its profile type and only the cpu
//     profile to have a sample type containing "cpu" (and no sample type may contain '-': Pyroscope rejects it).
//   - from/until are the interval in Unix seconds. spyName=rvbpfd becomes the pyroscope_spy label (not "rbspy":
//     Pyroscope would then rewrite every function name to "file:-1 - name").
//   - sampleRate, units and aggregationType are not sent: Pyroscope ignores them for pprof.
//
// Name and label rules (Pyroscope's labelset parser and distributor validation; a violation is a 400, i.e. a lost
// profile, so the sink sanitizes instead):
//   - app name: only [A-Za-z0-9_./-]; any other byte becomes '_'; surrounding spaces trimmed; empty -> "unknown".
//   - label names: [A-Za-z_][A-Za-z0-9_]* (other bytes -> '_', a leading digit gets a '_' prefix); names starting
//     with "__" and the names Pyroscope sets itself (service_name, pyroscope_spy) are not sent: service_name is the
//     app name (older Pyroscope releases reject a duplicate service_name label).
//   - label values: ',', '{' and '}' (the parser's delimiters), control bytes and invalid UTF-8 become '_';
//     surrounding spaces trimmed; cut to 2048 bytes (Pyroscope's default max_label_value_length) on a UTF-8
//     boundary; a label whose value ends up empty is left out.
//   - at most 26 labels (the first by name), fewer by the profile's sample label names (ProfileUpload::
//     sample_label_names): Pyroscope's default limit is 30 per series, it adds __name__, __delta__, service_name and
//     pyroscope_spy, and turns each sample label into one more. A process label named like a sample label is not
//     sent (a series cannot have one name twice).
//   - the whole `name` is percent-encoded: every byte except A-Z a-z 0-9 - . _ ~ becomes %XX (upper-case hex).
//
// Delivery policy (DeliveryWorker, delivery_worker.h): one worker thread sends uploads oldest first, one at a time.
//   2xx                                        delivered
//   408, 429, 5xx, no response (connect, DNS,  retried after BackoffDelay: backoff_min doubling up to backoff_max,
//   TLS, timeout)                              equal jitter, at least the server's Retry-After (capped at max)
//   any other status (400, 401, 404, 413, 422  given up on: delivery_failures += 1 (retrying cannot fix it)
//   ... and 3xx, which is not followed)
// While the backend is down new uploads keep queueing; beyond max_queue the oldest is dropped
// (dropped_queue_full). Credentials in the URL (user:password@) are passed to libcurl but never appear in
// last_error.
#ifndef RVBPFD_SRC_SINK_PUSH_SINK_H_
#define RVBPFD_SRC_SINK_PUSH_SINK_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/error.h"
#include "sink/delivery_worker.h"
#include "sink/http_transport.h"
#include "sink/sink.h"

namespace rvbpfd {

struct PushSinkOptions {
  std::string url;  // --push-url: Pyroscope base URL, e.g. http://127.0.0.1:4040 (a trailing /ingest is accepted)
  size_t max_queue = 256;                     // --push-queue: uploads kept while the backend is down
  std::chrono::milliseconds timeout{10000};   // per request, connect included
  std::chrono::milliseconds backoff_min{500}, backoff_max{30000};
  uint64_t jitter_seed = 0;                   // SplitMix64 seed (the agent uses e.g. its pid and start time)
  std::vector<std::pair<std::string, std::string>> headers;  // extra request headers (e.g. X-Scope-OrgID)
  // Tests: null = the real ones (CurlTransport, SinkClock::Steady(), SplitMix64Jitter(jitter_seed)).
  std::shared_ptr<HttpTransport> transport;
  std::shared_ptr<SinkClock> clock;
  std::shared_ptr<JitterSource> jitter;
};

class PushSink : public ProfileSink {
 public:
  // Fails with kUsage if the URL is not http(s)://host[:port][/path] (no query or fragment).
  static Result<std::unique_ptr<PushSink>> Create(PushSinkOptions options);
  ~PushSink() override;

  void Submit(ProfileUpload upload) override;
  bool Flush(std::chrono::milliseconds deadline) override;
  SinkStats stats() const override;

  const std::string& ingest_url() const { return ingest_url_; }  // <base>/ingest, credentials included

 private:
  PushSink(PushSinkOptions options, std::string ingest_url) : options_(std::move(options)),
                                                              ingest_url_(std::move(ingest_url)) {}
  DeliveryOutcome Deliver(const ProfileUpload& upload, const DeliveryContext& context);

  PushSinkOptions options_;
  const std::string ingest_url_;
  std::unique_ptr<DeliveryWorker> worker_;  // stopped first, in ~PushSink, while everything it uses is alive
};

// The pieces of the request, exposed for tests and for the fake receiver's documentation.
// The sanitized app name (rules above).
std::string PyroscopeAppName(std::string_view app_name);
// "<app>{k=v,...}" (rules above), not yet percent-encoded.
std::string PyroscopeName(std::string_view app_name, const std::map<std::string, std::string>& labels,
                          const std::vector<std::string>& sample_label_names = {});
// Every byte except A-Z a-z 0-9 - . _ ~ as %XX.
std::string PercentEncode(std::string_view text);
// "<ingest_url>?name=...&from=...&until=...&format=pprof&spyName=rvbpfd".
std::string PyroscopeIngestRequestUrl(std::string_view ingest_url, const ProfileUpload& upload);
// "<base>/ingest" from a --push-url, or kUsage naming the flag.
Result<std::string> PyroscopeIngestUrl(std::string_view push_url);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_SINK_PUSH_SINK_H_
