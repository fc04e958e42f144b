#include "sink/push_sink.h"

#include <gtest/gtest.h>

#include <future>
#include <limits>
#include <string>
#include <vector>

#include "sink/sink_test_util.h"

namespace rvbpfd {
namespace {

using namespace std::chrono_literals;
using std::chrono::milliseconds;
using testing::FakeClock;
using testing::FakeTransport;
using testing::ScriptedJitter;
using testing::Answer;

ProfileUpload MakeUpload(std::string body, int64_t from = 1700000000) {
  ProfileUpload u;
  u.app_name = "shop-api";
  u.profile_type = "cpu";
  u.labels = {{"host", "web-1"}, {"pid", "4242"}};
  u.from_unix_s = from;
  u.until_unix_s = from + 15;
  u.pprof_gz = std::move(body);
  return u;
}

struct Harness {
  std::shared_ptr<FakeClock> clock;
  std::shared_ptr<FakeTransport> transport;
  std::unique_ptr<PushSink> sink;
};

Harness MakeSink(std::vector<HttpResult> script, std::vector<uint64_t> jitter = {}, size_t max_queue = 256,
                 bool auto_advance = true, milliseconds backoff_min = 500ms, milliseconds backoff_max = 30000ms) {
  Harness h;
  h.clock = std::make_shared<FakeClock>(auto_advance);
  h.transport = std::make_shared<FakeTransport>(h.clock, std::move(script));
  PushSinkOptions options;
  options.url = "http://pyroscope.example:4040";
  options.max_queue = max_queue;
  options.backoff_min = backoff_min;
  options.backoff_max = backoff_max;
  options.headers = {{"X-Scope-OrgID", "team-a"}};
  options.transport = h.transport;
  options.clock = h.clock;
  options.jitter = std::make_shared<ScriptedJitter>(std::move(jitter));
  auto sink = PushSink::Create(std::move(options));
  EXPECT_TRUE(sink.ok()) << (sink.ok() ? "" : sink.error().ToString());
  if (sink.ok()) h.sink = std::move(sink).value();
  return h;
}

constexpr std::string_view kPushUrl = "http://pyroscope.example:4040/push.v1.PusherService/Push";

// The profiles one request carried: every raw profile of a push request, or an /ingest request's body.
std::vector<std::string> Profiles(const FakeTransport::Call& call) {
  if (call.url != kPushUrl) return {call.body};
  std::vector<std::string> out;
  const auto series = testing::DecodePushRequest(call.body);
  EXPECT_TRUE(series.has_value()) << "undecodable push request";
  for (const auto& s : series.value_or(std::vector<testing::PushedSeries>{})) {
    out.insert(out.end(), s.profiles.begin(), s.profiles.end());
  }
  return out;
}

// Every profile sent, in order, over all requests.
std::vector<std::string> Bodies(const FakeTransport& t) {
  std::vector<std::string> out;
  for (const auto& c : t.calls()) {
    const std::vector<std::string> p = Profiles(c);
    out.insert(out.end(), p.begin(), p.end());
  }
  return out;
}

// --- The request ---------------------------------------------------------------------------------------------------

TEST(PyroscopeNameTest, AppAndSortedLabelsInBraces) {
  const std::map<std::string, std::string> labels = {
      {"host", "web-1"},         {"pid", "4242"},           {"command", "ruby app.rb, -e {x}"},
      {"ruby_version", "3.4.5"}, {"container_id", "abc123"}, {"service_name", "shop-api"}};
  // service_name is the app name itself (not repeated); ',', '{', '}' in values become '_'.
  EXPECT_EQ(PyroscopeName("shop-api", labels),
            "shop-api{command=ruby app.rb_ -e _x_,container_id=abc123,host=web-1,pid=4242,ruby_version=3.4.5}");
  EXPECT_EQ(PyroscopeName("shop-api", {}), "shop-api{}");
}

TEST(PyroscopeNameTest, SanitizesWhatPyroscopeWouldReject) {
  EXPECT_EQ(PyroscopeAppName("  my app:v2/α  "), "my_app_v2/__");  // 'α' is two bytes
  EXPECT_EQ(PyroscopeAppName(""), "unknown");
  EXPECT_EQ(PyroscopeAppName("a{b}"), "a_b_");
  EXPECT_EQ(PyroscopeName("a", {{"1st-label", "x"},
                                {"__reserved", "x"},
                                {"pyroscope_spy", "x"},
                                {"empty", "   "},
                                {"utf8", " café\t\xff"},
                                {"eq", "a=b"}}),
            "a{_1st_label=x,eq=a=b,utf8=café__}");
  // Two names that sanitize alike: the first (by original name) wins, no duplicate label.
  EXPECT_EQ(PyroscopeName("a", {{"k-1", "first"}, {"k_1", "second"}}), "a{k_1=first}");
}

TEST(PyroscopeNameTest, ValueCutAt2048BytesOnACharacterBoundary) {
  std::string value = "a";
  for (int i = 0; i < 1500; ++i) value += "é";  // 1 + 3000 bytes; byte 2048 is the middle of an 'é'
  const std::string name = PyroscopeName("a", {{"k", value}});
  const std::string sent = name.substr(4, name.size() - 5);  // a{k=...}
  EXPECT_EQ(sent.size(), 2047u);
  EXPECT_EQ(sent, value.substr(0, 2047));
}

TEST(PyroscopeNameTest, AtMost26Labels) {
  std::map<std::string, std::string> labels;
  for (int i = 0; i < 30; ++i) labels[std::string("k") + static_cast<char>('a' + i / 10) + std::to_string(i % 10)] = "v";
  const std::string name = PyroscopeName("a", labels);
  EXPECT_EQ(std::count(name.begin(), name.end(), '='), 26);
  EXPECT_NE(name.find("kc5=v"), std::string::npos);
  EXPECT_EQ(name.find("kc6=v"), std::string::npos);
}

TEST(PyroscopeNameTest, SampleLabelNamesTakeTheirPlaceAndTheirNames) {
  std::map<std::string, std::string> labels = {{"holder", "spoofed"}, {"host", "web-1"}};
  for (int i = 0; i < 30; ++i) labels["k" + std::to_string(10 + i)] = "v";
  const std::string name = PyroscopeName("a", labels, {"holder", "waiter", "blame_source"});
  // 26 minus the 3 the samples bring; no second "holder".
  EXPECT_EQ(std::count(name.begin(), name.end(), '='), 23);
  EXPECT_EQ(name.find("holder"), std::string::npos);
  EXPECT_NE(name.find("host=web-1"), std::string::npos);
  ProfileUpload u = MakeUpload("x");
  u.labels["waiter"] = "Thread #3";
  u.sample_label_names = {"waiter"};
  EXPECT_EQ(PyroscopeIngestRequestUrl("http://h:4040/ingest", u).find("waiter"), std::string::npos);
}

TEST(PyroscopeUrlTest, ExactRequestUrl) {
  ProfileUpload u = MakeUpload("x");
  u.labels["command"] = "ruby app.rb";
  EXPECT_EQ(PercentEncode("a-z.A_Z~09 /{}=,%+&?é"), "a-z.A_Z~09%20%2F%7B%7D%3D%2C%25%2B%26%3F%C3%A9");
  EXPECT_EQ(PyroscopeIngestRequestUrl("http://h:4040/ingest", u),
            "http://h:4040/ingest?name=shop-api%7Bcommand%3Druby%20app.rb%2Chost%3Dweb-1%2Cpid%3D4242%7D"
            "&from=1700000000&until=1700000015&format=pprof&spyName=rvbpfd");
}

TEST(PyroscopeUrlTest, BaseUrlForms) {
  EXPECT_EQ(PyroscopeIngestUrl("http://127.0.0.1:4040").value(), "http://127.0.0.1:4040/ingest");
  EXPECT_EQ(PyroscopeIngestUrl("http://127.0.0.1:4040/").value(), "http://127.0.0.1:4040/ingest");
  EXPECT_EQ(PyroscopeIngestUrl("HTTPS://profiles.example/pyroscope//").value(),
            "HTTPS://profiles.example/pyroscope/ingest");
  EXPECT_EQ(PyroscopeIngestUrl("http://h:4040/ingest").value(), "http://h:4040/ingest");
  EXPECT_EQ(PyroscopeIngestUrl("http://u:pw@h").value(), "http://u:pw@h/ingest");
  // The push API lives beside /ingest, under the same base path.
  EXPECT_EQ(PyroscopePushUrl(PyroscopeIngestUrl("HTTPS://profiles.example/pyroscope//").value()),
            "HTTPS://profiles.example/pyroscope/push.v1.PusherService/Push");
  EXPECT_EQ(PyroscopePushUrl(PyroscopeIngestUrl("http://h:4040/ingest").value()),
            "http://h:4040/push.v1.PusherService/Push");
  for (const char* bad : {"ftp://h", "127.0.0.1:4040", "http://", "http:///ingest", "http://h/?x=1", "http://h#f",
                          "http://h /x", ""}) {
    auto r = PyroscopeIngestUrl(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code(), ErrorCode::kUsage);
    EXPECT_NE(r.error().message().find("--push-url"), std::string::npos);
  }
  auto secret = PyroscopeIngestUrl("http://user:s3cret@h?x");
  ASSERT_FALSE(secret.ok());
  EXPECT_EQ(secret.error().message().find("s3cret"), std::string::npos) << secret.error().message();
  EXPECT_NE(secret.error().message().find("http://***@h?x"), std::string::npos);
}

TEST(PushSinkTest, CreateRejectsBadUrlAndEmptyQueue) {
  PushSinkOptions options;
  options.url = "localhost:4040";
  EXPECT_EQ(PushSink::Create(options).error().code(), ErrorCode::kUsage);
  options.url = "http://localhost:4040";
  options.max_queue = 0;
  options.transport = std::make_shared<FakeTransport>(SinkClock::Steady(), std::vector<HttpResult>{});
  auto r = PushSink::Create(options);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("--push-queue"), std::string::npos);
}

TEST(PushSinkTest, PushRequestShape) {
  Harness h = MakeSink({});
  std::string body("\x1f\x8b\x08\x00pprof\0bytes", 15);
  ProfileUpload blame = MakeUpload("blame");
  blame.profile_type = "gvl_blame";
  blame.labels["holder"] = "shadowed by the sample label";
  blame.sample_label_names = {"holder"};
  h.sink->SubmitAll({MakeUpload(body), blame});
  ASSERT_TRUE(h.sink->Flush(60s));
  const auto calls = h.transport->calls();
  ASSERT_EQ(calls.size(), 1u);  // both in one request
  EXPECT_EQ(calls[0].url, kPushUrl);
  EXPECT_EQ(calls[0].content_type, "application/proto");
  EXPECT_EQ(calls[0].timeout, 10000ms);
  ASSERT_EQ(calls[0].headers.size(), 1u);
  EXPECT_EQ(calls[0].headers[0], (std::pair<std::string, std::string>{"X-Scope-OrgID", "team-a"}));
  const auto series = testing::DecodePushRequest(calls[0].body);
  ASSERT_TRUE(series.has_value());
  ASSERT_EQ(series->size(), 2u);
  // The labels the /ingest route would give the same profiles, sorted by name; one raw sample each.
  using Labels = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ((*series)[0].labels, (Labels{{"__delta__", "false"},
                                         {"__name__", "process_cpu"},
                                         {"host", "web-1"},
                                         {"pid", "4242"},
                                         {"pyroscope_spy", "rvbpfd"},
                                         {"service_name", "shop-api"}}));
  EXPECT_EQ((*series)[0].profiles, std::vector<std::string>{body});
  EXPECT_EQ((*series)[1].labels, (Labels{{"__delta__", "false"},
                                         {"__name__", "gvl_blame"},
                                         {"host", "web-1"},
                                         {"pid", "4242"},
                                         {"pyroscope_spy", "rvbpfd"},
                                         {"service_name", "shop-api"}}));
  EXPECT_EQ((*series)[1].profiles, std::vector<std::string>{"blame"});
  const SinkStats s = h.sink->stats();
  EXPECT_EQ(s.delivered, 2u);
  EXPECT_EQ(s.bytes_delivered, body.size() + 5);
  EXPECT_EQ(s.queued, 0u);
  EXPECT_EQ(s.retries + s.delivery_failures + s.dropped_queue_full, 0u);
  EXPECT_EQ(s.push_api, "push");
}

TEST(PushSinkTest, ProfileNamesAreTheOnesIngestDerivesFromTheSampleTypes) {
  // The table in push_sink.h: Pyroscope's /ingest names a pprof process_cpu when a sample type contains "cpu", else
  // after its last sample type, which the agent names after the profile type.
  EXPECT_EQ(PyroscopeProfileName("cpu"), "process_cpu");
  for (const char* type : {"gvl_wait", "gvl_held", "gc", "gvl_blame"}) EXPECT_EQ(PyroscopeProfileName(type), type);
}

TEST(PushSinkTest, BatchesAreCutAtTheByteCap) {
  Harness h = MakeSink({});
  std::vector<ProfileUpload> uploads;
  for (uint64_t kib : {400, 400, 400, 2000, 100}) {
    ProfileUpload u = MakeUpload("k" + std::to_string(kib));
    u.pprof_bytes = kib << 10;
    uploads.push_back(std::move(u));
  }
  h.sink->SubmitAll(std::move(uploads));
  ASSERT_TRUE(h.sink->Flush(60s));
  std::vector<std::vector<std::string>> requests;
  for (const auto& c : h.transport->calls()) requests.push_back(Profiles(c));
  // 1 MiB a request: 400+400 KiB, then 400 KiB alone (2000 more would pass the cap), 2000 KiB alone (the first
  // of a request goes whatever its size, and nothing fits after it), then 100 KiB.
  EXPECT_EQ(requests,
            (std::vector<std::vector<std::string>>{{"k400", "k400"}, {"k400"}, {"k2000"}, {"k100"}}));
}

class NoPushApiTest : public ::testing::TestWithParam<int> {};

TEST_P(NoPushApiTest, EveryProfileGoesToIngestFromThenOn) {
  Harness h = MakeSink({Answer(GetParam(), "404 page not found")});
  std::string body("\x1f\x8b\x08\x00pprof\0bytes", 15);
  h.sink->SubmitAll({MakeUpload(body), MakeUpload("second", 1700000015)});
  ASSERT_TRUE(h.sink->Flush(60s));
  h.sink->SubmitAll({MakeUpload("third", 1700000030)});
  ASSERT_TRUE(h.sink->Flush(60s));
  const auto calls = h.transport->calls();
  ASSERT_EQ(calls.size(), 4u);
  EXPECT_EQ(calls[0].url, kPushUrl);
  EXPECT_EQ(calls[1].url,
            "http://pyroscope.example:4040/ingest?name=shop-api%7Bhost%3Dweb-1%2Cpid%3D4242%7D"
            "&from=1700000000&until=1700000015&format=pprof&spyName=rvbpfd");
  EXPECT_EQ(calls[1].content_type, "application/octet-stream");
  EXPECT_EQ(calls[1].body, body);
  ASSERT_EQ(calls[1].headers.size(), 1u);
  EXPECT_EQ(calls[1].headers[0], (std::pair<std::string, std::string>{"X-Scope-OrgID", "team-a"}));
  EXPECT_EQ(calls[2].body, "second");
  EXPECT_EQ(calls[3].body, "third");  // the push API is not tried again
  const SinkStats s = h.sink->stats();
  EXPECT_EQ(s.delivered, 3u);
  EXPECT_EQ(s.retries + s.delivery_failures, 0u);
  EXPECT_EQ(s.push_api, "ingest");
}

INSTANTIATE_TEST_SUITE_P(Statuses, NoPushApiTest, ::testing::Values(404, 405, 415));

TEST(PushSinkTest, ARefusedPushCountsEveryProfileItCarried) {
  Harness h = MakeSink({Answer(400, "invalid labels")});
  h.sink->SubmitAll({MakeUpload("u0"), MakeUpload("u1"), MakeUpload("u2")});
  h.sink->Flush(60s);  // its result depends on whether the failure came before it was called
  ASSERT_EQ(h.transport->calls().size(), 1u);  // not split and resent: Pyroscope may have stored some
  const SinkStats s = h.sink->stats();
  EXPECT_EQ(s.delivery_failures, 3u);
  EXPECT_EQ(s.delivered + s.retries, 0u);
  EXPECT_NE(s.last_error.find("HTTP 400: invalid labels (not retried; one request of 3 profiles, some may have been "
                              "stored)"),
            std::string::npos)
      << s.last_error;
  EXPECT_EQ(s.push_api, "push");
}

TEST(PushSinkTest, AnIngestRetryLeavesTheProfilesAfterItUnattempted) {
  // No push API; then over /ingest u0 is delivered, u1 gets a 503: u2 is not attempted before u1's retry.
  Harness h = MakeSink({Answer(404), Answer(200), Answer(503)}, {0}, 256, true, 500ms, 4000ms);
  h.sink->SubmitAll({MakeUpload("u0"), MakeUpload("u1"), MakeUpload("u2")});
  ASSERT_TRUE(h.sink->Flush(60s));
  EXPECT_EQ(Bodies(*h.transport), (std::vector<std::string>{"u0", "u1", "u2", "u0", "u1", "u1", "u2"}));
  const auto calls = h.transport->calls();
  ASSERT_EQ(calls.size(), 5u);
  EXPECT_EQ(calls[3].at - calls[2].at, 250ms);  // u1's backoff (base 500, jitter 0)
  const SinkStats s = h.sink->stats();
  EXPECT_EQ(s.delivered, 3u);
  EXPECT_EQ(s.retries, 1u);
  EXPECT_EQ(s.delivery_failures, 0u);
}

// --- Queue and retry policy ----------------------------------------------------------------------------------------

TEST(PushSinkTest, DeliversOldestFirst) {
  Harness h = MakeSink({});
  // While u0 is being sent, u1..u4 arrive.
  PushSink* sink = nullptr;
  h.transport->on_call = [&sink](size_t index, const HttpRequest&) {
    if (index == 0) {
      for (int i = 1; i <= 4; ++i) sink->Submit(MakeUpload("u" + std::to_string(i)));
    }
  };
  sink = h.sink.get();
  h.sink->Submit(MakeUpload("u0"));
  ASSERT_TRUE(h.sink->Flush(60s));
  EXPECT_EQ(Bodies(*h.transport), (std::vector<std::string>{"u0", "u1", "u2", "u3", "u4"}));
  EXPECT_EQ(h.sink->stats().delivered, 5u);
}

TEST(PushSinkTest, RetriesWithExponentialBackoffAndJitter) {
  // 503, no response, 429, 500, then 200; jitter values chosen to hit both ends of the range.
  Harness h = MakeSink({Answer(503), Answer(0), Answer(429), Answer(500)},
                       {0, 0, std::numeric_limits<uint64_t>::max(), 7}, 256, true, 500ms, 4000ms);
  h.sink->Submit(MakeUpload("u0"));
  ASSERT_TRUE(h.sink->Flush(3600s));
  const auto calls = h.transport->calls();
  ASSERT_EQ(calls.size(), 5u);
  std::vector<milliseconds> delays;
  for (size_t i = 1; i < calls.size(); ++i) {
    delays.push_back(std::chrono::duration_cast<milliseconds>(calls[i].at - calls[i - 1].at));
    EXPECT_EQ(Profiles(calls[i]), std::vector<std::string>{"u0"});
  }
  // base 500 -> 250+0; base 1000 -> 500+0; base 2000 -> 1000 + (2^64-1 mod 1001 = 15); base 4000 -> 2000 + 7.
  EXPECT_EQ(delays, (std::vector<milliseconds>{250ms, 500ms, 1015ms, 2007ms}));
  const SinkStats s = h.sink->stats();
  EXPECT_EQ(s.retries, 4u);
  EXPECT_EQ(s.delivered, 1u);
  EXPECT_EQ(s.delivery_failures, 0u);
  EXPECT_EQ(s.consecutive_failures, 0u);
  EXPECT_NE(s.last_error.find("HTTP 500"), std::string::npos) << s.last_error;
}

TEST(PushSinkTest, BackoffIsTheBackendsNotTheUploads) {
  // u0 fails twice then is delivered; u1, submitted meanwhile, then fails once: its delay starts again from
  // backoff_min.
  Harness h = MakeSink({Answer(503), Answer(503), Answer(200), Answer(503)}, {0, 0, 0}, 256, true, 500ms, 4000ms);
  h.transport->on_call = [&h](size_t index, const HttpRequest&) {
    if (index == 2) h.sink->Submit(MakeUpload("u1"));
  };
  h.sink->Submit(MakeUpload("u0"));
  ASSERT_TRUE(h.sink->Flush(3600s));
  const auto calls = h.transport->calls();
  ASSERT_EQ(calls.size(), 5u);
  EXPECT_EQ(Bodies(*h.transport), (std::vector<std::string>{"u0", "u0", "u0", "u1", "u1"}));
  EXPECT_EQ(calls[1].at - calls[0].at, 250ms);
  EXPECT_EQ(calls[2].at - calls[1].at, 500ms);
  EXPECT_EQ(calls[3].at - calls[2].at, 0ms);  // after a delivery the next upload goes at once
  EXPECT_EQ(calls[4].at - calls[3].at, 250ms);
}

TEST(PushSinkTest, RetryAfterIsHonoredUpToBackoffMax) {
  Harness h = MakeSink({Answer(503, "", 3s), Answer(429, "", 3600s)}, {0, 0}, 256, true, 100ms, 10000ms);
  h.sink->Submit(MakeUpload("u0"));
  ASSERT_TRUE(h.sink->Flush(36000s));
  const auto calls = h.transport->calls();
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[1].at - calls[0].at, 3000ms);   // Retry-After 3 s beats the 50 ms backoff
  EXPECT_EQ(calls[2].at - calls[1].at, 10000ms);  // Retry-After 1 h is capped at backoff_max
}

