// bpf/ruby_walker.h must build for BPF and pass the verifier in the shape the sampler will use (bpf_loop calling one
// per-frame step, 8192 frames). The host build of the same file is exercised by every other test in this directory.
#include <bpf/libbpf.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <string>

namespace rvbpfd {
namespace {

TEST(WalkerBpf, CompilesAndPassesTheVerifier) {
  if (std::system("command -v clang > /dev/null 2>&1") != 0) GTEST_SKIP() << "clang not installed";
  const std::string obj = std::string(RVBPFD_BINARY_DIR) + "/ruby_walker_check." + std::to_string(getpid()) + ".o";
  const std::string cmd = std::string("clang -g -O2 -target bpf -D__TARGET_ARCH_x86 -I") + RVBPFD_BINARY_DIR +
                          "/bpf -I" RVBPFD_SOURCE_DIR "/include -I" RVBPFD_SOURCE_DIR "/bpf -c " RVBPFD_SOURCE_DIR
                          "/bpf/ruby_walker_check.bpf.c -o " + obj;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;

  bpf_object* o = bpf_object__open_file(obj.c_str(), nullptr);
  ASSERT_NE(o, nullptr) << "libbpf cannot open " << obj;
  int err = bpf_object__load(o);
  bpf_object__close(o);
  unlink(obj.c_str());
  // EACCES from BPF_PROG_LOAD is the verifier's rejection, not a permission problem: only a non-root run may skip.
  if ((err == -EPERM || err == -EACCES) && geteuid() != 0) {
    GTEST_SKIP() << "compiled; loading BPF is not permitted here (run as root)";
  }
  EXPECT_EQ(err, 0) << "the verifier rejected the walker (run bpftool prog load on the object for its log)";
}

}  // namespace
}  // namespace rvbpfd
