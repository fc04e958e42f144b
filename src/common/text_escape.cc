#include "common/text_escape.h"

#include "common/utf8.h"

namespace rvbpfd {
namespace {

void AppendHexByte(std::string* out, unsigned char c) {
  static constexpr char kHex[] = "0123456789abcdef";
  out->append("\\x");
  out->push_back(kHex[c >> 4]);
  out->push_back(kHex[c & 0xf]);
}

}  // namespace

std::string EscapeControlBytes(std::string_view s, bool keep_newlines) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    if (c >= 0x80) {
      const size_t n = Utf8SequenceLength(s, i);
      // U+0080..U+009F (C2 80..C2 9F) are the C1 controls: CSI (U+009B) starts an escape sequence on many terminals.
      const bool c1 = n == 2 && c == 0xc2 && static_cast<unsigned char>(s[i + 1]) <= 0x9f;
      if (n != 0 && !c1) {
        out.append(s.substr(i, n));
        i += n;
        continue;
      }
      const size_t bad = n == 0 ? 1 : n;
      for (size_t k = 0; k < bad; ++k) AppendHexByte(&out, static_cast<unsigned char>(s[i + k]));
      i += bad;
      continue;
    }
    switch (c) {
      case '\n': out.append(keep_newlines ? "\n" : "\\n"); break;
      case '\r': out.append("\\r"); break;
      case '\t': out.append("\\t"); break;
      default: AppendHexByte(&out, c);
    }
    ++i;
  }
  return out;
}

}  // namespace rvbpfd
