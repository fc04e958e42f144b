#include "session/stack_resolver.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>

namespace rvbpfd {

// The stack memo compares raw frames with memcmp: no padding bytes allowed.
static_assert(std::has_unique_object_representations_v<rv_ruby_frame>);

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

StackResolver::StackResolver(std::unique_ptr<MemoryReader> mem, const RubyOffsets& offsets, uint64_t global_symbols,
                             uint64_t current_vm_ptr)
    : mem_(std::move(mem)),
      symbolizer_(mem_.get(), offsets, global_symbols, current_vm_ptr),
      front_(kFrontSlots),
      stack_memo_(kStackMemoSlots),
      siblings_(kSiblingSlots) {}

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
  if (NeedsIseqHead(frame)) {  // both heads in one batch (one syscall for a live target)
    MemoryReader::Request both[2] = {{frame.addr, heads->head.data(), sizeof(heads->head)},
                                     {frame.cfp_iseq, heads->iseq_head.data(), sizeof(heads->iseq_head)}};
    return mem_->ReadMany(both) == 2;
  }
  if (!mem_->Read(frame.addr, heads->head.data(), sizeof(heads->head))) return false;
  CopyIseqHead(frame, heads);
  return true;
}

bool StackResolver::NeedsIseqHead(const rv_ruby_frame& frame) {
  // C frames have no line, so their cfp_iseq is not part of the result; an ISEQ frame's cfp_iseq is usually its
  // own addr, whose head was just read.
  return frame.kind != RV_RB_FRAME_CME_CFUNC && frame.cfp_iseq != 0 && frame.cfp_iseq != frame.addr;
}

void StackResolver::CopyIseqHead(const rv_ruby_frame& frame, Heads* heads) {
  static_assert(sizeof(Heads::iseq_head) <= sizeof(Heads::head));
  if (frame.kind != RV_RB_FRAME_CME_CFUNC && frame.cfp_iseq != 0 && frame.cfp_iseq == frame.addr) {
    std::copy_n(heads->head.begin(), heads->iseq_head.size(), heads->iseq_head.begin());
  }
}

size_t StackResolver::FrontIndex(const Key& k) {
  // The FNV hash's low bits depend only on the keys' low bits: take the top bits of a multiplicative mix instead.
  const uint64_t h = KeyHash()(k);
  return static_cast<size_t>(((h ^ (h >> 32)) * 0x9e3779b97f4a7c15ull) >> 54);  // 10 bits: kFrontSlots
}

size_t StackResolver::SiblingIndex(const Key& k) {
  const uint64_t h = KeyHash()(Key{k.addr, 0, k.cfp_iseq, k.kind, k.flags});
  return static_cast<size_t>(((h ^ (h >> 32)) * 0x9e3779b97f4a7c15ull) >> 56);  // 8 bits: kSiblingSlots
}

StackResolver::Node* StackResolver::Find(const Key& key, FrontSlot& slot) {
  if (slot.node != nullptr && slot.key == key) return slot.node;
  auto it = cache_.find(key);
  if (it == cache_.end()) return nullptr;
  slot.key = key;
  slot.node = &*it;
  return slot.node;
}

StackResolver::Node* StackResolver::ValidSibling(const rv_ruby_frame& frame, const Key& key, Heads* heads,
                                                bool* have_heads) {
  if (key.kind != RV_RB_FRAME_ISEQ && key.kind != RV_RB_FRAME_CME_ISEQ) return nullptr;
  const Key& s = siblings_[SiblingIndex(key)];
  if (s.addr != key.addr || s.cfp_iseq != key.cfp_iseq || s.kind != key.kind || s.flags != key.flags ||
      s.pc == key.pc) {
    return nullptr;
  }
  Node* n = Find(s, front_[FrontIndex(s)]);
  if (n == nullptr) return nullptr;
  Entry& e = n->second;
  // Valid in this epoch: its heads are the objects' heads now, so none need reading for this frame.
  if (e.epoch == epoch_) return !*have_heads || *heads == e.heads ? n : nullptr;
  // Of an earlier epoch and not in the batch revalidated at this one's start (unused for an epoch or more). The same
  // objects if their heads are unchanged: the entry is valid again, and this frame costs its heads and its line
  // instead of a full symbolization (~40 dependent reads).
  if (!*have_heads) *have_heads = ReadHeads(frame, heads);
  return *have_heads && Revalidate(e, *heads) ? n : nullptr;
}

