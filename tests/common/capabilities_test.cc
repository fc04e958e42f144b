#include "common/capabilities.h"

#include <gtest/gtest.h>

namespace rvbpfd {
namespace {

TEST(CapabilitiesTest, ParsesCapEffFromProcStatus) {
  const std::string status = "Name:\trvbpfd\nCapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\n"
                             "CapEff:\t000000c000080000\nCapBnd:\t000001ffffffffff\n";
  EXPECT_EQ(ParseEffectiveCapabilities(status), 0x000000c000080000ull);
  EXPECT_EQ(ParseEffectiveCapabilities("CapEff:\t1\n"), 1ull);  // the first line
  EXPECT_EQ(ParseEffectiveCapabilities("Name: x\n"), std::nullopt);
  EXPECT_EQ(ParseEffectiveCapabilities("CapEff:\tzz\n"), std::nullopt);
  EXPECT_EQ(ParseEffectiveCapabilities("CapEff:\t\n"), std::nullopt);
  EXPECT_TRUE(EffectiveCapabilities().has_value());  // this process's own file
}

TEST(CapabilitiesTest, NamesExactlyTheMissingOnes) {
  const uint64_t bpf_perfmon_ptrace = (1ull << kCapBpf) | (1ull << kCapPerfmon) | (1ull << kCapSysPtrace);
  EXPECT_EQ(MissingCapabilities(bpf_perfmon_ptrace, {kCapBpf, kCapPerfmon, kCapSysPtrace}), "");
  EXPECT_EQ(MissingCapabilities(1ull << kCapPerfmon, {kCapBpf, kCapPerfmon, kCapSysPtrace}),
            "CAP_BPF, CAP_SYS_PTRACE");
  EXPECT_EQ(PrivilegeHint({kCapBpf, kCapPerfmon}, 1ull << kCapBpf),
            "missing CAP_PERFMON: grant it (setcap, systemd AmbientCapabilities) or run as root");
  // All present (the failure has another cause) or unknown: say what is needed, without claiming one is missing.
  EXPECT_EQ(PrivilegeHint({kCapBpf, kCapPerfmon}, ~0ull), "needs CAP_BPF, CAP_PERFMON (or root)");
  EXPECT_EQ(PrivilegeHint({kCapSysPtrace}, std::nullopt), "needs CAP_SYS_PTRACE (or root)");
  EXPECT_EQ(CapabilityName(kCapDacReadSearch), "CAP_DAC_READ_SEARCH");
  EXPECT_EQ(CapabilityName(63), "capability 63");
}

}  // namespace
}  // namespace rvbpfd
