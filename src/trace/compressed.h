// The compressed container of .rvtrace files (docs/rvtrace.md, "Compression"): the JSON Lines text as a standard zstd
// stream, one zstd frame per flush of the writer, so a file cut after any flush decompresses to whole lines.
// Readers tell the container from plain JSON Lines by the zstd magic number, never by the file name.
#ifndef RVBPFD_SRC_TRACE_COMPRESSED_H_
#define RVBPFD_SRC_TRACE_COMPRESSED_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/error.h"

namespace rvbpfd {

// How the writer stores the lines (--trace-format).
enum class TraceFormat : uint8_t {
  kJsonl,  // plain JSON Lines: greppable, what the in-process recorder writes
  kZstd,   // JSON Lines in zstd frames (the recorder's default)
};
std::string_view TraceFormatName(TraceFormat format);

// Whether `bytes` starts like a zstd stream: a zstd frame's magic number or a skippable frame's. A plain trace
// starts with '{', which no zstd magic does.
bool LooksZstd(std::string_view bytes);

// The text of a zstd stream of one or more frames. A stream that ends inside a frame (the writer was killed after
// handing part of it to the kernel) is not an error: `text` holds everything the complete blocks before the cut
// decode to, and `cut` says so. Bytes that are not zstd data after the first frame are an error (kBadTrace).
struct DecompressedText {
  std::string text;
  bool cut = false;
};
// Fails with kBadTrace naming `name` for corrupt data, or when the text would exceed `max_bytes`.
Result<DecompressedText> DecompressZstd(std::string_view bytes, const std::string& name, uint64_t max_bytes);

// Streaming compressor of the writer: text goes in, the compressed bytes to hand to write(2) come out. Level 1
// (zstd's fastest standard level): the trace's lines repeat their keys and values so much that higher levels gain
// little. With `workers` >= 1 zstd compresses on that many threads of its own (which never take the daemon's
// signals) while the caller goes on formatting lines: the ring drain pays only for handing text over, and waits only
// when a frame ends, for the last part zstd has not compressed yet. Figures: docs/benchmarks.md, "Trace size and
// write rate".
class ZstdCompressor {
 public:
  static constexpr int kLevel = 1;
  static constexpr int kWorkers = 1;
  static Result<std::unique_ptr<ZstdCompressor>> Create(int workers = kWorkers);
  ~ZstdCompressor();
  ZstdCompressor(const ZstdCompressor&) = delete;
  ZstdCompressor& operator=(const ZstdCompressor&) = delete;

  // Compresses `text` and appends what zstd has ready to *out. `end_frame`: end the current zstd frame, so *out
  // (with everything appended before) is a complete stream of whole frames; otherwise zstd may keep part of the
  // text (with workers, up to a few MiB) for a later call. Fails only on a zstd error (kInternal).
  Status Compress(std::string_view text, bool end_frame, std::string* out);
  // Whether text went in since the last frame ended.
  bool frame_open() const { return frame_open_; }

 private:
  struct Context;
  explicit ZstdCompressor(std::unique_ptr<Context> ctx);
  std::unique_ptr<Context> ctx_;
  bool frame_open_ = false;
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_TRACE_COMPRESSED_H_
