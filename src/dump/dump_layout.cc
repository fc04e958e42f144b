#include "dump/dump_layout.h"

#include <elf.h>

#include <memory>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/cache_file.h"
#include "common/json_dump.h"
#include "common/json_read.h"

#include "sites/dwarf_info.h"
#include "sites/sites.h"

namespace rvbpfd {

DumpLayout DumpLayoutTable(int major, int minor, const RubyOffsets& offsets) {
  DumpLayout l;
  l.vm_main_ractor = offsets.vm_main_ractor;
  l.th_ec = offsets.thread_ec;
  if (offsets.thread_name != RubyOffsets::kNoThreadName) l.th_name = offsets.thread_name;
  l.ec_cfp = offsets.walk.ec_cfp;
  l.ec_thread_ptr = offsets.ec_thread_ptr;
  l.gvl = offsets.gvl;
  if (offsets.walk.cfp_size != 0) l.cfp_size = offsets.walk.cfp_size;
  rv_offsets th{};
  uint32_t main_serial = 0;
  if (TableOffsets(major, minor, &th, &main_serial)) {
    l.th_nt = th.th_nt;
    l.nt_tid = th.nt_tid;
  }
  const int v = major * 100 + minor;
  if (v == 303 || v == 304) {
    // From the 3.3/3.4 sources (vm_core.h, ractor_core.h, thread_sync.c, rtypeddata.h; x86_64, glibc's 40-byte
    // pthread_mutex_t for the native locks): the ractor's threads block ends where threads.sched (288, the GVL
    // table's) begins; the thread's status, locking_mutex, join_list and name come after its rb_thread_sched_item
    // (56, 144 bytes) and the fields 3.4 added before join_list and name. tests/dump checks each against the test
    // Rubies' DWARF; Debian trixie's stripped libruby-3.3 (rb_thread_main's threads.main at 0x188 agrees) is
    // checked end to end by tests/e2e/test_dump.py.
    l.vm_ractor_set = 8;
    l.vm_ractor_cnt = 24;
    l.ractor_threads_set = 256;
    l.ractor_threads_cnt = 272;
    l.ractor_vmlr_node = 432;
    l.th_lt_node = 0;
    l.th_status_bit = 240 * 8;
    l.th_locking_mutex = 344;
    l.th_join_list = v == 303 ? 360 : 376;
    if (l.th_name == DumpLayout::kNoField) l.th_name = v == 303 ? 432 : 448;
    l.th_self = 8 * 2;  // after lt_node (two pointers)
    l.th_ractor = 24;
    l.ec_fiber_ptr = 40;
    l.mutex_fiber = 0;
    l.typed_type = 16;
    l.typed_flag = 24;
    l.typed_data = 32;
    l.waiting_next = 0;
    l.waiting_thread = 8;
    l.cfp_self = 24;  // pc, sp, iseq, self
    l.waiter_th = 8;  // self, th, fiber, node
    l.waiter_node = 24;
    l.queue_waitq = 0;
    l.szqueue_pushq = 40;  // after the rb_queue (36 bytes) and num_waiting_push
    l.condvar_waitq = 0;
    l.monitor_mutex = 16;  // count, owner, mutex (ext/monitor/monitor.c; no DWARF of it in the VM binary)
  }
  return l;
}

namespace {

void Apply(std::optional<uint32_t> dwarf, uint32_t* field, const char* name, DumpLayout* l) {
  ApplyDwarfOffset(dwarf, field, name, &l->report);
}

// The first defined function of `names` (a CU that uses the structs asked about); 0 when none is.
uint64_t AnchorPc(const ElfFile& elf, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    std::optional<ElfSymbol> fn = elf.FindSymbol(n);
    if (fn && fn->shndx != SHN_UNDEF && fn->value != 0) return fn->value;
  }
  return 0;
}

// Every offset of DumpLayout but the GVL's (the walker's, cached with it), by its name in the cache entry.
constexpr std::pair<const char*, uint32_t DumpLayout::*> kFields[] = {
    {"vm_main_ractor", &DumpLayout::vm_main_ractor},     {"vm_ractor_set", &DumpLayout::vm_ractor_set},
    {"vm_ractor_cnt", &DumpLayout::vm_ractor_cnt},       {"ractor_vmlr_node", &DumpLayout::ractor_vmlr_node},
    {"ractor_threads_set", &DumpLayout::ractor_threads_set},
    {"ractor_threads_cnt", &DumpLayout::ractor_threads_cnt},
    {"th_lt_node", &DumpLayout::th_lt_node},             {"th_self", &DumpLayout::th_self},
    {"th_ractor", &DumpLayout::th_ractor},               {"th_nt", &DumpLayout::th_nt},
    {"th_ec", &DumpLayout::th_ec},                       {"th_status_bit", &DumpLayout::th_status_bit},
    {"th_locking_mutex", &DumpLayout::th_locking_mutex}, {"th_join_list", &DumpLayout::th_join_list},
    {"th_name", &DumpLayout::th_name},                   {"nt_tid", &DumpLayout::nt_tid},
    {"ec_cfp", &DumpLayout::ec_cfp},                     {"ec_fiber_ptr", &DumpLayout::ec_fiber_ptr},
    {"ec_thread_ptr", &DumpLayout::ec_thread_ptr},       {"mutex_fiber", &DumpLayout::mutex_fiber},
    {"typed_type", &DumpLayout::typed_type},             {"typed_flag", &DumpLayout::typed_flag},
    {"typed_data", &DumpLayout::typed_data},             {"waiting_next", &DumpLayout::waiting_next},
    {"waiting_thread", &DumpLayout::waiting_thread},     {"cfp_self", &DumpLayout::cfp_self},
    {"cfp_size", &DumpLayout::cfp_size},                 {"waiter_th", &DumpLayout::waiter_th},
    {"waiter_node", &DumpLayout::waiter_node},           {"queue_waitq", &DumpLayout::queue_waitq},
    {"szqueue_pushq", &DumpLayout::szqueue_pushq},       {"condvar_waitq", &DumpLayout::condvar_waitq},
    {"monitor_mutex", &DumpLayout::monitor_mutex},
};
constexpr int kDumpCacheFormat = 1;
constexpr uint64_t kMaxDumpEntryBytes = 16384;

// The thread list's offsets are what a dump cannot go without.
Status CheckThreadListFields(const DumpLayout& l, int major, int minor) {
  if (l.ractor_threads_set == DumpLayout::kNoField || l.th_lt_node == DumpLayout::kNoField ||
      l.th_nt == DumpLayout::kNoField || l.nt_tid == DumpLayout::kNoField || l.th_ec == DumpLayout::kNoField ||
      l.vm_main_ractor == DumpLayout::kNoField) {
    return Error(ErrorCode::kUnsupportedVersion,
                 "no thread-list offsets for CRuby " + std::to_string(major) + "." + std::to_string(minor) +
                     " (built in for 3.3 and 3.4; other versions need the VM binary's DWARF: install its debug "
                     "symbols)");
  }
  return Status::Ok();
}

}  // namespace

