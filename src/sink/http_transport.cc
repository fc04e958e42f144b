#include "sink/http_transport.h"

#include <curl/curl.h>

#include <algorithm>

#include "common/shared_library.h"

namespace rvbpfd {
namespace {

// The libcurl functions this file calls, resolved from libcurl.so.4 when the first transport is made (the library
// is not linked: common/shared_library.h says why).
struct CurlApi {
  decltype(&curl_global_init) global_init;
  decltype(&curl_easy_init) easy_init;
  decltype(&curl_easy_cleanup) easy_cleanup;
  decltype(&curl_easy_reset) easy_reset;
  decltype(&curl_easy_setopt) easy_setopt;
  decltype(&curl_easy_perform) easy_perform;
  decltype(&curl_easy_getinfo) easy_getinfo;
  decltype(&curl_easy_strerror) easy_strerror;
  decltype(&curl_slist_append) slist_append;
  decltype(&curl_slist_free_all) slist_free_all;
};

Result<CurlApi> OpenCurl() {
  Result<SharedLibrary> lib = SharedLibrary::Open("libcurl.so.4", "libcurl4");
  if (!lib) return lib.error();
  CurlApi api{};
  for (Status st : {lib->Resolve("curl_global_init", &api.global_init), lib->Resolve("curl_easy_init", &api.easy_init),
                    lib->Resolve("curl_easy_cleanup", &api.easy_cleanup),
                    lib->Resolve("curl_easy_reset", &api.easy_reset),
                    lib->Resolve("curl_easy_setopt", &api.easy_setopt),
                    lib->Resolve("curl_easy_perform", &api.easy_perform),
                    lib->Resolve("curl_easy_getinfo", &api.easy_getinfo),
                    lib->Resolve("curl_easy_strerror", &api.easy_strerror),
                    lib->Resolve("curl_slist_append", &api.slist_append),
                    lib->Resolve("curl_slist_free_all", &api.slist_free_all)}) {
    if (!st) return st.error();
  }
  // curl_global_init is not thread-safe by itself: it runs here, once, under the static's initialization guard.
  // Cleanup is left to process exit, as other threads may use libcurl until then.
  if (api.global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
    return Error(ErrorCode::kInternal, "initializing libcurl failed (curl_global_init); reinstall libcurl4");
  }
  return api;
}

// libcurl, opened and initialized once per process (thread-safe), or why it could not be.
const Result<CurlApi>& Curl() {
  static const Result<CurlApi> api = OpenCurl();
  return api;
}

// Only after Curl() succeeded (CurlTransport::Create).
const CurlApi& Api() { return Curl().value(); }

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
  void operator()(curl_slist* list) const { Api().slist_free_all(list); }
};

}  // namespace

Result<std::unique_ptr<CurlTransport>> CurlTransport::Create() {
  if (const Result<CurlApi>& api = Curl(); !api) return api.error();
  CURL* handle = Api().easy_init();
  if (handle == nullptr) return Error(ErrorCode::kInternal, "creating a libcurl handle failed (out of memory?)");
  return std::unique_ptr<CurlTransport>(new CurlTransport(handle));
}

CurlTransport::~CurlTransport() { Api().easy_cleanup(static_cast<CURL*>(handle_)); }

HttpResult CurlTransport::Post(const HttpRequest& request) {
  const CurlApi& api = Api();
  CURL* curl = static_cast<CURL*>(handle_);
  api.easy_reset(curl);  // options back to defaults; live connections and the DNS cache are kept

  std::unique_ptr<curl_slist, SlistFree> headers;
  auto add_header = [&headers, &api](const std::string& line) {
    if (curl_slist* grown = api.slist_append(headers.get(), line.c_str())) {
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
  api.easy_setopt(curl, CURLOPT_URL, request.url.c_str());
  api.easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  api.easy_setopt(curl, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  api.easy_setopt(curl, CURLOPT_POST, 1L);
  api.easy_setopt(curl, CURLOPT_POSTFIELDS, request.body.empty() ? kEmpty : request.body.data());
  api.easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
  api.easy_setopt(curl, CURLOPT_HTTPHEADER, headers.get());
  api.easy_setopt(curl, CURLOPT_USERAGENT, "rvbpfd");
  api.easy_setopt(curl, CURLOPT_TIMEOUT_MS, timeout_ms);
  api.easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
  api.easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);  // no SIGALRM for DNS timeouts: we are one thread of many
  api.easy_setopt(curl, CURLOPT_ERRORBUFFER, error_buffer);
  api.easy_setopt(curl, CURLOPT_WRITEFUNCTION, &WriteExcerpt);
  api.easy_setopt(curl, CURLOPT_WRITEDATA, &result.body_excerpt);
  api.easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  api.easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, &CheckCancel);
  api.easy_setopt(curl, CURLOPT_XFERINFODATA, const_cast<std::atomic<bool>*>(request.cancel));

  const CURLcode rc = api.easy_perform(curl);
  api.easy_setopt(curl, CURLOPT_ERRORBUFFER, nullptr);  // error_buffer dies with this frame
  if (rc != CURLE_OK) {
    result.status = 0;
    result.error = "POST " + RedactUrl(request.url) + ": " +
                   (rc == CURLE_ABORTED_BY_CALLBACK ? std::string("cancelled (sink shutting down)")
                    : error_buffer[0] != '\0'        ? std::string(error_buffer)
                                                     : std::string(api.easy_strerror(rc)));
    return result;
  }
  long status = 0;
  api.easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  result.status = static_cast<int>(status);
  curl_off_t retry_after = 0;
  if (api.easy_getinfo(curl, CURLINFO_RETRY_AFTER, &retry_after) == CURLE_OK && retry_after > 0) {
    result.retry_after = std::chrono::seconds(retry_after);
  }
  return result;
}

}  // namespace rvbpfd