class PermanentStatusTest : public ::testing::TestWithParam<int> {};

TEST_P(PermanentStatusTest, GivesUpWithoutRetrying) {
  Harness h = MakeSink({Answer(GetParam(), "invalid labels\nfoo"), Answer(200)});
  h.transport->on_call = [&h](size_t index, const HttpRequest&) {
    if (index == 0) h.sink->Submit(MakeUpload("u1"));
  };
  h.sink->Submit(MakeUpload("u0"));
  h.sink->Flush(60s);
  EXPECT_EQ(Bodies(*h.transport), (std::vector<std::string>{"u0", "u1"}));
  const SinkStats s = h.sink->stats();
  EXPECT_EQ(s.delivery_failures, 1u);
  EXPECT_EQ(s.delivered, 1u);
  EXPECT_EQ(s.retries, 0u);
  EXPECT_NE(s.last_error.find("HTTP " + std::to_string(GetParam()) + ": invalid labels foo"), std::string::npos)
      << s.last_error;
}

// (404, 405 and 415 say the backend has no push API: NoPushApiTest.)
INSTANTIATE_TEST_SUITE_P(Statuses, PermanentStatusTest, ::testing::Values(301, 400, 401, 413, 422));

TEST(PushSinkTest, AFlushDeadlineEndsAnIngestAttemptBetweenRequests) {
  // w fails once, so the worker waits out a backoff while u0..u4 arrive; then a Flush of 2.5 s sends all six at
  // once, finds no push API, and every /ingest answer takes 1 s: w (timeout 2.5 s), u0 (1.5 s) and u1 (0.5 s) go,
  // then the attempt ends at the Flush's deadline; u2..u4 go back unattempted and leave in a later attempt, with
  // the full timeout (whether the Flush saw them delivered before it returned is a race with the worker).
  Harness h = MakeSink({Answer(503), Answer(404)}, {0}, 256, /*auto_advance=*/false, 60000ms, 60000ms);
  h.transport->on_call = [&h](size_t index, const HttpRequest&) {
    if (index > 1) h.clock->Advance(1s);
  };
  h.sink->Submit(MakeUpload("w"));
  h.clock->AwaitParked(1);
  std::vector<ProfileUpload> uploads;
  for (int i = 0; i < 5; ++i) uploads.push_back(MakeUpload("u" + std::to_string(i)));
  h.sink->SubmitAll(std::move(uploads));
  h.sink->Flush(2500ms);
  EXPECT_TRUE(h.sink->Flush(60s));
  const auto calls = h.transport->calls();
  ASSERT_EQ(calls.size(), 8u);
  EXPECT_EQ(calls[2].timeout, 2500ms);
  EXPECT_EQ(calls[3].timeout, 1500ms);
  EXPECT_EQ(calls[4].timeout, 500ms);
  EXPECT_EQ(calls[5].timeout, 10000ms);  // a new attempt: the one under the Flush stopped at its deadline
  EXPECT_EQ(Bodies(*h.transport), (std::vector<std::string>{"w", "w", "u0", "u1", "u2", "u3", "u4", "w", "u0", "u1",
                                                             "u2", "u3", "u4"}));
  EXPECT_EQ(h.sink->stats().delivered, 6u);
}

