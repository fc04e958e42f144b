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

}  // namespace
}  // namespace rvbpfd
