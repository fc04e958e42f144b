// What a dump concludes from the threads it read: each thread's state and, for a blocked one, why (the recorder's
// release-reason rules over its stack, record/release_reason.h), what it waits for and whom, and the deadlocks
// (cycles of threads each waiting for a Mutex the next one owns, or joining the next one).
#ifndef RVBPFD_SRC_DUMP_DUMP_ANALYSIS_H_
#define RVBPFD_SRC_DUMP_DUMP_ANALYSIS_H_

#include <cstddef>
#include <optional>
#include <string_view>
#include <vector>

#include "dump/dump_reader.h"

namespace rvbpfd {

// Fills state, reason and waiting_for of every thread and the snapshot's deadlocks. States (docs/dump.md):
//   running      holds the GVL and its native thread is on a CPU or runnable
//   holding_gvl  holds the GVL while its native thread sleeps in the kernel (a C call blocking with the GVL held)
//   waiting_gvl  queued for the GVL
//   blocked      gave the GVL up to wait (th->status stopped: sleep, a Mutex, a queue, IO, join...)
//   runnable     none of these at the instant it was read (between two of them)
//   exited       its block returned; the VM has not removed it yet
// A waiting_for already set (the caller's io facts) keeps its fd and target. A thread waiting on one of the
// snapshot's wait_objects gets it as waiting_for's object (a Monitor's waiter: kind "monitor", owned as its Mutex).
void DeriveStates(DumpSnapshot* snap);

// The class a wait object's typed-data type name stands for ("queue": "Thread::Queue", "sized_queue",
// "condvar", "monitor"; "?" for another). Instances of a subclass have their base's type.
const char* WaitObjectClass(std::string_view type);

// The cycles of a graph in which each node waits for at most one other (waits_for[i]): each cycle once, as node
// indexes in wait order (each waits for the next, the last for the first), starting at its lowest index; cycles
// sorted by that index. Nodes that only lead into a cycle are not part of it.
std::vector<std::vector<size_t>> FindWaitCycles(const std::vector<std::optional<size_t>>& waits_for);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_DUMP_DUMP_ANALYSIS_H_
