// The real libcurl transport and PushSink against HTTP servers on 127.0.0.1: a minimal one written here (exact
// request bytes) and tests/e2e/fake_pyroscope.py (the receiver the agent's e2e test uses, with its outage control).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <zlib.h>

#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "sink/http_transport.h"
#include "sink/push_sink.h"
#include "sink/sink_test_util.h"

extern char** environ;

namespace rvbpfd {
namespace {

using namespace std::chrono_literals;
using testing::LoopbackHttpServer;
using testing::TempDir;

const char kOk[] = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";

// A port nothing listens on: bound once, then closed.
uint16_t ClosedPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::unique_ptr<CurlTransport> MakeCurl() {
  auto t = CurlTransport::Create();
  EXPECT_TRUE(t.ok());
  return std::move(t).value();
}

TEST(CurlTransportTest, PostsTheExactRequest) {
  LoopbackHttpServer server({kOk});
  ASSERT_NE(server.port(), 0);
  auto curl = MakeCurl();
  const std::string body("\x1f\x8b\x08\x00\x00binary\r\n\r\nbody\xff", 20);
  HttpRequest request;
  request.url = server.base() + "/ingest?name=app%7Bpid%3D1%7D&from=10&until=25&format=pprof&spyName=rvbpfd";
  request.content_type = "application/octet-stream";
  request.headers = {{"X-Scope-OrgID", "team-a"}};
  request.body = body;
  request.timeout = 30s;
  const HttpResult result = curl->Post(request);
  EXPECT_EQ(result.status, 200) << result.error;
  const auto requests = server.requests();
  ASSERT_EQ(requests.size(), 1u);
  const auto& r = requests[0];
  EXPECT_EQ(r.method, "POST");
  EXPECT_EQ(r.target, "/ingest?name=app%7Bpid%3D1%7D&from=10&until=25&format=pprof&spyName=rvbpfd");
  EXPECT_EQ(r.headers.at("content-type"), "application/octet-stream");
  EXPECT_EQ(r.headers.at("content-length"), "20");
  EXPECT_EQ(r.headers.at("x-scope-orgid"), "team-a");
  EXPECT_EQ(r.headers.at("user-agent"), "rvbpfd");
  EXPECT_EQ(r.headers.count("expect"), 0u);
  EXPECT_EQ(r.body, body);
}

TEST(CurlTransportTest, ReportsStatusBodyAndRetryAfter) {
  LoopbackHttpServer server({"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 7\r\nContent-Length: 21\r\n"
                             "Connection: close\r\n\r\ningester unavailable\n"});
  auto curl = MakeCurl();
  HttpRequest request;
  request.url = server.base() + "/ingest";
  request.content_type = "application/octet-stream";
  request.body = "x";
  const HttpResult result = curl->Post(request);
  EXPECT_EQ(result.status, 503);
  EXPECT_EQ(result.retry_after, 7s);
  EXPECT_EQ(result.body_excerpt, "ingester unavailable\n");
}

TEST(CurlTransportTest, SendsUrlCredentialsAsBasicAuth) {
  LoopbackHttpServer server({kOk});
  auto curl = MakeCurl();
  HttpRequest request;
  request.url = "http://user:s3cret@127.0.0.1:" + std::to_string(server.port()) + "/ingest";
  request.content_type = "application/octet-stream";
  request.body = "x";
  EXPECT_EQ(curl->Post(request).status, 200);
  ASSERT_EQ(server.requests().size(), 1u);
  EXPECT_EQ(server.requests()[0].headers.at("authorization"), "Basic dXNlcjpzM2NyZXQ=");
}

TEST(CurlTransportTest, ConnectionRefusedIsNoResponseWithoutCredentials) {
  auto curl = MakeCurl();
  HttpRequest request;
  request.url = "http://user:s3cret@127.0.0.1:" + std::to_string(ClosedPort()) + "/ingest";
  request.content_type = "application/octet-stream";
  request.body = "x";
  const HttpResult result = curl->Post(request);
  EXPECT_EQ(result.status, 0);
  EXPECT_NE(result.error.find("POST http://***@127.0.0.1:"), std::string::npos) << result.error;
  EXPECT_EQ(result.error.find("s3cret"), std::string::npos) << result.error;
}

TEST(CurlTransportTest, RefusesOtherProtocols) {
  auto curl = MakeCurl();
  HttpRequest request;
  request.url = "file:///etc/passwd";
  request.content_type = "application/octet-stream";
  request.body = "x";
  const HttpResult result = curl->Post(request);
  EXPECT_EQ(result.status, 0);
  EXPECT_FALSE(result.error.empty());
}

TEST(PushSinkLoopbackTest, RetriesThroughARealHttpServer) {
  LoopbackHttpServer server({"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", kOk});
  PushSinkOptions options;
  options.url = server.base() + "/";
  options.backoff_min = 10ms;
  options.backoff_max = 20ms;
  auto sink = PushSink::Create(options);
  ASSERT_TRUE(sink.ok()) << sink.error().ToString();
  ProfileUpload u;
  u.app_name = "shop-api";
  u.profile_type = "gvl_wait";
  u.labels = {{"pid", "4242"}, {"host", "web-1"}};
  u.from_unix_s = 100;
  u.until_unix_s = 115;
  u.pprof_gz = std::string("\x1f\x8b profile", 10);
  (*sink)->Submit(u);
  ASSERT_TRUE((*sink)->Flush(60s));
  const auto requests = server.requests();
  ASSERT_EQ(requests.size(), 2u);
  for (const auto& r : requests) {
    EXPECT_EQ(r.target, "/push.v1.PusherService/Push");
    const auto series = testing::DecodePushRequest(r.body);
    ASSERT_TRUE(series.has_value());
    ASSERT_EQ(series->size(), 1u);
    EXPECT_EQ((*series)[0].profiles, std::vector<std::string>{u.pprof_gz});
  }
  EXPECT_EQ((*sink)->stats().retries, 1u);
  EXPECT_EQ((*sink)->stats().delivered, 1u);
}

// --- Against tests/e2e/fake_pyroscope.py -----------------------------------------------------------------------------

std::string Gzip(const std::string& data) {
  z_stream zs{};
  deflateInit2(&zs, Z_BEST_SPEED, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);  // +16: gzip framing
  std::string out(deflateBound(&zs, data.size()) + 32, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

// A minimal pprof Profile: sample types samples/count and cpu/nanoseconds, no samples, the interval [from_s,
// from_s + 15 s) in time_nanos and duration_nanos (the push API takes the time from there).
std::string TinyPprof(int64_t from_s) {
  std::string p;
  p += std::string("\x0a\x04\x08\x01\x10\x02", 6);  // sample_type {type: 1 "samples", unit: 2 "count"}
  p += std::string("\x0a\x04\x08\x03\x10\x04", 6);  // sample_type {type: 3 "cpu", unit: 4 "nanoseconds"}
  for (std::string s : {"", "samples", "count", "cpu", "nanoseconds"}) {
    p += '\x32';
    p += static_cast<char>(s.size());
    p += s;
  }
  auto varint_field = [&p](char key, uint64_t v) {
    p += key;
    for (; v >= 0x80; v >>= 7) p += static_cast<char>((v & 0x7f) | 0x80);
    p += static_cast<char>(v);
  };
  varint_field('\x48', static_cast<uint64_t>(from_s) * 1'000'000'000);  // time_nanos = 9
  varint_field('\x50', 15'000'000'000);                                // duration_nanos = 10
  return Gzip(p);
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Polls `done` every 10 ms for at most 60 s (a failing test must end; nothing here asserts how long it took).
template <typename F>
bool Eventually(F done) {
  for (int i = 0; i < 6000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return done();
}

class FakePyroscope {
 public:
  explicit FakePyroscope(const std::string& dir) : dir_(dir) {
    const std::string script = std::string(RVBPFD_SOURCE_DIR) + "/tests/e2e/fake_pyroscope.py";
    const std::string out_dir = dir + "/received";
    const std::string port_file = dir + "/port";
    std::vector<std::string> args = {"python3", script, "--port", "0", "--out-dir", out_dir, "--port-file", port_file};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (::posix_spawnp(&pid_, "python3", nullptr, nullptr, argv.data(), environ) != 0) pid_ = -1;
    if (pid_ > 0 && Eventually([&] { return !ReadText(port_file).empty(); })) {
      port_ = std::stoi(ReadText(port_file));
    }
  }
  ~FakePyroscope() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
  }
  int port() const { return port_; }
  std::string out_dir() const { return dir_ + "/received"; }
  int Count(const std::string& name) const {
    const std::string text = ReadText(out_dir() + "/" + name + ".count");
    return text.empty() ? 0 : std::stoi(text);
  }

 private:
  std::string dir_;
  pid_t pid_ = -1;
  int port_ = 0;
};

TEST(PushSinkLoopbackTest, OutageAtTheFakePyroscopeThenRecovery) {
  TempDir tmp;
  FakePyroscope receiver(tmp.path());
  ASSERT_GT(receiver.port(), 0) << "tests/e2e/fake_pyroscope.py did not start (python3 missing?)";
  { std::ofstream(receiver.out_dir() + "/REFUSE") << "down\n"; }

  PushSinkOptions options;
  options.url = "http://127.0.0.1:" + std::to_string(receiver.port());
  options.max_queue = 2;
  options.backoff_min = 20ms;
  options.backoff_max = 50ms;
  auto created = PushSink::Create(options);
  ASSERT_TRUE(created.ok()) << created.error().ToString();
  PushSink& sink = **created;

  auto upload = [&](int64_t from) {
    ProfileUpload u;
    u.app_name = "shop-api";
    u.profile_type = "cpu";
    u.labels = {{"host", "web-1"}, {"pid", "4242"}, {"command", "ruby app.rb, --port=3000"}};
    u.from_unix_s = from;
    u.until_unix_s = from + 15;
    u.pprof_gz = TinyPprof(from);
    return u;
  };
  // Backend down: A is refused and retried; B and C arrive; with room for 2, A (the oldest) is dropped.
  sink.Submit(upload(100));
  ASSERT_TRUE(Eventually([&] { return receiver.Count("refused") >= 2 && sink.stats().retries >= 2; }));
  sink.Submit(upload(115));
  sink.Submit(upload(130));
  ASSERT_TRUE(Eventually([&] { return sink.stats().dropped_queue_full == 1; }));
  // Backend back: delivery resumes with B then C.
  ASSERT_EQ(std::remove((receiver.out_dir() + "/REFUSE").c_str()), 0);
  EXPECT_TRUE(sink.Flush(60s));
  const SinkStats s = sink.stats();
  EXPECT_EQ(s.delivered, 2u);
  EXPECT_EQ(s.dropped_queue_full, 1u);
  EXPECT_EQ(s.delivery_failures, 0u);
  EXPECT_GE(s.retries, 2u);
  EXPECT_EQ(receiver.Count("rejected"), 0) << ReadText(receiver.out_dir() + "/rejected.log");

  for (int i = 1; i <= 2; ++i) {
    const std::string meta = ReadText(receiver.out_dir() + "/00000" + std::to_string(i) + ".json");
    const int64_t from = i == 1 ? 115 : 130;
    EXPECT_NE(meta.find("\"from\": " + std::to_string(from)), std::string::npos) << meta;
    EXPECT_NE(meta.find("\"service_name\": \"shop-api\""), std::string::npos) << meta;
    EXPECT_NE(meta.find("\"command\": \"ruby app.rb_ --port=3000\""), std::string::npos) << meta;
    EXPECT_NE(meta.find("\"profile_name\": \"process_cpu\""), std::string::npos) << meta;
    EXPECT_NE(meta.find("\"Content-Type\": \"application/proto\""), std::string::npos) << meta;
    EXPECT_EQ(ReadText(receiver.out_dir() + "/00000" + std::to_string(i) + ".body"), TinyPprof(from));
  }
}

TEST(PushSinkLoopbackTest, ABackendWithoutThePushApiGetsEveryProfileThroughIngest) {
  TempDir tmp;
  FakePyroscope receiver(tmp.path());
  ASSERT_GT(receiver.port(), 0) << "tests/e2e/fake_pyroscope.py did not start (python3 missing?)";
  { std::ofstream(receiver.out_dir() + "/NO_PUSH") << "Pyroscope before 1.0\n"; }
  PushSinkOptions options;
  options.url = "http://127.0.0.1:" + std::to_string(receiver.port());
  auto created = PushSink::Create(options);
  ASSERT_TRUE(created.ok()) << created.error().ToString();
  PushSink& sink = **created;
  std::vector<ProfileUpload> uploads;
  for (int64_t from : {100, 115}) {
    ProfileUpload u;
    u.app_name = "shop-api";
    u.profile_type = "cpu";
    u.labels = {{"host", "web-1"}};
    u.from_unix_s = from;
    u.until_unix_s = from + 15;
    u.pprof_gz = TinyPprof(from);
    uploads.push_back(std::move(u));
  }
  sink.SubmitAll(std::move(uploads));
  EXPECT_TRUE(sink.Flush(60s));
  const SinkStats s = sink.stats();
  EXPECT_EQ(s.delivered, 2u);
  EXPECT_EQ(s.delivery_failures + s.retries, 0u);
  EXPECT_EQ(s.push_api, "ingest");
  EXPECT_EQ(receiver.Count("push_not_found"), 1);
  EXPECT_EQ(receiver.Count("ingest_requests"), 2);
  EXPECT_EQ(receiver.Count("rejected"), 0) << ReadText(receiver.out_dir() + "/rejected.log");
  for (int i = 1; i <= 2; ++i) {
    const std::string meta = ReadText(receiver.out_dir() + "/00000" + std::to_string(i) + ".json");
    EXPECT_NE(meta.find("\"api\": \"ingest\""), std::string::npos) << meta;
    EXPECT_NE(meta.find("\"from\": " + std::to_string(i == 1 ? 100 : 115)), std::string::npos) << meta;
  }
}

}  // namespace
}  // namespace rvbpfd
