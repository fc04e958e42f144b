#include "common/label_bound.h"

#include "common/utf8.h"

namespace rvbpfd {

bool BoundLabel(std::string* s) {
  if (s->size() <= kMaxLabelBytes / 3) return false;  // even all invalid, it is within the bound
  size_t written = 0;     // bytes as written so far
  size_t keep = 0;        // bytes of s that fit with the mark after them
  size_t i = 0;
  while (i < s->size()) {
    const size_t len = Utf8SequenceLength(*s, i);
    const size_t out = len == 0 ? 3 : len;  // an invalid byte is written as U+FFFD
    if (written + out <= kMaxLabelBytes - kTruncatedMark.size()) keep = i + (len == 0 ? 1 : len);
    written += out;
    if (written > kMaxLabelBytes) break;
    i += len == 0 ? 1 : len;
  }
  if (written <= kMaxLabelBytes) return false;
  s->resize(keep);
  s->append(kTruncatedMark);
  return true;
}

}  // namespace rvbpfd