TEST(PushSinkTest, AFailedAndARetriedProfileInOneIngestAttempt) {
  // Over /ingest: u0 refused for good, u1 retried, u2 not attempted until u1's retry.
  Harness h = MakeSink({Answer(404), Answer(400, "bad"), Answer(503)}, {0}, 256, true, 500ms, 4000ms);
  h.sink->SubmitAll({MakeUpload("u0"), MakeUpload("u1"), MakeUpload("u2")});
  h.sink->Flush(60s);  // its result depends on whether the failure came before it was called
  EXPECT_EQ(Bodies(*h.transport), (std::vector<std::string>{"u0", "u1", "u2", "u0", "u1", "u1", "u2"}));
  const SinkStats s = h.sink->stats();
  EXPECT_EQ(s.delivery_failures, 1u);
  EXPECT_EQ(s.retries, 1u);
  EXPECT_EQ(s.delivered, 2u);
}

TEST(PushSinkTest, ACutLargerThanTheQueueIsKeptWhole) {
  // max_queue 3, a hand-over of 5: nothing dropped while the backend keeps up.
  Harness h = MakeSink({}, {}, 3);
  std::vector<ProfileUpload> uploads;
  for (int i = 0; i < 5; ++i) uploads.push_back(MakeUpload("u" + std::to_string(i)));
  h.sink->SubmitAll(std::move(uploads));
  ASSERT_TRUE(h.sink->Flush(60s));
  EXPECT_EQ(Bodies(*h.transport), (std::vector<std::string>{"u0", "u1", "u2", "u3", "u4"}));
  EXPECT_EQ(h.sink->stats().dropped_queue_full, 0u);
}

