// Loopback tests of MetricsServer: real sockets on 127.0.0.1 with an ephemeral port.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "ops/metrics.h"

namespace rvbpfd {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// A blocking client socket. The receive timeout only keeps a broken server from hanging the test binary; no test
// outcome depends on it.
class Client {
 public:
  explicit Client(uint16_t port) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    timeval tv{30, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0;
  }
  ~Client() {
    if (fd_ >= 0) close(fd_);
  }
  bool connected() const { return connected_; }
  bool Send(const std::string& data) {
    return send(fd_, data.data(), data.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(data.size());
  }
  // Everything until the server closes the connection; eof() tells an orderly close from an error or timeout.
  std::string ReadAll() {
    std::string out;
    char buf[4096];
    eof_ = false;
    for (;;) {
      ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n == 0) eof_ = true;
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }
  bool eof() const { return eof_; }

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool eof_ = false;
};

std::string Get(uint16_t port, const std::string& request) {
  Client c(port);
  EXPECT_TRUE(c.connected());
  EXPECT_TRUE(c.Send(request));
  return c.ReadAll();
}

std::string Body(const std::string& response) {
  size_t end = response.find("\r\n\r\n");
  return end == std::string::npos ? "" : response.substr(end + 4);
}

class MetricsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_.SetGauge("rvbpfd_processes_watched", "Ruby processes being profiled", {}, 2);
    registry_.AddCounter("rvbpfd_dropped_total", "Records dropped", {{"reason", "queue_full"}}, 7);
  }
  std::unique_ptr<MetricsServer> StartServer(const MetricsServerOptions& options = MetricsServerOptions()) {
    Result<std::unique_ptr<MetricsServer>> s = MetricsServer::Start("127.0.0.1:0", &registry_, options);
    EXPECT_TRUE(s.ok()) << s.error().message();
    if (!s.ok()) return nullptr;
    EXPECT_NE((*s)->port(), 0);
    return std::move(s).value();
  }
  MetricsRegistry registry_;
};

