// The one error registry of rvbpfd: every user-visible failure has a code here, and each code has a distinct
// process exit status so scripts (and the e2e tests) can tell "not Ruby" from "no privileges" without parsing text.
//
// Messages are one line and say which step failed, the errno where there is one, and the flag or package that
// fixes it.
#ifndef RVBPFD_SRC_COMMON_ERROR_H_
#define RVBPFD_SRC_COMMON_ERROR_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace rvbpfd {

enum class ErrorCode : uint8_t {
  kUsage = 2,               // bad command line (CLI11 also uses 2 for parse errors)
  kNoSuchProcess = 3,       // --pid names no live process
  kNotRuby = 4,             // the process maps no CRuby VM (libruby.so or a static ruby)
  kUnsupportedVersion = 5,  // CRuby older than 3.2 (no scheduler events) or not yet supported
  kNoSymbols = 6,           // the VM binary has no .symtab/DWARF to find the probe sites
  kNoPrivilege = 7,         // BPF/perf/ptrace not permitted
  kOutputUnwritable = 8,    // -o path cannot be created
  kTargetExited = 9,        // the target exited before probes were attached
  kBpf = 10,                // loading or attaching BPF failed for another reason
  kBadTrace = 11,           // an .rvtrace file that cannot be read
  kIo = 12,                 // other I/O failures
  kUntrustedPath = 13,      // --cache-dir (or a directory above it) is owned by another user or writable by others
  kOutputTooLarge = 14,     // an export or report passed its --max-output-bytes cap (nothing left at -o)
  kInternal = 70,           // a bug in rvbpfd (EX_SOFTWARE)
};

// Short stable name of a code, used in messages ("rvbpfd: not-ruby: ...") and tests.
std::string_view ErrorCodeName(ErrorCode code);
inline int ExitStatus(ErrorCode code) { return static_cast<int>(code); }
// The code whose ExitStatus is `status`; nullopt when no code has it (e.g. read from another process).
std::optional<ErrorCode> ErrorCodeFromExitStatus(int64_t status);

class Error {
 public:
  Error(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "rvbpfd: <name>: <message>", the one-line form printed to stderr; control bytes in the message are escaped
  // (EscapeControlBytes), since it may quote what a target process controls.
  std::string ToString() const;
  // Prepends the failing step: Wrap("attaching uprobes") -> "attaching uprobes: <message>".
  Error Wrap(std::string_view step) const { return Error(code_, std::string(step) + ": " + message_); }

 private:
  ErrorCode code_;
  std::string message_;
};

// Formats "<what>: <strerror(err)> (errno <err>)".
std::string ErrnoMessage(std::string_view what, int err);

// A value or an Error. Factories return Result<T> so that objects are either valid or never built.
template <typename T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}          // NOLINT(google-explicit-constructor)
  Result(Error error) : v_(std::move(error)) {}      // NOLINT(google-explicit-constructor)
  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  T* operator->() { return &std::get<T>(v_); }
  const T* operator->() const { return &std::get<T>(v_); }
  const Error& error() const { return std::get<Error>(v_); }

 private:
  std::variant<T, Error> v_;
};

// For functions that return nothing on success.
class Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT(google-explicit-constructor)
  static Status Ok() { return Status(); }
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const { return error_; }

 private:
  Error error_{ErrorCode::kInternal, ""};
  bool ok_ = true;
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_COMMON_ERROR_H_
