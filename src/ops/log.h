// Structured logs of the fleet agent: one line per record, JSON or text.
//
//   JSON: {"ts":"2026-11-30T12:34:56.789Z","level":"info","msg":"attached","pid":1234,"comm":"puma"}
//   text: 2026-11-30T12:34:56.789Z info attached pid=1234 comm=puma
//
// Timestamps are RFC 3339 in UTC with milliseconds. Strings from targets (comm, service names, paths) are escaped:
// JSON escapes control characters and replaces invalid UTF-8 with U+FFFD (valid UTF-8 passes through); text quotes
// a value (JSON-style escapes) when it is empty or holds a space, '=', '"', '\' or a control byte, and escapes
// control bytes in the message, so a record is always exactly one line. Field names are written as given (callers
// use fixed snake_case names); a field named like ts/level/msg is not renamed.
//
// Thread-safe: a record is formatted outside the lock, then written with one write() on the stream under one mutex.
#ifndef RVBPFD_SRC_OPS_LOG_H_
#define RVBPFD_SRC_OPS_LOG_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "common/error.h"

namespace rvbpfd {

// A field value: string, integer (signed or unsigned 64-bit), double or bool. Implicit from any of them so that
// fields read {{"pid", pid}, {"comm", comm}, {"rate", 0.5}, {"ok", true}}.
class LogValue {
 public:
  using Variant = std::variant<std::string, int64_t, uint64_t, double, bool>;
  LogValue(const char* s) : v_(std::string(s != nullptr ? s : "")) {}      // NOLINT(google-explicit-constructor)
  LogValue(std::string s) : v_(std::move(s)) {}                           // NOLINT(google-explicit-constructor)
  LogValue(std::string_view s) : v_(std::string(s)) {}                    // NOLINT(google-explicit-constructor)
  LogValue(bool b) : v_(b) {}                                             // NOLINT(google-explicit-constructor)
  LogValue(double d) : v_(d) {}                                           // NOLINT(google-explicit-constructor)
  LogValue(float f) : v_(static_cast<double>(f)) {}                       // NOLINT(google-explicit-constructor)
  template <typename T>
    requires(std::is_integral_v<T> && !std::is_same_v<T, bool> && std::is_signed_v<T>)
  LogValue(T i) : v_(static_cast<int64_t>(i)) {}                          // NOLINT(google-explicit-constructor)
  template <typename T>
    requires(std::is_integral_v<T> && !std::is_same_v<T, bool> && std::is_unsigned_v<T>)
  LogValue(T u) : v_(static_cast<uint64_t>(u)) {}                         // NOLINT(google-explicit-constructor)
  const Variant& value() const { return v_; }

 private:
  Variant v_;
};
using LogFields = std::vector<std::pair<std::string, LogValue>>;

enum class LogFormat { kJson, kText };
enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// "json" or "text"; kUsage error otherwise.
Result<LogFormat> ParseLogFormat(std::string_view name);
std::string_view LogLevelName(LogLevel level);  // "debug", "info", "warn", "error"

// "2026-11-30T12:34:56.789Z" (milliseconds truncated, UTC).
std::string FormatRfc3339Millis(std::chrono::system_clock::time_point t);
// JSON string contents (without the quotes): \" \\ \b \f \n \r \t, other bytes < 0x20 and 0x7f as \u00XX, valid
// UTF-8 unchanged, each byte of an invalid UTF-8 sequence as U+FFFD.
std::string JsonEscape(std::string_view s);
// Strict UTF-8 check (no overlong forms, no surrogates, <= U+10FFFF).
bool IsValidUtf8(std::string_view s);

class Logger {
 public:
  using Clock = std::function<std::chrono::system_clock::time_point()>;
  // `out` must outlive the logger (std::cerr for the agent; a std::ostringstream in tests). A null clock means
  // std::chrono::system_clock::now.
  explicit Logger(LogFormat format = LogFormat::kJson, std::ostream* out = nullptr, Clock clock = nullptr);

  void Debug(std::string_view msg, const LogFields& fields = {}) { Log(LogLevel::kDebug, msg, fields); }
  void Info(std::string_view msg, const LogFields& fields = {}) { Log(LogLevel::kInfo, msg, fields); }
  void Warn(std::string_view msg, const LogFields& fields = {}) { Log(LogLevel::kWarn, msg, fields); }
  void Error(std::string_view msg, const LogFields& fields = {}) { Log(LogLevel::kError, msg, fields); }
  void Log(LogLevel level, std::string_view msg, const LogFields& fields);

  // The line Log would write (with its '\n'), for tests and for callers that print elsewhere.
  std::string Format(LogLevel level, std::string_view msg, const LogFields& fields) const;

  void SetFormat(LogFormat format) { format_.store(format, std::memory_order_relaxed); }
  LogFormat format() const { return format_.load(std::memory_order_relaxed); }
  // Records below this level are dropped (default kInfo).
  void SetMinLevel(LogLevel level) { min_level_.store(level, std::memory_order_relaxed); }
  LogLevel min_level() const { return min_level_.load(std::memory_order_relaxed); }
  // Redirects output (tests); `out` must outlive the logger or the next SetOutput.
  void SetOutput(std::ostream* out);
  void SetClock(Clock clock);

 private:
  std::atomic<LogFormat> format_;
  std::atomic<LogLevel> min_level_{LogLevel::kInfo};
  mutable std::mutex mu_;  // guards out_, clock_ and the write
  std::ostream* out_;
  Clock clock_;
};

// The process-wide logger of the agent (JSON to std::cerr until SetLogFormat).
Logger& AgentLog();
void SetLogFormat(LogFormat format);
// By name ("json" or "text", the --log-format values); kUsage error (and no change) otherwise.
Status SetLogFormat(std::string_view name);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_OPS_LOG_H_
