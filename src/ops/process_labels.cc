#include "ops/process_labels.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <limits>
#include <vector>

#include "ops/file_read.h"
#include "ops/log.h"

namespace rvbpfd {
namespace {

bool IsGoneErrno(int err) { return err == ENOENT || err == ESRCH; }

bool IsLowerHex64(std::string_view s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// The id in one cgroup path component, or "".
std::string_view IdInComponent(std::string_view c) {
  static constexpr std::string_view kPrefixes[] = {"docker-", "cri-containerd-", "crio-", "libpod-"};
  if (IsLowerHex64(c)) return c;
  for (std::string_view prefix : kPrefixes) {
    if (c.substr(0, prefix.size()) != prefix) continue;
    std::string_view rest = c.substr(prefix.size());
    constexpr std::string_view kScope = ".scope";
    if (rest.size() > kScope.size() && rest.substr(rest.size() - kScope.size()) == kScope) {
      rest.remove_suffix(kScope.size());
    }
    if (IsLowerHex64(rest)) return rest;
  }
  return {};
}

// A service name from the environment must be usable as a label value and an application name: bounded, printable,
// valid UTF-8. Anything else is the process's business, not a label.
bool UsableServiceName(std::string_view v) {
  if (v.empty() || v.size() > kMaxServiceNameBytes) return false;
  for (unsigned char c : v) {
    if (c < 0x20 || c == 0x7f) return false;
  }
  return IsValidUtf8(v);
}

// The positive decimal number `field` is, or 0 (not all digits, or past `max`).
uint64_t PositiveField(std::string_view field, uint64_t max) {
  if (field.empty() || field.size() > 20) return 0;
  uint64_t v = 0;
  for (char c : field) {
    if (c < '0' || c > '9') return 0;
    const uint64_t digit = static_cast<uint64_t>(c - '0');
    if (v > (max - digit) / 10) return 0;
    v = v * 10 + digit;
  }
  return v;
}

}  // namespace

ProcStat ParseProcStat(std::string_view text) {
  ProcStat st;
  const size_t close = text.rfind(')');
  if (close == std::string_view::npos) return st;
  std::string_view rest = text.substr(close + 1);
  if (rest.empty() || rest[0] != ' ') return st;
  rest.remove_prefix(1);
  while (!rest.empty() && rest.back() == '\n') rest.remove_suffix(1);
  // Fields from 3 (the state) on, split at single spaces as the kernel writes them.
  std::vector<std::string_view> fields;
  for (size_t i = 0; fields.size() < 20 && i <= rest.size();) {
    const size_t sp = std::min(rest.find(' ', i), rest.size());
    fields.push_back(rest.substr(i, sp - i));
    i = sp + 1;
  }
  if (fields.size() > 1) {
    st.parent_pid = static_cast<int>(PositiveField(fields[1], std::numeric_limits<int>::max()));  // field 4
  }
  if (fields.size() > 19) st.start_ticks = PositiveField(fields[19], UINT64_MAX);  // field 22
  return st;
}

std::string ParseCgroupPath(std::string_view text) {
  std::string_view chosen;
  bool have_v1 = false;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    std::string_view line = text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    pos = nl == std::string_view::npos ? text.size() : nl + 1;
    // "hierarchy-ID:controller-list:cgroup-path"; the path may itself contain ':'.
    size_t c1 = line.find(':');
    if (c1 == std::string_view::npos) continue;
    size_t c2 = line.find(':', c1 + 1);
    if (c2 == std::string_view::npos) continue;
    std::string_view path = line.substr(c2 + 1);
    if (path.empty()) continue;
    if (line.substr(0, c1) == "0" && c2 == c1 + 1) {  // the unified hierarchy wins over any v1 line
      chosen = path;
      break;
    }
    if (!have_v1) {
      chosen = path;
      have_v1 = true;
    }
  }
  constexpr std::string_view kDeleted = " (deleted)";
  if (chosen.size() > kDeleted.size() && chosen.substr(chosen.size() - kDeleted.size()) == kDeleted) {
    chosen.remove_suffix(kDeleted.size());
  }
  return std::string(chosen);
}

std::string ContainerIdFromCgroup(std::string_view path) {
  // Innermost first: a container's own sub-cgroups (podman's ".../libpod-<id>.scope/container", systemd inside a
  // container's "init.scope") sit below the component that names it.
  size_t end = path.size();
  while (end > 0) {
    size_t slash = path.rfind('/', end - 1);
    size_t begin = slash == std::string_view::npos ? 0 : slash + 1;
    std::string_view id = IdInComponent(path.substr(begin, end - begin));
    if (!id.empty()) return std::string(id);
    if (slash == std::string_view::npos) break;
    end = slash;
  }
  return "";
}

std::string ServiceNameFromEnviron(std::string_view env) {
  std::string_view rvbpf, otel;
  bool have_rvbpf = false, have_otel = false;
  size_t pos = 0;
  while (pos < env.size()) {
    size_t nul = env.find('\0', pos);
    std::string_view entry = env.substr(pos, nul == std::string_view::npos ? std::string_view::npos : nul - pos);
    pos = nul == std::string_view::npos ? env.size() : nul + 1;
    constexpr std::string_view kRvbpf = "RVBPF_SERVICE=";
    constexpr std::string_view kOtel = "OTEL_SERVICE_NAME=";
    if (!have_rvbpf && entry.substr(0, kRvbpf.size()) == kRvbpf) {
      rvbpf = entry.substr(kRvbpf.size());
      have_rvbpf = true;
    } else if (!have_otel && entry.substr(0, kOtel.size()) == kOtel) {
      otel = entry.substr(kOtel.size());
      have_otel = true;
    }
  }
  if (have_rvbpf && UsableServiceName(rvbpf)) return std::string(rvbpf);
  if (have_otel && UsableServiceName(otel)) return std::string(otel);
  return "";
}

Result<ProcessLabels> ReadProcessLabels(const std::string& proc_root, int pid) {
  std::string dir = proc_root + "/" + std::to_string(pid);
  auto gone = [&](std::string_view what, int err) {
    return Error(ErrorCode::kNoSuchProcess,
                 ErrnoMessage("reading " + dir + "/" + std::string(what) + " (process " + std::to_string(pid) +
                                  " exited?)",
                              err));
  };
  if (pid <= 0) return Error(ErrorCode::kNoSuchProcess, "process " + std::to_string(pid) + ": not a valid pid");
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0) {
    int err = errno;
    if (IsGoneErrno(err)) return gone("", err);
    return Error(ErrorCode::kIo, ErrnoMessage("stat " + dir, err));
  }

