#include "sink/push_sink.h"

#include <algorithm>
#include <cctype>
#include <set>

#include "common/proto_buffer.h"
#include "common/utf8.h"

namespace rvbpfd {
namespace {

constexpr size_t kMaxLabels = 26;             // Pyroscope's 30 labels per series minus the 4 it adds
constexpr size_t kMaxLabelValueBytes = 2048;  // Pyroscope's default max_label_value_length
constexpr size_t kMaxErrorExcerpt = 200;      // bytes of a response body quoted in last_error

bool IsAsciiAlnum(unsigned char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

std::string_view TrimSpaces(std::string_view s) {
  const auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; };
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

std::string SanitizeLabelName(std::string_view name) {
  std::string out;
  for (unsigned char c : name) out.push_back(IsAsciiAlnum(c) || c == '_' ? static_cast<char>(c) : '_');
  if (!out.empty() && out[0] >= '0' && out[0] <= '9') out.insert(out.begin(), '_');
  return out;
}

std::string SanitizeLabelValue(std::string_view value) {
  std::string out;
  for (size_t i = 0; i < value.size();) {
    const size_t n = Utf8SequenceLength(value, i);
    const unsigned char c = static_cast<unsigned char>(value[i]);
    if (n == 0 || (n == 1 && (c < 0x20 || c == 0x7f || c == ',' || c == '{' || c == '}'))) {
      out.push_back('_');
      i += 1;
      continue;
    }
    out.append(value.substr(i, n));
    i += n;
  }
  std::string trimmed(TrimSpaces(out));
  if (trimmed.size() > kMaxLabelValueBytes) {
    size_t cut = kMaxLabelValueBytes;
    while (cut > 0 && (static_cast<unsigned char>(trimmed[cut]) & 0xc0) == 0x80) --cut;  // not mid-character
    trimmed.resize(cut);
    trimmed = std::string(TrimSpaces(trimmed));
  }
  return trimmed;
}

// A response body as one short printable line.
std::string OneLine(std::string_view text) {
  std::string out;
  for (char ch : text) {
    const unsigned char c = static_cast<unsigned char>(ch);
    out.push_back(c < 0x20 || c == 0x7f ? ' ' : ch);
    if (out.size() >= kMaxErrorExcerpt) break;
  }
  return std::string(TrimSpaces(out));
}

bool StartsWithNoCase(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(s[i])) != prefix[i]) return false;
  }
  return true;
}

}  // namespace

std::string PyroscopeAppName(std::string_view app_name) {
  std::string out;
  for (unsigned char c : TrimSpaces(app_name)) {
    out.push_back(IsAsciiAlnum(c) || c == '_' || c == '.' || c == '/' || c == '-' ? static_cast<char>(c) : '_');
  }
  return out.empty() ? "unknown" : out;
}

std::vector<std::pair<std::string, std::string>> PyroscopeSeriesLabels(
    const std::map<std::string, std::string>& labels, const std::vector<std::string>& sample_label_names) {
  // The samples' label names count against the limit and are taken.
  std::set<std::string> taken;
  for (const std::string& n : sample_label_names) taken.insert(SanitizeLabelName(n));
  const size_t max_labels = kMaxLabels - std::min(kMaxLabels, taken.size());
  std::vector<std::pair<std::string, std::string>> out;
  std::set<std::string> sent;
  for (const auto& [raw_name, raw_value] : labels) {  // std::map: sorted by name
    if (sent.size() == max_labels) break;
    std::string name = SanitizeLabelName(raw_name);
    if (name.empty() || name.starts_with("__") || name == "service_name" || name == "pyroscope_spy") continue;
    if (taken.contains(name)) continue;
    std::string value = SanitizeLabelValue(raw_value);
    if (value.empty() || !sent.insert(name).second) continue;  // empty = absent; duplicates after sanitizing
    out.emplace_back(std::move(name), std::move(value));
  }
  return out;
}

std::string PyroscopeName(std::string_view app_name, const std::map<std::string, std::string>& labels,
                          const std::vector<std::string>& sample_label_names) {
  std::string out = PyroscopeAppName(app_name);
  out += '{';
  bool first = true;
  for (const auto& [name, value] : PyroscopeSeriesLabels(labels, sample_label_names)) {
    if (!first) out += ',';
    first = false;
    out += name;
    out += '=';
    out += value;
  }
  out += '}';
  return out;
}

std::string PyroscopeProfileName(std::string_view profile_type) {
  return profile_type == "cpu" ? "process_cpu" : std::string(profile_type);
}

