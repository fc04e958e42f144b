// `rvbpfd export --speedscope`: the model in speedscope's file format
// (https://www.speedscope.app/file-format-schema.json), one "evented" profile per Ruby thread.
//
// Stacks are not recorded yet, so the frames are the thread states themselves ("running", "wants_gvl",
// "released: sleeping", "gc", "unknown", ...): each state block is one open/close ("O"/"C") pair, and speedscope's
// left-heavy view then reads as "where did this thread's time go". Blocks before a thread started and after it
// exited are left out (the thread did not exist). Values are nanoseconds since the trace origin.
#ifndef RVBPFD_SRC_EXPORT_SPEEDSCOPE_H_
#define RVBPFD_SRC_EXPORT_SPEEDSCOPE_H_

#include <ostream>
#include <string>
#include <string_view>

#include "common/error.h"
#include "model/model.h"

namespace rvbpfd {

inline constexpr std::string_view kSpeedscopeSchema = "https://www.speedscope.app/file-format-schema.json";

// Fails with kIo when the stream fails.
Status ExportSpeedscope(const Model& model, std::ostream& out);
// Reads and models the trace first; errors are also those of Model::FromFile.
Status ExportSpeedscope(const std::string& trace_path, std::ostream& out);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_EXPORT_SPEEDSCOPE_H_
