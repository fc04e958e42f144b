// One profile ready for delivery: what the fleet agent hands to a ProfileSink (sink.h) at the end of each interval.
#ifndef RVBPFD_SRC_SINK_PROFILE_UPLOAD_H_
#define RVBPFD_SRC_SINK_PROFILE_UPLOAD_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace rvbpfd {

struct ProfileUpload {
  std::string app_name;                       // Pyroscope application name: the service name (see ops labels)
  std::string profile_type;                   // "cpu", "gvl_wait", "gvl_held", "gc", "gvl_blame"
  std::map<std::string, std::string> labels;  // host, pid, command, ruby_version, container_id, service_name
  // Label names the profile's samples carry (gvl_blame: holder, waiter, blame_source). Pyroscope adds them to the
  // series' labels, so the push sink leaves room for them and sends no process label of the same name.
  std::vector<std::string> sample_label_names;
  int64_t from_unix_s = 0;                    // interval start, Unix seconds
  int64_t until_unix_s = 0;                   // interval end, Unix seconds
  std::string pprof_gz;                       // the gzipped pprof Profile message
  // Bytes of the pprof before gzip. Pyroscope's size and rate limits count these, so the push sink sizes its
  // requests by them.
  uint64_t pprof_bytes = 0;
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_SINK_PROFILE_UPLOAD_H_