std::string DumpLayoutCacheEntry(const DumpLayout& l, int major, int minor, const std::string& content_sha256) {
  nlohmann::json fields = nlohmann::json::object();
  for (const auto& [name, field] : kFields) fields[name] = l.*field;
  nlohmann::json doc = {{"format", kDumpCacheFormat}, {"content_sha256", content_sha256}, {"major", major},
                        {"minor", minor},             {"layout", std::move(fields)}};
  return DumpJson(doc, 1) + "\n";
}

Result<DumpLayout> ParseDumpLayoutCacheEntry(const std::string& text, const std::string& content_sha256, int major,
                                             int minor, const RubyOffsets& offsets) {
  auto bad = [](const std::string& why) { return Error(ErrorCode::kIo, "dump layout cache: " + why); };
  const nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return bad("not a JSON object");
  auto int_at = [&](const char* key) -> std::optional<int64_t> {
    auto it = doc.find(key);
    return it == doc.end() ? std::nullopt : JsonInteger<int64_t>(*it);
  };
  if (int_at("format") != kDumpCacheFormat) return bad("format version differs");
  auto sha = doc.find("content_sha256");
  if (sha == doc.end() || !sha->is_string() || sha->get<std::string>() != content_sha256) {
    return bad("entry of other content");
  }
  if (int_at("major") != major || int_at("minor") != minor) return bad("entry of another Ruby version");
  auto fields = doc.find("layout");
  if (fields == doc.end() || !fields->is_object()) return bad("no layout object");
  DumpLayout l = DumpLayoutTable(major, minor, offsets);  // the GVL's offsets
  for (const auto& [name, field] : kFields) {
    auto it = fields->find(name);
    std::optional<uint32_t> v = it == fields->end() ? std::nullopt : JsonInteger<uint32_t>(*it);
    if (!v || (*v >= kMaxDumpLayoutOffset && *v != DumpLayout::kNoField)) {
      return bad(std::string("field ") + name + " is missing or out of range");
    }
    l.*field = *v;
  }
  if (Status s = CheckThreadListFields(l, major, minor); !s.ok()) return bad("no thread-list offsets");
  return l;
}