const std::shared_ptr<const Symbolizer::LineTable>& StackResolver::NoLineTable() {
  static const auto* const kNone = new std::shared_ptr<const Symbolizer::LineTable>(
      std::make_shared<const Symbolizer::LineTable>());
  return *kNone;
}

std::optional<int> StackResolver::LineFromSibling(Entry& sibling, const rv_ruby_frame& frame) {
  if (frame.flags & RV_RB_FRAME_F_LINE_ZERO) return 0;
  // 3.1's pc-less frames follow a rule of LineNumber's own. The sibling is valid in this epoch, so the iseq is the
  // object its table was read from, and CRuby never changes a line table once the iseq is compiled.
  if (frame.pc != 0) {
    if (sibling.lines == nullptr) {
      std::optional<Symbolizer::LineTable> table = symbolizer_.ReadLineTable(frame.cfp_iseq);
      // Not kept when the budget has no room for it without clearing this cache (`sibling` is one of its entries).
      if (table && Charge(table->bytes(), /*may_clear=*/false)) {
        sibling.lines = std::make_shared<const Symbolizer::LineTable>(std::move(*table));
        cache_bytes_ += sibling.lines->bytes();
        ++line_tables_;
      } else {
        sibling.lines = NoLineTable();
      }
    }
    if (sibling.lines != NoLineTable()) return Symbolizer::LineAt(*sibling.lines, frame.pc);
  }
  return symbolizer_.LineNumber(frame.cfp_iseq, frame.pc);
}

bool StackResolver::Revalidate(Entry& e, const Heads& now) {
  if (now != e.heads) return false;
  ++revalidations_;
  e.epoch = epoch_;
  return true;
}

FrameInfo StackResolver::ResolveFrame(const rv_ruby_frame& frame) { return *ResolveFrameShared(frame); }

SharedFrame StackResolver::ResolveFrameShared(const rv_ruby_frame& frame) {
  Node* node = nullptr;
  return ResolveFrameNode(frame, &node);
}

SharedFrame StackResolver::ResolveFrameNode(const rv_ruby_frame& frame, Node** node_out) {
  *node_out = nullptr;
  if (live_epoch_ != epoch_) RevalidateLive();
  const bool cacheable = frame.kind != RV_RB_FRAME_UNRESOLVED && frame.kind != RV_RB_FRAME_NONE;
  const Key key{frame.addr, frame.pc, frame.cfp_iseq, frame.kind, frame.flags};
  Heads heads;
  bool have_heads = false;
  FrontSlot* slot = nullptr;
  if (cacheable) {
    slot = &front_[FrontIndex(key)];
    if (Node* n = Find(key, *slot)) {
      Entry* e = &n->second;
      if (e->epoch == epoch_) {
        ++hits_;
        NoteUsed(n);
        *node_out = n;
        return e->info;
      }
      have_heads = ReadHeads(frame, &heads);
      if (have_heads && Revalidate(*e, heads)) {
        NoteUsed(n);
        *node_out = n;
        return e->info;
      }
      slot->node = nullptr;
      Uncharge(EntryBytes(*e->info));
      if (e->lines != nullptr && e->lines != NoLineTable() && e->lines.use_count() == 1) {
        Uncharge(e->lines->bytes());  // the last entry that shared the table
      }
      ForgetMemoNode(n);
      cache_.erase(key);
    }
  }
  ++misses_;
  SharedFrame info;
  std::shared_ptr<const Symbolizer::LineTable> lines;
  if (cacheable) {
    // Another pc of the same objects, valid in this epoch: the same label and path, this pc's line.
    Node* sibling = ValidSibling(frame, key, &heads, &have_heads);
    if (sibling != nullptr) {
      std::optional<int> line = LineFromSibling(sibling->second, frame);
      if (line) {
        FrameInfo named = *sibling->second.info;
        named.line = *line;
        info = std::make_shared<const FrameInfo>(std::move(named));
        heads = sibling->second.heads;
        have_heads = true;
        lines = sibling->second.lines;
        ++line_only_;
      }
    }
  }
  if (info == nullptr) {
    if (cacheable && !have_heads) have_heads = ReadHeads(frame, &heads);
    info = std::make_shared<const FrameInfo>(ToFrameInfo(frame, symbolizer_.Symbolize(frame)));
  }
  // The heads are read before symbolizing: if the object changed in between, the entry fails validation later.
  if (cacheable && have_heads && info->kind != FrameKind::kUnresolved) {
    const size_t bytes = EntryBytes(*info);
    if (cache_.size() >= kMaxCacheEntries || (account_ == nullptr && cache_bytes_ + bytes > kMaxCacheBytes)) {
      ClearCache();
    }
    // Past the budget (which may clear this cache first to make room): the frame is named, but not cached.
    if (!Charge(bytes, /*may_clear=*/true)) {
      ++uncached_;
      return info;
    }
    auto it = cache_.emplace(key, Entry{info, heads, epoch_, ~uint64_t{0}, std::move(lines)}).first;
    cache_bytes_ += bytes;
    slot->key = key;
    slot->node = &*it;
    siblings_[SiblingIndex(key)] = key;
    NoteUsed(&*it);
    *node_out = &*it;
  }
  return info;
}

