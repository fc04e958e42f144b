#include "ops/agent_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "elf/elf_fixtures.h"

namespace rvbpfd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(AgentConfigTest, DefaultsAreTheFleetDefaultsAndValid) {
  AgentConfig c;
  EXPECT_EQ(c.interval_s, 15);
  EXPECT_EQ(c.hz, 19);
  EXPECT_EQ(c.stacks, "release");
  EXPECT_EQ(c.max_overhead_pct, 5);
  EXPECT_EQ(c.metrics_listen, "127.0.0.1:9464");
  EXPECT_EQ(c.push_queue, 256u);
  EXPECT_TRUE(ValidateAgentConfig(c).ok()) << ValidateAgentConfig(c).error().message();
}

TEST(AgentConfigTest, AppliesEveryKeyOverTheBase) {
  AgentConfig base;
  base.include = {"comm:old"};
  Result<AgentConfig> c = ApplyConfigJson(base, R"({
    "interval": 10, "hz": 49, "stacks": "release,ready", "max-overhead": 2.5,
    "output-dir": "/var/lib/rvbpfd/profiles", "output-max-mb": 512, "output-service-max-mb": 64,
    "push-url": "https://pyroscope.example:4040", "push-queue": 64,
    "metrics-listen": "127.0.0.1:9500", "include": ["comm:ruby", "comm:puma*"], "exclude": ["label:service=batch"],
    "service-pin": ["/system.slice/shop.service=shop", "/kubepods/pod1=billing"], "ignore-env-service": true,
    "log-format": "text", "host": "node-7", "ring-buffer-kb": 4096, "cache-dir": "/tmp/sites",
    "memory-budget": "96M"
  })", "/etc/rvbpfd/agent.json");
  ASSERT_TRUE(c.ok()) << c.error().message();
  EXPECT_EQ(c->interval_s, 10);
  EXPECT_EQ(c->hz, 49);
  EXPECT_EQ(c->stacks, "release,ready");
  EXPECT_EQ(c->max_overhead_pct, 2.5);
  EXPECT_EQ(c->output_dir, "/var/lib/rvbpfd/profiles");
  EXPECT_EQ(c->output_max_mb, 512u);
  EXPECT_EQ(c->output_service_max_mb, 64u);
  EXPECT_THAT(c->service_pins, ElementsAre("/system.slice/shop.service=shop", "/kubepods/pod1=billing"));
  EXPECT_TRUE(c->ignore_env_service);
  EXPECT_EQ(c->push_url, "https://pyroscope.example:4040");
  EXPECT_EQ(c->push_queue, 64u);
  EXPECT_EQ(c->metrics_listen, "127.0.0.1:9500");
  EXPECT_THAT(c->include, ElementsAre("comm:ruby", "comm:puma*"));  // replaces the base list
  EXPECT_THAT(c->exclude, ElementsAre("label:service=batch"));
  EXPECT_EQ(c->log_format, "text");
  EXPECT_EQ(c->host, "node-7");
  EXPECT_EQ(c->ring_buffer_kb, 4096u);
  EXPECT_EQ(c->cache_dir, "/tmp/sites");
  EXPECT_EQ(c->memory_budget, uint64_t{96} << 20);
  EXPECT_TRUE(ValidateAgentConfig(*c).ok());
  EXPECT_EQ(AgentConfigKeys().size(), 19u);
}

TEST(AgentConfigTest, AbsentKeysKeepTheBase) {
  AgentConfig base;
  base.hz = 99;
  base.push_url = "http://a:1";
  Result<AgentConfig> c = ApplyConfigJson(base, R"({"interval": 30})");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->interval_s, 30);
  EXPECT_EQ(c->hz, 99);
  EXPECT_EQ(c->push_url, "http://a:1");
  EXPECT_TRUE(ApplyConfigJson(base, "{}").ok());
}

