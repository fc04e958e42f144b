// The first screen of `rvbpfd inspect` and the blame lines of `rvbpfd stats`: answers read off the attribution
// (model/attribution.h, via AggregateStacks) and the model, in a few dozen lines.
#ifndef RVBPFD_SRC_EXPORT_RUN_SUMMARY_H_
#define RVBPFD_SRC_EXPORT_RUN_SUMMARY_H_

#include <cstddef>
#include <ostream>

#include "export/pprof.h"
#include "model/model.h"
#include "trace/reader.h"

namespace rvbpfd {

// At most this many thread rows, blockers and blocked stacks (the rest is counted in one line), so the summary stays
// within ~40 lines whatever the trace.
inline constexpr size_t kSummaryThreads = 12;
inline constexpr size_t kSummaryBlockers = 5;
inline constexpr size_t kSummaryBlockedStacks = 5;
inline constexpr size_t kSummaryEndpoints = 8;
// Holders `stats` lists by name (the rest in one line).
inline constexpr size_t kStatsHolders = 10;

// The run (pid, ruby, duration, threads, events, samples); per thread its wall clock by state (ms: lifetime,
// running, gc, gvl_wait, blocked, unknown) and native tids; total GVL contention; the top blockers (holder thread,
// its method = the leaf frame of the blamed stacks, share of all GVL waiting, how the stacks were known); the top
// blocked stacks by release reason; per endpoint (model/endpoint.h, when any stack names one) its time running,
// waiting for the GVL, blocked (by reason) and the GVL wait it caused to others; dropped events and tracing pauses.
// `agg` is AggregateStacks(trace), `model` the Model of the same trace.
void PrintRunSummary(const TraceFile& trace, const StackProfile& agg, const Model& model, std::ostream& out);

// For `rvbpfd stats`: GVL blame totals by holder thread (ns others waited while it held the lock, share, its top
// method), plus the blame no holder carries (GVL not held, holder unknown).
void PrintBlameTotals(const TraceFile& trace, const StackProfile& agg, std::ostream& out);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_EXPORT_RUN_SUMMARY_H_
