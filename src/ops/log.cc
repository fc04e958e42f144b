#include "ops/log.h"

#include <time.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "common/utf8.h"

namespace rvbpfd {
namespace {

void AppendHexEscape(std::string* out, unsigned char c) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "\\u%04x", c);
  out->append(buf);
}

// Shortest text that reads back as the same double; non-finite values have no JSON form.
std::string FormatDouble(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), d);
  if (ec != std::errc()) return "0";
  return std::string(buf, end);
}

bool NeedsQuoting(std::string_view s) {
  if (s.empty()) return true;
  for (unsigned char c : s) {
    if (c <= 0x20 || c == 0x7f || c == '=' || c == '"' || c == '\\') return true;
  }
  return !IsValidUtf8(s);
}

// Escapes control bytes and invalid UTF-8 like JsonEscape; quotes and backslashes only when `quotes` (JSON
// strings, quoted text values), not in a text-format message, which is not quoted.
std::string Escape(std::string_view s, bool quotes) {
  std::string out;
  out.reserve(s.size() + 8);
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      size_t n = Utf8SequenceLength(s, i);
      if (n == 0) {
        out.append("\xef\xbf\xbd");  // U+FFFD for this byte; resynchronize at the next one
        ++i;
      } else {
        out.append(s.substr(i, n));
        i += n;
      }
      continue;
    }
    switch (c) {
      case '"': out.append(quotes ? "\\\"" : "\""); break;
      case '\\': out.append(quotes ? "\\\\" : "\\"); break;
      case '\b': out.append("\\b"); break;
      case '\f': out.append("\\f"); break;
      case '\n': out.append("\\n"); break;
      case '\r': out.append("\\r"); break;
      case '\t': out.append("\\t"); break;
      default:
        if (c < 0x20 || c == 0x7f) {
          AppendHexEscape(&out, c);
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
    ++i;
  }
  return out;
}

std::string TextMessage(std::string_view msg) { return Escape(msg, /*quotes=*/false); }

void AppendJsonValue(std::string* out, const LogValue& v) {
  std::visit(
      [out](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) {
          out->push_back('"');
          out->append(JsonEscape(x));
          out->push_back('"');
        } else if constexpr (std::is_same_v<T, bool>) {
          out->append(x ? "true" : "false");
        } else if constexpr (std::is_same_v<T, double>) {
          if (std::isfinite(x)) {
            out->append(FormatDouble(x));
          } else {
            out->push_back('"');  // JSON has no NaN/Inf: keep the information as a string
            out->append(FormatDouble(x));
            out->push_back('"');
          }
        } else {
          out->append(std::to_string(x));
        }
      },
      v.value());
}

void AppendTextValue(std::string* out, const LogValue& v) {
  std::visit(
      [out](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) {
          if (NeedsQuoting(x)) {
            out->push_back('"');
            out->append(JsonEscape(x));
            out->push_back('"');
          } else {
            out->append(x);
          }
        } else if constexpr (std::is_same_v<T, bool>) {
          out->append(x ? "true" : "false");
        } else if constexpr (std::is_same_v<T, double>) {
          out->append(FormatDouble(x));
        } else {
          out->append(std::to_string(x));
        }
      },
      v.value());
}

}  // namespace

Result<LogFormat> ParseLogFormat(std::string_view name) {
  if (name == "json") return LogFormat::kJson;
  if (name == "text") return LogFormat::kText;
  return rvbpfd::Error(ErrorCode::kUsage, "--log-format must be json or text, not \"" + std::string(name) + "\"");
}

std::string_view LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kError: return "error";
  }
  return "info";
}

std::string FormatRfc3339Millis(std::chrono::system_clock::time_point t) {
  using std::chrono::duration_cast;
  using std::chrono::milliseconds;
  // Floor (not truncation toward zero) so that times before 1970 still get a 0..999 millisecond part.
  int64_t ms_total = std::chrono::floor<milliseconds>(t.time_since_epoch()).count();
  int64_t secs = ms_total >= 0 ? ms_total / 1000 : -((-ms_total + 999) / 1000);
  int ms = static_cast<int>(ms_total - secs * 1000);
  time_t tt = static_cast<time_t>(secs);
  struct tm tm {};
  gmtime_r(&tt, &tm);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
  return buf;
}

bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    size_t n = Utf8SequenceLength(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string JsonEscape(std::string_view s) { return Escape(s, /*quotes=*/true); }

Logger::Logger(LogFormat format, std::ostream* out, Clock clock)
    : format_(format), out_(out != nullptr ? out : &std::cerr), clock_(std::move(clock)) {}

void Logger::SetOutput(std::ostream* out) {
  std::lock_guard<std::mutex> lock(mu_);
  out_ = out != nullptr ? out : &std::cerr;
}

void Logger::SetClock(Clock clock) {
  std::lock_guard<std::mutex> lock(mu_);
  clock_ = std::move(clock);
}

std::string Logger::Format(LogLevel level, std::string_view msg, const LogFields& fields) const {
  std::chrono::system_clock::time_point now;
  {
    std::lock_guard<std::mutex> lock(mu_);
    now = clock_ ? clock_() : std::chrono::system_clock::now();
  }
  std::string ts = FormatRfc3339Millis(now);
  std::string line;
  line.reserve(96 + msg.size() + fields.size() * 24);
  if (format() == LogFormat::kJson) {
    line.append("{\"ts\":\"").append(ts).append("\",\"level\":\"").append(LogLevelName(level));
    line.append("\",\"msg\":\"").append(JsonEscape(msg)).append("\"");
    for (const auto& [key, value] : fields) {
      line.append(",\"").append(JsonEscape(key)).append("\":");
      AppendJsonValue(&line, value);
    }
    line.append("}\n");
  } else {
    line.append(ts).append(" ").append(LogLevelName(level)).append(" ").append(TextMessage(msg));
    for (const auto& [key, value] : fields) {
      line.push_back(' ');
      line.append(JsonEscape(key)).push_back('=');
      AppendTextValue(&line, value);
    }
    line.push_back('\n');
  }
  return line;
}

void Logger::Log(LogLevel level, std::string_view msg, const LogFields& fields) {
  if (static_cast<int>(level) < static_cast<int>(min_level())) return;
  std::string line = Format(level, msg, fields);
  std::lock_guard<std::mutex> lock(mu_);
  out_->write(line.data(), static_cast<std::streamsize>(line.size()));
  out_->flush();
}

Logger& AgentLog() {
  // Never destroyed: threads may still log while static destructors run at exit.
  static Logger* logger = new Logger(LogFormat::kJson, &std::cerr);
  return *logger;
}

void SetLogFormat(LogFormat format) { AgentLog().SetFormat(format); }

Status SetLogFormat(std::string_view name) {
  Result<LogFormat> format = ParseLogFormat(name);
  if (!format.ok()) return format.error();
  AgentLog().SetFormat(format.value());
  return Status::Ok();
}

}  // namespace rvbpfd
