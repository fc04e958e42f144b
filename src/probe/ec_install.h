// Installs the per-process part of a VM binary's EC route (src/stacks/ec_route.h) into BPF's proc_ec map, once the
// process has mapped the VM and ld.so has relocated it: at once when attaching to a running process; in launch mode
// (or for a process the fleet agent found at exec) only after the dynamic loader ran, so Resolve() is retried until
// then.
//
// Used by the recorder's main loop and the fleet agent (through ProbeBackend::PollEc, which writes the map); one
// instance per process. Not thread-safe (the daemon's loop).
#ifndef RVBPFD_SRC_PROBE_EC_INSTALL_H_
#define RVBPFD_SRC_PROBE_EC_INSTALL_H_

#include <cstdint>
#include <optional>
#include <string>

#include "rvbpfd/abi.h"
#include "stacks/ec_route.h"

namespace rvbpfd {

class ProcessEcInstaller {
 public:
  enum class State {
    kPending,    // the VM is not mapped or not relocated yet: samples use current_th until then
    kInstalled,  // proc_ec holds the route
    kFailed,     // the process's values are unusable (error() says why): samples keep using current_th
  };

  ProcessEcInstaller(int pid, std::string vm_path, EcRoute route, uint8_t binary, std::string proc_root = "/proc");

  // One attempt while pending (a /proc/PID/maps scan and at most three small reads of the target): the process's
  // proc_ec values once the VM is mapped and relocated, for the backend to write. nullopt while pending, after a
  // failure, and once installed (state() says which).
  std::optional<rv_proc_ec> Resolve();
  // The backend's answer for the values Resolve gave: written (kInstalled), or refused with `why` (kFailed, as when
  // Resolve finds the process's values unusable).
  State Installed();
  State Failed(std::string why);

  int pid() const { return pid_; }
  State state() const { return state_; }
  const std::string& error() const { return error_; }

 private:
  int pid_;
  std::string vm_path_;
  EcRoute route_;
  uint8_t binary_;
  std::string proc_root_;
  State state_ = State::kPending;
  std::string error_;
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_PROBE_EC_INSTALL_H_
