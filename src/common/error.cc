#include "common/error.h"

#include <cstring>

#include "common/text_escape.h"

namespace rvbpfd {

std::string_view ErrorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kUsage: return "usage";
    case ErrorCode::kNoSuchProcess: return "no-such-process";
    case ErrorCode::kNotRuby: return "not-ruby";
    case ErrorCode::kUnsupportedVersion: return "unsupported-version";
    case ErrorCode::kNoSymbols: return "no-symbols";
    case ErrorCode::kNoPrivilege: return "no-privilege";
    case ErrorCode::kOutputUnwritable: return "output-unwritable";
    case ErrorCode::kTargetExited: return "target-exited";
    case ErrorCode::kBpf: return "bpf";
    case ErrorCode::kBadTrace: return "bad-trace";
    case ErrorCode::kIo: return "io";
    case ErrorCode::kUntrustedPath: return "untrusted-path";
    case ErrorCode::kOutputTooLarge: return "output-too-large";
    case ErrorCode::kInternal: return "internal";
  }
  return "internal";
}

std::optional<ErrorCode> ErrorCodeFromExitStatus(int64_t status) {
  if (status < 0 || status > 255) return std::nullopt;
  const auto code = static_cast<ErrorCode>(status);
  // ErrorCodeName names every code of the enum and answers "internal" for any other value.
  if (ErrorCodeName(code) == "internal" && code != ErrorCode::kInternal) return std::nullopt;
  return code;
}

std::string Error::ToString() const {
  std::string out = "rvbpfd: ";
  out += ErrorCodeName(code_);
  out += ": ";
  // Messages quote comm, paths and argv of target processes: no control byte of theirs reaches the terminal.
  out += EscapeControlBytes(message_);
  return out;
}

std::string ErrnoMessage(std::string_view what, int err) {
  std::string out(what);
  out += ": ";
  out += std::strerror(err);
  out += " (errno ";
  out += std::to_string(err);
  out += ")";
  return out;
}

}  // namespace rvbpfd
