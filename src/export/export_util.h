// Shared by the exporters: a buffered writer (exports of a million-event trace are tens of MB, so lines are built
// in a string and handed to the stream in large pieces) and the number formats both file formats need.
// Memory: an export never holds more of its output than one buffer (kFlushBytes plus one frame's text): what a
// trace can make large (labels, deep stacks repeated per event) is written as it is produced, and MaybeFlush runs
// inside every loop over a stack's frames.
#ifndef RVBPFD_SRC_EXPORT_EXPORT_UTIL_H_
#define RVBPFD_SRC_EXPORT_EXPORT_UTIL_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

#include "common/error.h"
#include "model/model.h"
#include "trace/json_format.h"

namespace rvbpfd {

class ExportSink {
 public:
  explicit ExportSink(std::ostream& out) : out_(out) { buffer_.reserve(kFlushBytes * 2); }
  ExportSink(const ExportSink&) = delete;
  ExportSink& operator=(const ExportSink&) = delete;

  std::string* buffer() { return &buffer_; }
  void Append(std::string_view s) { buffer_.append(s); }
  // Hands the buffer to the stream once it passes kFlushBytes.
  void MaybeFlush() {
    if (buffer_.size() >= kFlushBytes) Flush();
  }
  // Once the stream failed (disk full, a closed pipe, the output cap of common/safe_file.h) nothing more is written
  // and the buffer is dropped, so an export of a hostile trace stops growing; writers poll failed() to stop early.
  void Flush() {
    if (out_) out_.write(buffer_.data(), static_cast<std::streamsize>(buffer_.size()));
    buffer_.clear();
  }
  bool failed() const { return !out_; }
  // Flushes and reports a stream failure (disk full, closed pipe) as kIo naming `what`.
  Status Finish(std::string_view what) {
    Flush();
    out_.flush();
    if (!out_) return Error(ErrorCode::kIo, "writing the " + std::string(what) + " export failed");
    return Status::Ok();
  }

 private:
  static constexpr size_t kFlushBytes = 256 * 1024;  // bytes per write to the stream
  std::ostream& out_;
  std::string buffer_;
};

// Appends ns as microseconds with exactly three decimals ("1234.567"), computed in integers so no precision is lost
// for traces of any length (a double holds ns exactly only up to 2^53, about 104 days).
inline void AppendMicros(std::string* out, uint64_t ns) {
  AppendUint(out, ns / 1000);
  const uint64_t frac = ns % 1000;
  out->push_back('.');
  out->push_back(static_cast<char>('0' + frac / 100));
  out->push_back(static_cast<char>('0' + frac / 10 % 10));
  out->push_back(static_cast<char>('0' + frac % 10));
}

// Arithmetic on numbers read from a trace file, which may hold anything (a started_at in year 4052, a duration of
// 1e300 ms): results saturate at the type's limit instead of overflowing.
inline uint64_t SaturatingMul(uint64_t a, uint64_t b) {
  uint64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}
inline uint64_t SaturatingAdd(uint64_t a, uint64_t b) {
  uint64_t r = 0;
  return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}
inline int64_t SaturatingToInt64(uint64_t v) {
  return v > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(v);
}
// Milliseconds (a trace's duration_ms) to ns: 0 for negative or NaN, UINT64_MAX past what uint64 holds.
inline uint64_t MsToNsSaturated(double ms) {
  if (!(ms > 0)) return 0;
  const double ns = ms * 1e6;
  if (!(ns < 18446744073709551616.0)) return UINT64_MAX;  // 2^64, exactly representable
  return static_cast<uint64_t>(ns);
}

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_EXPORT_EXPORT_UTIL_H_
