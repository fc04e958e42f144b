// ProfileSink: where the fleet agent's finished profiles go. Two implementations: DirSink (dir_sink.h, rotated
// files under --output-dir) and PushSink (push_sink.h, Pyroscope's HTTP ingest at --push-url). Both queue uploads
// in memory (bounded, oldest dropped first) and deliver them from one worker thread of their own, so the agent's
// main loop never waits on a disk or a network.
#ifndef RVBPFD_SRC_SINK_SINK_H_
#define RVBPFD_SRC_SINK_SINK_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "sink/profile_upload.h"

namespace rvbpfd {

// Counters since the sink was created (monotonic except queued/consecutive_failures, which are current values).
struct SinkStats {
  uint64_t delivered = 0;           // uploads written / accepted by the backend (HTTP 2xx)
  uint64_t delivery_failures = 0;   // uploads given up on without retry (HTTP 4xx other than 408/429, write errors)
  uint64_t retries = 0;             // failed attempts that will be retried (connection errors, 5xx, 408, 429)
  uint64_t dropped_queue_full = 0;  // uploads dropped, oldest first, because max_queue uploads were already waiting
  uint64_t queued = 0;              // uploads waiting now, including the one being sent
  uint64_t bytes_delivered = 0;     // pprof_gz bytes of the delivered uploads
  // Added beyond the agent contract:
  uint64_t consecutive_failures = 0;  // retryable failures since the last delivery or permanent failure
  uint64_t rotated_files = 0;         // DirSink only: files deleted to keep the total under the size cap
  std::string last_error;             // the last failure, one line ("" = none yet); never contains URL credentials
  // PushSink only: the API profiles go to, "push" (push.v1.PusherService/Push, many profiles a request) or "ingest"
  // (/ingest, one profile a request, once the backend answered the push API with 404, 405 or 415).
  std::string push_api;
};

class ProfileSink {  // thread-safe
 public:
  virtual ~ProfileSink() = default;
  // Queues `upload` and returns at once: never blocks on I/O. When the queue is full the oldest waiting upload is
  // dropped and counted in dropped_queue_full.
  virtual void Submit(ProfileUpload upload) = 0;
  // Submit for each of `uploads`, in order, under one lock: the agent hands over a whole cut at once, so the push
  // sink can send it in few requests.
  virtual void SubmitAll(std::vector<ProfileUpload> uploads) = 0;
  // Waits until everything queued has been delivered or given up on, or `deadline` has passed. True only if the
  // queue drained with nothing dropped or failed while waiting. Used at graceful shutdown.
  virtual bool Flush(std::chrono::milliseconds deadline) = 0;
  virtual SinkStats stats() const = 0;
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_SINK_SINK_H_
