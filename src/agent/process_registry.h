// The fleet agent's per-process state: labels, the probe set the process shares, how its frames are named, its
// profile aggregation for the current interval, and the bookkeeping that keeps samples of dead threads out.
//
// Threading: used from the agent's main loop only.
#ifndef RVBPFD_SRC_AGENT_PROCESS_REGISTRY_H_
#define RVBPFD_SRC_AGENT_PROCESS_REGISTRY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/agent_env.h"
#include "agent/probe_sets.h"
#include "agent/process_profile.h"
#include "common/flat_map64.h"
#include "common/memory_budget.h"
#include "common/target_file.h"
#include "ops/process_labels.h"
#include "probe/ec_install.h"
#include "session/ingest.h"
#include "session/thread_info.h"
#include "sink/profile_upload.h"
#include "target/target.h"

namespace rvbpfd {

struct WatchedProcess {
  // Its share of the agent's memory budget: the profile's reservation (Agent::ProcessReservation) and the frame
  // cache's bytes. Declared first, so it is closed after the caches it accounts for are gone.
  std::unique_ptr<MemoryBudget::Account> memory;
  int pid = 0;
  ProcessLabels labels;
  RubyTarget target;
  ProbeSet* set = nullptr;
  std::unique_ptr<FrameSource> frames;  // created at the first stack (the VM is mapped by then)
  std::unique_ptr<ProcessProfile> profile;
  // How its samples find their EC (TLS ruby_current_ec), installed once ld.so relocated the VM; until then, and if
  // that fails, samples use the thread the last scheduler event named.
  std::optional<ProcessEcInstaller> ec;
  uint64_t attached_ns = 0;  // monotonic
  // Readable once the process has exited (AgentEnv::open_exit_fd); not ok(): its liveness is read from /proc.
  FileFd exit_fd;
  // A native thread keeps its last th in BPF's current_th after that Ruby thread exited (until it runs another), so
  // a sample can name a dead thread; such samples are dropped (bounded: erased when the pointer is reused).
  ExitedThreads exited_threads;
  // Reads its threads' names (and namespace tids) for the profile's thread labels; set when it is watched.
  std::optional<ThreadInfoTracker> thread_info;
  GcEpoch gc_epoch;
  uint64_t interval_start_ns = 0;  // monotonic
  uint64_t events = 0;             // scheduler events handled (whole life)
  uint64_t samples = 0;
  rv_pid_traps traps_seen{};       // the process's uprobe hits (ProbeBackend::PidTraps) at the last budget check
};

// Upload labels of a process: host, pid, command, ruby_version, container_id (only when non-empty), service_name,
// service_name_source (ProcessLabels: environment, comm or cgroup). The process tree's labels need the registry:
// AddProcessTreeLabels, below.
std::map<std::string, std::string> UploadLabels(const std::string& host, const WatchedProcess& p);

// One ProfileUpload per built profile; from/until in Unix seconds, each rounded to the nearest second (until > from).
std::vector<ProfileUpload> MakeUploads(const std::string& host, const WatchedProcess& p,
                                       std::vector<BuiltProfile> profiles, int64_t from_unix_ns,
                                       int64_t until_unix_ns);

class ProcessRegistry {
 public:
  // Called for every record (tens of thousands a second): one or two adjacent slots of a flat index rather than the
  // ordered map's tree walk or a node-based hash map's bucket chase (each a likely cache miss).
  WatchedProcess* Find(int pid) {
    WatchedProcess** found = index_.find(static_cast<uint32_t>(pid));
    return found == nullptr ? nullptr : *found;
  }
  WatchedProcess& Add(std::unique_ptr<WatchedProcess> p) {
    const int pid = p->pid;
    WatchedProcess& added = *(procs_[pid] = std::move(p));
    index_[static_cast<uint32_t>(pid)] = &added;
    return added;
  }
  std::unique_ptr<WatchedProcess> Remove(int pid) {
    auto it = procs_.find(pid);
    if (it == procs_.end()) return nullptr;
    std::unique_ptr<WatchedProcess> p = std::move(it->second);
    procs_.erase(it);
    index_.erase(static_cast<uint32_t>(pid));
    return p;
  }
  size_t size() const { return procs_.size(); }
  std::vector<int> pids() const {
    std::vector<int> out;
    for (const auto& [pid, p] : procs_) out.push_back(pid);
    return out;
  }
  std::map<int, std::unique_ptr<WatchedProcess>>& all() { return procs_; }
  const std::map<int, std::unique_ptr<WatchedProcess>>& all() const { return procs_; }
  const WatchedProcess* Find(int pid) const {
    WatchedProcess* const* found = index_.find(static_cast<uint32_t>(pid));
    return found == nullptr ? nullptr : *found;
  }

 private:
  std::map<int, std::unique_ptr<WatchedProcess>> procs_;  // ordered by pid: deterministic cuts, logs and tests
  FlatMap64<WatchedProcess*> index_;                       // the same processes by pid, for Find
};

// A process's place among the processes the agent profiles (docs/deploy.md "Forking servers"), derived from parent
// pids and start times (ProcessLabels, read at discovery), not reported by the process. A process is the parent of
// another when the other names its pid as parent and it started no later (not a later process reusing the pid):
//   kRoleWorker  its parent is a process the agent profiles (a forked worker of a Puma, Unicorn or Pitchfork master,
//                a Resque child...);
//   kRoleMaster  not a worker, and a process the agent profiles has it as parent;
//   ""           neither (a process on its own), or its parent is unknown.
// `p` need not be in the registry (a finished process is removed before its last cut). O(processes profiled).
inline constexpr std::string_view kRoleMaster = "master";
inline constexpr std::string_view kRoleWorker = "worker";
std::string_view ProcessRole(const ProcessRegistry& registry, const WatchedProcess& p);

// Adds the process tree's labels to each of p's uploads: parent_pid (when known) and process_role (when not "").
void AddProcessTreeLabels(const ProcessRegistry& registry, const WatchedProcess& p,
                          std::vector<ProfileUpload>* uploads);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_AGENT_PROCESS_REGISTRY_H_