std::string PyroscopePushRequest(std::span<const ProfileUpload> uploads) {
  // Field numbers of grafana/pyroscope's api/push/v1/push.proto and api/types/v1/types.proto.
  constexpr uint32_t kPushRequestSeries = 1;
  constexpr uint32_t kSeriesLabels = 1, kSeriesSamples = 2;
  constexpr uint32_t kLabelPairName = 1, kLabelPairValue = 2;
  constexpr uint32_t kRawSampleRawProfile = 1;
  std::string request;
  ProtoBuffer req(&request);
  for (const ProfileUpload& u : uploads) {
    std::vector<std::pair<std::string, std::string>> labels =
        PyroscopeSeriesLabels(u.labels, u.sample_label_names);
    labels.emplace_back("__name__", PyroscopeProfileName(u.profile_type));
    labels.emplace_back("__delta__", "false");
    labels.emplace_back("pyroscope_spy", "rvbpfd");
    labels.emplace_back("service_name", PyroscopeAppName(u.app_name));
    std::sort(labels.begin(), labels.end());
    std::string series;
    ProtoBuffer ser(&series);
    for (const auto& [name, value] : labels) {
      std::string pair;
      ProtoBuffer lp(&pair);
      lp.BytesField(kLabelPairName, name);
      lp.BytesField(kLabelPairValue, value);
      ser.BytesField(kSeriesLabels, pair);
    }
    std::string sample;
    ProtoBuffer(&sample).BytesField(kRawSampleRawProfile, u.pprof_gz);
    ser.BytesField(kSeriesSamples, sample);
    req.BytesField(kPushRequestSeries, series);
  }
  return request;
}

std::string PercentEncode(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size() * 3);
  for (unsigned char c : text) {
    if (IsAsciiAlnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xf]);
    }
  }
  return out;
}

std::string PyroscopeIngestRequestUrl(std::string_view ingest_url, const ProfileUpload& upload) {
  std::string url(ingest_url);
  url += "?name=";
  url += PercentEncode(PyroscopeName(upload.app_name, upload.labels, upload.sample_label_names));
  url += "&from=" + std::to_string(upload.from_unix_s);
  url += "&until=" + std::to_string(upload.until_unix_s);
  url += "&format=pprof&spyName=rvbpfd";
  return url;
}

Result<std::string> PyroscopeIngestUrl(std::string_view push_url) {
  const std::string shown = RedactUrl(push_url);
  const auto usage = [&](std::string_view why) {
    return Error(ErrorCode::kUsage, "--push-url \"" + shown + "\": " + std::string(why) +
                                        "; expected the Pyroscope base URL, e.g. --push-url http://127.0.0.1:4040");
  };
  for (unsigned char c : push_url) {
    if (c <= 0x20 || c == 0x7f) return usage("contains a space or control character");
  }
  size_t scheme_len = 0;
  if (StartsWithNoCase(push_url, "http://")) {
    scheme_len = 7;
  } else if (StartsWithNoCase(push_url, "https://")) {
    scheme_len = 8;
  } else {
    return usage("must start with http:// or https://");
  }
  if (push_url.find_first_of("?#") != std::string_view::npos) return usage("must not have a query or fragment");
  const size_t path_start = std::min(push_url.find('/', scheme_len), push_url.size());
  if (path_start == scheme_len) return usage("has no host");
  std::string_view base = push_url;
  while (base.size() > path_start && base.back() == '/') base.remove_suffix(1);
  std::string url(base);
  if (!std::string_view(url).substr(path_start).ends_with("/ingest")) url += "/ingest";
  return url;
}

std::string PyroscopePushUrl(std::string_view ingest_url) {
  std::string_view base = ingest_url;
  base.remove_suffix(std::string_view("/ingest").size());
  return std::string(base) + "/push.v1.PusherService/Push";
}

Result<std::unique_ptr<PushSink>> PushSink::Create(PushSinkOptions options) {
  Result<std::string> ingest_url = PyroscopeIngestUrl(options.url);
  if (!ingest_url) return ingest_url.error();
  if (!options.transport) {
    Result<std::unique_ptr<CurlTransport>> curl = CurlTransport::Create();
    if (!curl) return curl.error().Wrap("--push-url");
    options.transport = std::move(curl).value();
  }
  if (!options.jitter) options.jitter = std::make_shared<SplitMix64Jitter>(options.jitter_seed);
  if (!options.clock) options.clock = SinkClock::Steady();

  DeliveryWorkerOptions worker_options;
  worker_options.max_queue = options.max_queue;
  worker_options.backoff = BackoffPolicy{options.backoff_min, options.backoff_max};
  worker_options.attempt_timeout = options.timeout;
  worker_options.clock = options.clock;
  worker_options.jitter = options.jitter;

  worker_options.max_batch = kMaxPushBatch;
  worker_options.max_batch_bytes = kMaxPushBatchBytes;

  std::unique_ptr<PushSink> sink(new PushSink(std::move(options), std::move(ingest_url).value()));
  Result<std::unique_ptr<DeliveryWorker>> worker = DeliveryWorker::Start(
      std::move(worker_options),
      [s = sink.get()](std::span<const ProfileUpload> uploads, const DeliveryContext& context) {
        return s->Deliver(uploads, context);
      });
  if (!worker) return worker.error();
  sink->worker_ = std::move(worker).value();
  return sink;
}