TEST(AgentConfigTest, UnknownKeysAreErrorsNamingKeyAndSource) {
  Result<AgentConfig> c = ApplyConfigJson(AgentConfig(), R"({"hzz": 19})", "/etc/rvbpfd/agent.json");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().code(), ErrorCode::kUsage);
  EXPECT_THAT(c.error().message(), HasSubstr("/etc/rvbpfd/agent.json"));
  EXPECT_THAT(c.error().message(), HasSubstr("unknown key \"hzz\""));
  EXPECT_THAT(c.error().message(), HasSubstr("known keys: interval, hz,"));
  Result<AgentConfig> dashed = ApplyConfigJson(AgentConfig(), R"({"--hz": 19})", "f.json");
  ASSERT_FALSE(dashed.ok());
  EXPECT_THAT(dashed.error().message(), HasSubstr("without the leading \"--\": \"hz\""));
  // Keys that are not file keys (the config path itself, the tests-only proc root) are unknown too.
  EXPECT_FALSE(ApplyConfigJson(AgentConfig(), R"({"config": "x"})").ok());
  EXPECT_FALSE(ApplyConfigJson(AgentConfig(), R"({"proc-root": "/tmp"})").ok());
}

TEST(AgentConfigTest, WrongTypesAreErrorsNamingTheKey) {
  struct Case {
    const char* json;
    const char* expect;
  };
  const Case cases[] = {
      {R"({"hz": "19"})", "key \"hz\": expected an integer, got string"},
      {R"({"hz": 19.5})", "key \"hz\": expected an integer, got 19.5"},
      {R"({"hz": 99999999999})", "key \"hz\": expected an integer in -2147483648..2147483647, got 99999999999"},
      {R"({"interval": "15s"})", "key \"interval\": expected a number, got string"},
      {R"({"interval": null})", "key \"interval\": expected a number, got null"},
      {R"({"push-queue": -1})", "key \"push-queue\": expected a non-negative integer, got -1"},
      {R"({"output-max-mb": 1.5})", "key \"output-max-mb\": expected an integer"},
      {R"({"ring-buffer-kb": 4294967296})", "key \"ring-buffer-kb\": expected an integer in 0..4294967295, got 4294967296"},
      {R"({"push-url": 4040})", "key \"push-url\": expected a string, got 4040"},
      {R"({"include": "comm:ruby"})", "key \"include\": expected an array of strings, got string"},
      {R"({"exclude": ["comm:a", 3]})", "key \"exclude\": expected an array of strings, got array"},
      {R"({"stacks": true})", "key \"stacks\": expected a string, got boolean"},
  };
  for (const Case& k : cases) {
    Result<AgentConfig> c = ApplyConfigJson(AgentConfig(), k.json, "a.json");
    ASSERT_FALSE(c.ok()) << k.json;
    EXPECT_EQ(c.error().code(), ErrorCode::kUsage);
    EXPECT_THAT(c.error().message(), HasSubstr(k.expect)) << k.json;
    EXPECT_THAT(c.error().message(), HasSubstr("config a.json")) << k.json;
  }
}

TEST(AgentConfigTest, MalformedDocumentsAreErrors) {
  Result<AgentConfig> syntax = ApplyConfigJson(AgentConfig(), "{\"hz\": 19,", "a.json");
  ASSERT_FALSE(syntax.ok());
  EXPECT_THAT(syntax.error().message(), HasSubstr("config a.json: not valid JSON"));
  EXPECT_THAT(syntax.error().message(), ::testing::Not(HasSubstr("[json.exception")));
  Result<AgentConfig> array = ApplyConfigJson(AgentConfig(), "[1, 2]", "a.json");
  ASSERT_FALSE(array.ok());
  EXPECT_THAT(array.error().message(), HasSubstr("expected a JSON object"));
  Result<AgentConfig> dup = ApplyConfigJson(AgentConfig(), R"({"include": ["comm:a"], "include": ["comm:b"]})");
  ASSERT_FALSE(dup.ok());
  EXPECT_THAT(dup.error().message(), HasSubstr("key \"include\" appears twice"));
  // A nested object's keys are not top-level keys: only the type error is reported.
  Result<AgentConfig> nested = ApplyConfigJson(AgentConfig(), R"({"host": {"a": 1, "a": 2}})");
  ASSERT_FALSE(nested.ok());
  EXPECT_THAT(nested.error().message(), HasSubstr("key \"host\": expected a string, got object"));
}

