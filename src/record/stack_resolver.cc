#include "record/stack_resolver.h"

#include <utility>

namespace rvbpfd {

FrameInfo ToFrameInfo(const rv_ruby_frame& frame, const SymbolizedFrame& s) {
  FrameInfo f;
  if (!s.resolved || frame.kind == RV_RB_FRAME_UNRESOLVED || frame.kind == RV_RB_FRAME_NONE) {
    f.kind = FrameKind::kUnresolved;
    f.label = s.full_label.value_or("<unresolved>");
    return f;
  }
  f.label = s.full_label.value_or("");
  if (frame.kind == RV_RB_FRAME_CME_CFUNC) {
    f.kind = FrameKind::kCfunc;
    f.path = "<cfunc>";  // rb_profile_frame_path is nil for C frames; the trace format names them "<cfunc>"
    f.line = 0;
  } else {
    f.kind = FrameKind::kRuby;
    f.path = s.path.value_or("");
    f.line = s.line;
  }
  return f;
}

StackResolver::StackResolver(std::unique_ptr<MemoryReader> mem, const RubyOffsets& offsets, uint64_t global_symbols)
    : mem_(std::move(mem)), symbolizer_(mem_.get(), offsets, global_symbols) {}

size_t StackResolver::KeyHash::operator()(const Key& k) const {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the words
  auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  mix(k.addr);
  mix(k.pc);
  mix(k.cfp_iseq);
  mix((static_cast<uint64_t>(k.kind) << 32) | k.flags);
  return static_cast<size_t>(h);
}

bool StackResolver::ReadHeads(const rv_ruby_frame& frame, Heads* heads) {
  if (!mem_->Read(frame.addr, heads->head.data(), sizeof(heads->head))) return false;
  // C frames have no line; their cfp_iseq is not part of the result.
  if (frame.kind != RV_RB_FRAME_CME_CFUNC && frame.cfp_iseq != 0 &&
      !mem_->Read(frame.cfp_iseq, heads->iseq_head.data(), sizeof(heads->iseq_head))) {
    return false;
  }
  return true;
}

FrameInfo StackResolver::ResolveFrame(const rv_ruby_frame& frame) {
  const bool cacheable = frame.kind != RV_RB_FRAME_UNRESOLVED && frame.kind != RV_RB_FRAME_NONE;
  const Key key{frame.addr, frame.pc, frame.cfp_iseq, frame.kind, frame.flags};
  Heads heads;
  bool have_heads = false;
  if (cacheable) {
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      if (it->second.epoch == epoch_) {
        ++hits_;
        return it->second.info;
      }
      have_heads = ReadHeads(frame, &heads);
      if (have_heads && heads == it->second.heads) {
        ++revalidations_;
        it->second.epoch = epoch_;
        return it->second.info;
      }
      cache_.erase(it);
    }
  }
  ++misses_;
  if (cacheable && !have_heads) have_heads = ReadHeads(frame, &heads);
  FrameInfo info = ToFrameInfo(frame, symbolizer_.Symbolize(frame));
  // The heads are read before symbolizing: if the object changed in between, the entry fails validation later.
  if (cacheable && have_heads && info.kind != FrameKind::kUnresolved) {
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(key, Entry{info, heads, epoch_});
  }
  return info;
}

void StackResolver::Resolve(std::span<const rv_ruby_frame> frames, std::vector<FrameInfo>* out) {
  out->clear();
  out->reserve(frames.size());
  for (const rv_ruby_frame& f : frames) out->push_back(ResolveFrame(f));
}

}  // namespace rvbpfd
