// The example configurations shipped in deploy/ must stay loadable by the agent's own parser and validator.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>

#include "elf/elf_fixtures.h"
#include "ops/agent_config.h"

namespace rvbpfd {
namespace {

const std::string kSource = RVBPFD_SOURCE_DIR;

TEST(DeployFilesTest, SystemdExampleConfigIsValid) {
  std::string path = kSource + "/deploy/systemd/agent.json";
  Result<AgentConfig> c = ApplyConfigFile(AgentConfig(), path);
  ASSERT_TRUE(c.ok()) << c.error().message();
  Status st = ValidateAgentConfig(*c);
  EXPECT_TRUE(st.ok()) << st.error().message();
  // The example spells out every key, so it documents them all.
  EXPECT_EQ(c->metrics_listen, "127.0.0.1:9464");
  std::string text = testing::ReadFile(path);
  for (std::string_view key : AgentConfigKeys()) {
    EXPECT_NE(text.find("\"" + std::string(key) + "\":"), std::string::npos) << key;
  }
}

// The ConfigMap's "agent.json: |" block scalar: the lines indented deeper than the key.
std::string ConfigMapAgentJson(const std::string& yaml) {
  std::istringstream in(yaml);
  std::string line, out;
  size_t key_indent = std::string::npos;
  while (std::getline(in, line)) {
    size_t indent = line.find_first_not_of(' ');
    if (key_indent == std::string::npos) {
      if (indent != std::string::npos && line.compare(indent, 13, "agent.json: |") == 0) key_indent = indent;
      continue;
    }
    if (indent != std::string::npos && indent <= key_indent) break;
    out += line + "\n";
  }
  return out;
}

TEST(DeployFilesTest, KubernetesConfigMapConfigIsValid) {
  std::string yaml = testing::ReadFile(kSource + "/deploy/kubernetes/daemonset.yaml");
  std::string json = ConfigMapAgentJson(yaml);
  ASSERT_FALSE(json.empty());
  Result<AgentConfig> c = ApplyConfigJson(AgentConfig(), json, "daemonset.yaml ConfigMap");
  ASSERT_TRUE(c.ok()) << c.error().message();
  EXPECT_TRUE(ValidateAgentConfig(*c).ok());
  // The liveness probe and Prometheus reach the endpoint on the pod IP, so it must not be loopback-only there, and
  // it must be the port the manifest declares.
  EXPECT_EQ(c->metrics_listen, "0.0.0.0:9464");
  EXPECT_NE(yaml.find("containerPort: 9464"), std::string::npos);
}

// The memory budget leaves the agent's fixed base (docs/deploy.md "Budgets": ~96 MiB measured; 64 MiB is the margin
// the default keeps) under the limit each shipped unit puts on it.
TEST(DeployFilesTest, MemoryBudgetsLeaveTheBaseUnderTheUnitsLimits) {
  constexpr uint64_t kMargin = uint64_t{64} << 20;
  const std::string unit = testing::ReadFile(kSource + "/deploy/systemd/rvbpfd-agent.service");
  ASSERT_NE(unit.find("\nMemoryMax=256M\n"), std::string::npos);
  Result<AgentConfig> c = ApplyConfigFile(AgentConfig(), kSource + "/deploy/systemd/agent.json");
  ASSERT_TRUE(c.ok()) << c.error().message();
  EXPECT_LE(c->memory_budget + kMargin, uint64_t{256} << 20);
  EXPECT_LE(kDefaultMemoryBudget + kMargin, uint64_t{256} << 20);
  const std::string yaml = testing::ReadFile(kSource + "/deploy/kubernetes/daemonset.yaml");
  ASSERT_NE(yaml.find("memory: 256Mi"), std::string::npos);
  Result<AgentConfig> k = ApplyConfigJson(AgentConfig(), ConfigMapAgentJson(yaml), "daemonset.yaml ConfigMap");
  ASSERT_TRUE(k.ok()) << k.error().message();
  EXPECT_LE(k->memory_budget + kMargin, uint64_t{256} << 20);
}

TEST(AgentConfigTest, MemoryBudgetTakesBytesOrSuffixes) {
  EXPECT_EQ(ParseByteSize("192M").value(), uint64_t{192} << 20);
  EXPECT_EQ(ParseByteSize("64MiB").value(), uint64_t{64} << 20);
  EXPECT_EQ(ParseByteSize("1g").value(), uint64_t{1} << 30);
  EXPECT_EQ(ParseByteSize("4096K").value(), uint64_t{4} << 20);
  EXPECT_EQ(ParseByteSize("1048576").value(), uint64_t{1} << 20);
  EXPECT_FALSE(ParseByteSize("").ok());
  EXPECT_FALSE(ParseByteSize("M").ok());
  EXPECT_FALSE(ParseByteSize("12X").ok());
  EXPECT_FALSE(ParseByteSize("99999999999999999999").ok());
  EXPECT_FALSE(ParseByteSize("17179869184G").ok());
  Result<AgentConfig> c = ApplyConfigJson(AgentConfig(), R"({"memory-budget": "64M"})");
  ASSERT_TRUE(c.ok()) << c.error().message();
  EXPECT_EQ(c->memory_budget, uint64_t{64} << 20);
  c = ApplyConfigJson(AgentConfig(), R"({"memory-budget": 8388608})");
  ASSERT_TRUE(c.ok()) << c.error().message();
  EXPECT_EQ(c->memory_budget, uint64_t{8} << 20);
  EXPECT_FALSE(ApplyConfigJson(AgentConfig(), R"({"memory-budget": "lots"})").ok());
  AgentConfig small;
  small.memory_budget = 1 << 20;
  small.output_dir = "/tmp/x";
  Status st = ValidateAgentConfig(small);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message().find("--memory-budget"), std::string::npos) << st.error().message();
}

}  // namespace
}  // namespace rvbpfd
