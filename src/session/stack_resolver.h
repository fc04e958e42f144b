// Turns walker frames from the BPF ring (rv_ruby_frame) into trace frames (FrameInfo) by symbolizing them against
// the target's live memory (src/stacks' Symbolizer over process_vm_readv), with a cache.
//
// Cache safety: a frame's label, path and line are a function of the objects its rv_ruby_frame points to (the CME or
// iseq at addr, the cfp's iseq for the line) and of pc. The cache is keyed by the whole frame (kind, addr, pc,
// cfp_iseq, flags) and each entry keeps a snapshot of the head of those objects (flags word, class and definition
// pointers). CRuby frees and moves objects only inside GC, so an entry validated in the current GC epoch (the
// recorder counts GC_ENTER records; a drop also starts a new epoch) is used as is; in a later epoch the heads are
// re-read from the target first, and an object that was freed or moved and whose slot was reused has a different
// head, so the symbolizer's type checks run again. Unresolved frames are never cached. Known gap: an anonymous class
// that is later assigned to a constant keeps its cached "#<Class:0x...>" label.
//
// Cost per GC and per new pc: the entries used in one epoch are revalidated together at the first use in the next
// (one batch of reads per GC for a process's working set, not one per distinct stack). A frame that misses only
// because its pc is new (a thread stopped at another instruction of a method already named) takes the label and
// path of that method's entry and only its line is new: the symbolizer's other reads (iseq body, strings, class path)
// are the bulk of a miss. The line comes from the iseq's line table, read in one batch at the first new pc and
// shared by the entries of its pcs, so later new pcs of a hot method read nothing. The entry must be valid in this
// epoch, or become so: one last used before the previous epoch (so not in the batch) is revalidated against the heads
// of the new frame's objects, which are read anyway. A sample's pc is usually new, and its method often unused for
// epochs: most of the agent's symbolization reads.
//
// Resolved frames are shared and immutable (SharedFrame): a cache hit hands out a reference to the cached frame
// instead of copying its strings, and a frame stays valid for its holders after its cache entry is dropped.
//
// Threading: used from the daemon's main loop only.
#ifndef RVBPFD_SRC_SESSION_STACK_RESOLVER_H_
#define RVBPFD_SRC_SESSION_STACK_RESOLVER_H_

#include <linux/types.h>

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/memory_budget.h"
#include "rvbpfd/abi.h"
#include "stacks/memory_reader.h"
#include "stacks/ruby_offsets.h"
#include "stacks/symbolizer.h"
#include "trace/stacks.h"

namespace rvbpfd {

// A resolved frame, shared between the resolver's cache and the records that named it; never modified once made.
using SharedFrame = std::shared_ptr<const FrameInfo>;
// A resolved stack (leaf first) as one immutable shared object: a record holds one reference for its whole stack,
// and a consumer that keys on the object's address finds a stack seen before without looking at its frames.
using SharedStack = std::shared_ptr<const std::vector<SharedFrame>>;

// How a walk ended (its rv_stack_header): whole, cut at RV_MAX_STACK_FRAMES, or stopped at a frame it could not read
// (or with no EC). A stack that is not whole says so at its oldest end, with StackEndFrame, rather than passing for
// a whole one.
enum class StackEnd : uint8_t { kWhole, kTruncated, kIncomplete };
StackEnd StackEndOf(const rv_stack_header& header);
// The marker frame of a stack that is not whole ("<truncated>", "<incomplete stack>"): one shared object per kind,
// so consumers keyed on frame objects see one marker. Null for kWhole.
const SharedFrame& StackEndFrame(StackEnd end);
// Appends the header's marker frame to `frames` (leaf first, so at the oldest end); nothing for a whole stack.
void AppendStackEndMarker(const rv_stack_header& header, std::vector<FrameInfo>* frames);

class StackResolver {
 public:
  // Entries kept before the cache is cleared (bounds the daemon's memory on programs that generate code forever).
  static constexpr size_t kMaxCacheEntries = 1 << 18;
  // Bytes the cached frames may hold (their strings plus a fixed per-entry cost) before the cache is cleared: a
  // target controls its labels and paths (up to Symbolizer::kMaxStringBytes each), so a count alone would let
  // 2^18 entries of ~130 KB each grow the daemon by tens of GB.
  static constexpr size_t kMaxCacheBytes = 64u << 20;
  // What one cache entry is charged besides its strings' bytes: the map node, key, heads and the shared frame's
  // control block (bytes, rounded up).
  static constexpr size_t kEntryOverheadBytes = 192;

