// Launch mode: find the CRuby VM binary a command will run before it runs (the uprobes must be attached before its
// first Ruby instruction), and start the command held at a gate until the probes are live.
#ifndef RVBPFD_SRC_RECORD_LAUNCH_H_
#define RVBPFD_SRC_RECORD_LAUNCH_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/error.h"

namespace rvbpfd {

struct LaunchPlan {
  std::string executable;       // absolute path that will be exec'd (after PATH lookup and #! resolution)
  std::string vm_path;          // the ELF holding the VM: the executable itself (static) or its libruby.so
  bool vm_is_shared_library = false;
};

// Resolves argv[0] through PATH, follows one level of `#!` (including `#!/usr/bin/env ruby`), and finds the ELF that
// holds the VM: the executable if it defines `ruby_version`, else its DT_NEEDED libruby found through DT_RUNPATH /
// DT_RPATH ($ORIGIN expanded), LD_LIBRARY_PATH and the system library directories. Errors: kNotRuby (with what was
// found), kNoSuchProcess is never used here; a missing command is kUsage.
Result<LaunchPlan> PlanLaunch(const std::vector<std::string>& argv, const std::string& path_env,
                              const std::string& ld_library_path);

// A forked child that waits at a gate before exec. Release() lets it exec; the destructor kills and reaps a child
// that was never released (so a failed attach never leaves the program running unobserved).
class HeldChild {
 public:
  static Result<HeldChild> Spawn(const std::vector<std::string>& argv);
  HeldChild(HeldChild&& other) noexcept;
  HeldChild& operator=(HeldChild&&) = delete;
  HeldChild(const HeldChild&) = delete;
  ~HeldChild();

  pid_t pid() const { return pid_; }
  // Lets the child exec. Returns an error if exec failed (the child reports errno through a CLOEXEC pipe).
  Status Release();
  // Non-blocking: true once the child has exited; fills its wait status.
  bool Reap(int* wait_status);

 private:
  HeldChild() = default;
  pid_t pid_ = -1;
  int gate_fd_ = -1;      // write end: closing it (or writing) releases the child
  int exec_err_fd_ = -1;  // read end: gets errno if execvp failed, EOF on success
  bool released_ = false;
  bool reaped_ = false;
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_RECORD_LAUNCH_H_
