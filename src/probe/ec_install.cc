#include "probe/ec_install.h"

#include <utility>

#include "stacks/memory_reader.h"
#include "target/target.h"

namespace rvbpfd {

ProcessEcInstaller::ProcessEcInstaller(int pid, std::string vm_path, EcRoute route, uint8_t binary,
                                       std::string proc_root)
    : pid_(pid), vm_path_(std::move(vm_path)), route_(std::move(route)), binary_(binary),
      proc_root_(std::move(proc_root)) {}

ProcessEcInstaller::State ProcessEcInstaller::Poll(BpfSession& session) {
  if (state_ != State::kPending) return state_;
  std::optional<uint64_t> lowest = LowestMappingOf(pid_, vm_path_, proc_root_);
  if (!lowest) return state_;  // not mapped yet (launch mode before exec, or ld.so still loading)
  ProcessMemoryReader mem(pid_);
  Result<std::optional<rv_proc_ec>> pe = ResolveProcessEc(route_, binary_, EcRouteLoadBias(route_, *lowest), mem);
  if (!pe) {
    state_ = State::kFailed;
    error_ = pe.error().message();
    return state_;
  }
  if (!pe->has_value()) return state_;  // mapped, not relocated yet
  if (Status st = session.SetProcEc(static_cast<uint32_t>(pid_), **pe); !st) {
    state_ = State::kFailed;
    error_ = st.error().message();
    return state_;
  }
  installed_ = **pe;
  state_ = State::kInstalled;
  return state_;
}

}  // namespace rvbpfd