TEST(AgentConfigTest, ApplyConfigFileReadsTheFileAndNamesItInErrors) {
  testing::TempDir dir;
  std::string path = dir.Join("agent.json");
  testing::WriteFile(path, R"({"push-url": "http://127.0.0.1:4040", "interval": 20})");
  Result<AgentConfig> c = ApplyConfigFile(AgentConfig(), path);
  ASSERT_TRUE(c.ok()) << c.error().message();
  EXPECT_EQ(c->push_url, "http://127.0.0.1:4040");
  EXPECT_EQ(c->interval_s, 20);
  EXPECT_EQ(c->config_file, path);

  Result<AgentConfig> missing = ApplyConfigFile(AgentConfig(), dir.Join("nope.json"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code(), ErrorCode::kIo);
  EXPECT_THAT(missing.error().message(), HasSubstr(dir.Join("nope.json")));
  EXPECT_THAT(missing.error().message(), HasSubstr("errno 2"));

  testing::WriteFile(path, R"({"hz": "fast"})");
  Result<AgentConfig> bad = ApplyConfigFile(AgentConfig(), path);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code(), ErrorCode::kUsage);
  EXPECT_THAT(bad.error().message(), HasSubstr("config " + path + ": key \"hz\""));

  testing::WriteFile(path, "{\"host\": \"" + std::string(kMaxConfigFileBytes, 'x') + "\"}");
  Result<AgentConfig> big = ApplyConfigFile(AgentConfig(), path);
  ASSERT_FALSE(big.ok());
  EXPECT_THAT(big.error().message(), HasSubstr("larger than"));
}

TEST(AgentConfigTest, ToJsonRoundTrips) {
  AgentConfig c;
  c.interval_s = 12.25;
  c.hz = 7;
  c.stacks = "off";
  c.max_overhead_pct = 0.1;
  c.output_dir = "/out \"quoted\"";
  c.output_max_mb = 3;
  c.push_url = "http://p:1";
  c.push_queue = 9;
  c.metrics_listen = "off";
  c.include = {"comm:a", "cgroup:/x"};
  c.exclude = {"label:container="};
  c.log_format = "text";
  c.host = "h";
  c.ring_buffer_kb = 64;
  c.cache_dir = "/c";
  std::string text = AgentConfigToJson(c);
  EXPECT_EQ(text.find("{\"interval\":12.25,\"hz\":7,"), 0u) << text;  // documented key order
  Result<AgentConfig> back = ApplyConfigJson(AgentConfig(), text);
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(*back, c);
}

TEST(AgentConfigTest, InvalidUtf8NeverThrowsAndIsRejectedInTheHost) {
  AgentConfig c;
  c.host = "bad\xffhost";
  c.output_dir = "/out/\xc0\xaf";
  c.include = {"comm:\xfe"};
  std::string text;
  ASSERT_NO_THROW(text = AgentConfigToJson(c));
  EXPECT_NE(text.find("\"host\":\"bad\xef\xbf\xbdhost\""), std::string::npos) << text;
  Status st = ValidateAgentConfig(c);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kUsage);
  EXPECT_THAT(st.error().message(), HasSubstr("host (--host) must be at most 255 bytes of UTF-8"));
  // A number in a config file with invalid UTF-8 around it: an error naming the key, no exception.
  Result<AgentConfig> parsed = ApplyConfigJson(AgentConfig(), "{\"hz\": \"\xff\"}");
  ASSERT_FALSE(parsed.ok());
}

TEST(AgentConfigTest, PushUrlCredentialsAreRedactedInErrors) {
  AgentConfig c;
  c.push_url = "https://alice:s3cret@pyro:4040/x?token=abc";
  Status st = ValidateAgentConfig(c);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.error().message(), HasSubstr("https://***@pyro:4040/x?token=***"));
  EXPECT_EQ(st.error().message().find("s3cret"), std::string::npos) << st.error().message();
  EXPECT_EQ(st.error().message().find("abc"), std::string::npos) << st.error().message();
}

Status Validate(void (*edit)(AgentConfig*)) {
  AgentConfig c;
  edit(&c);
  return ValidateAgentConfig(c);
}

