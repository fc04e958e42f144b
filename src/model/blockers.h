// The top blockers: the GVL blame of a trace (model/attribution.h) grouped by what the holders ran, across threads.
// `rvbpfd inspect`'s summary and the report's table (report_data.h "blockers") both print these rows; neither
// groups blame itself.
//
// A row is the holder's innermost Ruby method: the first frame of the blamed stack, leaf first, that is a Ruby frame
// of the program (not IsVmLibraryFrame: not a C function, not one of CRuby's <internal:...> builtins); the stack's
// leaf when it has none. Blame taken while the holder ran a GC is the row kGcFrame, blame with no holder stack the
// row of its stand-in frame (BlameStandInFrame). Each row says which threads held the lock meanwhile (with their
// share) and which library function, the stack's leaf, the method was in (none: its own Ruby code), so
// `Object#burn` and its `Process.clock_gettime` are one row, and one method run by five threads is one row.
#ifndef RVBPFD_SRC_MODEL_BLOCKERS_H_
#define RVBPFD_SRC_MODEL_BLOCKERS_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/attribution.h"
#include "trace/stacks.h"

namespace rvbpfd {

struct BlockerHolder {
  uint64_t key = 0;  // the holder (tracker key; 0 = nobody held the lock, or who did is not known)
  uint64_t ns = 0;
};

struct BlockerCall {
  std::string label;  // the library function's frame label
  uint64_t ns = 0;
};

struct Blocker {
  std::string method;                  // see above
  uint64_t ns = 0;                     // others' GVL wait blamed on it, estimated blame included
  std::vector<BlockerHolder> holders;  // distinct holders, heaviest first
  std::vector<BlockerCall> calls;      // the library functions it was in, heaviest first; the rest of `ns` was its
                                       // own Ruby code
  // ns by how the blamed stacks were known: BlameSourceName, or "inferred" for blame estimated while paused.
  std::map<std::string_view, uint64_t> by_source;
};

// The rows of `a.blame_ns`, heaviest first (ties: by method). `frames` and `stacks` are the trace's dictionaries
// (TraceFile::frames / stacks); a stack or frame id they do not define counts as no stack / an unresolved frame.
std::vector<Blocker> GroupBlockers(const AttributionResult& a, const std::unordered_map<uint32_t, FrameInfo>& frames,
                                   const std::unordered_map<uint32_t, std::vector<uint32_t>>& stacks);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_MODEL_BLOCKERS_H_
