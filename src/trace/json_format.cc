#include "trace/json_format.h"

#include <cstdio>

#include <charconv>
#include <cmath>

#include "common/utf8.h"

namespace rvbpfd {
namespace {

constexpr char kHex[] = "0123456789abcdef";
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

}  // namespace

void AppendJsonString(std::string* out, std::string_view s) {
  out->push_back('"');
  size_t run = 0;  // start of the pending run of bytes that need no escaping
  size_t i = 0;
  auto flush_run = [&] { out->append(s.data() + run, i - run); };
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
      ++i;
      continue;
    }
    if (c >= 0x80) {
      const size_t len = Utf8SequenceLength(s, i);
      if (len != 0) {
        i += len;
        continue;
      }
      flush_run();
      out->append(kReplacement);
      run = ++i;
      continue;
    }
    flush_run();
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      case '\b': out->append("\\b"); break;
      case '\f': out->append("\\f"); break;
      default: {
        const char esc[6] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 0xF]};
        out->append(esc, sizeof(esc));
      }
    }
    run = ++i;
  }
  flush_run();
  out->push_back('"');
}

void AppendUint(std::string* out, uint64_t value) {
  char buf[20];  // 2^64-1 has 20 digits
  const auto res = std::to_chars(buf, buf + sizeof(buf), value);
  out->append(buf, res.ptr);
}

void AppendFixed(std::string* out, double value, int decimals) {
  if (!std::isfinite(value)) {
    out->append("null");
    return;
  }
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::fixed, decimals);
  if (res.ec != std::errc()) {
    out->append("null");  // only for magnitudes beyond 1e40 or so, which no trace field reaches
    return;
  }
  out->append(buf, res.ptr);
}

void AppendDouble(std::string* out, double value) {
  if (!std::isfinite(value)) {
    out->append("null");
    return;
  }
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), value);
  out->append(buf, res.ptr);
}

void AppendHexString(std::string* out, uint64_t value) {
  char buf[24];
  int n = snprintf(buf, sizeof(buf), "\"0x%llx\"", static_cast<unsigned long long>(value));
  out->append(buf, static_cast<size_t>(n));
}

}  // namespace rvbpfd