TEST(PushSinkTest, ASmallerHandOverDoesNotShrinkTheRoomALargerOneMade) {
  // max_queue 3; a cut of 5 fails while an exited process's 1 profile arrives: 6 wait for 5 places (the largest
  // hand-over), so only u0 is dropped.
  Harness h = MakeSink({Answer(503)}, {}, 3);
  h.transport->on_call = [&h](size_t index, const HttpRequest&) {
    if (index == 0) h.sink->SubmitAll({MakeUpload("u5")});
  };
  std::vector<ProfileUpload> uploads;
  for (int i = 0; i < 5; ++i) uploads.push_back(MakeUpload("u" + std::to_string(i)));
  h.sink->SubmitAll(std::move(uploads));
  h.sink->Flush(60s);  // its result depends on whether the drop came before it was called
  EXPECT_EQ(h.sink->stats().dropped_queue_full, 1u);
  EXPECT_EQ(h.sink->stats().delivered, 5u);
}

TEST(PushSinkTest, ARetriedBatchIsDroppedOldestFirstWhenNewerProfilesFillTheQueue) {
  // max_queue 3: [u0 u1 u2] fails while u3 and u4 arrive; five wait for three places, so u0 and u1 go.
  Harness h = MakeSink({Answer(503)}, {}, 3);
  h.transport->on_call = [&h](size_t index, const HttpRequest&) {
    if (index == 0) {
      h.sink->Submit(MakeUpload("u3"));
      h.sink->Submit(MakeUpload("u4"));
    }
  };
  h.sink->SubmitAll({MakeUpload("u0"), MakeUpload("u1"), MakeUpload("u2")});
  h.sink->Flush(60s);  // false when the drops happen while it waits: whether they do is a race with the worker
  EXPECT_EQ(Bodies(*h.transport), (std::vector<std::string>{"u0", "u1", "u2", "u2", "u3", "u4"}));
  const SinkStats s = h.sink->stats();
  EXPECT_EQ(s.dropped_queue_full, 2u);
  EXPECT_EQ(s.retries, 1u);
  EXPECT_EQ(s.delivered, 3u);
}

