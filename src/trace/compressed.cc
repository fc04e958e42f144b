#include "trace/compressed.h"

#include <zstd.h>

#include <algorithm>
#include <cstring>

#include "common/threads.h"

namespace rvbpfd {
namespace {

struct DctxDeleter {
  void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

uint32_t LoadLe32(std::string_view bytes) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  return v;
}

}  // namespace

std::string_view TraceFormatName(TraceFormat format) { return format == TraceFormat::kZstd ? "zstd" : "jsonl"; }

bool LooksZstd(std::string_view bytes) {
  if (bytes.size() < 4) return false;
  const uint32_t magic = LoadLe32(bytes);
  return magic == ZSTD_MAGICNUMBER || (magic & ZSTD_MAGIC_SKIPPABLE_MASK) == ZSTD_MAGIC_SKIPPABLE_START;
}

Result<DecompressedText> DecompressZstd(std::string_view bytes, const std::string& name, uint64_t max_bytes) {
  auto bad = [&](const std::string& what) { return Error(ErrorCode::kBadTrace, "reading trace " + name + ": " + what); };
  std::unique_ptr<ZSTD_DCtx, DctxDeleter> dctx(ZSTD_createDCtx());
  if (!dctx) return Error(ErrorCode::kInternal, "reading trace " + name + ": cannot allocate a zstd decoder");
  // The window a frame may ask for bounds the decoder's memory: zstd's own default limit (128 MiB), stated here so a
  // library default cannot raise it. rvbpfd writes windows of at most 512 KiB at its level.
  ZSTD_DCtx_setParameter(dctx.get(), ZSTD_d_windowLogMax, 27);
  const size_t chunk = ZSTD_DStreamOutSize();
  DecompressedText result;
  std::string& out = result.text;
  size_t used = 0;
  ZSTD_inBuffer in{bytes.data(), bytes.size(), 0};
  size_t hint = 0;
  for (;;) {
    if (out.size() - used < chunk && out.size() < max_bytes) {
      // Doubling keeps the copies linear; the first guess is the usual ratio of a trace.
      const uint64_t want = std::max<uint64_t>({uint64_t{out.size()} * 2, uint64_t{bytes.size()} * 4, chunk});
      out.resize(static_cast<size_t>(std::min<uint64_t>(want, max_bytes)));
    }
    ZSTD_outBuffer o{out.data() + used, std::min(out.size() - used, chunk), 0};
    if (o.size == 0) {
      return bad("decompresses to more than " + std::to_string(max_bytes) +
                 " bytes (the most a trace may have; its events are held in memory)");
    }
    const size_t in_before = in.pos;
    hint = ZSTD_decompressStream(dctx.get(), &o, &in);
    if (ZSTD_isError(hint)) {
      return bad("corrupt zstd data near byte " + std::to_string(in.pos) + " (" + ZSTD_getErrorName(hint) + ")");
    }
    used += o.pos;
    // All input consumed and output room left over: the decoder has given everything it can.
    if (in.pos == in.size && o.pos < o.size) break;
    // zstd guarantees progress while it has input and room; a call that made none would loop forever.
    if (in.pos == in_before && o.pos == 0) return bad("zstd decoder made no progress near byte " + std::to_string(in.pos));
  }
  out.resize(used);
  if (out.capacity() > used + used / 4) out.shrink_to_fit();  // growth by doubling may have left half unused
  // A non-zero hint at the end: the last frame is incomplete (or its header is), as a killed writer leaves it.
  result.cut = hint != 0;
  return result;
}

struct ZstdCompressor::Context {
  struct Deleter {
    void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
  };
  std::unique_ptr<ZSTD_CCtx, Deleter> cctx;
  std::unique_ptr<char[]> chunk;
  size_t chunk_size = 0;
};

ZstdCompressor::ZstdCompressor(std::unique_ptr<Context> ctx) : ctx_(std::move(ctx)) {}
ZstdCompressor::~ZstdCompressor() = default;

Result<std::unique_ptr<ZstdCompressor>> ZstdCompressor::Create(int workers) {
  auto ctx = std::make_unique<Context>();
  ctx->cctx.reset(ZSTD_createCCtx());
  if (!ctx->cctx) return Error(ErrorCode::kInternal, "creating the trace's zstd compressor: out of memory");
  for (auto [param, value] : {std::pair{ZSTD_c_compressionLevel, kLevel}, std::pair{ZSTD_c_checksumFlag, 1},
                              std::pair{ZSTD_c_nbWorkers, workers}}) {
    const size_t r = ZSTD_CCtx_setParameter(ctx->cctx.get(), param, value);
    if (ZSTD_isError(r)) {
      return Error(ErrorCode::kInternal, std::string("configuring the trace's zstd compressor: ") + ZSTD_getErrorName(r));
    }
  }
  ctx->chunk_size = ZSTD_CStreamOutSize();
  ctx->chunk = std::make_unique<char[]>(ctx->chunk_size);
  return std::unique_ptr<ZstdCompressor>(new ZstdCompressor(std::move(ctx)));
}

Status ZstdCompressor::Compress(std::string_view text, bool end_frame, std::string* out) {
  if (!text.empty()) frame_open_ = true;
  if (text.empty() && !(end_frame && frame_open_)) return Status::Ok();
  ZSTD_inBuffer in{text.data(), text.size(), 0};
  const ZSTD_EndDirective mode = end_frame ? ZSTD_e_end : ZSTD_e_continue;
  // zstd starts its worker threads inside these calls; a new thread inherits this mask, so the workers never take
  // the signals the main loop waits for (common/threads.h).
  const sigset_t block = MainThreadSignals();
  sigset_t old;
  pthread_sigmask(SIG_BLOCK, &block, &old);
  struct RestoreMask {
    const sigset_t* old;
    ~RestoreMask() { pthread_sigmask(SIG_SETMASK, old, nullptr); }
  } restore{&old};
  for (;;) {
    ZSTD_outBuffer o{ctx_->chunk.get(), ctx_->chunk_size, 0};
    const size_t remaining = ZSTD_compressStream2(ctx_->cctx.get(), &o, &in, mode);
    if (ZSTD_isError(remaining)) {
      return Error(ErrorCode::kInternal, std::string("compressing the trace: ") + ZSTD_getErrorName(remaining));
    }
    out->append(ctx_->chunk.get(), o.pos);
    // ZSTD_e_end is done when nothing remains to flush; ZSTD_e_continue once it has taken all the input.
    if (end_frame ? remaining == 0 : in.pos == in.size) break;
  }
  if (end_frame) frame_open_ = false;
  return Status::Ok();
}

}  // namespace rvbpfd
