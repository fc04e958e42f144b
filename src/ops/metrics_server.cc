// MetricsServer: a deliberately small HTTP/1.x responder for Prometheus scrapes (see metrics.h).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "common/threads.h"
#include "ops/metrics.h"

namespace rvbpfd {
namespace {

using SteadyClock = std::chrono::steady_clock;

struct Connection {
  int fd = -1;
  std::string in;        // request head bytes received so far (at most max_request_bytes + 1)
  std::string out;       // response; non-empty once the request was answered
  size_t out_sent = 0;
  SteadyClock::time_point deadline;
};

void CloseConnection(Connection* c) {
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
}

std::string Response(int status, std::string_view reason, std::string_view content_type, const std::string& body,
                     bool head_only, std::string_view extra_headers = "") {
  std::string r = "HTTP/1.1 " + std::to_string(status) + " " + std::string(reason) + "\r\n";
  r += "Content-Type: " + std::string(content_type) + "\r\n";
  r += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  r += extra_headers;
  r += "Connection: close\r\n\r\n";
  if (!head_only) r += body;
  return r;
}

// The end of the request head ("\r\n\r\n", or "\n\n" from lenient clients), or npos.
size_t HeadEnd(const std::string& in) {
  size_t crlf = in.find("\r\n\r\n");
  size_t lf = in.find("\n\n");
  return std::min(crlf, lf);
}


// The response to a complete (or oversized) request head `in`: 431 past max_request_bytes without an end, 400 for a
// malformed request line, 404 off /metrics, 405 for a method other than GET/HEAD, else the registry's page.
std::string ResponseTo(const std::string& in, size_t max_request_bytes, MetricsRegistry* registry) {
  size_t end = HeadEnd(in);
  if (end == std::string::npos) {
    return Response(431, "Request Header Fields Too Large", "text/plain; charset=utf-8",
                    "request head larger than " + std::to_string(max_request_bytes) + " bytes\n", false);
  }
  std::string_view head(in.data(), end);
  std::string_view line = head.substr(0, head.find('\n'));
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  size_t sp1 = line.find(' ');
  size_t sp2 = sp1 == std::string_view::npos ? std::string_view::npos : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.substr(sp2 + 1).substr(0, 5) != "HTTP/") {
    return Response(400, "Bad Request", "text/plain; charset=utf-8", "malformed request line\n", false);
  }
  std::string_view method = line.substr(0, sp1);
  std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  std::string_view path = target.substr(0, target.find('?'));
  bool head_only = method == "HEAD";
  if (path != "/metrics") {
    return Response(404, "Not Found", "text/plain; charset=utf-8", "not found; try /metrics\n", head_only);
  }
  if (method != "GET" && method != "HEAD") {
    return Response(405, "Method Not Allowed", "text/plain; charset=utf-8", "use GET\n", false,
                    "Allow: GET, HEAD\r\n");
  }
  return Response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", registry->RenderPrometheus(), head_only);
}

// The poll timeout (ms, -1: none) until the earliest connection deadline or the end of an accept pause, at most 60 s.
int PollTimeoutMs(const std::vector<Connection>& conns, bool accept_paused,
                  SteadyClock::time_point accept_paused_until) {
  if (conns.empty() && !accept_paused) return -1;
  SteadyClock::time_point next = accept_paused ? accept_paused_until : SteadyClock::time_point::max();
  for (const Connection& c : conns) next = std::min(next, c.deadline);
  auto wait = std::chrono::ceil<std::chrono::milliseconds>(next - SteadyClock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(wait, 0, 60'000));
}

// Reads what a connection without a response has sent (never more than max_request_bytes + 1 in all); true once
// the request head is complete or oversized. Closes the connection when the client went away.
bool ReadRequest(Connection& c, size_t max_request_bytes) {
  char buf[4096];
  size_t room = max_request_bytes + 1 - std::min(c.in.size(), max_request_bytes);
  ssize_t got = recv(c.fd, buf, std::min(sizeof(buf), room), 0);
  if (got > 0) {
    c.in.append(buf, static_cast<size_t>(got));
    return HeadEnd(c.in) != std::string::npos || c.in.size() > max_request_bytes;
  }
  if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    CloseConnection(&c);  // the client went away before finishing its request
  }
  return false;
}

// Sends as much of the response as the socket takes; closes the connection once all of it was sent or the client
// left.
void SendResponse(Connection& c) {
  while (c.out_sent < c.out.size()) {
    ssize_t sent = send(c.fd, c.out.data() + c.out_sent, c.out.size() - c.out_sent, MSG_NOSIGNAL);
    if (sent > 0) {
      c.out_sent += static_cast<size_t>(sent);
      continue;
    }
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    CloseConnection(&c);  // EPIPE/ECONNRESET: the client left
    break;
  }
  if (c.fd >= 0 && c.out_sent == c.out.size()) CloseConnection(&c);
}

// Drops finished connections and those past their deadline (silent or slow clients).
void DropFinishedConnections(std::vector<Connection>* conns) {
  SteadyClock::time_point now = SteadyClock::now();
  for (Connection& c : *conns) {
    if (c.fd >= 0 && now >= c.deadline) CloseConnection(&c);
  }
  conns->erase(std::remove_if(conns->begin(), conns->end(), [](const Connection& c) { return c.fd < 0; }),
               conns->end());
}

// Accepts pending connections, a bounded number per round so a connection flood cannot starve the stop signal. When
// full, the oldest connection goes, so clients that hold slots open cannot lock out a scraper. Out of fds or
// memory: accepting pauses for 100 ms (*accept_paused_until).
void AcceptConnections(int listen_fd, const MetricsServerOptions& options, std::vector<Connection>* conns,
                       SteadyClock::time_point* accept_paused_until) {
  for (int k = 0; k < 64; ++k) {
    int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        *accept_paused_until = SteadyClock::now() + std::chrono::milliseconds(100);
      }
      break;  // EAGAIN: drained; ECONNABORTED and the like: retry next round
    }
    if (conns->size() >= options.max_connections) {
      CloseConnection(&conns->front());
      conns->erase(conns->begin());
    }
    Connection c;
    c.fd = fd;
    c.deadline = SteadyClock::now() + options.connection_timeout;
    conns->push_back(std::move(c));
  }
}

}  // namespace

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& listen, MetricsRegistry* registry) {
  return Start(listen, registry, MetricsServerOptions());
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& listen, MetricsRegistry* registry,
                                                            const MetricsServerOptions& options) {
  if (registry == nullptr) return Error(ErrorCode::kInternal, "metrics server: no registry");
  Result<ListenAddress> addr = ParseListenAddress(listen);
  if (!addr.ok()) return addr.error().Wrap("--metrics-listen");
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->registry_ = registry;
  server->options_ = options;
  if (server->options_.max_connections == 0) server->options_.max_connections = 1;

  server->listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (server->listen_fd_ < 0) return Error(ErrorCode::kIo, ErrnoMessage("metrics endpoint: socket", errno));
  int one = 1;
  // A restarted agent must rebind at once even while the last run's connections sit in TIME_WAIT.
  setsockopt(server->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(addr->port);
  sa.sin_addr.s_addr = htonl(addr->ipv4_host_order);
  if (bind(server->listen_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    return Error(ErrorCode::kIo, ErrnoMessage("metrics endpoint: binding " + listen, errno) +
                                     " (another process on that port? choose one with --metrics-listen, or off)");
  }
  if (::listen(server->listen_fd_, 16) != 0) {
    return Error(ErrorCode::kIo, ErrnoMessage("metrics endpoint: listen on " + listen, errno));
  }
  socklen_t len = sizeof(sa);
  if (getsockname(server->listen_fd_, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    return Error(ErrorCode::kIo, ErrnoMessage("metrics endpoint: getsockname", errno));
  }
  server->port_ = ntohs(sa.sin_port);
  server->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (server->wake_fd_ < 0) return Error(ErrorCode::kIo, ErrnoMessage("metrics endpoint: eventfd", errno));
  server->thread_ = StartHelperThread([s = server.get()] { s->Run(); });
  return server;
}

MetricsServer::~MetricsServer() {
  if (thread_.joinable()) {
    uint64_t one = 1;
    // An eventfd write of 1 cannot block or fail short of a counter overflow; retry only on EINTR.
    while (write(wake_fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
    thread_.join();
  }
  if (wake_fd_ >= 0) close(wake_fd_);
  if (listen_fd_ >= 0) close(listen_fd_);
}

uint64_t MetricsServer::requests_served() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return requests_served_;
}

void MetricsServer::Run() {
  std::vector<Connection> conns;  // in accept order: conns.front() is the oldest
  std::vector<pollfd> fds;
  // After EMFILE/ENFILE the listening socket stays readable: polling it again at once would spin, so accepting
  // pauses briefly (the pending client waits in the backlog).
  SteadyClock::time_point accept_paused_until{};

  // Answers a complete (or oversized) request head: fills c->out.
  auto answer = [&](Connection* c) {
    c->out = ResponseTo(c->in, options_.max_request_bytes, registry_);
    c->out_sent = 0;
    // The response gets its own time budget: a large page to a slow reader is still bounded.
    c->deadline = SteadyClock::now() + options_.connection_timeout;
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++requests_served_;
  };

  for (;;) {
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    bool accept_paused = SteadyClock::now() < accept_paused_until;
    fds.push_back({listen_fd_, static_cast<short>(accept_paused ? 0 : POLLIN), 0});
    for (const Connection& c : conns) fds.push_back({c.fd, static_cast<short>(c.out.empty() ? POLLIN : POLLOUT), 0});
    int n = poll(fds.data(), fds.size(), PollTimeoutMs(conns, accept_paused, accept_paused_until));
    if (n < 0) {
      if (errno == EINTR) continue;
      break;  // EFAULT/EINVAL/ENOMEM: cannot serve; the agent keeps running without an endpoint
    }
    if (fds[0].revents != 0) break;  // the destructor asked us to stop

    // Serve connections that are ready (fds[2 + i] belongs to conns[i]).
    for (size_t i = 0; i < conns.size(); ++i) {
      Connection& c = conns[i];
      if (fds[2 + i].revents == 0) continue;
      if (c.out.empty() && ReadRequest(c, options_.max_request_bytes)) answer(&c);
      // Also reached straight after answer(): most responses fit the socket buffer and finish here.
      if (c.fd >= 0 && !c.out.empty()) SendResponse(c);
    }
    DropFinishedConnections(&conns);
    if (fds[1].revents != 0) AcceptConnections(listen_fd_, options_, &conns, &accept_paused_until);
  }
  for (Connection& c : conns) CloseConnection(&c);
}

}  // namespace rvbpfd