TEST_F(MetricsServerTest, ServesMetrics) {
  std::unique_ptr<MetricsServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  std::string r = Get(server->port(), "GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n");
  EXPECT_THAT(r, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(r, HasSubstr("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
  EXPECT_THAT(r, HasSubstr("\r\nConnection: close\r\n"));
  std::string body = Body(r);
  EXPECT_EQ(body, registry_.RenderPrometheus());
  EXPECT_THAT(r, HasSubstr("\r\nContent-Length: " + std::to_string(body.size()) + "\r\n"));
  EXPECT_THAT(body, HasSubstr("rvbpfd_processes_watched 2\n"));

  // The page reflects the registry at request time.
  registry_.SetGauge("rvbpfd_processes_watched", "Ruby processes being profiled", {}, 5);
  EXPECT_THAT(Body(Get(server->port(), "GET /metrics?x=1 HTTP/1.0\r\n\r\n")),
              HasSubstr("rvbpfd_processes_watched 5\n"));
  EXPECT_EQ(server->requests_served(), 2u);
}

TEST_F(MetricsServerTest, HeadHasNoBody) {
  std::unique_ptr<MetricsServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  std::string r = Get(server->port(), "HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_THAT(r, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(r, HasSubstr("Content-Length: " + std::to_string(registry_.RenderPrometheus().size()) + "\r\n"));
  EXPECT_EQ(Body(r), "");
}

TEST_F(MetricsServerTest, OtherPathsMethodsAndGarbage) {
  std::unique_ptr<MetricsServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  EXPECT_THAT(Get(server->port(), "GET / HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 404 Not Found\r\n"));
  EXPECT_THAT(Get(server->port(), "GET /metricsx HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 404 "));
  std::string post = Get(server->port(), "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  EXPECT_THAT(post, StartsWith("HTTP/1.1 405 Method Not Allowed\r\n"));
  EXPECT_THAT(post, HasSubstr("\r\nAllow: GET, HEAD\r\n"));
  EXPECT_THAT(Get(server->port(), "hello\r\n\r\n"), StartsWith("HTTP/1.1 400 Bad Request\r\n"));
  EXPECT_THAT(Get(server->port(), "GET /metrics\r\n\r\n"), StartsWith("HTTP/1.1 400 "));  // no HTTP version
  EXPECT_THAT(Get(server->port(), "GET /metrics HTTP/1.1\n\n"), StartsWith("HTTP/1.1 200 "));  // bare LF
}

TEST_F(MetricsServerTest, RequestSplitAcrossWrites) {
  std::unique_ptr<MetricsServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  Client c(server->port());
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(c.Send("GET /met"));
  ASSERT_TRUE(c.Send("rics HTTP/1.1\r\nHost: x\r\n"));
  ASSERT_TRUE(c.Send("\r\n"));
  EXPECT_THAT(c.ReadAll(), StartsWith("HTTP/1.1 200 OK\r\n"));
}

TEST_F(MetricsServerTest, OversizedRequestHeadIsRefused) {
  MetricsServerOptions options;
  options.max_request_bytes = 1024;
  std::unique_ptr<MetricsServer> server = StartServer(options);
  ASSERT_NE(server, nullptr);
  // Exactly one byte over the cap and no end of head: the server reads all of it, answers and closes.
  std::string head = "GET /metrics HTTP/1.1\r\nX: ";
  std::string r = Get(server->port(), head + std::string(1025 - head.size(), 'a'));
  EXPECT_THAT(r, StartsWith("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
}

TEST_F(MetricsServerTest, SilentClientDoesNotBlockTheNextOne) {
  std::unique_ptr<MetricsServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  Client silent(server->port());
  ASSERT_TRUE(silent.connected());
  // The silent connection stays open (2 s timeout) while the next client is served.
  std::string r = Get(server->port(), "GET /metrics HTTP/1.1\r\n\r\n");
  EXPECT_THAT(r, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(Body(r), HasSubstr("rvbpfd_dropped_total{reason=\"queue_full\"} 7\n"));
}

TEST_F(MetricsServerTest, SilentClientIsClosedAfterTheTimeout) {
  MetricsServerOptions options;
  options.connection_timeout = std::chrono::milliseconds(50);
  std::unique_ptr<MetricsServer> server = StartServer(options);
  ASSERT_NE(server, nullptr);
  Client silent(server->port());
  ASSERT_TRUE(silent.connected());
  EXPECT_EQ(silent.ReadAll(), "");  // the server hung up without answering
  EXPECT_TRUE(silent.eof());
  EXPECT_EQ(server->requests_served(), 0u);
  EXPECT_THAT(Get(server->port(), "GET /metrics HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 200 OK\r\n"));
}

TEST_F(MetricsServerTest, FullServerClosesTheOldestConnection) {
  MetricsServerOptions options;
  options.max_connections = 2;
  std::unique_ptr<MetricsServer> server = StartServer(options);
  ASSERT_NE(server, nullptr);
  Client a(server->port());
  Client b(server->port());
  ASSERT_TRUE(a.connected());
  ASSERT_TRUE(b.connected());
  // The third connection evicts `a` (the oldest), so a scraper gets through while slots are held.
  EXPECT_THAT(Get(server->port(), "GET /metrics HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_EQ(a.ReadAll(), "");
  EXPECT_TRUE(a.eof());
  // `b` was not evicted: it can still be served.
  ASSERT_TRUE(b.Send("GET /metrics HTTP/1.1\r\n\r\n"));
  EXPECT_THAT(b.ReadAll(), StartsWith("HTTP/1.1 200 OK\r\n"));
}

TEST_F(MetricsServerTest, DestructorStopsWithOpenConnections) {
  std::unique_ptr<MetricsServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  uint16_t port = server->port();
  Client open_conn(port);
  ASSERT_TRUE(open_conn.connected());
  // Once a later client was served, `open_conn` (earlier in the accept queue) has been accepted: an unaccepted one
  // would see a reset from the closing listener instead of the server's orderly close tested here.
  EXPECT_THAT(Get(port, "GET /metrics HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 200 OK\r\n"));
  server.reset();  // must return, not wait for the client
  EXPECT_EQ(open_conn.ReadAll(), "");
  EXPECT_TRUE(open_conn.eof());
  Client after(port);
  EXPECT_FALSE(after.connected());  // the listening socket is closed
}

TEST_F(MetricsServerTest, StartErrors) {
  Result<std::unique_ptr<MetricsServer>> bad = MetricsServer::Start("nonsense", &registry_);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code(), ErrorCode::kUsage);
  EXPECT_THAT(bad.error().message(), HasSubstr("--metrics-listen"));

  std::unique_ptr<MetricsServer> first = StartServer();
  ASSERT_NE(first, nullptr);
  std::string taken = "127.0.0.1:" + std::to_string(first->port());
  Result<std::unique_ptr<MetricsServer>> second = MetricsServer::Start(taken, &registry_);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.error().code(), ErrorCode::kIo);
  EXPECT_THAT(second.error().message(), HasSubstr("binding " + taken));
  EXPECT_THAT(second.error().message(), HasSubstr("errno 98"));

  EXPECT_FALSE(MetricsServer::Start("127.0.0.1:0", nullptr).ok());
}

}  // namespace
}  // namespace rvbpfd