TEST(PushSinkTest, IngestGivesUpOnA404) {
  Harness h = MakeSink({Answer(404), Answer(404, "no such tenant")});
  h.sink->Submit(MakeUpload("u0"));
  h.sink->Flush(60s);  // its result depends on whether the failure came before it was called
  EXPECT_EQ(h.transport->calls().size(), 2u);
  const SinkStats s = h.sink->stats();
  EXPECT_EQ(s.delivery_failures, 1u);
  EXPECT_EQ(s.retries, 0u);
  EXPECT_NE(s.last_error.find("/ingest: HTTP 404: no such tenant (not retried)"), std::string::npos) << s.last_error;
}

class RetryableStatusTest : public ::testing::TestWithParam<int> {};

TEST_P(RetryableStatusTest, Retries) {
  Harness h = MakeSink({Answer(GetParam())});
  h.sink->Submit(MakeUpload("u0"));
  ASSERT_TRUE(h.sink->Flush(60s));
  EXPECT_EQ(Bodies(*h.transport), (std::vector<std::string>{"u0", "u0"}));
  EXPECT_EQ(h.sink->stats().retries, 1u);
  EXPECT_EQ(h.sink->stats().delivered, 1u);
}

INSTANTIATE_TEST_SUITE_P(Statuses, RetryableStatusTest, ::testing::Values(0, 408, 429, 500, 502, 503, 504));

