#include "common/error.h"

#include <gtest/gtest.h>

namespace rvbpfd {
namespace {

TEST(ErrorCodeFromExitStatusTest, KnowsEveryCodeAndNothingElse) {
  for (ErrorCode c : {ErrorCode::kUsage, ErrorCode::kNoSuchProcess, ErrorCode::kNotRuby, ErrorCode::kUnsupportedVersion,
                      ErrorCode::kNoSymbols, ErrorCode::kNoPrivilege, ErrorCode::kOutputUnwritable,
                      ErrorCode::kTargetExited, ErrorCode::kBpf, ErrorCode::kBadTrace, ErrorCode::kIo,
                      ErrorCode::kUntrustedPath, ErrorCode::kOutputTooLarge, ErrorCode::kInternal}) {
    EXPECT_EQ(ErrorCodeFromExitStatus(ExitStatus(c)), c);
  }
  for (int64_t bad : {-1, 0, 1, 15, 69, 71, 255, 256, 70 + 256}) EXPECT_EQ(ErrorCodeFromExitStatus(bad), std::nullopt);
}

}  // namespace
}  // namespace rvbpfd
