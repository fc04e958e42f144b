#include "dump/dump_reader.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <map>
#include <utility>

#include "common/hex.h"
#include "stacks/ec_route.h"

namespace rvbpfd {
namespace {

constexpr uint32_t kNo = DumpLayout::kNoField;
constexpr uint64_t kRubyTData = 0x0c;   // T_DATA
constexpr uint64_t kRubyTMask = 0x1f;   // T_MASK
constexpr uint64_t kLowestObject = 0x1000;

bool Known(uint32_t field) { return field != kNo; }

// A VALUE that can be a heap object: aligned and above the special constants.
bool HeapObject(uint64_t v) { return v >= kLowestObject && (v & 7) == 0; }

// The header of a typed-data object: the address of its type's name and its data pointer (the address of its data
// inside the object, for an embedded one). nullopt when `obj` is not a heap T_DATA object of the typed kind.
struct TypedHeader {
  uint64_t name_ptr = 0;
  uint64_t data = 0;
};
std::optional<TypedHeader> ReadTypedHeader(MemoryReader& mem, const DumpLayout& l, uint64_t obj) {
  if (!HeapObject(obj) || !Known(l.typed_type) || !Known(l.typed_data)) return std::nullopt;
  uint64_t flags = 0, type_ptr = 0, tflag = 0;
  if (!mem.ReadValue(obj, &flags) || (flags & kRubyTMask) != kRubyTData) return std::nullopt;
  if (!mem.ReadValue(obj + l.typed_type, &type_ptr)) return std::nullopt;
  // 3.3/3.4 keep "typed, embedded" in typed_flag (1, | 2); later versions in the low bits of the type pointer.
  if (Known(l.typed_flag)) {
    if (!mem.ReadValue(obj + l.typed_flag, &tflag)) return std::nullopt;
  } else {
    tflag = type_ptr & 3;
  }
  if ((tflag & 1) == 0 || tflag > 3) return std::nullopt;
  TypedHeader h;
  // rb_data_type_t starts with wrap_struct_name.
  if (!mem.ReadValue(type_ptr & ~uint64_t{3}, &h.name_ptr)) return std::nullopt;
  h.data = obj + l.typed_data;
  if ((tflag & 2) == 0 && (!mem.ReadValue(obj + l.typed_data, &h.data) || h.data == 0)) return std::nullopt;
  return h;
}

// Whether the C string at name_ptr is `type` (compared with its NUL).
bool TypeNameIs(MemoryReader& mem, uint64_t name_ptr, std::string_view type) {
  char name[32] = {};
  if (type.size() >= sizeof(name) || !mem.Read(name_ptr, name, type.size() + 1)) return false;
  return name[type.size()] == '\0' && std::string_view(name, type.size()) == type;
}

struct ListedThread {
  uint64_t ractor = 0;
  uint64_t th = 0;
  bool operator==(const ListedThread&) const = default;
};

// The nodes of the ccan_list_head at `head` (its links' addresses), at most `limit` of them; false when a link is
// unreadable, NULL, or the list goes on past the limit (a list changing under the walk, or not a list at all).
bool ListNodes(MemoryReader& mem, uint64_t head, size_t limit, std::vector<uint64_t>* nodes) {
  nodes->clear();
  uint64_t node = 0;
  if (!mem.ReadValue(head, &node)) return false;
  while (node != head) {
    if (node == 0 || nodes->size() >= limit) return false;
    nodes->push_back(node);
    if (!mem.ReadValue(node, &node)) return false;
  }
  return true;
}

// The ractors of the VM: its ractor list when the layout has it, else the main ractor alone.
Result<std::vector<uint64_t>> ReadRactors(MemoryReader& mem, const DumpLayout& l, const VmRoots& roots) {
  uint64_t vm = 0, main_ractor = 0;
  if (roots.vm_ptr_addr != 0) {
    if (!mem.ReadValue(roots.vm_ptr_addr, &vm) || vm == 0) {
      return Error(ErrorCode::kNoSymbols,
                   "reading " + roots.vm_ptr_source + " failed (or it is NULL: the VM is not set up)");
    }
    if (!mem.ReadValue(vm + l.vm_main_ractor, &main_ractor) || main_ractor == 0) {
      return Error(ErrorCode::kNoSymbols, "reading the VM's main ractor (vm->ractor.main_ractor) failed: the VM is "
                                          "not set up yet, or its layout is not the one this binary was analysed for");
    }
  } else if (!mem.ReadValue(roots.main_ractor_ptr_addr, &main_ractor) || main_ractor == 0) {
    return Error(ErrorCode::kNoSymbols, "reading ruby_single_main_ractor failed (or it is NULL: the VM is not set "
                                        "up, or the process runs several ractors, which needs ruby_current_vm_ptr)");
  }
  std::vector<uint64_t> ractors;
  if (vm != 0 && Known(l.vm_ractor_set) && Known(l.ractor_vmlr_node)) {
    std::vector<uint64_t> nodes;
    if (ListNodes(mem, vm + l.vm_ractor_set, kMaxDumpRactors, &nodes)) {
      for (uint64_t n : nodes) ractors.push_back(n - l.ractor_vmlr_node);
    }
  }
  if (std::find(ractors.begin(), ractors.end(), main_ractor) == ractors.end()) {
    ractors.insert(ractors.begin(), main_ractor);
  } else {
    std::erase(ractors, main_ractor);
    ractors.insert(ractors.begin(), main_ractor);  // the main ractor's threads first: its main thread is thread 1
  }
  return ractors;
}

// Every thread of every ractor, checked: a node's thread points back at its ractor (when the layout knows where).
Result<std::vector<ListedThread>> ReadThreadList(MemoryReader& mem, const DumpLayout& l, const VmRoots& roots) {
  Result<std::vector<uint64_t>> ractors = ReadRactors(mem, l, roots);
  if (!ractors) return ractors.error();
  std::vector<ListedThread> out;
  for (uint64_t r : *ractors) {
    uint32_t cnt = 0;
    size_t limit = kMaxDumpThreads - std::min(out.size(), kMaxDumpThreads);
    if (Known(l.ractor_threads_cnt) && mem.ReadValue(r + l.ractor_threads_cnt, &cnt)) {
      limit = std::min<size_t>(limit, cnt + size_t{1});  // one more: a thread added meanwhile is a torn read
    }
    std::vector<uint64_t> nodes;
    if (!ListNodes(mem, r + l.ractor_threads_set, limit, &nodes)) {
      if (r == ractors->front()) {
        return Error(ErrorCode::kNoSymbols, "reading the main ractor's thread list failed (a link is unreadable or "
                                            "the list is longer than its count)");
      }
      continue;  // another ractor being torn down: its threads are gone
    }
    for (uint64_t n : nodes) {
      const uint64_t th = n - l.th_lt_node;
      uint64_t back = 0;
      if (Known(l.th_ractor) && (!mem.ReadValue(th + l.th_ractor, &back) || back != r)) {
        return Error(ErrorCode::kNoSymbols, "a thread of the ractor list does not point back at its ractor: the "
                                            "VM's layout is not the one this binary was analysed for");
      }
      out.push_back({r, th});
    }
  }
  return out;
}

// The fields of one thread that change as it runs: what a second reading compares.
struct Moving {
  uint64_t cfp = 0;
  uint8_t status = 0xff;
  bool operator==(const Moving&) const = default;
};

Moving ReadMoving(MemoryReader& mem, const DumpLayout& l, uint64_t th, uint64_t ec) {
  Moving m;
  if (ec != 0 && Known(l.ec_cfp)) mem.ReadValue(ec + l.ec_cfp, &m.cfp);
  if (Known(l.th_status_bit)) {
    uint8_t byte = 0;
    if (mem.ReadValue(th + l.th_status_bit / 8, &byte)) m.status = (byte >> (l.th_status_bit % 8)) & 3;
  }
  return m;
}

std::vector<uint64_t> ReadJoiners(MemoryReader& mem, const DumpLayout& l, uint64_t th) {
  std::vector<uint64_t> out;
  if (!Known(l.th_join_list) || !Known(l.waiting_next) || !Known(l.waiting_thread)) return out;
  uint64_t w = 0;
  if (!mem.ReadValue(th + l.th_join_list, &w)) return out;
  while (w != 0 && out.size() < kMaxJoinersPerThread) {
    uint64_t joiner = 0, next = 0;
    if (!mem.ReadValue(w + l.waiting_thread, &joiner) || !mem.ReadValue(w + l.waiting_next, &next)) break;
    if (joiner != 0) out.push_back(joiner);
    w = next;
  }
  return out;
}

// The typed-data types a thread can wait on that the dump lists with their waiters.
constexpr std::string_view kWaitTypes[] = {"queue", "sized_queue", "condvar", "monitor"};
// Top frames searched for one (the leaf is the blocking method, or Mutex#sleep under ConditionVariable#wait, itself
// under Monitor#wait_for_cond).
constexpr size_t kWaitFrames = 4;

// The first of the thread's top control frames (at most `frames` of them) whose receiver is of a kWaitTypes type.
void FindWaitObject(MemoryReader& mem, const DumpLayout& l, uint64_t ec, size_t frames, DumpedThread* t) {
  if (!Known(l.cfp_self) || !Known(l.cfp_size) || !Known(l.ec_cfp) || ec == 0) return;
  uint64_t cfp = 0;
  if (!mem.ReadValue(ec + l.ec_cfp, &cfp) || cfp == 0) return;
  for (size_t i = 0; i < std::min(frames, kWaitFrames); i++, cfp += l.cfp_size) {
    uint64_t self = 0;
    if (!mem.ReadValue(cfp + l.cfp_self, &self)) return;
    std::optional<TypedHeader> h = ReadTypedHeader(mem, l, self);
    if (!h) continue;
    for (std::string_view type : kWaitTypes) {
      if (!TypeNameIs(mem, h->name_ptr, type)) continue;
      t->wait_object = self;
      t->wait_type = std::string(type);
      t->wait_data = h->data;
      return;
    }
  }
}

// The threads (rb_thread_t *) of the sync_waiter list at `head`, in list order, reading at most *budget nodes (and
// taking those read from it); false when it could not be read whole within that (a waiter's thread that cannot be
// read is skipped, not an error).
bool ReadWaiters(MemoryReader& mem, const DumpLayout& l, uint64_t head, size_t* budget, std::vector<uint64_t>* out) {
  std::vector<uint64_t> nodes;
  const bool whole = ListNodes(mem, head, *budget, &nodes);
  *budget -= std::min(*budget, nodes.size());
  if (!whole) return false;
  for (uint64_t n : nodes) {
    uint64_t th = 0;
    if (mem.ReadValue(n - l.waiter_node + l.waiter_th, &th) && th != 0) out->push_back(th);
  }
  return true;
}

// Each distinct object the threads wait on, with its wait lists (queues, condvars) or its Mutex's owner (monitors).
void ReadWaitObjects(MemoryReader& mem, const DumpLayout& l, DumpSnapshot* snap) {
  const bool lists = Known(l.waiter_th) && Known(l.waiter_node);
  // A thread waits in one list at a time: all lists together hold at most every thread (a few more for threads
  // that began to wait during the reading). The bound keeps lists a hostile process links in circles from costing
  // more than that.
  size_t budget = snap->threads.size() + 64;
  for (const DumpedThread& t : snap->threads) {
    if (t.wait_object == 0) continue;
    auto& objs = snap->wait_objects;
    if (std::any_of(objs.begin(), objs.end(), [&](const WaitObject& o) { return o.object == t.wait_object; })) {
      continue;
    }
    WaitObject o{.object = t.wait_object, .type = t.wait_type};
    if (t.wait_type == "monitor") {
      if (Known(l.monitor_mutex) && mem.ReadValue(t.wait_data + l.monitor_mutex, &o.monitor_mutex)) {
        o.owner_fiber = ReadMutexOwnerFiber(mem, l, o.monitor_mutex).value_or(0);
      }
    } else if (!lists) {
      o.lists_complete = false;
    } else {
      const uint32_t waitq = t.wait_type == "condvar" ? l.condvar_waitq : l.queue_waitq;
      if (!Known(waitq) || !ReadWaiters(mem, l, t.wait_data + waitq, &budget, &o.waiters)) o.lists_complete = false;
      if (t.wait_type == "sized_queue" && (!Known(l.szqueue_pushq) ||
                                           !ReadWaiters(mem, l, t.wait_data + l.szqueue_pushq, &budget,
                                                        &o.push_waiters))) {
        o.lists_complete = false;
      }
    }
    objs.push_back(std::move(o));
  }
}

// One thread's own part of the reading; its stack is taken again while it moves (kMaxThreadRereads).
DumpedThread ReadThread(MemoryReader& mem, const DumpLayout& l, uint64_t th, const DumpReadHooks& hooks) {
  DumpedThread t;
  t.th = th;
  uint64_t nt = 0, ec = 0;
  int32_t tid = 0;
  if (mem.ReadValue(th + l.th_nt, &nt) && nt != 0 && mem.ReadValue(nt + l.nt_tid, &tid) && tid > 0) {
    t.ns_tid = tid;
    t.native_tid = tid;
  }
  mem.ReadValue(th + l.th_ec, &ec);
  if (ec != 0 && Known(l.ec_thread_ptr)) {
    uint64_t back = 0;
    if (!mem.ReadValue(ec + l.ec_thread_ptr, &back) || back != th) ec = 0;  // not this thread's EC (yet)
  }
  if (ec != 0 && Known(l.ec_fiber_ptr)) mem.ReadValue(ec + l.ec_fiber_ptr, &t.fiber);
  uint64_t name = 0;
  if (Known(l.th_name) && mem.ReadValue(th + l.th_name, &name) && HeapObject(name) && hooks.string) {
    t.name = hooks.string(name);
  }
  for (int attempt = 0; attempt < kMaxThreadRereads; attempt++) {
    const Moving before = ReadMoving(mem, l, th, ec);
    StackReading s;
    if (ec != 0 && hooks.stack) s = hooks.stack(ec);
    uint64_t locking = 0;
    if (Known(l.th_locking_mutex)) mem.ReadValue(th + l.th_locking_mutex, &locking);
    const Moving after = ReadMoving(mem, l, th, ec);
    t.frames = std::move(s.frames);
    t.stack_complete = s.complete && ec != 0;
    t.locking_mutex = HeapObject(locking) ? locking : 0;
    if (after.status <= 3) t.status = static_cast<RubyThreadStatus>(after.status);
    t.changed = !(before == after);
    if (!t.changed) break;
  }
  if (t.locking_mutex != 0) {
    std::optional<uint64_t> owner = ReadMutexOwnerFiber(mem, l, t.locking_mutex);
    if (owner) {
      t.mutex_owner_fiber = *owner;
    } else {
      t.locking_mutex = 0;  // not a Mutex after all (a torn value): nothing to report
    }
  }
  t.joined_by = ReadJoiners(mem, l, th);
  if (!t.status || t.status == RubyThreadStatus::kStopped || t.status == RubyThreadStatus::kStoppedForever) {
    FindWaitObject(mem, l, ec, t.frames.size(), &t);
  }
  return t;
}

// The GVL's holder and queue of each ractor (its first thread stands for it), as indexes into `threads`.
void ReadGvl(MemoryReader& mem, const DumpLayout& l, uint64_t vm_ptr_addr, const std::vector<ListedThread>& listed,
             DumpSnapshot* snap) {
  if (l.gvl.base == RV_GVL_BASE_NONE) {
    snap->notes.push_back("the GVL's holder and queue are not known for this VM binary");
    return;
  }
  std::map<uint64_t, size_t> index;
  for (size_t i = 0; i < snap->threads.size(); i++) index[snap->threads[i].th] = i;
  std::vector<uint64_t> done;
  for (const ListedThread& lt : listed) {
    if (std::find(done.begin(), done.end(), lt.ractor) != done.end()) continue;
    done.push_back(lt.ractor);
    std::optional<rv_gvl_reading> g = ReadGvlForThread(mem, l.gvl, vm_ptr_addr, lt.th);
    if (!g) {
      snap->notes.push_back("the GVL of a ractor could not be read");
      continue;
    }
    if (auto it = index.find(g->holder); it != index.end()) {
      snap->threads[it->second].holds_gvl = true;
      if (lt.ractor == listed.front().ractor) snap->gvl_holder = it->second;
    }
    for (uint32_t i = 0; i < g->nqueued && i < RV_GVL_MAX_QUEUED; i++) {
      auto it = index.find(g->queued[i]);
      if (it == index.end()) continue;
      snap->threads[it->second].gvl_queue_position = static_cast<int>(i);
      if (lt.ractor == listed.front().ractor) snap->gvl_waiters.push_back(it->second);
    }
    if (lt.ractor == listed.front().ractor) snap->gvl_waiting_count = g->waiting;
    if (g->flags & RV_GVL_F_QUEUE_TRUNCATED) {
      snap->notes.push_back("the GVL queue is longer than " + std::to_string(RV_GVL_MAX_QUEUED) +
                            " threads: the first are named");
    }
  }
}

}  // namespace


std::optional<uint64_t> TypedDataOf(MemoryReader& mem, const DumpLayout& l, uint64_t obj, std::string_view type) {
  std::optional<TypedHeader> h = ReadTypedHeader(mem, l, obj);
  if (!h || !TypeNameIs(mem, h->name_ptr, type)) return std::nullopt;
  return h->data;
}

std::optional<uint64_t> ReadMutexOwnerFiber(MemoryReader& mem, const DumpLayout& l, uint64_t obj) {
  if (!Known(l.mutex_fiber)) return std::nullopt;
  std::optional<uint64_t> data = TypedDataOf(mem, l, obj, "mutex");
  uint64_t fiber = 0;
  if (!data || !mem.ReadValue(*data + l.mutex_fiber, &fiber)) return std::nullopt;
  return fiber;
}

std::optional<std::string> ThreadObjectMismatch(MemoryReader& mem, const DumpLayout& l, uint64_t th) {
  if (!Known(l.th_self)) return std::nullopt;
  uint64_t self = 0;
  if (!mem.ReadValue(th + l.th_self, &self)) return "its self field is unreadable";
  if (self == 0) return "it has no Thread object yet: the VM is still starting, or this is not the VM";
  std::optional<uint64_t> data = TypedDataOf(mem, l, self, "VM/thread");
  if (!data) return "its self (" + Hex(self) + ") is not a Thread object";
  if (*data != th) return "its Thread object (" + Hex(self) + ") belongs to another thread";
  return std::nullopt;
}

namespace {

// The type check of where the reading started: the main ractor's first thread (its main thread) must be a Ruby
// thread, its `self` a Thread object whose data is that thread. A VM pointer recovered from code (not exported) must
// also show at least that one thread.
Status CheckMainThread(MemoryReader& mem, const DumpLayout& l, const VmRoots& roots,
                       const std::vector<ListedThread>& listed) {
  const std::string root = roots.vm_ptr_addr != 0 ? roots.vm_ptr_source : "ruby_single_main_ractor";
  if (listed.empty()) {
    if (!roots.vm_ptr_from_code) return Status::Ok();
    return Error(ErrorCode::kNoSymbols, "the main ractor read through " + root + " lists no thread: it does not "
                                        "look like the VM, refusing to guess");
  }
  if (std::optional<std::string> why = ThreadObjectMismatch(mem, l, listed.front().th)) {
    return Error(ErrorCode::kNoSymbols, "the first thread of the main ractor read through " + root +
                                            " is not a Ruby thread (" + *why + "): it does not hold the VM of the "
                                            "layout this binary was analysed for");
  }
  return Status::Ok();
}

}  // namespace

Result<DumpSnapshot> ReadRubyThreads(MemoryReader& mem, const DumpLayout& l, const VmRoots& roots,
                                     const DumpReadHooks& hooks) {
  DumpSnapshot snap;
  for (int attempt = 1; attempt <= kMaxDumpAttempts; attempt++) {
    Result<std::vector<ListedThread>> before = ReadThreadList(mem, l, roots);
    if (!before) return before.error();
    if (attempt == 1) {
      if (Status s = CheckMainThread(mem, l, roots, *before); !s.ok()) return s.error();
    }
    snap = DumpSnapshot{};
    snap.attempts = attempt;
    for (size_t i = 0; i < before->size(); i++) {
      DumpedThread t = ReadThread(mem, l, (*before)[i].th, hooks);
      t.ruby_thread = static_cast<int>(i + 1);
      snap.threads.push_back(std::move(t));
    }
    ReadGvl(mem, l, roots.vm_ptr_addr, *before, &snap);
    ReadWaitObjects(mem, l, &snap);
    Result<std::vector<ListedThread>> after = ReadThreadList(mem, l, roots);
    snap.torn = !after || *after != *before;
    if (!snap.torn) break;
  }
  for (const auto& [field, what] : {std::pair{l.th_status_bit, "thread statuses (every thread neither holding nor "
                                                                "queued for the GVL counts as blocked)"},
                                     std::pair{l.th_name, "thread names"},
                                     std::pair{l.th_locking_mutex, "the Mutex a thread waits for"},
                                     std::pair{l.th_join_list, "Thread#join targets"},
                                     std::pair{l.ractor_vmlr_node, "ractors other than the main one"}}) {
    if (!Known(field)) snap.notes.push_back(std::string("not read (no DWARF for it): ") + what);
  }
  if (snap.torn) {
    snap.notes.push_back("the thread list changed during each of " + std::to_string(kMaxDumpAttempts) +
                         " readings: the last one is shown");
  }
  return snap;
}

}  // namespace rvbpfd