bool StackResolver::Charge(size_t bytes, bool may_clear) {
  return account_ == nullptr || account_->Charge(bytes, may_clear);
}

void StackResolver::Uncharge(size_t bytes) {
  bytes = std::min(cache_bytes_, bytes);
  cache_bytes_ -= bytes;
  if (account_ != nullptr) account_->Release(bytes);
}

void StackResolver::ClearCache() {
  cache_.clear();
  Uncharge(cache_bytes_);
  std::fill(front_.begin(), front_.end(), FrontSlot{});
  for (StackMemo& m : stack_memo_) m = StackMemo{};
  live_.clear();
  ++cache_clears_;
}

bool StackResolver::MemoValidNow(const StackMemo& memo) const {
  if (memo.nodes.size() != memo.raw.size()) return false;
  return std::all_of(memo.nodes.begin(), memo.nodes.end(), [this](const Node* n) { return n->second.epoch == epoch_; });
}

void StackResolver::ForgetMemoNode(const Node* node) {
  // Rare (an entry whose objects changed in a GC): a scan of the memos' node lists (at most 128 x 64) is cheap.
  for (StackMemo& m : stack_memo_) {
    if (std::find(m.nodes.begin(), m.nodes.end(), node) != m.nodes.end()) m.nodes.clear();
  }
}

void StackResolver::Resolve(std::span<const rv_ruby_frame> frames, std::vector<FrameInfo>* out) {
  if (live_epoch_ != epoch_) RevalidateLive();
  RevalidateStale(frames);
  out->clear();
  out->reserve(frames.size());
  for (const rv_ruby_frame& f : frames) out->push_back(*ResolveFrameShared(f));
}

SharedStack StackResolver::ResolveStack(std::span<const rv_ruby_frame> frames, StackEnd end) {
  StackMemo* memo = nullptr;
  SharedStack whole = ResolveWhole(frames, &memo);
  if (end == StackEnd::kWhole) return whole;
  if (memo != nullptr && memo->marked != nullptr && memo->marked_end == end) return memo->marked;
  auto marked = std::make_shared<std::vector<SharedFrame>>();
  marked->reserve(whole->size() + 1);
  marked->assign(whole->begin(), whole->end());
  marked->push_back(StackEndFrame(end));
  if (memo != nullptr) {
    memo->marked = marked;
    memo->marked_end = end;
  }
  return marked;
}

SharedStack StackResolver::ResolveWhole(std::span<const rv_ruby_frame> frames, StackMemo** memo_out) {
  *memo_out = nullptr;
  StackMemo* memo = nullptr;
  bool same_raw = false;
  if (!frames.empty() && frames.size() <= kMemoMaxFrames) {
    uint64_t h = frames.size();
    for (const rv_ruby_frame& f : frames) h = (h ^ KeyHash()(Key{f.addr, f.pc, f.cfp_iseq, f.kind, f.flags})) * 31;
    memo = &stack_memo_[((h ^ (h >> 32)) * 0x9e3779b97f4a7c15ull) >> 57];  // 7 bits: kStackMemoSlots
    same_raw = memo->stack != nullptr && memo->raw.size() == frames.size() &&
               std::memcmp(memo->raw.data(), frames.data(), frames.size_bytes()) == 0;
  }
  // First, at a new epoch's first stack, the batch that revalidates the entries of the previous one.
  if (live_epoch_ != epoch_) RevalidateLive();
  if (same_raw && memo->epoch != epoch_ && MemoValidNow(*memo)) {
    // Every frame would be named from the same entry: the stack stands, its entries are in use in this epoch.
    for (Node* n : memo->nodes) NoteUsed(n);
    memo->epoch = epoch_;
    ++stacks_kept_;
  }
  if (same_raw && memo->epoch == epoch_) {
    hits_ += frames.size();
    *memo_out = memo;
    return memo->stack;
  }
  RevalidateStale(frames);
  auto out = std::make_shared<std::vector<SharedFrame>>();
  out->reserve(frames.size());
  nodes_.clear();
  bool all_cached = true;
  const uint64_t clears = cache_clears_;
  for (const rv_ruby_frame& f : frames) {
    Node* node = nullptr;
    out->push_back(ResolveFrameNode(f, &node));
    // A miss that was cached is as good as a hit from now on; an uncached frame is symbolized anew every time.
    all_cached = all_cached && node != nullptr;
    nodes_.push_back(node);
  }
  if (memo == nullptr || !all_cached || cache_clears_ != clears) return out;
  memo->epoch = epoch_;
  memo->nodes.assign(nodes_.begin(), nodes_.end());
  *memo_out = memo;
  // The same frame objects as the remembered stack (shared_ptr == compares addresses): it is still this stack.
  if (same_raw && *memo->stack == *out) return memo->stack;
  memo->raw.assign(frames.begin(), frames.end());
  memo->stack = out;
  memo->marked = nullptr;
  return out;
}

