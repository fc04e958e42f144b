// Reading every Ruby thread of a live process from its memory, without stopping it (`rvbpfd dump`): the VM's ractors,
// each ractor's thread list, per thread its native thread, status, name, the Mutex it waits for, its stack, and the
// GVL's holder and queue.
//
// The process keeps running while it is read, so every read is bounded and checked (a list is walked at most its
// count of nodes and never past kMaxThreads, a node must point back at its ractor and its EC at its thread, a Mutex
// must be a T_DATA object of the "mutex" type), and the reading is taken whole again when the thread list changed
// while it was read (a torn read), up to kMaxAttempts times. A thread whose stack or status changed while its own
// part was read is read again, and marked `changed` when it never held still.
#ifndef RVBPFD_SRC_DUMP_DUMP_READER_H_
#define RVBPFD_SRC_DUMP_DUMP_READER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dump/dump_layout.h"
#include "stacks/memory_reader.h"
#include "trace/stacks.h"

namespace rvbpfd {

// What a thread waits for, as a dump reports it (docs/dump.md, "waiting_for").
struct WaitingFor {
  std::string kind;  // "mutex", "monitor", "queue", "condvar", "join", "io", "sleep", "process_wait"
  std::optional<size_t> owner;           // index (DumpSnapshot::threads) of the thread it waits for
  uint64_t object = 0;                   // what it waits on (VALUE): the Mutex, Queue, SizedQueue, ConditionVariable
                                         // or Monitor; 0 unknown or none
  std::string object_type;               // "Thread::Mutex", "Thread::Queue", ... (its CRuby type; "" with no object)
  std::optional<std::string> operation;  // "queue": "pop" or "push" (the wait list it is in)
  std::optional<int> fd;                 // "io": the descriptor its system call waits on
  std::optional<std::string> fd_target;  // "io": what /proc/PID/fd/N names ("pipe:[123]", a path, "socket:[..]")
};

struct DumpedThread {
  uint64_t th = 0;                // rb_thread_t *
  int ruby_thread = 0;            // 1-based, in the VM's thread-list order: 1 is the main thread (see docs/dump.md)
  int ns_tid = 0;                 // rb_native_thread.tid: the kernel tid in the target's pid namespace (0: none)
  int native_tid = 0;             // the host tid (ns_tid translated; equal outside a container; 0: unknown)
  std::optional<std::string> name;          // Thread#name
  std::optional<RubyThreadStatus> status;   // th->status (nullopt: the layout has no status field)
  char task_state = 0;            // /proc/PID/task/TID/stat state letter ('R', 'S', 'D'...; 0: unread)
  bool holds_gvl = false;
  int gvl_queue_position = -1;    // 0 = next to get the GVL; -1 = not queued
  std::vector<FrameInfo> frames;  // leaf first, as rb_profile_frames
  bool stack_complete = true;     // the walk reached the bottom of the VM stack
  bool changed = false;           // its stack or status kept changing while it was read
  uint64_t fiber = 0;             // ec->fiber_ptr
  uint64_t locking_mutex = 0;     // the Thread::Mutex (VALUE) it sleeps to lock; 0 none
  uint64_t mutex_owner_fiber = 0; // that Mutex's owning fiber (0: unlocked or unreadable)
  std::vector<uint64_t> joined_by;  // rb_thread_t * of the threads in Thread#join / #value on this one
  // The Queue, SizedQueue, ConditionVariable or Monitor (VALUE) that is the receiver of one of its top frames (0:
  // none), its typed-data type name ("queue", "sized_queue", "condvar", "monitor") and data pointer.
  uint64_t wait_object = 0;
  std::string wait_type;
  uint64_t wait_data = 0;

