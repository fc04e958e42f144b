// PushSink: delivers profiles to Grafana Pyroscope (or anything speaking its HTTP APIs, e.g. Grafana Alloy's
// pyroscope.receive_http) at --push-url.
//
// Two APIs, one series per profile either way (checked against grafana/pyroscope's source: api/push/v1/push.proto,
// pkg/distributor, pkg/ingester/pyroscope/ingest_handler.go and pkg/og/convert/pprof/profile.go, releases 1.1 to
// 2.2):
//
// 1. The push API, used first: a cut's profiles in few requests (kMaxPushBatch, kMaxPushBatchBytes).
//
//   POST <base>/push.v1.PusherService/Push          (Connect unary)
//   Content-Type: application/proto
//   <body: PushRequest { repeated RawProfileSeries series = 1 }, one series per profile:
//          RawProfileSeries { repeated LabelPair labels = 1; repeated RawSample samples = 2 },
//          LabelPair { string name = 1; string value = 2 }, RawSample { bytes raw_profile = 1 } = the gzipped pprof>
//
//   - The series' labels are the ones the /ingest route below makes for the same profile, so both APIs store the
//     same series: __name__ (the profile name, table below), __delta__="false", pyroscope_spy="rvbpfd",
//     service_name (the app name) and the process labels (rules below).
//   - Pyroscope takes the profile's time from the pprof's time_nanos on both routes (the agent always sets it; /ingest
//     uses `from` only when time_nanos is 0), so from/until have no counterpart here.
//   - 200 = every profile stored. A 4xx may come after Pyroscope stored some series of the request, so a refused
//     request is not split and resent: its profiles count as failures, and the error says some may be stored.
//   - 404, 405 or 415 means the backend has no push API (Pyroscope before 1.0 answers 404; a proxy may pass only
//     /ingest): the sink then sends every profile, that request's included, through /ingest for the rest of its life
//     (SinkStats::push_api = "ingest").
//
// 2. The ingest API (Pyroscope server HTTP API, "Ingestion", format pprof), one profile a request:
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
// Delivery policy (DeliveryWorker, delivery_worker.h): one worker thread sends uploads oldest first, one request at
// a time; the status of a push request applies to every profile it carried.
//   2xx                                        delivered
//   408, 429, 5xx, no response (connect, DNS,  retried after BackoffDelay: backoff_min doubling up to backoff_max,
//   TLS, timeout)                              equal jitter, at least the server's Retry-After (capped at max)
//   any other status (400, 401, 404, 413, 422  given up on: delivery_failures += 1 per profile the request
//                                              carried (retrying cannot fix it)
//   ... and 3xx, which is not followed)        (on the push API, 404, 405 and 415 switch to /ingest instead)
// While the backend is down new uploads keep queueing; beyond max_queue the oldest is dropped
// (dropped_queue_full). Credentials in the URL (user:password@) are passed to libcurl but never appear in
// last_error.
#ifndef RVBPFD_SRC_SINK_PUSH_SINK_H_
#define RVBPFD_SRC_SINK_PUSH_SINK_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
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

// Profiles an attempt carries on the push API: at most this many, and at most this many pprof bytes before gzip in
// all (a larger profile goes alone). Pyroscope up to 1.14 checks a whole request against its ingestion burst (2 MB by
// default), so a request of 1 MiB passes on default limits; at fleet-agent sizes a cut of 50 processes takes a few
// requests.
inline constexpr size_t kMaxPushBatch = 256;
inline constexpr uint64_t kMaxPushBatchBytes = 1u << 20;

class PushSink : public ProfileSink {
 public:
  // Fails with kUsage if the URL is not http(s)://host[:port][/path] (no query or fragment).
  static Result<std::unique_ptr<PushSink>> Create(PushSinkOptions options);
  ~PushSink() override;

  void Submit(ProfileUpload upload) override;
  void SubmitAll(std::vector<ProfileUpload> uploads) override;
  bool Flush(std::chrono::milliseconds deadline) override;
  SinkStats stats() const override;

 private:
  PushSink(PushSinkOptions options, std::string ingest_url);
  // One attempt (DeliverFunction): the whole batch in one push request, or each profile to /ingest once the backend
  // has shown it has no push API.
  std::vector<DeliveryOutcome> Deliver(std::span<const ProfileUpload> uploads, const DeliveryContext& context);
  HttpResult Post(std::string url, std::string_view content_type, const std::string& body,
                  const DeliveryContext& context) const;
  // The outcome of a request carrying `profiles` profiles (delivery policy above).
  DeliveryOutcome Outcome(const std::string& url, const HttpResult& result, size_t profiles) const;

  PushSinkOptions options_;
  const std::string ingest_url_;  // <base>/ingest, credentials included
  const std::string push_url_;    // <base>/push.v1.PusherService/Push
  std::atomic<bool> use_ingest_{false};     // set by the worker thread once; read by stats()
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
// "<base>/push.v1.PusherService/Push" from what PyroscopeIngestUrl returned.
std::string PyroscopePushUrl(std::string_view ingest_url);
// The labels a profile's series gets besides the ones Pyroscope derives (service name, profile name, spy), sanitized
// and limited as above, sorted by name.
std::vector<std::pair<std::string, std::string>> PyroscopeSeriesLabels(
    const std::map<std::string, std::string>& labels, const std::vector<std::string>& sample_label_names = {});
// The __name__ Pyroscope's /ingest route gives a profile of this type (the table above): "process_cpu" for cpu,
// the type itself otherwise.
std::string PyroscopeProfileName(std::string_view profile_type);
// The body of a push: a PushRequest with one series per upload (labels above, plus __name__, __delta__="false",
// pyroscope_spy="rvbpfd" and service_name, as the /ingest route sets them), each with the upload's gzipped pprof
// as its one raw sample.
std::string PyroscopePushRequest(std::span<const ProfileUpload> uploads);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_SINK_PUSH_SINK_H_
