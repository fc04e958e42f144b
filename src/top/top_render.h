// Drawing `rvbpfd top`: pure functions from one interval's snapshot (top_snapshot.h) to the lines of the screen
// (or of the plain-text snapshot without a terminal) and to the --json object. Text the target controls (frame
// labels and paths) is escaped (common/text_escape.h) so it cannot drive the terminal.
#ifndef RVBPFD_SRC_TOP_TOP_RENDER_H_
#define RVBPFD_SRC_TOP_TOP_RENDER_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "top/top_snapshot.h"

namespace rvbpfd {

struct TopLayout {
  size_t width = 0;   // columns; 0: lines are not cut
  size_t height = 0;  // rows; 0: every row is shown
  // Rows of the blocker and blocked-stack tables at most (fewer when the threads need the height).
  size_t max_table_rows = 5;
};

// The screen: a header line (pid, interval, GVL holder), one row per thread in the snapshot's order with the share
// of the interval in each state, then the top blockers and the top blocked stacks. With a height, the tables shrink
// first, then the thread rows (the last one says how many are left out); every line is cut to the width.
std::vector<std::string> RenderTop(const TopSnapshot& snap, const TopLayout& layout);

// One line of JSON (docs/top.md).
std::string TopJson(const TopSnapshot& snap);

// `line` cut to `width` code points (0: not cut), never inside a UTF-8 sequence.
std::string CutToWidth(std::string_view line, size_t width);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_TOP_TOP_RENDER_H_
