// Frame and stack dictionaries of an .rvtrace file (docs/rvtrace.md, "Frames and stacks").
//
// A stack is recorded at most once per trace: the first time a frame or a stack is seen the writer emits a
// dictionary line for it, and every later use refers to it by id. StackTable is the interning half of that, kept
// apart from the writer so it can be tested on its own and reused by converters.
#ifndef RVBPFD_SRC_TRACE_STACKS_H_
#define RVBPFD_SRC_TRACE_STACKS_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace rvbpfd {

enum class FrameKind : uint8_t {
  kRuby,        // an ISEQ frame: label, path and line as rb_profile_frames reports them
  kCfunc,       // a C function frame (path "<cfunc>" by convention, line 0)
  kGc,          // the pseudo-frame a sample taken during GC carries
  kUnresolved,  // a frame the symbolizer could not read safely; its label says what is known ("<unresolved ...>")
};

// splitmix64's finalizer: spreads small dense ids (frame and stack ids, pointers) over hash buckets.
inline uint64_t MixHash(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// The label of the kGc pseudo-frame, one for `rvbpfd record` and the fleet agent's profiles.
inline constexpr std::string_view kGcFrameLabel = "(garbage collection)";

// "ruby", "cfunc", "gc", "unresolved".
std::string_view FrameKindString(FrameKind kind);
std::optional<FrameKind> ParseFrameKind(std::string_view name);

struct FrameInfo {
  std::string label;  // rb_profile_frame_full_label, e.g. "Integer#times", "block in Foo.bar"
  std::string path;   // file path, "<cfunc>", "<internal:kernel>", or empty when unknown
  int32_t line = 0;   // 1-based line number; 0 when the frame has none (C frames, GC, unresolved)
  FrameKind kind = FrameKind::kRuby;

  friend bool operator==(const FrameInfo&, const FrameInfo&) = default;
};

// A frame of CRuby's own library: a C function, or a Ruby-level builtin CRuby ships in <internal:...> (Kernel#loop,
// Integer#times, Thread::Queue#pop on 3.3+). Every other Ruby frame is the program's (its gems included). The release
// reasons look at the library frames above the program's innermost frame; the top blockers name that frame.
bool IsVmLibraryFrame(const FrameInfo& f);

// The hashes every frame and stack table uses (the trace's StackTable, the pprof builder, the agent's tables).
size_t HashFrame(const FrameInfo& f);
// A stack as its frame ids, leaf first.
size_t HashStackIds(std::span<const uint32_t> ids);

// Ids of an interned item and whether this call created it (so the caller writes its dictionary line).
struct InternResult {
  uint32_t id = 0;
  bool is_new = false;
};

// Assigns dense ids, starting at 1, to distinct frames and to distinct frame-id sequences. Ids are stable for the
// life of the table. Not thread-safe: one table per writer.
class StackTable {
 public:
  InternResult InternFrame(const FrameInfo& frame);
  // `frame_ids` is leaf first and must name frames this table returned (the caller's contract; not checked here).
  InternResult InternStack(std::span<const uint32_t> frame_ids);

  size_t frame_count() const { return frames_.size(); }
  size_t stack_count() const { return stacks_.size(); }
  // Lookups by id; nullptr for an id this table never returned.
  const FrameInfo* frame(uint32_t id) const;
  const std::vector<uint32_t>* stack(uint32_t id) const;

 private:
  struct FrameHash {
    size_t operator()(const FrameInfo& f) const;
  };
  struct StackHash {
    size_t operator()(const std::vector<uint32_t>& ids) const;
  };

  std::vector<FrameInfo> frames_;              // id - 1 -> frame
  std::vector<std::vector<uint32_t>> stacks_;  // id - 1 -> frame ids, leaf first
  std::unordered_map<FrameInfo, uint32_t, FrameHash> frame_ids_;
  std::unordered_map<std::vector<uint32_t>, uint32_t, StackHash> stack_ids_;
  std::vector<uint32_t> probe_;  // reused key buffer, so a repeated stack costs no allocation
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_TRACE_STACKS_H_
