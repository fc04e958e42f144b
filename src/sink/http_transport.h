// HTTP POST for PushSink, behind an interface so unit tests script the backend's answers without a network.
// CurlTransport is the real one (libcurl: http and https, proxies from the usual environment variables).
#ifndef RVBPFD_SRC_SINK_HTTP_TRANSPORT_H_
#define RVBPFD_SRC_SINK_HTTP_TRANSPORT_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/url_redact.h"

namespace rvbpfd {

struct HttpRequest {
  std::string url;
  std::string content_type;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers, e.g. X-Scope-OrgID
  std::string_view body;                                      // must outlive the Post call
  std::chrono::milliseconds timeout{10000};                   // whole request, connect included
  const std::atomic<bool>* cancel = nullptr;                  // set to true to abort promptly (sink shutdown)
};

struct HttpResult {
  int status = 0;                          // HTTP status; 0 = no response (DNS, connect, TLS, timeout, cancel)
  std::string error;                       // status 0: what failed, one line
  std::string body_excerpt;                // the response body's first bytes (Pyroscope explains 4xx there)
  std::chrono::seconds retry_after{0};     // the Retry-After header in seconds (0 = absent)
};

class HttpTransport {
 public:
  virtual ~HttpTransport() = default;
  // One POST. Never throws; failures are in the result. Called from one thread at a time.
  virtual HttpResult Post(const HttpRequest& request) = 0;
};

// libcurl, one easy handle reused across requests (keeps the connection to the backend alive). Not thread-safe:
// one per sink, used from its worker thread. Redirects are not followed (a 3xx is reported as is). Only http and
// https are allowed, also for proxies.
class CurlTransport : public HttpTransport {
 public:
  // Fails (kIo) if libcurl.so.4 cannot be loaded (it is opened on first use, common/shared_library.h), (kInternal) if
  // it cannot be initialized.
  static Result<std::unique_ptr<CurlTransport>> Create();
  ~CurlTransport() override;
  CurlTransport(const CurlTransport&) = delete;
  CurlTransport& operator=(const CurlTransport&) = delete;

  HttpResult Post(const HttpRequest& request) override;

 private:
  explicit CurlTransport(void* handle) : handle_(handle) {}
  void* handle_;  // CURL*
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_SINK_HTTP_TRANSPORT_H_
