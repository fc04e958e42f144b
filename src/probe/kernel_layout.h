// Where the fields of the running kernel's struct task_struct that the BPF programs read are (rv_kernel_layout):
// found in the kernel's BTF once per kernel build and cached by its build ID, so a run does not parse the ~5 MB of
// /sys/kernel/btf/vmlinux (~10 ms) and the BPF object needs no CO-RE relocation (libbpf would parse it again for each
// of the object's three instances).
//
// Threading: free functions without shared state.
#ifndef RVBPFD_SRC_PROBE_KERNEL_LAYOUT_H_
#define RVBPFD_SRC_PROBE_KERNEL_LAYOUT_H_

#include <string>
#include <string_view>

#include "common/error.h"
#include "rvbpfd/abi.h"

struct btf;

namespace rvbpfd {

// The offsets from a parsed kernel BTF. Each field is searched by name through task_struct's members, anonymous
// structs and unions included (a CONFIG_RANDSTRUCT kernel nests them), and must be a whole-byte integer of the size
// rv_kernel_layout gives. Errors (kBpf) name the missing or mistyped field.
Result<rv_kernel_layout> KernelLayoutFromBtf(const btf* kernel_btf);

// The GNU build ID (lowercase hex) in `notes`, the ELF notes of the running kernel (/sys/kernel/notes); "" when
// there is none. Bounded by the note headers: a truncated or oversized note ends the scan.
std::string KernelBuildIdFromNotes(std::string_view notes);

// A cache entry for `layout` of the kernel `build_id`, and its reading: an entry of another build ID, another format,
// or with an offset out of task_struct's plausible range or misaligned for its field is refused (kIo).
std::string KernelLayoutCacheEntry(const rv_kernel_layout& layout, const std::string& build_id);
Result<rv_kernel_layout> ParseKernelLayoutCacheEntry(const std::string& text, const std::string& build_id);

struct KernelLayoutSources {
  std::string notes_path = "/sys/kernel/notes";
  std::string btf_path = "/sys/kernel/btf/vmlinux";
};

// The running kernel's layout: from `<cache_dir>/kernel-<build id>.json` when it holds a valid entry, else from the
// BTF (and then entered in the cache). No build ID or cache_dir "": the BTF every time. Errors (kBpf) name the BTF
// file and the kernel option that provides it.
Result<rv_kernel_layout> LoadKernelLayout(const std::string& cache_dir, const KernelLayoutSources& sources = {});

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_PROBE_KERNEL_LAYOUT_H_
