#include "sink/push_sink.h"

#include <algorithm>
#include <cctype>
#include <set>

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

std::string PyroscopeName(std::string_view app_name, const std::map<std::string, std::string>& labels,
                          const std::vector<std::string>& sample_label_names) {
  std::string out = PyroscopeAppName(app_name);
  out += '{';
  // The samples' label names count against the limit and are taken.
  std::set<std::string> taken;
  for (const std::string& n : sample_label_names) taken.insert(SanitizeLabelName(n));
  const size_t max_labels = kMaxLabels - std::min(kMaxLabels, taken.size());
  std::set<std::string> sent;
  for (const auto& [raw_name, raw_value] : labels) {  // std::map: sorted by name
    if (sent.size() == max_labels) break;
    std::string name = SanitizeLabelName(raw_name);
    if (name.empty() || name.starts_with("__") || name == "service_name" || name == "pyroscope_spy") continue;
    if (taken.contains(name)) continue;
    std::string value = SanitizeLabelValue(raw_value);
    if (value.empty() || !sent.insert(name).second) continue;  // empty = absent; duplicates after sanitizing
    if (sent.size() > 1) out += ',';
    out += name;
    out += '=';
    out += value;
  }
  out += '}';
  return out;
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

  std::unique_ptr<PushSink> sink(new PushSink(std::move(options), std::move(ingest_url).value()));
  Result<std::unique_ptr<DeliveryWorker>> worker = DeliveryWorker::Start(
      std::move(worker_options),
      [s = sink.get()](const ProfileUpload& upload, const DeliveryContext& context) {
        return s->Deliver(upload, context);
      });
  if (!worker) return worker.error();
  sink->worker_ = std::move(worker).value();
  return sink;
}

PushSink::~PushSink() { worker_.reset(); }

void PushSink::Submit(ProfileUpload upload) {
  if (upload.pprof_gz.empty()) {  // a caller bug: count it rather than send Pyroscope an empty body
    worker_->CountFailure("not sent: empty " + upload.profile_type + " profile of " + upload.app_name);
    return;
  }
  worker_->Submit(std::move(upload));
}

bool PushSink::Flush(std::chrono::milliseconds deadline) { return worker_->Flush(deadline); }

SinkStats PushSink::stats() const { return worker_->stats(); }

DeliveryOutcome PushSink::Deliver(const ProfileUpload& upload, const DeliveryContext& context) {
  HttpRequest request;
  request.url = PyroscopeIngestRequestUrl(ingest_url_, upload);
  request.content_type = "application/octet-stream";
  request.headers = options_.headers;
  request.body = upload.pprof_gz;
  request.timeout = context.timeout;
  request.cancel = context.cancel;
  const HttpResult result = options_.transport->Post(request);
  if (result.status >= 200 && result.status < 300) return DeliveryOutcome::Delivered();
  if (result.status == 0) {
    return DeliveryOutcome::Retry(result.error.empty() ? "POST " + RedactUrl(ingest_url_) + ": no response"
                                                       : result.error);
  }
  std::string error = "POST " + RedactUrl(ingest_url_) + ": HTTP " + std::to_string(result.status);
  const std::string excerpt = OneLine(result.body_excerpt);
  if (!excerpt.empty()) error += ": " + excerpt;
  if (result.status == 408 || result.status == 429 || result.status >= 500) {
    return DeliveryOutcome::Retry(std::move(error),
                                  std::chrono::duration_cast<std::chrono::milliseconds>(result.retry_after));
  }
  return DeliveryOutcome::Failed(std::move(error) + " (not retried)");
}

}  // namespace rvbpfd