TEST(AgentConfigTest, ValidateChecksRanges) {
  struct Case {
    void (*edit)(AgentConfig*);
    const char* expect;  // "" = valid
  };
  const Case cases[] = {
      {[](AgentConfig* c) { c->interval_s = 1; }, ""},
      {[](AgentConfig* c) { c->interval_s = 0.5; }, "interval (--interval) must be between 1 and 3600"},
      {[](AgentConfig* c) { c->interval_s = 3601; }, "interval (--interval)"},
      {[](AgentConfig* c) { c->interval_s = std::nan(""); }, "interval (--interval)"},
      {[](AgentConfig* c) { c->hz = 0; }, "hz (--hz) must be between 1 and 1000"},
      {[](AgentConfig* c) { c->hz = 1000; }, ""},
      {[](AgentConfig* c) { c->hz = 1001; }, "hz (--hz)"},
      {[](AgentConfig* c) { c->max_overhead_pct = 0; }, ""},
      {[](AgentConfig* c) { c->max_overhead_pct = 100; }, ""},
      {[](AgentConfig* c) { c->max_overhead_pct = -1; }, "max-overhead (--max-overhead)"},
      {[](AgentConfig* c) { c->max_overhead_pct = 100.5; }, "max-overhead (--max-overhead)"},
      {[](AgentConfig* c) { c->stacks = "off"; }, ""},
      {[](AgentConfig* c) { c->stacks = "ready,release"; }, ""},
      {[](AgentConfig* c) { c->stacks = "all"; }, "stacks (--stacks) must be release, release,ready or off"},
      {[](AgentConfig* c) { c->log_format = "xml"; }, "log-format (--log-format)"},
      {[](AgentConfig* c) { c->output_max_mb = 0; }, "output-max-mb (--output-max-mb)"},
      {[](AgentConfig* c) { c->push_queue = 0; }, "push-queue (--push-queue)"},
      {[](AgentConfig* c) { c->push_queue = kMaxPushQueue + 1; }, "push-queue (--push-queue)"},
      {[](AgentConfig* c) { c->ring_buffer_kb = 2; }, "ring-buffer-kb (--ring-buffer-kb)"},
      {[](AgentConfig* c) { c->push_url = "https://pyroscope.example/base"; }, ""},
      {[](AgentConfig* c) { c->push_url = "pyroscope:4040"; }, "push-url (--push-url) \"pyroscope:4040\" must start"},
      {[](AgentConfig* c) { c->push_url = "http://"; }, "has no host"},
      {[](AgentConfig* c) { c->push_url = "http://:4040"; }, "has no host"},
      {[](AgentConfig* c) { c->push_url = "http://a b"; }, "spaces"},
      {[](AgentConfig* c) { c->push_url = "http://a/?x=1"; }, "query"},
      {[](AgentConfig* c) { c->metrics_listen = "off"; }, ""},
      {[](AgentConfig* c) { c->metrics_listen = ""; }, ""},
      {[](AgentConfig* c) { c->metrics_listen = "0.0.0.0:9464"; }, ""},
      {[](AgentConfig* c) { c->metrics_listen = "localhost:0"; }, ""},
      {[](AgentConfig* c) { c->metrics_listen = "9464"; }, "metrics-listen (--metrics-listen)"},
      {[](AgentConfig* c) { c->metrics_listen = "example.com:9464"; }, "not an IPv4 address"},
      {[](AgentConfig* c) { c->include = {"comm:ruby"}; c->exclude = {"cgroup:/system.slice"}; }, ""},
      {[](AgentConfig* c) { c->include = {"ruby"}; }, "--include rule \"ruby\""},
      {[](AgentConfig* c) { c->exclude = {"label:pod=x"}; }, "--exclude rule \"label:pod=x\""},
      {[](AgentConfig* c) { c->service_pins = {"/system.slice/shop=shop"}; }, ""},
      {[](AgentConfig* c) { c->service_pins = {"system.slice=shop"}; }, "--service-pin rule \"system.slice=shop\""},
      {[](AgentConfig* c) { c->service_pins = {"/a"}; }, "--service-pin rule \"/a\""},
      {[](AgentConfig* c) { c->service_pins = {"/a="}; }, "--service-pin rule \"/a=\""},
      {[](AgentConfig* c) { c->output_service_max_mb = kMaxOutputMb + 1; }, "output-service-max-mb"},
      {[](AgentConfig* c) { c->host = "a\nb"; }, "host (--host)"},
      {[](AgentConfig* c) { c->cache_dir = ""; }, "cache-dir (--cache-dir)"},
  };
  for (size_t i = 0; i < std::size(cases); ++i) {
    Status st = Validate(cases[i].edit);
    if (std::string(cases[i].expect).empty()) {
      EXPECT_TRUE(st.ok()) << "case " << i << ": " << st.error().message();
    } else {
      ASSERT_FALSE(st.ok()) << "case " << i;
      EXPECT_EQ(st.error().code(), ErrorCode::kUsage);
      EXPECT_THAT(st.error().message(), HasSubstr(cases[i].expect)) << "case " << i;
    }
  }
}