TEST(PushSinkTest, DropsOldestWhenFullWhileBackingOff) {
  // max_queue 3. While u0's first attempt fails, u1..u5 arrive: u1 and u2 are dropped on arrival, and u0 (the
  // oldest) when its attempt fails with three newer uploads waiting. Delivery resumes with u3, u4, u5 in order.
  Harness h = MakeSink({Answer(503)}, {}, 3);
  h.transport->on_call = [&h](size_t index, const HttpRequest&) {
    if (index == 0) {
      for (int i = 1; i <= 5; ++i) h.sink->Submit(MakeUpload("u" + std::to_string(i)));
      EXPECT_EQ(h.sink->stats().dropped_queue_full, 2u);
      EXPECT_EQ(h.sink->stats().queued, 4u);  // 3 waiting + the one being sent
    }
  };
  h.sink->Submit(MakeUpload("u0"));
  h.sink->Flush(60s);
  EXPECT_EQ(Bodies(*h.transport), (std::vector<std::string>{"u0", "u3", "u4", "u5"}));
  const SinkStats s = h.sink->stats();
  EXPECT_EQ(s.dropped_queue_full, 3u);
  EXPECT_EQ(s.retries, 1u);
  EXPECT_EQ(s.delivered, 3u);
  EXPECT_EQ(s.queued, 0u);
}

