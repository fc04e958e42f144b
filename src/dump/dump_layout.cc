#include "dump/dump_layout.h"

#include <elf.h>

#include <memory>
#include <optional>

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

}  // namespace

Result<DumpLayout> DumpLayoutForBinary(const ElfFile& elf, int major, int minor, const RubyOffsets& offsets) {
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
  if (l.ractor_threads_set == DumpLayout::kNoField || l.th_lt_node == DumpLayout::kNoField ||
      l.th_nt == DumpLayout::kNoField || l.nt_tid == DumpLayout::kNoField || l.th_ec == DumpLayout::kNoField ||
      l.vm_main_ractor == DumpLayout::kNoField) {
    return Error(ErrorCode::kUnsupportedVersion,
                 "no thread-list offsets for CRuby " + std::to_string(major) + "." + std::to_string(minor) +
                     " (built in for 3.3 and 3.4; other versions need the VM binary's DWARF: install its debug "
                     "symbols)");
  }
  return l;
}

}  // namespace rvbpfd
