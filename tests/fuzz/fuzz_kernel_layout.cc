// libFuzzer harness: the kernel layout cache entry's reader (ParseKernelLayoutCacheEntry), which trusts nothing a
// cache file holds, and the ELF note scan of /sys/kernel/notes (KernelBuildIdFromNotes). The same bytes go to both.
// An accepted entry holds plausible offsets and its own serialisation reads back to the same layout; a build ID is
// lowercase hex of at most 64 bytes.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_util.h"
#include "probe/kernel_layout.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rvbpfd;
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::string id = KernelBuildIdFromNotes(text);
  FUZZ_CHECK(id.size() % 2 == 0 && id.size() <= 128);
  FUZZ_CHECK(id.find_first_not_of("0123456789abcdef") == std::string::npos);
  for (const std::string& build_id : {std::string("7dd4ff07"), id}) {
    Result<rv_kernel_layout> layout = ParseKernelLayoutCacheEntry(text, build_id);
    if (!layout.ok()) continue;
    FUZZ_CHECK(layout->task_pid != 0 && layout->task_pid % 4 == 0 && layout->task_pid < (64u << 10));
    FUZZ_CHECK(layout->task_tgid != 0 && layout->task_tgid % 4 == 0 && layout->task_tgid < (64u << 10));
    FUZZ_CHECK(layout->task_fsbase != 0 && layout->task_fsbase % 8 == 0 && layout->task_fsbase < (64u << 10));
    FUZZ_CHECK(layout->task_exit_code % 4 == 0 && layout->task_exit_code < (64u << 10));
    Result<rv_kernel_layout> back = ParseKernelLayoutCacheEntry(KernelLayoutCacheEntry(*layout, build_id), build_id);
    FUZZ_CHECK(back.ok());
    FUZZ_CHECK(back->task_pid == layout->task_pid && back->task_tgid == layout->task_tgid &&
               back->task_fsbase == layout->task_fsbase && back->task_exit_code == layout->task_exit_code);
  }
  return 0;
}