TEST(PushSinkTest, EmptyProfileIsCountedNotSent) {
  Harness h = MakeSink({});
  h.sink->Submit(MakeUpload(""));
  EXPECT_TRUE(h.sink->Flush(1s));
  EXPECT_TRUE(h.transport->calls().empty());
  EXPECT_EQ(h.sink->stats().delivery_failures, 1u);
  EXPECT_NE(h.sink->stats().last_error.find("empty cpu profile"), std::string::npos);
}

// --- Flush ---------------------------------------------------------------------------------------------------------

// Runs Flush(deadline) on another thread; true if it returned without the (manual) clock moving. If it does not
// return within 60 s of real time (a bug: it waits for virtual time), the clock is moved a day so the test can end.
bool FlushReturnsWithoutTimePassing(Harness& h, milliseconds deadline, bool* result) {
  auto flushed = std::async(std::launch::async, [&h, deadline] { return h.sink->Flush(deadline); });
  const bool in_time = flushed.wait_for(60s) == std::future_status::ready;
  if (!in_time) h.clock->Advance(24h);
  *result = flushed.get();
  return in_time;
}

TEST(PushSinkTest, FlushWithNothingQueuedReturnsTrue) {
  Harness h = MakeSink({});
  EXPECT_TRUE(h.sink->Flush(0ms));
}

