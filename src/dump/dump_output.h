// `rvbpfd dump`'s two outputs: JSON (--json; the contract in docs/dump.md) and text for a terminal.
#ifndef RVBPFD_SRC_DUMP_DUMP_OUTPUT_H_
#define RVBPFD_SRC_DUMP_DUMP_OUTPUT_H_

#include <nlohmann/json.hpp>
#include <ostream>

#include "dump/dump_reader.h"

namespace rvbpfd {

nlohmann::json DumpToJson(const DumpSnapshot& snap);
// Text: a header (process, GVL holder and waiters), the deadlocks, then every thread with its state and stack.
// Target-controlled strings are printed as read; the caller escapes control bytes.
void PrintDumpText(const DumpSnapshot& snap, std::ostream& out);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_DUMP_DUMP_OUTPUT_H_