  // `global_symbols` and `current_vm_ptr`: runtime addresses of ruby_global_symbols and ruby_current_vm_ptr (see
  // Symbolizer).
  StackResolver(std::unique_ptr<MemoryReader> mem, const RubyOffsets& offsets, uint64_t global_symbols,
                uint64_t current_vm_ptr = 0);

  // Symbolizes `frames` (newest first, as the walker produced them) into `out` (cleared first), leaf first.
  void Resolve(std::span<const rv_ruby_frame> frames, std::vector<FrameInfo>* out);
  FrameInfo ResolveFrame(const rv_ruby_frame& frame);
  // The same, without copying: cached frames are shared (the agent's per-record path), with `end`'s marker frame at
  // the oldest end. A repeated stack whose frames are all still valid is the same object as before (with the same
  // end), also across epochs once its frames are revalidated. Never null.
  SharedStack ResolveStack(std::span<const rv_ruby_frame> frames, StackEnd end = StackEnd::kWhole);
  SharedFrame ResolveFrameShared(const rv_ruby_frame& frame);

  // The GC epoch the next Resolve runs in (see above).
  void set_epoch(uint64_t epoch) { epoch_ = epoch; }
  uint64_t cache_hits() const { return hits_; }
  uint64_t revalidations() const { return revalidations_; }
  uint64_t cache_misses() const { return misses_; }
  // Misses named from another pc's entry of the same objects, reading only the line (a subset of cache_misses).
  uint64_t line_only_misses() const { return line_only_; }
  // Line tables read for them: one per iseq whose pcs were named that way (while its entries stay cached).
  uint64_t line_tables_read() const { return line_tables_; }
  // Stacks served whole in a later epoch because every entry they were named from is valid in it (usually found
  // unchanged by the batch at the epoch's start).
  uint64_t stacks_kept_across_gc() const { return stacks_kept_; }
  // Bytes the cache is charged for now (see kMaxCacheBytes), and how often it was cleared at either bound.
  size_t cache_bytes() const { return cache_bytes_; }
  uint64_t cache_clears() const { return cache_clears_; }
  // Frames named but not cached because the memory account refused their bytes.
  uint64_t uncached() const { return uncached_; }

  // Charges the cache's bytes (entries and line tables) to `account` instead of the kMaxCacheBytes bound: an entry
  // the account refuses is not cached (its frame is still named), a line table it refuses is not kept (lines are read
  // per pc). Set before the first Resolve; the account's evictor should call ClearCache. Null: kMaxCacheBytes.
  void set_memory_account(MemoryBudget::Account* account) { account_ = account; }
  // Drops every cached entry, line table and remembered stack, and releases their bytes: frames are named anew
  // from the target's memory at their next use. Frames already handed out stay valid for their holders.
  void ClearCache();