TEST(PushSinkTest, FlushAttemptsAtOnceInsteadOfSleepingOutTheBackoff) {
  Harness h = MakeSink({Answer(503)}, {0}, 256, /*auto_advance=*/false, 60000ms, 60000ms);
  h.sink->Submit(MakeUpload("u0"));
  const auto wake = h.clock->AwaitParked(1);  // after the 503, waiting out a 30 s backoff
  const auto failed_at = h.transport->calls().at(0).at;
  EXPECT_EQ(wake - failed_at, 30000ms);
  bool flushed = false;
  ASSERT_TRUE(FlushReturnsWithoutTimePassing(h, 5s, &flushed));
  EXPECT_TRUE(flushed);
  const auto calls = h.transport->calls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[1].at, failed_at);  // no time passed: attempted at once
  EXPECT_EQ(calls[1].timeout, 5000ms);  // cut to what was left of the flush
}

TEST(PushSinkTest, FlushReturnsFalseWhenAnUploadFailsWhileFlushing) {
  Harness h = MakeSink({Answer(503), Answer(400)}, {0}, 256, /*auto_advance=*/false);
  h.sink->Submit(MakeUpload("u0"));
  h.clock->AwaitParked(1);
  bool flushed = true;
  ASSERT_TRUE(FlushReturnsWithoutTimePassing(h, 5s, &flushed));
  EXPECT_FALSE(flushed);
  EXPECT_EQ(h.sink->stats().delivery_failures, 1u);
  EXPECT_EQ(h.sink->stats().queued, 0u);
}

TEST(PushSinkTest, FlushGivesUpAtItsDeadline) {
  Harness h = MakeSink({Answer(503), Answer(503), Answer(503)}, {0, 0}, 256, /*auto_advance=*/false, 1000ms,
                       60000ms);
  h.sink->Submit(MakeUpload("u0"));
  h.clock->AwaitParked(1);
  const auto start = h.clock->Now();
  auto flushed = std::async(std::launch::async, [&h] { return h.sink->Flush(1200ms); });
  // Flush -> attempt 2 at once (503) -> backoff 1000 ms (base 2000, jitter 0) -> attempt 3 at +1000 ms (503) ->
  // backoff 2000 ms, but the flush ends at +1200 ms: the worker wakes there and Flush returns false.
  EXPECT_EQ(h.clock->AwaitParked(2) - start, 1000ms);
  h.clock->Advance(1000ms);
  EXPECT_EQ(h.clock->AwaitParked(3) - start, 1200ms);
  h.clock->Advance(200ms);
  EXPECT_FALSE(flushed.get());
  const auto calls = h.transport->calls();
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[1].timeout, 1200ms);
  EXPECT_EQ(calls[2].timeout, 200ms);
  EXPECT_EQ(h.sink->stats().queued, 1u);  // still queued: delivery continues after the flush
  EXPECT_EQ(h.sink->stats().retries, 3u);
}

TEST(PushSinkTest, DestructorCancelsAnAttemptInProgress) {
  Harness h = MakeSink({});
  std::promise<void> entered;
  h.transport->on_call = [&entered](size_t index, const HttpRequest& request) {
    if (index != 0) return;
    entered.set_value();
    while (!request.cancel->load()) std::this_thread::sleep_for(1ms);  // a slow backend, until cancelled
  };
  h.sink->Submit(MakeUpload("u0"));
  entered.get_future().wait();
  h.sink.reset();  // must return: the attempt is cancelled and the worker joined
  EXPECT_EQ(h.transport->calls().size(), 1u);
}

TEST(PushSinkTest, DestructorDuringBackoffDoesNotWait) {
  Harness h = MakeSink({Answer(503)}, {}, 256, /*auto_advance=*/false, 3600000ms, 3600000ms);
  h.sink->Submit(MakeUpload("u0"));
  h.clock->AwaitParked(1);
  h.sink.reset();
  EXPECT_EQ(h.transport->calls().size(), 1u);
}

}  // namespace
}  // namespace rvbpfd