namespace {

Result<DumpLayout> ComputeDumpLayout(const ElfFile& elf, int major, int minor, const RubyOffsets& offsets) {
  DumpLayout l = DumpLayoutTable(major, minor, offsets);
  std::unique_ptr<DwarfInfo> dwarf = DwarfInfo::Open(elf);
  if (dwarf) {
    // vm_core.h / ractor_core.h structs: vm.c's CU (as the EC route reads them); thread_sync.c is included by
    // thread.c, whose CU has the Mutex, the native thread and RTypedData.
    const uint64_t vm = AnchorPc(elf, {"rb_current_ec_noinline", "rb_vm_main_ractor_ec", "rb_profile_frames"});
    const uint64_t thread = AnchorPc(elf, {"rb_mutex_lock", "rb_thread_create", "rb_mutex_new"});
    if (vm != 0) {
      auto m = [&](const char* s, std::initializer_list<const char*> path) {
        return dwarf->MemberPathOffset(vm, s, path);
      };
      Apply(m("rb_vm_struct", {"ractor", "main_ractor"}), &l.vm_main_ractor, "vm.ractor.main_ractor", &l);
      Apply(m("rb_vm_struct", {"ractor", "set"}), &l.vm_ractor_set, "vm.ractor.set", &l);
      Apply(m("rb_vm_struct", {"ractor", "cnt"}), &l.vm_ractor_cnt, "vm.ractor.cnt", &l);
      Apply(m("rb_ractor_struct", {"vmlr_node"}), &l.ractor_vmlr_node, "ractor.vmlr_node", &l);
      Apply(m("rb_ractor_struct", {"threads", "set"}), &l.ractor_threads_set, "ractor.threads.set", &l);
      Apply(m("rb_ractor_struct", {"threads", "cnt"}), &l.ractor_threads_cnt, "ractor.threads.cnt", &l);
      Apply(m("rb_thread_struct", {"lt_node"}), &l.th_lt_node, "thread.lt_node", &l);
      Apply(m("rb_thread_struct", {"self"}), &l.th_self, "thread.self", &l);
      Apply(m("rb_thread_struct", {"ractor"}), &l.th_ractor, "thread.ractor", &l);
      Apply(m("rb_thread_struct", {"nt"}), &l.th_nt, "thread.nt", &l);
      Apply(m("rb_thread_struct", {"ec"}), &l.th_ec, "thread.ec", &l);
      Apply(dwarf->MemberBitOffset(vm, "rb_thread_struct", "status"), &l.th_status_bit, "thread.status (bits)", &l);
      Apply(m("rb_thread_struct", {"locking_mutex"}), &l.th_locking_mutex, "thread.locking_mutex", &l);
      Apply(m("rb_thread_struct", {"join_list"}), &l.th_join_list, "thread.join_list", &l);
      Apply(m("rb_thread_struct", {"name"}), &l.th_name, "thread.name", &l);
      Apply(m("rb_execution_context_struct", {"cfp"}), &l.ec_cfp, "ec.cfp", &l);
      Apply(m("rb_execution_context_struct", {"fiber_ptr"}), &l.ec_fiber_ptr, "ec.fiber_ptr", &l);
      Apply(m("rb_execution_context_struct", {"thread_ptr"}), &l.ec_thread_ptr, "ec.thread_ptr", &l);
      Apply(m("rb_control_frame_struct", {"self"}), &l.cfp_self, "cfp.self", &l);
    }
    if (thread != 0) {
      auto m = [&](const char* s, const char* f) { return dwarf->MemberOffset(thread, s, f); };
      Apply(m("rb_native_thread", "tid"), &l.nt_tid, "native_thread.tid", &l);
      Apply(m("rb_mutex_struct", "fiber"), &l.mutex_fiber, "mutex.fiber", &l);
      Apply(m("RTypedData", "type"), &l.typed_type, "RTypedData.type", &l);
      Apply(m("RTypedData", "typed_flag"), &l.typed_flag, "RTypedData.typed_flag", &l);
      Apply(m("RTypedData", "data"), &l.typed_data, "RTypedData.data", &l);
      Apply(m("rb_waiting_list", "next"), &l.waiting_next, "waiting_list.next", &l);
      Apply(m("rb_waiting_list", "thread"), &l.waiting_thread, "waiting_list.thread", &l);
      Apply(m("sync_waiter", "th"), &l.waiter_th, "sync_waiter.th", &l);
      Apply(m("sync_waiter", "node"), &l.waiter_node, "sync_waiter.node", &l);
      Apply(m("rb_queue", "waitq"), &l.queue_waitq, "queue.waitq", &l);
      Apply(m("rb_szqueue", "pushq"), &l.szqueue_pushq, "szqueue.pushq", &l);
      Apply(m("rb_condvar", "waitq"), &l.condvar_waitq, "condvar.waitq", &l);
    }
  }
  if (Status s = CheckThreadListFields(l, major, minor); !s.ok()) return s.error();
  return l;
}

}  // namespace