  ProcessLabels labels;
  labels.pid = pid;

  // comm is at most 16 bytes (TASK_COMM_LEN with the NUL); 256 leaves room for a future kernel and still bounds it.
  SmallFile comm = ReadSmallFile(dir + "/comm", 256);
  if (comm.err != 0) {
    if (IsGoneErrno(comm.err)) return gone("comm", comm.err);
    return Error(ErrorCode::kIo, ErrnoMessage("reading " + dir + "/comm", comm.err));
  }
  labels.comm = std::move(comm.data);
  if (!labels.comm.empty() && labels.comm.back() == '\n') labels.comm.pop_back();

  SmallFile cgroup = ReadSmallFile(dir + "/cgroup", kMaxCgroupFileBytes);
  if (cgroup.err == ESRCH) return gone("cgroup", cgroup.err);
  if (cgroup.err == ENOENT) {
    // No cgroup file: a kernel without CONFIG_CGROUPS, unless the whole process is gone.
    if (stat(dir.c_str(), &st) != 0 && IsGoneErrno(errno)) return gone("cgroup", errno);
  } else if (cgroup.err != 0) {
    return Error(ErrorCode::kIo, ErrnoMessage("reading " + dir + "/cgroup", cgroup.err));
  } else {
    labels.cgroup = ParseCgroupPath(cgroup.data);
    labels.container_id = ContainerIdFromCgroup(labels.cgroup);
  }

  // The parent: a missing or malformed stat leaves it unknown (0), as a missing cgroup file leaves the cgroup empty.
  SmallFile stat_file = ReadSmallFile(dir + "/stat", kMaxStatFileBytes);
  if (stat_file.err == ESRCH) return gone("stat", stat_file.err);
  if (stat_file.err == 0 && !stat_file.truncated) {
    const ProcStat st = ParseProcStat(stat_file.data);
    labels.parent_pid = st.parent_pid;
    labels.start_ticks = st.start_ticks;
  }

  // environ needs ptrace read access (CAP_SYS_PTRACE for other users' processes); without it, or for a zombie,
  // the service name is the command name.
  SmallFile env_file = ReadSmallFile(dir + "/environ", kMaxEnvironBytes);
  if (env_file.err == 0) {
    std::string_view env = env_file.data;
    // Past the cap the last entry may be cut short: only whole entries count.
    if (env_file.truncated) env = env.substr(0, env.rfind('\0') == std::string_view::npos ? 0 : env.rfind('\0'));
    labels.service_name = ServiceNameFromEnviron(env);
  }
  labels.service_name_source = kServiceFromEnvironment;
  if (labels.service_name.empty()) {
    labels.service_name = labels.comm;
    labels.service_name_source = kServiceFromComm;
  }
  return labels;
}

Result<ServiceNamePolicy> ServiceNamePolicy::Create(const std::vector<std::string>& pins, bool ignore_environment) {
  ServiceNamePolicy policy;
  policy.ignore_environment = ignore_environment;
  for (const std::string& rule : pins) {
    const size_t eq = rule.rfind('=');
    Pin pin;
    if (eq != std::string::npos) pin = Pin{rule.substr(0, eq), rule.substr(eq + 1)};
    if (eq == std::string::npos || pin.cgroup_prefix.empty() || pin.cgroup_prefix[0] != '/' ||
        !UsableServiceName(pin.service)) {
      return Error(ErrorCode::kUsage, "--service-pin rule \"" + rule +
                                          "\": expected CGROUP_PREFIX=SERVICE, the prefix starting with '/' and the "
                                          "service 1.." + std::to_string(kMaxServiceNameBytes) +
                                          " bytes of printable UTF-8");
    }
    policy.pins.push_back(std::move(pin));
  }
  return policy;
}

void ApplyServiceNamePolicy(const ServiceNamePolicy& policy, ProcessLabels* labels) {
  const ServiceNamePolicy::Pin* best = nullptr;
  for (const ServiceNamePolicy::Pin& pin : policy.pins) {
    if (labels->cgroup.starts_with(pin.cgroup_prefix) &&
        (best == nullptr || pin.cgroup_prefix.size() > best->cgroup_prefix.size())) {
      best = &pin;
    }
  }
  if (best != nullptr) {
    labels->service_name = best->service;
    labels->service_name_source = kServiceFromCgroup;
  } else if (policy.ignore_environment && labels->service_name_source == kServiceFromEnvironment) {
    labels->service_name = labels->comm;
    labels->service_name_source = kServiceFromComm;
  }
}

}  // namespace rvbpfd