void StackResolver::RevalidateStale(std::span<const rv_ruby_frame> frames) {
  stale_.clear();
  for (const rv_ruby_frame& f : frames) {
    if (f.kind == RV_RB_FRAME_UNRESOLVED || f.kind == RV_RB_FRAME_NONE) continue;
    const Key key{f.addr, f.pc, f.cfp_iseq, f.kind, f.flags};
    Node* n = Find(key, front_[FrontIndex(key)]);
    if (n == nullptr || n->second.epoch == epoch_) continue;
    // A frame repeated in the stack (recursion) is queued once.
    if (std::any_of(stale_.begin(), stale_.end(), [&](const Stale& s) { return s.node == n; })) continue;
    stale_.push_back({n, f});
  }
  RevalidateBatch();
}

void StackResolver::RevalidateLive() {
  stale_.clear();
  for (Node* n : live_) {
    const Key& k = n->first;
    stale_.push_back({n, rv_ruby_frame{k.addr, k.pc, k.cfp_iseq, k.kind, k.flags}});
  }
  live_.clear();  // refilled by NoteUsed as frames are named in this epoch
  live_epoch_ = epoch_;
  RevalidateBatch();
}

void StackResolver::RevalidateBatch() {
  if (stale_.empty()) return;
  stale_heads_.assign(stale_.size(), Heads{});
  requests_.clear();
  // Same reads as ReadHeads, per frame: the object's head, then (when it is another object) the cfp's iseq head.
  for (size_t i = 0; i < stale_.size(); ++i) {
    const rv_ruby_frame& f = stale_[i].frame;
    requests_.push_back({f.addr, stale_heads_[i].head.data(), sizeof(Heads::head)});
    if (NeedsIseqHead(f)) {
      requests_.push_back({f.cfp_iseq, stale_heads_[i].iseq_head.data(), sizeof(Heads::iseq_head)});
    }
  }
  mem_->ReadMany(requests_);
  size_t r = 0;
  for (size_t i = 0; i < stale_.size(); ++i) {
    const rv_ruby_frame& f = stale_[i].frame;
    bool ok = requests_[r++].ok;
    if (NeedsIseqHead(f)) ok = requests_[r++].ok && ok;
    CopyIseqHead(f, &stale_heads_[i]);
    if (ok) Revalidate(stale_[i].node->second, stale_heads_[i]);
  }
}

StackEnd StackEndOf(const rv_stack_header& h) {
  if (h.flags & RV_STACK_F_TRUNCATED) return StackEnd::kTruncated;
  if (h.walk_status != RV_WALK_OK || (h.flags & RV_STACK_F_NO_EC)) return StackEnd::kIncomplete;
  return StackEnd::kWhole;
}

const SharedFrame& StackEndFrame(StackEnd end) {
  static const SharedFrame kNone;
  static const SharedFrame kTruncated =
      std::make_shared<const FrameInfo>(FrameInfo{"<truncated>", "", 0, FrameKind::kUnresolved});
  static const SharedFrame kIncomplete =
      std::make_shared<const FrameInfo>(FrameInfo{"<incomplete stack>", "", 0, FrameKind::kUnresolved});
  switch (end) {
    case StackEnd::kTruncated:
      return kTruncated;
    case StackEnd::kIncomplete:
      return kIncomplete;
    case StackEnd::kWhole:
      break;
  }
  return kNone;
}

void AppendStackEndMarker(const rv_stack_header& h, std::vector<FrameInfo>* frames) {
  const StackEnd end = StackEndOf(h);
  if (end != StackEnd::kWhole) frames->push_back(*StackEndFrame(end));
}

}  // namespace rvbpfd
