// `rvbpfd export --pprof`: a trace's Ruby stacks as a gzipped pprof profile (schema: proto/profile.proto), and the
// aggregation it shares with `--folded` (export/folded.h).
//
// Two kinds of weight are attributed to stacks:
//   - CPU: each `sample` event counts once, and as 1e9 / sample_hz ns of CPU time (the header's "sample_hz").
//   - GVL wait: the ns from a thread's wants_gvl to its next gvl_acquired, attributed to the waiter's stack: the
//     wants_gvl's own stack when it carries one, else the stack of the gvl_released that began the thread's time off
//     the lock (what it was doing when it gave the lock up, hence what it waits to continue; not an older release
//     followed by a gvl_acquired, as in 3.2's timeslices), else the stack of its latest sample, else a "[no stack]"
//     frame. A wait open across lost events (events_dropped) or a tracing pause is not
//     counted: its end points may belong to different waits.
//   - GVL blame (model/attribution.h): each counted wait's ns attributed to the thread(s) that held the GVL meanwhile
//     and what they ran (their samples inside the wait, else their release stack), labelled holder, waiter and
//     blame_source (sampled, release_stack, last_sample, no_stack, gvl_free, holder_unknown).
//   - Estimated GVL wait and blame while --max-overhead had the scheduler probes paused (model/attribution.h: from
//     the samples' GVL readings), labelled provenance "inferred" (observed waits: "observed"; their blame: "derived").
//   - Wall clock: each thread's lifetime by state (label "state": running, gc, gvl_wait, blocked, unknown; blocked
//     time also has a "reason" label) at the stack it was attributed to.
// Samples and waits are aggregated per (stack, Ruby thread); each pprof sample is labelled with the thread. Every
// sample is also labelled `endpoint`, its stack's (model/endpoint.h: the Rails action, job class or Sinatra
// route, "-" for none; for blame the holder's stack's), and `endpoint_rule`, the rule that derived it, when it
// names one. A trace
// of several processes (docs/rvtrace.md, "Process lines") is aggregated process by process (each has its own GVL)
// into one profile whose samples are also labelled pid (numeric, the process's host pid). The
// Profile message is encoded by PprofBuilder (export/pprof_builder.h), which the fleet agent's profiles share.
#ifndef RVBPFD_SRC_EXPORT_PPROF_H_
#define RVBPFD_SRC_EXPORT_PPROF_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>

#include "common/error.h"
#include "model/attribution.h"
#include "trace/reader.h"

namespace rvbpfd {

// kNoStackFrame, kGcFrame, BlameStandInFrame: model/attribution.h.

struct StackWeights {
  uint64_t samples = 0;      // CPU samples
  uint64_t gvl_wait_ns = 0;  // GVL wait, ns
};

struct StackProfile {
  // Key: (stack id, or 0 for "no stack"; Ruby thread serial, or UINT32_MAX for samples about no known thread).
  std::map<std::pair<uint32_t, uint32_t>, StackWeights> weights;
  uint64_t period_ns = 0;       // CPU ns one sample stands for
  bool period_assumed = false;  // the header had no sample_hz: kDefaultSampleHz was used
  uint64_t total_samples = 0;
  uint64_t total_gvl_wait_ns = 0;
  uint64_t waits = 0;          // wants_gvl -> gvl_acquired pairs counted
  uint64_t waits_skipped = 0;  // waits dropped because lost events or a pause fell inside them
  // GVL wait estimated from GVL readings in paused windows (inferred, model/attribution.h), by (waiter's stack,
  // Ruby thread or kNoThread) like `weights`; not in total_gvl_wait_ns.
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> estimated_gvl_wait_ns;
  uint64_t total_estimated_gvl_wait_ns = 0;
  // GVL blame and wall-clock time (model/attribution.h); thread keys are TraceThreadKey(ruby_thread).
  AttributionResult attribution;
};
inline constexpr uint32_t kNoThread = UINT32_MAX;

// Pure function of the trace: events are taken in time order (stable for equal t_ns).
StackProfile AggregateStacks(const TraceFile& trace);

// The serialized, uncompressed Profile message (exposed for tests and for other encoders).
std::string BuildPprofProfile(const TraceFile& trace);
// Writes the gzipped profile. Fails with kIo when the stream fails, kInternal if zlib fails.
Status ExportPprof(const TraceFile& trace, std::ostream& out);

// gzip (RFC 1952) of `data`, for the export and the fleet agent's profiles. Each thread keeps its deflate states and
// resets one per call (the same bytes as a fresh one): the agent compresses ~4 profiles per process every interval,
// and a fresh state is ~256 KiB of zlib tables allocated, page-faulted in and cleared each time.
// Level 1 (Z_BEST_SPEED, the level Go's runtime/pprof writes profiles at); an input under kGzipStoreBelowBytes is
// stored (level 0, no compression). Compressing costs a fixed ~10 us per stream on this project's test VM, mostly
// building the block's Huffman trees, which is nearly all of a small profile's cost (most of a fleet agent's ~20
// profiles a second are that small): stored, one costs ~1 us and up to a few hundred bytes more than compressed.
Result<std::string> Gzip(std::string_view data);
inline constexpr size_t kGzipStoreBelowBytes = 1024;

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_EXPORT_PPROF_H_
