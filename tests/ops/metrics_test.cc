#include "ops/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "elf/elf_fixtures.h"

namespace rvbpfd {
namespace {

using ::testing::HasSubstr;

TEST(MetricsRegistryTest, RendersTextFormatSortedWithHelpAndTypeOncePerName) {
  MetricsRegistry r;
  r.SetGauge("rvbpfd_processes_watched", "Ruby processes being profiled", {}, 3);
  r.AddCounter("rvbpfd_dropped_total", "Records dropped", {{"reason", "queue_full"}}, 2);
  r.AddCounter("rvbpfd_dropped_total", "Records dropped", {{"reason", "ring_full_events"}}, 5);
  r.AddCounter("rvbpfd_dropped_total", "Records dropped", {{"reason", "queue_full"}}, 1);
  r.SetCounter("rvbpfd_events_total", "Scheduler events received", {}, 1234567890123);
  r.SetCounter("rvbpfd_agent_cpu_seconds_total", "CPU", {}, 0.25);
  EXPECT_EQ(r.RenderPrometheus(),
            "# HELP rvbpfd_agent_cpu_seconds_total CPU\n"
            "# TYPE rvbpfd_agent_cpu_seconds_total counter\n"
            "rvbpfd_agent_cpu_seconds_total 0.25\n"
            "# HELP rvbpfd_dropped_total Records dropped\n"
            "# TYPE rvbpfd_dropped_total counter\n"
            "rvbpfd_dropped_total{reason=\"queue_full\"} 3\n"
            "rvbpfd_dropped_total{reason=\"ring_full_events\"} 5\n"
            "# HELP rvbpfd_events_total Scheduler events received\n"
            "# TYPE rvbpfd_events_total counter\n"
            "rvbpfd_events_total 1234567890123\n"
            "# HELP rvbpfd_processes_watched Ruby processes being profiled\n"
            "# TYPE rvbpfd_processes_watched gauge\n"
            "rvbpfd_processes_watched 3\n");
  EXPECT_EQ(r.rejected_writes(), 0u);
  EXPECT_EQ(MetricsRegistry().RenderPrometheus(), "");
}

TEST(MetricsRegistryTest, SetOverwritesAndLabelsAreSortedAndEscaped) {
  MetricsRegistry r;
  r.SetGauge("g", "line1\nback\\slash \"q\"", {{"z", "1"}, {"a", "x\\y\"z\nw"}}, 1);
  r.SetGauge("g", "ignored: the first help stays", {{"z", "1"}, {"a", "x\\y\"z\nw"}}, 2);
  r.SetGauge("g", "", {{"a", "b"}}, -1.5);
  EXPECT_EQ(r.RenderPrometheus(),
            "# HELP g line1\\nback\\\\slash \"q\"\n"
            "# TYPE g gauge\n"
            "g{a=\"b\"} -1.5\n"
            "g{a=\"x\\\\y\\\"z\\nw\",z=\"1\"} 2\n");
}

TEST(MetricsRegistryTest, SpecialValues) {
  MetricsRegistry r;
  r.SetGauge("a", "h", {}, std::numeric_limits<double>::infinity());
  r.SetGauge("b", "h", {}, -std::numeric_limits<double>::infinity());
  r.SetGauge("c", "h", {}, std::nan(""));
  r.SetGauge("d", "h", {}, 1e300);
  r.SetGauge("e", "h", {}, 9007199254740993.0);  // above 2^53: not printed as a (possibly wrong) integer
  std::string out = r.RenderPrometheus();
  EXPECT_THAT(out, HasSubstr("\na +Inf\n"));
  EXPECT_THAT(out, HasSubstr("\nb -Inf\n"));
  EXPECT_THAT(out, HasSubstr("\nc NaN\n"));
  EXPECT_THAT(out, HasSubstr("\nd 1e+300\n"));
  EXPECT_THAT(out, HasSubstr("\ne 9007199254740992\n"));
}

TEST(MetricsRegistryTest, RejectsInvalidWrites) {
  MetricsRegistry r;
  r.SetCounter("ok_total", "h", {}, 1);
  r.SetGauge("ok_total", "h", {}, 5);                  // type conflict
  r.AddCounter("ok_total", "h", {}, -1);               // counters never go down
  r.AddCounter("ok_total", "h", {}, std::nan(""));
  r.SetGauge("9bad", "h", {}, 1);                      // name starts with a digit
  r.SetGauge("bad-name", "h", {}, 1);
  r.SetGauge("", "h", {}, 1);
  r.SetGauge("g", "h", {{"__reserved", "x"}}, 1);
  r.SetGauge("g", "h", {{"bad-label", "x"}}, 1);
  r.SetGauge("g", "h", {{"", "x"}}, 1);
  r.SetGauge("g", "h", {{"a:b", "x"}}, 1);             // a colon is for metric names only
  r.SetGauge("ns:g", "h", {{"_a1", "x"}}, 1);          // accepted
  EXPECT_EQ(r.rejected_writes(), 10u);
  EXPECT_EQ(r.RenderPrometheus(),
            "# HELP ns:g h\n# TYPE ns:g gauge\nns:g{_a1=\"x\"} 1\n"
            "# HELP ok_total h\n# TYPE ok_total counter\nok_total 1\n");
}

TEST(MetricsRegistryTest, ConcurrentWritersAndReaders) {
  MetricsRegistry r;
  constexpr int kThreads = 4, kAdds = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&r, t] {
      for (int i = 0; i < kAdds; ++i) {
        r.AddCounter("c_total", "h", {{"t", std::to_string(t % 2)}}, 1);
        if (i % 100 == 0) r.RenderPrometheus();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::string out = r.RenderPrometheus();
  EXPECT_THAT(out, HasSubstr("c_total{t=\"0\"} 4000\n"));
  EXPECT_THAT(out, HasSubstr("c_total{t=\"1\"} 4000\n"));
}

TEST(ParseListenAddressTest, AcceptsIpv4AndLocalhost) {
  Result<ListenAddress> a = ParseListenAddress("127.0.0.1:9464");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->ipv4_host_order, 0x7f000001u);
  EXPECT_EQ(a->port, 9464);
  EXPECT_TRUE(a->loopback());
  Result<ListenAddress> any = ParseListenAddress("0.0.0.0:0");
  ASSERT_TRUE(any.ok());
  EXPECT_EQ(any->ipv4_host_order, 0u);
  EXPECT_EQ(any->port, 0);
  EXPECT_FALSE(any->loopback());
  Result<ListenAddress> lh = ParseListenAddress("localhost:65535");
  ASSERT_TRUE(lh.ok());
  EXPECT_EQ(lh->ipv4_host_order, 0x7f000001u);
  EXPECT_EQ(lh->port, 65535);
  EXPECT_TRUE(ParseListenAddress("127.0.0.2:1")->loopback());
  EXPECT_FALSE(ParseListenAddress("10.1.2.3:1")->loopback());
}

TEST(ParseListenAddressTest, RejectsEverythingElse) {
  for (const char* bad : {"", "9464", ":9464", "127.0.0.1", "127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:-1",
                          "127.0.0.1:94a", "127.0.0:9464", "127.0.0.1.1:1", "256.0.0.1:1", "127.1:1",
                          "0x7f.0.0.1:1", "example.com:80", "[::1]:9464", "127.0.0.0001:1", " 127.0.0.1:1"}) {
    Result<ListenAddress> a = ParseListenAddress(bad);
    EXPECT_FALSE(a.ok()) << bad;
    if (!a.ok()) {
      EXPECT_EQ(a.error().code(), ErrorCode::kUsage);
      EXPECT_THAT(a.error().message(), HasSubstr("expected IPV4:PORT"));
    }
  }
}

TEST(ReadSelfUsageTest, ParsesStatAndStatus) {
  testing::TempDir dir;
  // comm with spaces and a ')' inside: fields are counted after the last ')'.
  testing::WriteFile(dir.Join("self/stat"),
                     "4242 (rvbpfd (a) b) S 1 4242 4242 0 -1 4194560 5000 0 0 0 250 150 0 0 20 0 6 0 100 "
                     "123456789 2500 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n");
  testing::WriteFile(dir.Join("self/status"),
                     "Name:\trvbpfd\nVmPeak:\t  200000 kB\nVmHWM:\t   40960 kB\nVmRSS:\t   30720 kB\nThreads:\t6\n");
  Result<SelfUsage> u = ReadSelfUsage(dir.path());
  ASSERT_TRUE(u.ok()) << u.error().message();
  double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  EXPECT_DOUBLE_EQ(u->cpu_seconds, 400 / tick);
  EXPECT_EQ(u->rss_bytes, 30720u * 1024);
  EXPECT_EQ(u->rss_peak_bytes, 40960u * 1024);

  MetricsRegistry r;
  ExportSelfUsage(*u, &r);
  std::string out = r.RenderPrometheus();
  EXPECT_THAT(out, HasSubstr("# TYPE rvbpfd_agent_cpu_seconds_total counter\n"));
  EXPECT_THAT(out, HasSubstr("# TYPE rvbpfd_agent_rss_bytes gauge\nrvbpfd_agent_rss_bytes 31457280\n"));
}

TEST(ReadSelfUsageTest, ErrorsNameTheFile) {
  testing::TempDir dir;
  Result<SelfUsage> none = ReadSelfUsage(dir.path());
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code(), ErrorCode::kIo);
  EXPECT_THAT(none.error().message(), HasSubstr(dir.Join("self/stat")));

