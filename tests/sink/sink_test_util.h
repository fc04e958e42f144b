// Test doubles for the sink tests: a virtual clock, a scripted HTTP transport, scripted jitter, a temp directory
// and a one-request-per-connection HTTP server on 127.0.0.1.
#ifndef RVBPFD_TESTS_SINK_SINK_TEST_UTIL_H_
#define RVBPFD_TESTS_SINK_SINK_TEST_UTIL_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "sink/delivery_worker.h"
#include "sink/http_transport.h"

namespace rvbpfd::testing {

using namespace std::chrono_literals;

// Virtual time for the delivery worker. In auto-advance mode a wait jumps the clock to its deadline at once, so a
// whole retry sequence runs instantly and the attempts' timestamps are the exact backoff delays. In manual mode
// the worker parks in WaitUntil until the test advances the clock (or something notifies the worker).
class FakeClock : public SinkClock {
 public:
  explicit FakeClock(bool auto_advance) : auto_advance_(auto_advance) {}

  TimePoint Now() override { return TimePoint(std::chrono::nanoseconds(now_ns_.load())); }

  void WaitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, TimePoint deadline) override {
    {
      std::lock_guard<std::mutex> guard(m_);
      if (auto_advance_) {
        const int64_t target = deadline.time_since_epoch() / 1ns;
        if (target > now_ns_.load()) now_ns_.store(target);
        return;
      }
      parked_ = true;
      ++parks_;
      parked_deadline_ = deadline;
      parked_mu_ = lock.mutex();
      parked_cv_ = &cv;
    }
    park_cv_.notify_all();
    cv.wait(lock);
    std::lock_guard<std::mutex> guard(m_);
    parked_ = false;
  }

  // Manual mode: blocks until the worker has parked at least `count` times and is parked now; returns the deadline
  // it waits for, or the epoch if that does not happen within 60 s of real time (a bug; the test then fails).
  TimePoint AwaitParked(int count) {
    std::unique_lock<std::mutex> lock(m_);
    if (!park_cv_.wait_for(lock, 60s, [&] { return parked_ && parks_ >= count; })) return TimePoint{};
    return parked_deadline_;
  }

  // Moves time forward and wakes a parked worker.
  void Advance(std::chrono::nanoseconds d) {
    std::mutex* mu = nullptr;
    std::condition_variable* cv = nullptr;
    {
      std::lock_guard<std::mutex> guard(m_);
      mu = parked_mu_;
      cv = parked_cv_;
    }
    if (mu != nullptr) {
      std::lock_guard<std::mutex> guard(*mu);  // the worker is inside cv.wait: the notify cannot be lost
      now_ns_ += d / 1ns;
    } else {
      now_ns_ += d / 1ns;
    }
    if (cv != nullptr) cv->notify_all();
  }

 private:
  const bool auto_advance_;
  std::atomic<int64_t> now_ns_{1'000'000'000'000};  // an arbitrary, non-zero start
  std::mutex m_;
  std::condition_variable park_cv_;
  bool parked_ = false;
  int parks_ = 0;
  TimePoint parked_deadline_{};
  std::mutex* parked_mu_ = nullptr;
  std::condition_variable* parked_cv_ = nullptr;
};

// Returns the listed values in order, then 0.
class ScriptedJitter : public JitterSource {
 public:
  explicit ScriptedJitter(std::vector<uint64_t> values) : values_(std::move(values)) {}
  uint64_t Next() override { return next_ < values_.size() ? values_[next_++] : 0; }

 private:
  std::vector<uint64_t> values_;
  size_t next_ = 0;
};

// Answers call i with script[i] (HTTP 200 beyond the script) and records every request.
class FakeTransport : public HttpTransport {
 public:
  struct Call {
    std::string url;
    std::string content_type;
    std::vector<std::pair<std::string, std::string>> headers;
    std::string body;
    std::chrono::milliseconds timeout{};
    SinkClock::TimePoint at{};
  };

  FakeTransport(std::shared_ptr<SinkClock> clock, std::vector<HttpResult> script)
      : clock_(std::move(clock)), script_(std::move(script)) {}

  // Runs on the worker thread inside call number `index`, before it returns.
  std::function<void(size_t index, const HttpRequest& request)> on_call;

  HttpResult Post(const HttpRequest& request) override {
    size_t index = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      index = calls_.size();
      calls_.push_back(Call{request.url, request.content_type, request.headers, std::string(request.body),
                            request.timeout, clock_->Now()});
    }
    if (on_call) on_call(index, request);
    if (index < script_.size()) return script_[index];
    HttpResult ok;
    ok.status = 200;
    return ok;
  }

  std::vector<Call> calls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }

 private:
  std::shared_ptr<SinkClock> clock_;
  std::vector<HttpResult> script_;
  mutable std::mutex mu_;
  std::vector<Call> calls_;
};

inline HttpResult Answer(int status, std::string body = "", std::chrono::seconds retry_after = 0s) {
  HttpResult r;
  r.status = status;
  r.body_excerpt = std::move(body);
  r.retry_after = retry_after;
  if (status == 0) r.error = "POST http://backend/ingest: Connection refused";
  return r;
}

// One series of a decoded push request: its labels in the order sent, and its raw profiles.
struct PushedSeries {
  std::vector<std::pair<std::string, std::string>> labels;
  std::vector<std::string> profiles;
};

