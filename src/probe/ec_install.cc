#include "probe/ec_install.h"

#include <utility>

#include "stacks/memory_reader.h"
#include "target/target.h"

namespace rvbpfd {

ProcessEcInstaller::ProcessEcInstaller(int pid, std::string vm_path, EcRoute route, uint8_t binary,
                                       std::string proc_root)
    : pid_(pid), vm_path_(std::move(vm_path)), route_(std::move(route)), binary_(binary),
      proc_root_(std::move(proc_root)) {}

std::optional<rv_proc_ec> ProcessEcInstaller::Resolve() {
  if (state_ != State::kPending) return std::nullopt;
  std::optional<uint64_t> lowest = LowestMappingOf(pid_, vm_path_, proc_root_);
  if (!lowest) return std::nullopt;  // not mapped yet (launch mode before exec, or ld.so still loading)
  const uint64_t bias = EcRouteLoadBias(route_, *lowest);
  if (EcRouteHasGotSlot(route_) &&
      !EcRouteSlotInPlace(route_, MappedFileOffset(pid_, vm_path_, bias + route_.got_vaddr, proc_root_))) {
    return std::nullopt;  // ld.so has not mapped the data segment yet: the slot's address shows other bytes of the file
  }
  ProcessMemoryReader mem(pid_);
  Result<std::optional<rv_proc_ec>> pe = ResolveProcessEc(route_, binary_, bias, mem);
  if (!pe) {
    Failed(pe.error().message());
    return std::nullopt;
  }
  return *pe;  // nullopt: mapped, not relocated yet
}

ProcessEcInstaller::State ProcessEcInstaller::Installed() {
  state_ = State::kInstalled;
  return state_;
}

ProcessEcInstaller::State ProcessEcInstaller::Failed(std::string why) {
  state_ = State::kFailed;
  error_ = std::move(why);
  return state_;
}

}  // namespace rvbpfd