  testing::WriteFile(dir.Join("self/stat"), "1 (x) S 1 2 3\n");
  Result<SelfUsage> short_stat = ReadSelfUsage(dir.path());
  ASSERT_FALSE(short_stat.ok());
  EXPECT_THAT(short_stat.error().message(), HasSubstr("fewer than 15 fields"));

  testing::WriteFile(dir.Join("self/stat"), "1 (x) S 1 2 3 4 5 6 7 8 9 10 x 12 13 14\n");
  EXPECT_THAT(ReadSelfUsage(dir.path()).error().message(), HasSubstr("field 14 is not a number"));

  testing::WriteFile(dir.Join("self/stat"), "1 (x) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14\n");
  testing::WriteFile(dir.Join("self/status"), "Name:\tx\nVmHWM:\t 1 kB\n");
  Result<SelfUsage> no_rss = ReadSelfUsage(dir.path());
  ASSERT_FALSE(no_rss.ok());
  EXPECT_THAT(no_rss.error().message(), HasSubstr("no VmRSS line"));
  testing::WriteFile(dir.Join("self/status"), "VmRSS:\t 1 MB\nVmHWM:\t 1 kB\n");
  EXPECT_FALSE(ReadSelfUsage(dir.path()).ok());
}

TEST(MetricsRegistryTest, CollectorsRunAtEachRenderInOrder) {
  MetricsRegistry r;
  int renders = 0;
  std::vector<std::string> order;
  // A collector writes through the registry's own methods: it runs without the lock held (else this deadlocks).
  r.AddCollector([&](MetricsRegistry& reg) {
    order.push_back("first");
    reg.SetGauge("g", "G", {}, ++renders);
  });
  r.AddCollector([&](MetricsRegistry&) { order.push_back("second"); });
  EXPECT_EQ(renders, 0);  // adding runs nothing
  EXPECT_THAT(r.RenderPrometheus(), HasSubstr("\ng 1\n"));
  EXPECT_THAT(r.RenderPrometheus(), HasSubstr("\ng 2\n"));
  EXPECT_EQ(order, (std::vector<std::string>{"first", "second", "first", "second"}));
}

TEST(MetricsRegistryTest, SelfUsageIsReadAtEachRenderAndNothingIsWrittenWhenItFails) {
  MetricsRegistry r;
  int reads = 0;
  bool fail = true;
  r.AddCollector(SelfUsageCollector([&]() -> Result<SelfUsage> {
    ++reads;
    if (fail) return Error(ErrorCode::kIo, "cannot read /proc/self/stat");
    return SelfUsage{2.5, 4096, 8192};
  }));
  EXPECT_EQ(r.RenderPrometheus(), "");
  fail = false;
  const std::string out = r.RenderPrometheus();
  EXPECT_THAT(out, HasSubstr("rvbpfd_agent_cpu_seconds_total 2.5\n"));
  EXPECT_THAT(out, HasSubstr("rvbpfd_agent_rss_bytes 4096\n"));
  EXPECT_EQ(reads, 2);
  // Without a reader: the real /proc/self.
  MetricsRegistry real;
  real.AddCollector(SelfUsageCollector(nullptr));
  EXPECT_THAT(real.RenderPrometheus(), HasSubstr("# TYPE rvbpfd_agent_rss_bytes gauge\n"));
}

TEST(ReadSelfUsageTest, ReadsTheRealProc) {
  Result<SelfUsage> u = ReadSelfUsage();
  ASSERT_TRUE(u.ok()) << u.error().message();
  EXPECT_GT(u->rss_bytes, 0u);
  EXPECT_GE(u->rss_peak_bytes, u->rss_bytes);
  EXPECT_GE(u->cpu_seconds, 0);
}

}  // namespace
}  // namespace rvbpfd