 private:
  struct Key {
    uint64_t addr, pc, cfp_iseq;
    uint32_t kind, flags;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  struct Heads {
    std::array<uint64_t, 5> head{};       // first words of the object at addr (CME: flags, defined_class, def,
                                          // called_id, owner; iseq: flags, wrapper, body, ...)
    std::array<uint64_t, 3> iseq_head{};  // flags, wrapper, body of cfp_iseq
    bool operator==(const Heads&) const = default;
  };
  struct Entry {
    SharedFrame info;
    Heads heads;
    uint64_t epoch = 0;       // last GC epoch in which heads were seen unchanged
    uint64_t used_epoch = ~uint64_t{0};  // last GC epoch a frame was named from it (none yet: ~0)
    // The line table of the frame's cfp_iseq, shared with the entries of that iseq's other pcs made from this one
    // (LineFromSibling); null until a new pc needed it, NoLineTable() when it could not be read whole.
    std::shared_ptr<const Symbolizer::LineTable> lines;
  };
  // A cache_ node: its address is stable across rehashes until it is erased.
  using Node = std::pair<const Key, Entry>;
  // A direct-mapped index in front of cache_ (slot = key hash mod kFrontSlots): most lookups are hits on a few
  // hundred hot frames, and one compare here is several times cheaper than the hash map's find. A slot points at a
  // cache_ node (stable across rehashes) and is reset whenever that node is erased.
  static constexpr size_t kFrontSlots = 1024;  // = 1 << 10, FrontIndex's bits
  struct FrontSlot {
    Key key{};
    Node* node = nullptr;
  };

  // The line of `frame`, a new pc of the iseq `sibling` names: from the iseq's line table (read and kept in the
  // sibling's entry at the first such pc), else LineNumber's own reads.
  std::optional<int> LineFromSibling(Entry& sibling, const rv_ruby_frame& frame);
  static const std::shared_ptr<const Symbolizer::LineTable>& NoLineTable();
  // False when the objects cannot be read (the frame then goes to the symbolizer, which reports it unresolved).
  bool ReadHeads(const rv_ruby_frame& frame, Heads* heads);
  // Whether the frame's cfp_iseq head is a second read; when it is the frame's own object, CopyIseqHead fills it in
  // from the head already read.
  static bool NeedsIseqHead(const rv_ruby_frame& frame);
  static void CopyIseqHead(const rv_ruby_frame& frame, Heads* heads);
  // Whole stacks resolved in one epoch with every frame from the cache: the same raw frames in the same epoch give
  // the same shared frames (cache entries are only erased in a later epoch, or all at once, which clears these too),
  // so a repeated stack costs one hash and one compare. In a later epoch, once every one of the stack's cache entries
  // is valid in it (the batch at the epoch's start, RevalidateLive, found them unchanged, as it usually does), the
  // remembered stack is served as it is: the per-frame path would name each frame from the same entry. Otherwise its
  // frames go through that path, and when they are the same objects the remembered stack is served again (its
  // identity outlives GCs).
  // Direct-mapped by stack hash; stacks of up to kMemoMaxFrames frames (at most ~kStackMemoSlots * kMemoMaxFrames *
  // 64 bytes = 520 KB, ~110 KB typical).
  static constexpr size_t kStackMemoSlots = 128;
  static constexpr size_t kMemoMaxFrames = 64;
  struct StackMemo {
    std::vector<rv_ruby_frame> raw;
    // The cache entry each frame of `raw` was named from (same order); cleared when one of them is erased, so a
    // memo never points at an erased node.
    std::vector<Node*> nodes;
    SharedStack stack;  // null: the slot is empty
    uint64_t epoch = 0;
    SharedStack marked;  // `stack` with marked_end's marker frame (the last one asked for), null: none yet
    StackEnd marked_end = StackEnd::kWhole;
  };