PushSink::PushSink(PushSinkOptions options, std::string ingest_url)
    : options_(std::move(options)), ingest_url_(std::move(ingest_url)), push_url_(PyroscopePushUrl(ingest_url_)) {}

PushSink::~PushSink() { worker_.reset(); }

void PushSink::Submit(ProfileUpload upload) {
  if (upload.pprof_gz.empty()) {  // a caller bug: count it rather than send Pyroscope an empty profile
    worker_->CountFailure("not sent: empty " + upload.profile_type + " profile of " + upload.app_name);
    return;
  }
  worker_->Submit(std::move(upload));
}

void PushSink::SubmitAll(std::vector<ProfileUpload> uploads) {
  std::vector<ProfileUpload> kept;
  kept.reserve(uploads.size());
  for (ProfileUpload& u : uploads) {
    if (u.pprof_gz.empty()) {
      worker_->CountFailure("not sent: empty " + u.profile_type + " profile of " + u.app_name);
    } else {
      kept.push_back(std::move(u));
    }
  }
  worker_->SubmitAll(std::move(kept));
}

bool PushSink::Flush(std::chrono::milliseconds deadline) { return worker_->Flush(deadline); }

SinkStats PushSink::stats() const {
  SinkStats s = worker_->stats();
  s.push_api = use_ingest_.load(std::memory_order_relaxed) ? "ingest" : "push";
  return s;
}

HttpResult PushSink::Post(std::string url, std::string_view content_type, const std::string& body,
                          const DeliveryContext& context) const {
  HttpRequest request;
  request.url = std::move(url);
  request.content_type = content_type;
  request.headers = options_.headers;
  request.body = body;
  request.timeout = context.timeout;
  request.cancel = context.cancel;
  return options_.transport->Post(request);
}

DeliveryOutcome PushSink::Outcome(const std::string& url, const HttpResult& result, size_t profiles) const {
  if (result.status >= 200 && result.status < 300) return DeliveryOutcome::Delivered();
  if (result.status == 0) {
    return DeliveryOutcome::Retry(result.error.empty() ? "POST " + RedactUrl(url) + ": no response" : result.error);
  }
  std::string error = "POST " + RedactUrl(url) + ": HTTP " + std::to_string(result.status);
  const std::string excerpt = OneLine(result.body_excerpt);
  if (!excerpt.empty()) error += ": " + excerpt;
  if (result.status == 408 || result.status == 429 || result.status >= 500) {
    return DeliveryOutcome::Retry(std::move(error),
                                  std::chrono::duration_cast<std::chrono::milliseconds>(result.retry_after));
  }
  error += " (not retried";
  if (profiles > 1) error += "; one request of " + std::to_string(profiles) + " profiles, some may have been stored";
  return DeliveryOutcome::Failed(std::move(error) + ")");
}

std::vector<DeliveryOutcome> PushSink::Deliver(std::span<const ProfileUpload> uploads,
                                               const DeliveryContext& context) {
  if (!use_ingest_.load(std::memory_order_relaxed)) {
    const HttpResult result = Post(push_url_, "application/proto", PyroscopePushRequest(uploads), context);
    // A backend without the push API (Pyroscope before 1.0, or a proxy that passes only /ingest) gets every profile
    // through /ingest from now on, this batch included.
    if (result.status != 404 && result.status != 405 && result.status != 415) {
      return std::vector<DeliveryOutcome>(uploads.size(), Outcome(push_url_, result, uploads.size()));
    }
    use_ingest_.store(true, std::memory_order_relaxed);
  }
  std::vector<DeliveryOutcome> out;
  for (const ProfileUpload& u : uploads) {
    // Each request gets what is left of a Flush (the push request before it, or earlier ones, may have used it up).
    DeliveryContext request = context;
    if (!out.empty() && context.cancel != nullptr && context.cancel->load(std::memory_order_relaxed)) break;
    const SinkClock::TimePoint now = options_.clock->Now();
    const std::optional<std::chrono::milliseconds> left = context.LeftAt(now);
    if (left && *left <= std::chrono::milliseconds(0) && !out.empty()) break;  // the rest go back unattempted
    request.timeout = context.RequestTimeout(now);
    out.push_back(Outcome(ingest_url_,
                          Post(PyroscopeIngestRequestUrl(ingest_url_, u), "application/octet-stream", u.pprof_gz,
                               request),
                          1));
    // A retry waits for the backoff; the uploads after it go back to the queue unattempted.
    if (out.back().kind == DeliveryOutcome::Kind::kRetry) break;
  }
  return out;
}

}  // namespace rvbpfd