  // Derived (DeriveStates, dump/dump_analysis.h).
  std::string state;                    // "running", "holding_gvl", "waiting_gvl", "blocked", "runnable", "exited"
  std::optional<std::string> reason;    // the release-reason trace name ("sleep", "mutex", "io", ...)
  std::optional<WaitingFor> waiting_for;
};

// A Queue, SizedQueue, ConditionVariable or Monitor some thread waits on, with its wait lists as the VM keeps them.
struct WaitObject {
  uint64_t object = 0;  // VALUE
  std::string type;     // typed-data type name: "queue", "sized_queue", "condvar", "monitor"
  std::vector<uint64_t> waiters;       // rb_thread_t *, list order: waiting to pop (queues), to be signalled (condvar)
  std::vector<uint64_t> push_waiters;  // sized_queue: waiting to push
  bool lists_complete = true;          // false: a list was unreadable, or all lists were longer than the threads
                                       // + 64 (each thread waits in one at a time)
  uint64_t monitor_mutex = 0;          // monitor: the Mutex it locks (VALUE; 0 unreadable)
  uint64_t owner_fiber = 0;            // monitor: that Mutex's owning fiber (0: not owned or unreadable)
};

struct DumpSnapshot {
  int pid = 0;
  std::string ruby_version;
  std::vector<DumpedThread> threads;
  std::optional<size_t> gvl_holder;  // index into threads
  std::vector<size_t> gvl_waiters;   // indexes, queue order (the next to run first)
  uint32_t gvl_waiting_count = 0;    // the VM's count of queued threads
  // Cycles of threads each waiting for the next (a Mutex it owns, a thread it joins): indexes, each cycle starting at
  // its lowest native tid.
  std::vector<std::vector<size_t>> deadlocks;
  std::vector<WaitObject> wait_objects;  // each one once, in the order of their first waiting thread
  int attempts = 0;     // whole readings taken (more than one: the thread list changed under the first)
  bool torn = false;    // the thread list still changed during the last attempt
  std::vector<std::string> notes;  // what could not be read, one line each
};

// How the reader gets what it does not read itself: a thread's stack (the host walker over its EC and the symbolizer,
// in production; canned frames in tests) and a String's bytes.
struct StackReading {
  std::vector<FrameInfo> frames;
  bool complete = true;
};
struct DumpReadHooks {
  std::function<StackReading(uint64_t ec)> stack;
  std::function<std::optional<std::string>(uint64_t value)> string;  // a T_STRING (nullopt: not one)
};

inline constexpr size_t kMaxDumpThreads = 65536;
inline constexpr size_t kMaxDumpRactors = 4096;
inline constexpr int kMaxDumpAttempts = 5;
inline constexpr int kMaxThreadRereads = 3;
// Joiners listed per thread (a longer join list is cut there).
inline constexpr size_t kMaxJoinersPerThread = 1024;

// Where the reader starts (runtime addresses): ruby_current_vm_ptr (exported by most builds), else
// ruby_single_main_ractor (found in rb_thread_main's code for a binary that does not export the VM pointer; it names
// the main ractor only while the process has no other).
struct VmRoots {
  uint64_t vm_ptr_addr = 0;
  uint64_t main_ractor_ptr_addr = 0;
  // What vm_ptr_addr is, for messages: the exported symbol, or the global a function's code reads
  // (dump/dump_vm_route.h). from_code: not exported, so what it holds must pass the main thread's type check.
  std::string vm_ptr_source = "ruby_current_vm_ptr";
  bool vm_ptr_from_code = false;
};

// Reads every thread of the VM. Errors: kNoSymbols when the VM pointer, the main ractor or a thread list does not
// hold what the layout says (one line naming the step); native tids, task states and io facts are left for the
// caller (ns_tid is filled, native_tid = ns_tid).
Result<DumpSnapshot> ReadRubyThreads(MemoryReader& mem, const DumpLayout& layout, const VmRoots& roots,
                                     const DumpReadHooks& hooks);

// The data pointer of the typed-data object `obj` (a heap T_DATA object, typed, whose rb_data_type_t is named `type`;
// for an embedded one, the address of its data inside the object). nullopt when it is not one, or unreadable.
std::optional<uint64_t> TypedDataOf(MemoryReader& mem, const DumpLayout& layout, uint64_t obj, std::string_view type);

// Why the rb_thread_t at `th` is not a Ruby thread: its `self` is not a "VM/thread" object whose data is `th`.
// nullopt when it is one, or when the layout does not know where `self` is.
std::optional<std::string> ThreadObjectMismatch(MemoryReader& mem, const DumpLayout& layout, uint64_t th);

// The owning fiber of the Thread::Mutex object `obj`, checked: a heap T_DATA object of the typed-data kind whose type
// is named "mutex". nullopt when it is not one, or unreadable; 0 when the Mutex is unlocked.
std::optional<uint64_t> ReadMutexOwnerFiber(MemoryReader& mem, const DumpLayout& layout, uint64_t obj);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_DUMP_DUMP_READER_H_
