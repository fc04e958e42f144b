// Labels of a watched process for the fleet agent: command, cgroup, container id and service name, read from
// /proc/PID (injectable root). The host's /proc is used, so `pid` is the host pid; the files read here are in procfs
// itself and need no access to the process's mount namespace.
//
// Everything read here is controlled by the (untrusted) process or its container runtime: reads are capped, and
// values that are not plain text are ignored rather than passed on to labels.
#ifndef RVBPFD_SRC_OPS_PROCESS_LABELS_H_
#define RVBPFD_SRC_OPS_PROCESS_LABELS_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace rvbpfd {

struct ProcessLabels {
  int pid = 0;                 // host pid
  std::string comm;            // /proc/PID/comm (without the trailing newline)
  std::string cgroup;          // the unified (v2) cgroup path from /proc/PID/cgroup, or the first v1 path
  std::string container_id;    // 64-hex (docker/containerd/cri-o/podman) id found in the cgroup path, or ""
  std::string service_name;    // RVBPF_SERVICE, else OTEL_SERVICE_NAME from /proc/PID/environ, else comm
  // Who named the service (the upload label service_name_source): kServiceFromEnvironment (the process's own claim,
  // which any process can make for any name), kServiceFromComm, or kServiceFromCgroup (the operator's pin).
  std::string service_name_source;
  // The parent's host pid (/proc/PID/stat, field 4) when the labels were read (the agent: at discovery); 0 when
  // unknown. A process whose parent exits is re-parented (to init or a subreaper): the value is not updated.
  int parent_pid = 0;
  // When it started, in clock ticks since boot (/proc/PID/stat, field 22); 0 when unknown. A parent always started
  // before its children: what tells a parent from a later process that reused its pid.
  uint64_t start_ticks = 0;

  bool operator==(const ProcessLabels&) const = default;
};

inline constexpr std::string_view kServiceFromEnvironment = "environment";
inline constexpr std::string_view kServiceFromComm = "comm";
inline constexpr std::string_view kServiceFromCgroup = "cgroup";

// The operator's say over service names (docs/deploy.md): pins of cgroup path prefixes to service names
// (--service-pin PREFIX=SERVICE) and whether the environment's names are ignored (--ignore-env-service).
struct ServiceNamePolicy {
  struct Pin {
    std::string cgroup_prefix;  // starts with '/'; a plain string prefix, as the filters' cgroup:PREFIX
    std::string service;
  };
  std::vector<Pin> pins;
  bool ignore_environment = false;
  // Parses the --service-pin rules; kUsage naming the flag and the rule when one is not PREFIX=SERVICE with a
  // prefix starting with '/' and a service name that is usable (as for RVBPF_SERVICE).
  static Result<ServiceNamePolicy> Create(const std::vector<std::string>& pins, bool ignore_environment);
};

// Applies `policy` to labels read by ReadProcessLabels: the longest pinned prefix of the cgroup path names the
// service (source kServiceFromCgroup); else, when the environment is ignored, a name from it becomes comm.
void ApplyServiceNamePolicy(const ServiceNamePolicy& policy, ProcessLabels* labels);

// Caps on what is read from /proc/PID (bytes).
inline constexpr size_t kMaxEnvironBytes = 1 << 20;    // a larger environment is searched in its first 1 MiB only
inline constexpr size_t kMaxCgroupFileBytes = 64 * 1024;
inline constexpr size_t kMaxStatFileBytes = 4096;     // /proc/PID/stat: comm and 50 numbers, about 1 KiB at most
inline constexpr size_t kMaxServiceNameBytes = 255;    // longer RVBPF_SERVICE/OTEL_SERVICE_NAME values are ignored

// Errors: kNoSuchProcess when /proc/PID (or its comm/cgroup) is gone (ENOENT/ESRCH: the process exited), kIo for
// other failures of comm or cgroup. An unreadable environ (EACCES without CAP_SYS_PTRACE, or a zombie's empty one) is
// not an error: the service name then falls back to comm. A missing cgroup file (kernel without cgroups) gives "".
Result<ProcessLabels> ReadProcessLabels(const std::string& proc_root, int pid);

// Fields of /proc/PID/stat text ("PID (COMM) STATE PPID ... STARTTIME ..."), counted after its LAST ')' (comm is the
// process's choice and may hold spaces and parentheses). Each is 0 when the text is not of that form or the field is
// not a positive decimal number of its type.
struct ProcStat {
  int parent_pid = 0;        // field 4
  uint64_t start_ticks = 0;  // field 22
};
ProcStat ParseProcStat(std::string_view stat_text);

// The cgroup path of /proc/PID/cgroup text: the v2 line "0::/path", else the path of the first v1 line; "" when none.
// A trailing " (deleted)" (a removed cgroup) is dropped.
std::string ParseCgroupPath(std::string_view cgroup_file_text);

// The container id in a cgroup path: the innermost path component that is a 64-hex id, either bare
// (/docker/<id>, /kubepods/burstable/pod<uid>/<id>) or as docker-<id>.scope, cri-containerd-<id>.scope,
// crio-<id>.scope, libpod-<id>.scope (".scope" optional). Lowercase hex only; "" when none.
std::string ContainerIdFromCgroup(std::string_view cgroup_path);

// The service name from NUL-separated environ bytes: RVBPF_SERVICE, else OTEL_SERVICE_NAME; "" when neither is set
// to a usable value (1..kMaxServiceNameBytes bytes, no control characters, valid UTF-8). The first occurrence of a
// variable counts (as getenv finds it).
std::string ServiceNameFromEnviron(std::string_view environ_bytes);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_OPS_PROCESS_LABELS_H_
