// UTF-8 validation shared by every writer of text that must be valid UTF-8 (JSON, logs, terminal messages).
#ifndef RVBPFD_SRC_COMMON_UTF8_H_
#define RVBPFD_SRC_COMMON_UTF8_H_

#include <cstddef>
#include <string_view>

namespace rvbpfd {

// Length in bytes of the valid UTF-8 sequence starting at s[i] (1 for ASCII), or 0 when the bytes there are not
// one (RFC 3629 table: no overlong forms, no UTF-16 surrogates, nothing above U+10FFFF). Requires i < s.size().
inline size_t Utf8SequenceLength(std::string_view s, size_t i) {
  auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) return 1;
  size_t len = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // allowed range of the second byte
  if (c >= 0xc2 && c <= 0xdf) {
    len = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    len = 3;
    if (c == 0xe0) lo = 0xa0;  // overlong
    if (c == 0xed) hi = 0x9f;  // surrogates
  } else if (c >= 0xf0 && c <= 0xf4) {
    len = 4;
    if (c == 0xf0) lo = 0x90;  // overlong
    if (c == 0xf4) hi = 0x8f;  // above U+10FFFF
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (size_t k = 2; k < len; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xbf) return 0;
  }
  return len;
}

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_COMMON_UTF8_H_
