// The memory of a fake CRuby process as CheckLiveLayout reads it (session/vm_binary.h), shared by the layout check's
// and the fleet agent's unit tests: the hook list at bias + kHooks (NULL), ruby_single_main_ractor at
// bias + kMainRactor pointing at a ractor whose threads.main (+kRactorMainThread) is the main thread, whose nt
// (+kThNt) has the native tid at +kNtTid.
#ifndef RVBPFD_TESTS_SESSION_FAKE_VM_MEMORY_H_
#define RVBPFD_TESTS_SESSION_FAKE_VM_MEMORY_H_

#include <cstdint>

#include "stacks/fake_memory.h"

namespace rvbpfd::testing {

struct FakeVm {
  static constexpr uint64_t kHooks = 0x5000, kMainRactor = 0x5008;  // ELF vaddrs
  static constexpr uint32_t kRactorMainThread = 0x188, kThNt = 40, kNtTid = 24;
  static constexpr uint64_t kRactor = 0x10000, kThread = 0x20000, kNativeThread = 0x30000;  // runtime addresses
};

// `main_thread` 0: ruby_setup has allocated the main ractor but not given it its main thread yet.
inline FakeMemory FakeVmMemory(uint64_t bias, int tid, uint64_t main_thread = FakeVm::kThread) {
  FakeMemory m;
  m.Map(bias + FakeVm::kHooks, 16);
  m.Map(FakeVm::kRactor, 0x400);
  m.Map(FakeVm::kThread, 0x100);
  m.Map(FakeVm::kNativeThread, 0x40);
  m.Put64(bias + FakeVm::kMainRactor, FakeVm::kRactor);
  m.Put64(FakeVm::kRactor + FakeVm::kRactorMainThread, main_thread);
  m.Put64(FakeVm::kThread + FakeVm::kThNt, FakeVm::kNativeThread);
  m.Put32(FakeVm::kNativeThread + FakeVm::kNtTid, static_cast<uint32_t>(tid));
  return m;
}

}  // namespace rvbpfd::testing

#endif  // RVBPFD_TESTS_SESSION_FAKE_VM_MEMORY_H_
