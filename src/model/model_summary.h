// The model's part of `rvbpfd inspect`: per-thread time in each state, GVL contention and release reasons.
#ifndef RVBPFD_SRC_MODEL_MODEL_SUMMARY_H_
#define RVBPFD_SRC_MODEL_MODEL_SUMMARY_H_

#include <ostream>

#include "model/model.h"

namespace rvbpfd {

// How many release reasons a thread's line lists (by time spent, descending).
inline constexpr size_t kTopReleaseReasons = 3;

// One table row per Ruby thread: ms in running / wants_gvl / released / gc / unknown, GVL contention (total ms
// waiting for the lock, number of waits, longest wait in ms) and the top release reasons with their ms; then the
// GVL's idle time and the unknown windows. Derived labels (sleeping, waiting_mutex, preempted) are marked as such.
void PrintModelSummary(const Model& model, std::ostream& out);

// Two lines for `rvbpfd stats`: GVL contention over all threads (total wait, number of waits, longest wait and whose)
// and how long the GVL was held, idle and unknown.
void PrintContentionSummary(const Model& model, std::ostream& out);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_MODEL_MODEL_SUMMARY_H_
