// The struct layout `rvbpfd dump` reads a live CRuby process with, beyond what the frame walker and the sampler
// already know (stacks/ruby_offsets.h): the VM's ractor list, each ractor's thread list, the thread fields a dump
// shows (native thread, status, name, the Mutex it waits for, who joins it), the execution context's fiber, and the
// Mutex behind a Thread::Mutex object.
//
// Two sources, as for the walker: a built-in table for the release lines the test Rubies cover (3.3, 3.4; measured
// on their DWARF and checked against it by tests/dump), and the VM binary's DWARF, which wins and is cross-checked.
// A field neither gives is kNoField and the dump goes without what it gives (a thread's name, its status, who owns
// the Mutex it waits for), saying so in its output.
#ifndef RVBPFD_SRC_DUMP_DUMP_LAYOUT_H_
#define RVBPFD_SRC_DUMP_DUMP_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/error.h"
#include "elf/elf_file.h"
#include "rvbpfd/abi.h"
#include "stacks/ruby_offsets.h"

namespace rvbpfd {

struct DumpLayout {
  static constexpr uint32_t kNoField = 0xffffffffu;

  // rb_vm_t
  uint32_t vm_main_ractor = kNoField;  // ractor.main_ractor (rb_ractor_t *)
  uint32_t vm_ractor_set = kNoField;   // ractor.set (ccan_list_head of rb_ractor_t.vmlr_node)
  uint32_t vm_ractor_cnt = kNoField;   // ractor.cnt (unsigned int)
  // rb_ractor_t
  uint32_t ractor_vmlr_node = kNoField;    // its node in vm->ractor.set
  uint32_t ractor_threads_set = kNoField;  // threads.set (ccan_list_head of rb_thread_t.lt_node)
  uint32_t ractor_threads_cnt = kNoField;  // threads.cnt (unsigned int)
  // rb_thread_t
  uint32_t th_lt_node = kNoField;        // its node in ractor->threads.set
  uint32_t th_self = kNoField;           // VALUE: its Thread object (typed data of type "VM/thread" whose data is it)
  uint32_t th_ractor = kNoField;         // rb_ractor_t *
  uint32_t th_nt = kNoField;             // struct rb_native_thread *
  uint32_t th_ec = kNoField;             // rb_execution_context_t *
  uint32_t th_status_bit = kNoField;     // bits from the struct's start of the 2-bit `status` (enum rb_thread_status)
  uint32_t th_locking_mutex = kNoField;  // VALUE: the Thread::Mutex it sleeps to lock (Qfalse: none)
  uint32_t th_join_list = kNoField;      // struct rb_waiting_list *: the threads joining it
  uint32_t th_name = kNoField;           // VALUE: Thread#name (a String or nil)
  // rb_native_thread
  uint32_t nt_tid = kNoField;  // int: the kernel tid as the target's pid namespace numbers it
  // rb_execution_context_t
  uint32_t ec_cfp = kNoField;         // the current control frame (changes whenever the thread runs Ruby code)
  uint32_t ec_fiber_ptr = kNoField;   // rb_fiber_t *: the fiber running on the thread
  uint32_t ec_thread_ptr = kNoField;  // rb_thread_t *
  // thread_sync.c's rb_mutex_t (3.3/3.4: the owning fiber first)
  uint32_t mutex_fiber = kNoField;
  // struct RTypedData (3.3/3.4: basic, type, typed_flag, data)
  uint32_t typed_type = kNoField;
  uint32_t typed_flag = kNoField;
  uint32_t typed_data = kNoField;
  // struct rb_waiting_list (next, thread, fiber)
  uint32_t waiting_next = kNoField;
  uint32_t waiting_thread = kNoField;
  // rb_control_frame_t: the frame's receiver (the Queue in Queue#pop, the ConditionVariable in #wait...)
  uint32_t cfp_self = kNoField;
  uint32_t cfp_size = kNoField;  // bytes from one control frame to its caller's
  // thread_sync.c's waiter (struct sync_waiter, on the waiting thread's C stack) and what links it
  uint32_t waiter_th = kNoField;      // rb_thread_t *
  uint32_t waiter_node = kNoField;    // its ccan_list_node in the waitq it waits in
  uint32_t queue_waitq = kNoField;    // struct rb_queue.waitq: the threads waiting to pop
  uint32_t szqueue_pushq = kNoField;  // struct rb_szqueue.pushq: the threads waiting to push
  uint32_t condvar_waitq = kNoField;  // struct rb_condvar.waitq
  // ext/monitor's struct rb_monitor (count, owner, mutex): the Mutex a Monitor locks (its owner is the Monitor's)
  uint32_t monitor_mutex = kNoField;
  // The GVL (holder and queue), as the sampler reads it.
  rv_gvl_offsets gvl{};

  // Where the values came from: DWARF field names, and "field: table X, dwarf Y" where the two disagree.
  OffsetsReport report;
};

// rb_thread_status (vm_core.h), the same in 3.2 - 4.0.
enum class RubyThreadStatus : uint8_t { kRunnable = 0, kStopped = 1, kStoppedForever = 2, kKilled = 3 };

// The built-in table for major.minor over what `offsets` (the walker's layout, DWARF over its own table) already
// holds; 3.3 and 3.4 only. Other versions get only the fields `offsets` gives (no thread list without DWARF).
DumpLayout DumpLayoutTable(int major, int minor, const RubyOffsets& offsets);

// DumpLayoutTable overridden by the VM binary's DWARF, when it has some. kUnsupportedVersion when neither gives the
// thread list (the ractor's threads.set and the thread's lt_node, nt and tid): nothing could be dumped.
// Reading DWARF inflates the binary's debug sections (~150 ms for a 3.3 libruby, most of a dump's time), so a layout
// DWARF gave is cached like the stack layout (stacks/offsets_cache.h) under `<cache_dir>/<content_sha256>.dump.json`;
// cache_dir or content_sha256 "": no cache.
Result<DumpLayout> DumpLayoutForBinary(const ElfFile& elf, int major, int minor, const RubyOffsets& offsets,
                                       const std::string& content_sha256 = "", const std::string& cache_dir = "");

// The cache entry's text and its reader (tests). The reader checks the format, the key, the version, every field
// (an offset below kMaxDumpLayoutOffset or kNoField) and the thread-list fields; the GVL's offsets come from
// `offsets`.
inline constexpr uint32_t kMaxDumpLayoutOffset = 1u << 16;
std::string DumpLayoutCacheEntry(const DumpLayout& layout, int major, int minor, const std::string& content_sha256);
Result<DumpLayout> ParseDumpLayoutCacheEntry(const std::string& text, const std::string& content_sha256, int major,
                                             int minor, const RubyOffsets& offsets);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_DUMP_DUMP_LAYOUT_H_
