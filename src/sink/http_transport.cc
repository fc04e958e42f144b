#include "sink/http_transport.h"

#include <curl/curl.h>

#include <algorithm>
#include <mutex>

namespace rvbpfd {
namespace {

// Bytes of the response body kept for messages: Pyroscope's 4xx bodies are one short line of explanation.
constexpr size_t kBodyExcerptBytes = 512;

size_t WriteExcerpt(char* data, size_t size, size_t nmemb, void* user) {
  auto* out = static_cast<std::string*>(user);
  const size_t n = size * nmemb;
  if (out->size() < kBodyExcerptBytes) out->append(data, std::min(n, kBodyExcerptBytes - out->size()));
  return n;  // the rest is read and discarded, so the connection stays reusable
}

int CheckCancel(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  const auto* cancel = static_cast<const std::atomic<bool>*>(user);
  return cancel != nullptr && cancel->load(std::memory_order_relaxed) ? 1 : 0;
}

struct SlistFree {
  void operator()(curl_slist* list) const { curl_slist_free_all(list); }
};

}  // namespace

bool EnsureCurlGlobalInit() {
  static std::once_flag once;
  static bool ok = false;
  std::call_once(once, [] { ok = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK; });
  return ok;
}

Result<std::unique_ptr<CurlTransport>> CurlTransport::Create() {
  if (!EnsureCurlGlobalInit()) {
    return Error(ErrorCode::kInternal, "initializing libcurl failed (curl_global_init); reinstall libcurl4");
  }
  CURL* handle = curl_easy_init();
  if (handle == nullptr) return Error(ErrorCode::kInternal, "creating a libcurl handle failed (out of memory?)");
  return std::unique_ptr<CurlTransport>(new CurlTransport(handle));
}

CurlTransport::~CurlTransport() { curl_easy_cleanup(static_cast<CURL*>(handle_)); }

HttpResult CurlTransport::Post(const HttpRequest& request) {
  CURL* curl = static_cast<CURL*>(handle_);
  curl_easy_reset(curl);  // options back to defaults; live connections and the DNS cache are kept

  std::unique_ptr<curl_slist, SlistFree> headers;
  auto add_header = [&headers](const std::string& line) {
    if (curl_slist* grown = curl_slist_append(headers.get(), line.c_str())) {
      (void)headers.release();
      headers.reset(grown);
    }
  };
  add_header("Content-Type: " + request.content_type);
  add_header("Expect:");  // no 100-continue round trip: profiles are small and the server reads them whole
  for (const auto& [name, value] : request.headers) add_header(name + ": " + value);

  HttpResult result;
  char error_buffer[CURL_ERROR_SIZE] = {};
  static const char kEmpty[] = "";
  const long timeout_ms = static_cast<long>(std::max<int64_t>(request.timeout.count(), 1));
  curl_easy_setopt(curl, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_POST, 1L);
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, request.body.empty() ? kEmpty : request.body.data());
  curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers.get());
  curl_easy_setopt(curl, CURLOPT_USERAGENT, "rvbpfd");
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, timeout_ms);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);  // no SIGALRM for DNS timeouts: we are one thread of many
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error_buffer);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &WriteExcerpt);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &result.body_excerpt);
  curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, &CheckCancel);
  curl_easy_setopt(curl, CURLOPT_XFERINFODATA, const_cast<std::atomic<bool>*>(request.cancel));

  const CURLcode rc = curl_easy_perform(curl);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, nullptr);  // error_buffer dies with this frame
  if (rc != CURLE_OK) {
    result.status = 0;
    result.error = "POST " + RedactUrl(request.url) + ": " +
                   (rc == CURLE_ABORTED_BY_CALLBACK ? std::string("cancelled (sink shutting down)")
                    : error_buffer[0] != '\0'        ? std::string(error_buffer)
                                                     : std::string(curl_easy_strerror(rc)));
    return result;
  }
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  result.status = static_cast<int>(status);
  curl_off_t retry_after = 0;
  if (curl_easy_getinfo(curl, CURLINFO_RETRY_AFTER, &retry_after) == CURLE_OK && retry_after > 0) {
    result.retry_after = std::chrono::seconds(retry_after);
  }
  return result;
}

}  // namespace rvbpfd