TEST(AgentConfigTest, PlanReloadAppliesReloadableKeysAndKeepsTheOthers) {
  AgentConfig running;
  running.config_file = "/etc/rvbpfd/agent.json";
  running.proc_root = "/fake/proc";
  AgentConfig loaded = running;
  loaded.config_file = "/other.json";  // not a file key: never reported, never taken
  loaded.proc_root = "/proc";
  loaded.include = {"comm:ruby"};
  loaded.push_url = "http://p:4040";
  loaded.interval_s = 60;
  loaded.hz = 99;
  loaded.metrics_listen = "127.0.0.1:1";
  loaded.max_overhead_pct = 1;
  loaded.host = "renamed";

  ReloadPlan plan = PlanReload(running, loaded);
  EXPECT_THAT(plan.changed,
              ElementsAre("interval", "hz", "max-overhead", "push-url", "metrics-listen", "include", "host"));
  EXPECT_THAT(plan.applied, ElementsAre("interval", "push-url", "include"));
  EXPECT_THAT(plan.needs_restart, ElementsAre("hz", "max-overhead", "metrics-listen", "host"));
  EXPECT_TRUE(plan.any_applied());
  EXPECT_EQ(plan.next.include, loaded.include);
  EXPECT_EQ(plan.next.push_url, loaded.push_url);
  EXPECT_EQ(plan.next.interval_s, 60);
  EXPECT_EQ(plan.next.hz, running.hz);
  EXPECT_EQ(plan.next.metrics_listen, running.metrics_listen);
  EXPECT_EQ(plan.next.host, running.host);
  EXPECT_EQ(plan.next.config_file, running.config_file);
  EXPECT_EQ(plan.next.proc_root, running.proc_root);

  ReloadPlan same = PlanReload(running, running);
  EXPECT_THAT(same.changed, IsEmpty());
  EXPECT_FALSE(same.any_applied());
  EXPECT_EQ(same.next, running);
}

TEST(AgentConfigTest, ReloadableKeysAreExactlyTheDocumentedOnes) {
  std::vector<std::string> reloadable;
  for (std::string_view k : AgentConfigKeys()) {
    if (IsReloadableKey(k)) reloadable.emplace_back(k);
  }
  EXPECT_THAT(reloadable, ElementsAre("interval", "output-dir", "output-max-mb", "output-service-max-mb", "push-url",
                                      "push-queue", "include", "exclude", "service-pin", "ignore-env-service",
                                      "log-format"));
  EXPECT_FALSE(IsReloadableKey("no-such-key"));
}

TEST(AgentConfigTest, EachKeyIsComparedByPlanReload) {
  // Every key the file can set must be seen by PlanReload (a key missing from the table would be silently ignored).
  AgentConfig a;
  Result<AgentConfig> b = ApplyConfigJson(a, R"({
    "interval": 16, "hz": 20, "stacks": "off", "max-overhead": 6, "output-dir": "/o", "output-max-mb": 2,
    "push-url": "http://x:1", "push-queue": 3, "metrics-listen": "off", "include": ["comm:a"], "exclude": ["comm:b"],
    "output-service-max-mb": 1, "service-pin": ["/a=b"], "ignore-env-service": true,
    "log-format": "text", "host": "h", "ring-buffer-kb": 16, "cache-dir": "/c", "memory-budget": 8388608})");
  ASSERT_TRUE(b.ok());
  ReloadPlan plan = PlanReload(a, *b);
  std::vector<std::string> keys(AgentConfigKeys().begin(), AgentConfigKeys().end());
  EXPECT_EQ(plan.changed, keys);
  EXPECT_EQ(plan.applied.size() + plan.needs_restart.size(), keys.size());
}

}  // namespace
}  // namespace rvbpfd
