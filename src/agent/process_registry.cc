#include "agent/process_registry.h"

namespace rvbpfd {

std::map<std::string, std::string> UploadLabels(const std::string& host, const WatchedProcess& p) {
  std::map<std::string, std::string> l;
  l["host"] = host;
  l["pid"] = std::to_string(p.pid);
  l["command"] = p.labels.comm;
  l["ruby_version"] = p.target.ruby_version;
  if (!p.labels.container_id.empty()) l["container_id"] = p.labels.container_id;
  l["service_name"] = p.labels.service_name;
  // Whether the name is the process's own claim (environment), its command, or the operator's pin (cgroup).
  if (!p.labels.service_name_source.empty()) l["service_name_source"] = p.labels.service_name_source;
  return l;
}

std::vector<ProfileUpload> MakeUploads(const std::string& host, const WatchedProcess& p,
                                       std::vector<BuiltProfile> profiles, int64_t from_unix_ns,
                                       int64_t until_unix_ns) {
  std::vector<ProfileUpload> out;
  // Rounded to the nearest second both ends, so consecutive intervals of a process stay contiguous (this until is
  // the next from) instead of overlapping by a second.
  const int64_t from_s = (from_unix_ns + 500'000'000) / 1'000'000'000;
  int64_t until_s = (until_unix_ns + 500'000'000) / 1'000'000'000;
  if (until_s <= from_s) until_s = from_s + 1;
  for (BuiltProfile& b : profiles) {
    ProfileUpload u;
    u.app_name = p.labels.service_name;
    u.profile_type = b.profile_type;
    u.labels = UploadLabels(host, p);
    u.from_unix_s = from_s;
    u.until_unix_s = until_s;
    u.pprof_gz = std::move(b.pprof_gz);
    u.pprof_bytes = b.pprof_bytes;
    u.sample_label_names = std::move(b.sample_label_names);
    out.push_back(std::move(u));
  }
  return out;
}

namespace {

// Whether `parent` is the process `child` was forked from: the pid `child` names as its parent, and started no later
// (a process that reused the pid of an exited parent started after the child). Unknown start times never match.
bool IsParentOf(const ProcessLabels& parent, const ProcessLabels& child) {
  return child.parent_pid > 0 && parent.pid == child.parent_pid && parent.pid != child.pid &&
         parent.start_ticks > 0 && child.start_ticks > 0 && parent.start_ticks <= child.start_ticks;
}

}  // namespace

std::string_view ProcessRole(const ProcessRegistry& registry, const WatchedProcess& p) {
  const WatchedProcess* parent = p.labels.parent_pid > 0 ? registry.Find(p.labels.parent_pid) : nullptr;
  if (parent != nullptr && IsParentOf(parent->labels, p.labels)) return kRoleWorker;
  for (const auto& [pid, other] : registry.all()) {
    if (IsParentOf(p.labels, other->labels)) return kRoleMaster;
  }
  return {};
}

void AddProcessTreeLabels(const ProcessRegistry& registry, const WatchedProcess& p,
                          std::vector<ProfileUpload>* uploads) {
  const std::string_view role = ProcessRole(registry, p);
  for (ProfileUpload& u : *uploads) {
    if (p.labels.parent_pid > 0) u.labels["parent_pid"] = std::to_string(p.labels.parent_pid);
    if (!role.empty()) u.labels["process_role"] = std::string(role);
  }
}

}  // namespace rvbpfd