Result<DumpLayout> DumpLayoutForBinary(const ElfFile& elf, int major, int minor, const RubyOffsets& offsets,
                                       const std::string& content_sha256, const std::string& cache_dir) {
  // As the stack layout's cache (stacks/offsets_cache.h): only a layout DWARF gave is cached, looked up only while
  // the binary (or its debug file) has DWARF.
  const bool cacheable = !cache_dir.empty() && !content_sha256.empty() &&
                         elf.dwarf_file().FindSection(".debug_info").has_value();
  const std::string path = cache_dir + "/" + content_sha256 + ".dump.json";
  if (cacheable) {
    if (std::optional<std::string> text = ReadCacheFile(path, kMaxDumpEntryBytes)) {
      if (Result<DumpLayout> cached = ParseDumpLayoutCacheEntry(*text, content_sha256, major, minor, offsets)) {
        return cached;
      }
    }
  }
  Result<DumpLayout> computed = ComputeDumpLayout(elf, major, minor, offsets);
  if (computed && cacheable && !computed->report.dwarf_fields.empty()) {
    try {
      WriteCacheFile(cache_dir, path, DumpLayoutCacheEntry(*computed, major, minor, content_sha256));
    } catch (const std::exception&) {
      // Only allocation can throw here; the layout itself is still good.
    }
  }
  return computed;
}

}  // namespace rvbpfd
