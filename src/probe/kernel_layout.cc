#include "probe/kernel_layout.h"

#include <bpf/btf.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <optional>

#include <nlohmann/json.hpp>

#include "common/cache_file.h"
#include "common/json_dump.h"
#include "common/json_read.h"

namespace rvbpfd {
namespace {

// Bump when the meaning of a field changes, so old entries are recomputed rather than misread.
constexpr int kKernelLayoutCacheFormat = 2;  // 2: task_exit_code
// task_struct is 3-14 KiB on the kernels we know; an offset beyond this is not a task_struct field.
constexpr uint32_t kMaxTaskOffset = 64u << 10;
// Anonymous structs and unions nest a few levels at most (CONFIG_RANDSTRUCT adds one).
constexpr int kMaxAnonymousDepth = 8;
// /sys/kernel/notes holds a few small notes (~200 bytes).
constexpr uint64_t kMaxNotesBytes = 64u << 10;
constexpr uint64_t kMaxEntryBytes = 4u << 10;
constexpr uint32_t kNtGnuBuildId = 3;

struct Member {
  uint32_t bit_offset;  // from the start of the struct searched
  uint32_t type_id;
  uint32_t bitfield_bits;
};

// The member called `name` of the struct or union `type_id`, searching anonymous members' own members too.
std::optional<Member> FindMember(const btf* b, uint32_t type_id, std::string_view name, int depth = 0) {
  const btf_type* t = btf__type_by_id(b, type_id);
  if (t == nullptr || !btf_is_composite(t) || depth > kMaxAnonymousDepth) return std::nullopt;
  const btf_member* m = btf_members(t);
  for (uint16_t i = 0; i < btf_vlen(t); ++i, ++m) {
    const uint32_t bit_offset = btf_member_bit_offset(t, i);
    if (m->name_off == 0) {
      const int inner_id = btf__resolve_type(b, m->type);
      if (inner_id <= 0) continue;
      if (auto inner = FindMember(b, static_cast<uint32_t>(inner_id), name, depth + 1)) {
        inner->bit_offset += bit_offset;
        return inner;
      }
      continue;
    }
    const char* member_name = btf__name_by_offset(b, m->name_off);
    if (member_name != nullptr && name == member_name) {
      return Member{bit_offset, m->type, btf_member_bitfield_size(t, i)};
    }
  }
  return std::nullopt;
}

// The byte offset of integer member `name` of `type_id` when it is a whole-byte integer of `size` bytes.
Result<uint32_t> IntegerField(const btf* b, uint32_t type_id, const std::string& where, std::string_view name,
                              uint32_t size) {
  const std::string field = where + "." + std::string(name);
  auto bad = [&](const std::string& why) { return Error(ErrorCode::kBpf, "the kernel's BTF: " + field + " " + why); };
  std::optional<Member> m = FindMember(b, type_id, name);
  if (!m) return bad("is missing");
  if (m->bitfield_bits != 0 || m->bit_offset % 8 != 0) return bad("is a bit field");
  const int resolved = btf__resolve_type(b, m->type_id);
  const btf_type* t = resolved > 0 ? btf__type_by_id(b, static_cast<uint32_t>(resolved)) : nullptr;
  if (t == nullptr || !btf_is_int(t) || t->size != size) {
    return bad("is not an integer of " + std::to_string(size) + " bytes");
  }
  return m->bit_offset / 8;
}

bool Plausible(uint32_t offset, uint32_t align) {
  return offset != 0 && offset < kMaxTaskOffset && offset % align == 0;
}

}  // namespace

Result<rv_kernel_layout> KernelLayoutFromBtf(const btf* kernel_btf) {
  const int task_id = btf__find_by_name_kind(kernel_btf, "task_struct", BTF_KIND_STRUCT);
  if (task_id <= 0) return Error(ErrorCode::kBpf, "the kernel's BTF has no struct task_struct");
  const uint32_t task = static_cast<uint32_t>(task_id);
  Result<uint32_t> pid = IntegerField(kernel_btf, task, "task_struct", "pid", 4);
  if (!pid.ok()) return pid.error();
  Result<uint32_t> tgid = IntegerField(kernel_btf, task, "task_struct", "tgid", 4);
  if (!tgid.ok()) return tgid.error();
  std::optional<Member> thread = FindMember(kernel_btf, task, "thread");
  const int thread_id = thread ? btf__resolve_type(kernel_btf, thread->type_id) : -1;
  const btf_type* thread_type = thread_id > 0 ? btf__type_by_id(kernel_btf, static_cast<uint32_t>(thread_id)) : nullptr;
  if (thread_type == nullptr || !btf_is_struct(thread_type) || thread->bit_offset % 8 != 0) {
    return Error(ErrorCode::kBpf, "the kernel's BTF: task_struct.thread is missing or not a struct");
  }
  Result<uint32_t> fsbase =
      IntegerField(kernel_btf, static_cast<uint32_t>(thread_id), "task_struct.thread", "fsbase", 8);
  if (!fsbase.ok()) return fsbase.error();
  rv_kernel_layout layout{};
  layout.task_pid = *pid;
  layout.task_tgid = *tgid;
  layout.task_fsbase = thread->bit_offset / 8 + *fsbase;
  if (!Plausible(layout.task_pid, 4) || !Plausible(layout.task_tgid, 4) || !Plausible(layout.task_fsbase, 8)) {
    return Error(ErrorCode::kBpf, "the kernel's BTF puts task_struct's pid, tgid or thread.fsbase out of range");
  }
  // Optional: without it a followed process's exit status is not known (0: BPF does not read it).
  Result<uint32_t> exit_code = IntegerField(kernel_btf, task, "task_struct", "exit_code", 4);
  if (exit_code.ok() && Plausible(*exit_code, 4)) layout.task_exit_code = *exit_code;
  return layout;
}

std::string KernelBuildIdFromNotes(std::string_view notes) {
  size_t pos = 0;
  while (notes.size() - pos >= 12) {
    uint32_t namesz, descsz, type;
    std::memcpy(&namesz, notes.data() + pos, 4);
    std::memcpy(&descsz, notes.data() + pos + 4, 4);
    std::memcpy(&type, notes.data() + pos + 8, 4);
    pos += 12;
    // Padded to 4 bytes each; summed in 64 bits, so hostile sizes cannot wrap the bounds check.
    const uint64_t name_bytes = (uint64_t{namesz} + 3u) & ~uint64_t{3};
    const uint64_t desc_bytes = (uint64_t{descsz} + 3u) & ~uint64_t{3};
    if (name_bytes + desc_bytes > notes.size() - pos) return "";
    const std::string_view name = notes.substr(pos, namesz);
    const std::string_view desc = notes.substr(pos + name_bytes, descsz);
    pos += name_bytes + desc_bytes;
    if (type == kNtGnuBuildId && name == std::string_view("GNU\0", 4) && !desc.empty() && desc.size() <= 64) {
      static constexpr char kHex[] = "0123456789abcdef";
      std::string hex;
      for (unsigned char c : desc) {
        hex += kHex[c >> 4];
        hex += kHex[c & 15];
      }
      return hex;
    }
  }
  return "";
}

std::string KernelLayoutCacheEntry(const rv_kernel_layout& layout, const std::string& build_id) {
  const nlohmann::json doc = {{"format", kKernelLayoutCacheFormat},
                              {"build_id", build_id},
                              {"task_pid", layout.task_pid},
                              {"task_tgid", layout.task_tgid},
                              {"task_fsbase", layout.task_fsbase},
                              {"task_exit_code", layout.task_exit_code}};
  return DumpJson(doc, 1) + "\n";
}

Result<rv_kernel_layout> ParseKernelLayoutCacheEntry(const std::string& text, const std::string& build_id) {
  auto bad = [](const std::string& why) { return Error(ErrorCode::kIo, "kernel layout cache: " + why); };
  const nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return bad("not a JSON object");
  auto u32_at = [&](const char* key) -> std::optional<uint32_t> {
    auto it = doc.find(key);
    return it == doc.end() ? std::nullopt : JsonInteger<uint32_t>(*it);
  };
  if (u32_at("format") != static_cast<uint32_t>(kKernelLayoutCacheFormat)) return bad("format version differs");
  auto id = doc.find("build_id");
  if (id == doc.end() || !id->is_string() || id->get<std::string>() != build_id) return bad("another kernel's entry");
  const std::optional<uint32_t> pid = u32_at("task_pid"), tgid = u32_at("task_tgid"), fsbase = u32_at("task_fsbase");
  if (!pid || !tgid || !fsbase || !Plausible(*pid, 4) || !Plausible(*tgid, 4) || !Plausible(*fsbase, 8)) {
    return bad("an offset is missing, out of range or misaligned");
  }
  rv_kernel_layout layout{};
  layout.task_pid = *pid;
  layout.task_tgid = *tgid;
  layout.task_fsbase = *fsbase;
  // 0: the kernel has none (the status is then not read); anything else must be a plausible int offset.
  const std::optional<uint32_t> exit_code = u32_at("task_exit_code");
  if (!exit_code || (*exit_code != 0 && !Plausible(*exit_code, 4))) return bad("task_exit_code is missing or misplaced");
  layout.task_exit_code = *exit_code;
  return layout;
}

Result<rv_kernel_layout> LoadKernelLayout(const std::string& cache_dir, const KernelLayoutSources& sources) {
  std::string build_id;
  if (std::optional<std::string> notes = ReadCacheFile(sources.notes_path, kMaxNotesBytes)) {
    build_id = KernelBuildIdFromNotes(*notes);
  }
  const std::string cache_path =
      cache_dir.empty() || build_id.empty() ? "" : cache_dir + "/kernel-" + build_id + ".json";
  if (!cache_path.empty()) {
    if (std::optional<std::string> text = ReadCacheFile(cache_path, kMaxEntryBytes)) {
      if (Result<rv_kernel_layout> cached = ParseKernelLayoutCacheEntry(*text, build_id); cached.ok()) return cached;
    }
  }
  btf* kernel_btf = btf__parse_raw(sources.btf_path.c_str());
  if (kernel_btf == nullptr) {
    return Error(ErrorCode::kBpf, ErrnoMessage("reading the kernel's BTF (" + sources.btf_path + ")", errno) +
                                      "; on-CPU sampling and following forks need a kernel built with "
                                      "CONFIG_DEBUG_INFO_BTF=y");
  }
  Result<rv_kernel_layout> layout = KernelLayoutFromBtf(kernel_btf);
  btf__free(kernel_btf);
  if (layout.ok() && !cache_path.empty()) {
    WriteCacheFile(cache_dir, cache_path, KernelLayoutCacheEntry(*layout, build_id));
  }
  return layout;
}

}  // namespace rvbpfd