// Decodes a push.v1 PushRequest (written here from push.proto's field numbers, independently of the sink's encoder):
// series = 1 { labels = 1 { name = 1, value = 2 }, samples = 2 { raw_profile = 1 } }. Only varint and
// length-delimited fields are expected; anything else, or a truncated field, gives nullopt.
inline std::optional<std::vector<PushedSeries>> DecodePushRequest(std::string_view body) {
  // Calls f(field, bytes) for each length-delimited field of `msg`; false on anything malformed.
  auto each = [](std::string_view msg, const std::function<bool(uint32_t, std::string_view)>& f) {
    size_t pos = 0;
    auto varint = [&](uint64_t* v) {
      *v = 0;
      for (int shift = 0; shift < 64 && pos < msg.size(); shift += 7) {
        const auto b = static_cast<unsigned char>(msg[pos++]);
        *v |= static_cast<uint64_t>(b & 0x7f) << shift;
        if ((b & 0x80) == 0) return true;
      }
      return false;
    };
    while (pos < msg.size()) {
      uint64_t key = 0, v = 0;
      if (!varint(&key)) return false;
      if ((key & 7) == 0) {
        if (!varint(&v)) return false;
        continue;
      }
      if ((key & 7) != 2 || !varint(&v) || v > msg.size() - pos) return false;
      if (!f(static_cast<uint32_t>(key >> 3), msg.substr(pos, v))) return false;
      pos += v;
    }
    return true;
  };
  std::vector<PushedSeries> out;
  const bool ok = each(body, [&](uint32_t field, std::string_view series) {
    if (field != 1) return true;
    PushedSeries s;
    const bool series_ok = each(series, [&](uint32_t f, std::string_view m) {
      if (f == 1) {
        std::pair<std::string, std::string> label;
        return each(m, [&](uint32_t lf, std::string_view v) {
          if (lf == 1) label.first = v;
          if (lf == 2) label.second = v;
          return true;
        }) && (s.labels.push_back(label), true);
      }
      if (f == 2) {
        return each(m, [&](uint32_t rf, std::string_view v) {
          if (rf == 1) s.profiles.emplace_back(v);
          return true;
        });
      }
      return true;
    });
    out.push_back(std::move(s));
    return series_ok;
  });
  if (!ok) return std::nullopt;
  return out;
}

// A fresh directory under /tmp, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/rvbpfd-sink-test-XXXXXX";
    const char* made = ::mkdtemp(pattern);
    path_ = made != nullptr ? made : "";
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A minimal HTTP/1.1 server on 127.0.0.1:<ephemeral>: serves `responses` in order, one per connection (it closes
// each connection after answering), recording each request. Reads are bounded by a 30 s poll so a broken client
// fails the test instead of hanging it.
class LoopbackHttpServer {
 public:
  struct Request {
    std::string method, target;
    std::map<std::string, std::string> headers;  // lower-case names
    std::string body;
  };

  explicit LoopbackHttpServer(std::vector<std::string> responses) : responses_(std::move(responses)) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::listen(listen_fd_, 8) != 0 || ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return;
    }
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }

  ~LoopbackHttpServer() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (listen_fd_ >= 0) ::close(listen_fd_);
  }

  uint16_t port() const { return port_; }
  std::string base() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<Request> requests() const {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

 private:
  bool WaitReadable(int fd) {
    for (int waited_ms = 0; waited_ms < 30000 && !stop_; waited_ms += 50) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 50) > 0) return true;
    }
    return false;
  }

  void Serve() {
    for (const std::string& response : responses_) {
      if (!WaitReadable(listen_fd_)) return;
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      std::string data;
      char buf[4096];
      size_t header_end = std::string::npos;
      size_t content_length = 0;
      while (WaitReadable(fd)) {
        const ssize_t n = ::read(fd, buf, sizeof(buf));
        if (n <= 0) break;
        data.append(buf, static_cast<size_t>(n));
        if (header_end == std::string::npos && (header_end = data.find("\r\n\r\n")) != std::string::npos) {
          content_length = ParseHeaders(data.substr(0, header_end));
        }
        if (header_end != std::string::npos && data.size() >= header_end + 4 + content_length) break;
      }
      if (header_end != std::string::npos) {
        std::lock_guard<std::mutex> lock(mu_);
        pending_.body = data.substr(header_end + 4, content_length);
        requests_.push_back(pending_);
      }
      (void)!::write(fd, response.data(), response.size());
      ::shutdown(fd, SHUT_WR);
      ::close(fd);
    }
  }

  size_t ParseHeaders(const std::string& head) {
    pending_ = Request{};
    size_t line_end = head.find("\r\n");
    const std::string request_line = head.substr(0, line_end);
    const size_t sp1 = request_line.find(' ');
    const size_t sp2 = request_line.find(' ', sp1 + 1);
    pending_.method = request_line.substr(0, sp1);
    pending_.target = request_line.substr(sp1 + 1, sp2 - sp1 - 1);
    while (line_end != std::string::npos && line_end + 2 < head.size()) {
      const size_t start = line_end + 2;
      line_end = head.find("\r\n", start);
      const std::string line = head.substr(start, line_end == std::string::npos ? std::string::npos : line_end - start);
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string name = line.substr(0, colon);
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
      std::string value = line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(' '));
      pending_.headers[name] = value;
    }
    const auto it = pending_.headers.find("content-length");
    return it == pending_.headers.end() ? 0 : std::stoul(it->second);
  }

  std::vector<std::string> responses_;
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::vector<Request> requests_;
  Request pending_;
  std::thread thread_;
};

}  // namespace rvbpfd::testing

#endif  // RVBPFD_TESTS_SINK_SINK_TEST_UTIL_H_