  static size_t FrontIndex(const Key& key);
  // ResolveStack without the end marker; *memo is set to the memo slot that holds the returned stack, or null.
  SharedStack ResolveWhole(std::span<const rv_ruby_frame> frames, StackMemo** memo);
  // ResolveFrameShared that also gives the cache entry the frame was named from, or null when it was not cached.
  SharedFrame ResolveFrameNode(const rv_ruby_frame& frame, Node** node);
  // Whether every entry a memo's stack was named from is valid in this epoch (see StackMemo).
  bool MemoValidNow(const StackMemo& memo) const;
  // Before cache_ erases `node`: memos named from it stop pointing at it.
  void ForgetMemoNode(const Node* node);
  // Before a stack is resolved: re-reads the heads of all its cached frames of an earlier epoch in one batch
  // (MemoryReader::ReadMany) and marks those still unchanged as valid in this epoch. Frames whose heads changed or
  // could not be read are left as they were, and the per-frame path handles them.
  void RevalidateStale(std::span<const rv_ruby_frame> frames);
  // At the first use in a new epoch: revalidates live_ (the entries valid in the previous one) in one batch; those
  // unchanged stay live, the others are left stale for the per-frame path.
  void RevalidateLive();
  // Reads the heads of every stale_ entry in one ReadMany and marks the unchanged ones valid in this epoch.
  void RevalidateBatch();
  // Records that a frame was named from `node` in this epoch (live_, while it has room): only entries in use are
  // carried into the next epoch's batch.
  void NoteUsed(Node* node) {
    if (node->second.used_epoch == epoch_) return;
    node->second.used_epoch = epoch_;
    if (live_.size() < kMaxLiveEntries) live_.push_back(node);
  }
  Node* Find(const Key& key, FrontSlot& slot);
  // Marks `e` valid in this epoch when `now` (its objects' heads read now) equals the heads it was named with.
  bool Revalidate(Entry& e, const Heads& now);
  // The cached entry of the same objects and flags as `frame` (whose key is `key`) with another pc, valid in this
  // epoch, or null: what a miss on a new pc is named from (ISEQ frames only; a C frame has no pc). An entry of an
  // earlier epoch is revalidated here, as RevalidateStale would: against the frame's heads (`*heads`, read now when
  // `*have_heads` is false), which must equal the entry's. Heads read here are left in `*heads`.
  Node* ValidSibling(const rv_ruby_frame& frame, const Key& key, Heads* heads, bool* have_heads);
  static size_t SiblingIndex(const Key& key);
  static size_t EntryBytes(const FrameInfo& f) { return kEntryOverheadBytes + f.label.capacity() + f.path.capacity(); }
  // Adds bytes to account_ (true without one); `may_clear`: the account may clear this cache to make room.
  bool Charge(size_t bytes, bool may_clear);
  void Uncharge(size_t bytes);  // cache_bytes_ and account_ less `bytes`

  MemoryBudget::Account* account_ = nullptr;
  uint64_t uncached_ = 0;

  std::unique_ptr<MemoryReader> mem_;
  Symbolizer symbolizer_;
  std::unordered_map<Key, Entry, KeyHash> cache_;
  std::vector<FrontSlot> front_;  // kFrontSlots entries (40 KB)
  std::vector<StackMemo> stack_memo_;  // kStackMemoSlots entries
  // Entries used in live_epoch_, at most kMaxLiveEntries; see RevalidateLive.
  static constexpr size_t kMaxLiveEntries = 512;
  std::vector<Node*> live_;
  uint64_t live_epoch_ = 0;
  // The last cached key per (addr, cfp_iseq, kind, flags), direct-mapped (kSiblingSlots; a zero key, of kind
  // RV_RB_FRAME_NONE, matches no frame): where ValidSibling looks. Keys, not pointers, so an erased entry is simply
  // not found.
  static constexpr size_t kSiblingSlots = 256;  // = 1 << 8, SiblingIndex's bits
  std::vector<Key> siblings_;
  // RevalidateStale's and RevalidateLive's scratch space (kept to avoid allocating per stack).
  struct Stale {
    Node* node;
    rv_ruby_frame frame;
  };
  std::vector<Stale> stale_;
  std::vector<Node*> nodes_;  // ResolveWhole's: the entry of each frame of the stack being resolved
  std::vector<Heads> stale_heads_;
  std::vector<MemoryReader::Request> requests_;
  uint64_t cache_clears_ = 0;
  size_t cache_bytes_ = 0;
  uint64_t epoch_ = 0;
  uint64_t hits_ = 0;
  uint64_t revalidations_ = 0;
  uint64_t misses_ = 0;
  uint64_t line_only_ = 0;
  uint64_t line_tables_ = 0;
  uint64_t stacks_kept_ = 0;
};

// Converts one symbolizer result into a trace frame of the walker frame's kind.
FrameInfo ToFrameInfo(const rv_ruby_frame& frame, const SymbolizedFrame& symbolized);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_SESSION_STACK_RESOLVER_H_
