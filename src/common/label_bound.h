// The length bound of text a target process chooses and rvbpfd keeps: Ruby frame labels (method and class names)
// and paths. A target can name a method or a file with 64 KiB, and recurse through it thousands of frames deep; each
// copy of such a label is held by the recorder's and the agent's frame caches, written into traces, and repeated
// by every export per stack and per event. Every label and path is therefore cut to kMaxLabelBytes where it is
// made (stacks/symbolizer.h, Symbolizer::Symbolize) and where it is read back (trace/reader.h), and marked.
#ifndef RVBPFD_SRC_COMMON_LABEL_BOUND_H_
#define RVBPFD_SRC_COMMON_LABEL_BOUND_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace rvbpfd {

// The most bytes a label or path has, as written to a trace (JSON-unescaped UTF-8), the mark included.
inline constexpr size_t kMaxLabelBytes = 1024;
// What ends a cut label: U+2026 then "[truncated]" (14 bytes).
inline constexpr std::string_view kTruncatedMark = "\xe2\x80\xa6[truncated]";

// Cuts `s` so that, as the trace writer writes it (every byte that is not valid UTF-8 becomes U+FFFD, 3 bytes), it
// takes at most kMaxLabelBytes bytes: the longest prefix that ends on a whole UTF-8 sequence and leaves room for
// kTruncatedMark, then the mark. A text within the bound is left as it is. Returns whether it cut.
bool BoundLabel(std::string* s);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_COMMON_LABEL_BOUND_H_
