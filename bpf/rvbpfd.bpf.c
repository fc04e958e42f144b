// SPDX-License-Identifier: GPL-2.0
/* rvbpfd's probes: one program, attached at every probe site of a CRuby VM binary (its thread-event hook sites, GC
 * hook sites, Kernel#sleep and Mutex#lock entries). The site's BPF cookie indexes `sites`, which userspace filled
 * with the event and where `th` lives at that instruction; the program has no Ruby-version knowledge of its own.
 *
 * Cost model: each hit is one int3 trap, ~0.75 us here where the kernel emulates the probed instruction (userspace
 * puts the probes there: sites/placement.h), ~9.5 us where it single-steps it; the work below (a few map lookups, two
 * user reads, the ring write) adds ~0.6 us, and never blocks: a full ring buffer bumps a per-CPU drop counter. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "regs.bpf.h"
#include "ruby_stack.bpf.h"
#include "subprogs.bpf.h"
#include "rvbpfd/abi.h"

char LICENSE[] SEC("license") = "GPL";

/* Size is set by userspace before load (--ring-buffer-kb); a power of two multiple of the page size. */
struct {
  __uint(type, BPF_MAP_TYPE_RINGBUF);
  __uint(max_entries, 1 << 22);
} events SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, RV_MAX_SITES);
  __type(key, __u32);
  __type(value, struct rv_site);
} sites SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, RV_MAX_BINARIES);
  __type(key, __u32);
  __type(value, struct rv_offsets);
} offsets SEC(".maps");

/* Processes being recorded (host tgid -> rv_target). The uprobes live on the VM's file, shared by every process
 * mapping it, so this filter is what keeps other processes' events out. */
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, RV_MAX_TARGETS);
  __type(key, __u32);
  __type(value, struct rv_target);
} target_pids SEC(".maps");

/* Each recorded process's uprobe hits so far, at its rv_target.slot: its trap bill (the fleet agent's --max-overhead
 * is per process, and records undercount traps). Mmapable: the agent reads every process's count 5 times a second
 * from the shared pages, with no syscall and no walk of target_pids' buckets. */
struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, RV_MAX_TARGETS);
  __uint(map_flags, BPF_F_MMAPABLE);
  __type(key, __u32);
  __type(value, struct rv_pid_traps);
} pid_traps SEC(".maps");

/* Threads of targets in their own pid namespace (rv_target.pidns): (host tgid, namespace tid) -> host tid. The VM
 * names the subject of a STARTED/READY by the tid it sees in its namespace (rb_native_thread.tid); this is how such
 * an event fired on another thread gets the subject's host tid. Filled by every hit a thread of such a target takes
 * on itself (and by userspace, for the threads that exist when it adds the process); an EXITED on the thread removes
 * its entry, since the namespace may give the tid to a new thread once this one is gone. Never used for targets in
 * the host's namespace. */
struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, 65536);
  __type(key, struct rv_ns_tid_key);
  __type(value, __u32);
} ns_tids SEC(".maps");

/* When a target process last trapped on this CPU (CLOCK_MONOTONIC ns): a hit long after the previous one on the
 * same CPU finds the trap path out of the caches (rv_config.cold_gap_ns). Per CPU because caches are. */
struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, __u64);
} last_trap SEC(".maps");

/* What the programs remember of a native thread between its events, one entry per native tid, read and written in
 * place (a lookup, rather than an LRU update's element allocation, on most hits). */
struct rv_native_thread {
  /* The rb_thread_t * it last ran. Set at every event whose th is known and which runs on the thread itself; read at
   * sites where DWARF says th is optimized out (those events always concern the current thread) and by samples
   * whose EC has no other route. 0: none seen yet. */
  __u64 th;
  __u32 bin;  /* which VM binary that th runs (index into offsets / walk_config): samples have no site to say */
  __u8 in_gc; /* 1 between GC_ENTER and GC_EXIT: samples there get the GC pseudo-frame */
  __u8 pad[3];
};

struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, 65536);
  __type(key, __u32);
  __type(value, struct rv_native_thread);
} native_threads SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct rv_counters);
} counters SEC(".maps");

/* Events lost to a full ring so far, one count for all CPUs (rv_counters.dropped says the same per CPU). The map is
 * mmapable: the daemon checks it at every poll by reading its shared page, where reading the per-CPU counters would
 * cost a syscall per poll. An atomic add per drop, which is rare. */
struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 1);
  __uint(map_flags, BPF_F_MMAPABLE);
  __type(key, __u32);
  __type(value, __u64);
} drop_count SEC(".maps");

/* Launch mode's held process (rvbpfd/abi.h struct rv_held), written by userspace (the pid) and by stack output. */
struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct rv_held);
} held SEC(".maps");

/* Counts one lost event in c (when there is one) and in drop_count. */
static __always_inline void rv_count_drop(struct rv_counters *c) {
  __u32 zero = 0;
  __u64 *total = bpf_map_lookup_elem(&drop_count, &zero);
  if (c) c->dropped++;
  if (total) __sync_fetch_and_add(total, 1);
}

/* Probe hits per site (cookie -> hits, per CPU), including hits that are discarded: the daemon sums them per attach
 * group to see which sites cost the target its traps (OverheadBudget). One per-CPU increment per hit. */
struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, RV_MAX_SITES);
  __type(key, __u32);
  __type(value, __u64);
} site_hits SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, RV_MAX_BINARIES);
  __type(key, __u32);
  __type(value, struct rv_walk_config);
} walk_config SEC(".maps");

/* Set by userspace through the skeleton's rodata before load (rv_config says what each switch does); read-only once
 * loaded, so the verifier knows every value and removes the branches a run switches off. */
const volatile struct rv_config rv_cfg = {};
/* The kernel's task_struct field offsets, set the same way (rv_kernel_layout says why they are not CO-RE reads). */
const volatile struct rv_kernel_layout rv_kernel = {};

/* How samples of a process find their EC (host tgid -> rv_proc_ec), filled by userspace once the VM is mapped and
 * relocated in that process (bpf/ruby_ec.h). A process without an entry uses only native_threads' th. */
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, RV_MAX_TARGETS);
  __type(key, __u32);
  __type(value, struct rv_proc_ec);
} proc_ec SEC(".maps");

/* Two 128 KiB stack-record slots per CPU (a PERCPU_ARRAY value is limited to 32 KiB, so this is a plain array; userspace
 * sets max_entries to 2 x possible CPUs): slot 2*cpu for uprobes, 2*cpu+1 for samples. The perf_event program runs
 * from the timer interrupt and can interrupt a uprobe program in the middle of its walk on the same CPU (uprobe
 * programs do not take the bpf_prog_active guard that perf_event programs check), so the two must not share a slot;
 * neither nests with itself. A slot is sized for the larger entry, a sample's with its GVL reading; uprobes use it as
 * a struct rv_stack_record. */
struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct rv_sample_record);
} stack_scratch SEC(".maps");

/* Native thread tid's entry, created empty when it has none; NULL only when the map refuses the insert. */
static __always_inline struct rv_native_thread *rv_native_thread_of(__u32 tid) {
  struct rv_native_thread *nt = bpf_map_lookup_elem(&native_threads, &tid);
  if (nt) return nt;
  struct rv_native_thread empty = {};
  bpf_map_update_elem(&native_threads, &tid, &empty, BPF_NOEXIST);
  return bpf_map_lookup_elem(&native_threads, &tid);
}

/* Fills the fixed part every ring entry starts with. */
static __always_inline void rv_fill_record(struct rv_record *r, __u64 ts, __u64 th, __u32 serial, __u32 tid,
                                           __u32 probe_tid, __u32 pid, __u16 kind, __u16 site, __u32 flags) {
  r->ts_ns = ts;
  r->th = th;
  r->serial = serial;
  r->tid = tid;
  r->probe_tid = probe_tid;
  r->pid = pid;
  r->kind = kind;
  r->site = site;
  r->flags = flags;
}

/* Submits a reserved single record, counted in events. No wakeup per record: waking the daemon's epoll costs an
 * irq_work per event, a large share of the probe's cost at high rates. The daemon polls every few ms anyway; it is
 * woken only once the ring is a quarter full, which leaves it room to drain before anything is dropped. */
static __always_inline void rv_submit_record(struct rv_record *r, struct rv_counters *c) {
  __u64 avail = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA); /* unconsumed bytes, this record included */
  __u64 size = bpf_ringbuf_query(&events, BPF_RB_RING_SIZE);
  bpf_ringbuf_submit(r, avail >= size / 4 ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP);
  if (c) {
    c->events++;
    if (avail > c->ring_high_water) c->ring_high_water = avail;
  }
}

/* Submits a stack entry (record [+ GVL reading] + header + frames, `size` bytes) from the scratch slot `s`. Events
 * count in events/dropped like single records; samples in their own counters, so a lost sample is never reported as a
 * lost event. `fresh`: the stack holds a frame the daemon has not been woken for (seen_frames): wake it now. */
static __always_inline void rv_output_stack(void *s, __u32 size, int is_sample, __u32 fresh) {
  __u32 zero = 0;
  struct rv_counters *c = bpf_map_lookup_elem(&counters, &zero);
  __u64 avail = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA);
  __u64 ring = bpf_ringbuf_query(&events, BPF_RB_RING_SIZE);
  if (size > sizeof(struct rv_sample_record)) size = sizeof(struct rv_sample_record);
  /* Same wakeup rule as single records (rv_submit_record), and at once for a stack with a new frame. */
  __u64 wake = fresh || avail + size >= ring / 4 ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
  if (bpf_ringbuf_output(&events, s, size, wake) != 0) {
    if (!is_sample) rv_count_drop(c);
    else if (c) c->samples_dropped++;
    return;
  }
  if (fresh) {
    struct rv_held *h = bpf_map_lookup_elem(&held, &zero);
    if (h) h->fresh_end = bpf_ringbuf_query(&events, BPF_RB_PROD_POS);
  }
  if (c) {
    if (is_sample) c->samples++;
    else c->events++;
    avail += size;
    if (avail > c->ring_high_water) c->ring_high_water = avail;
  }
}

/* Events that may run on a native thread other than the one they are about (3.3+: STARTED on the creator, READY on
 * a waker or the timer thread). For these the tid comes from th->nt->tid (a namespace tid in a target with its own pid
 * namespace, translated through ns_tids). */
static __always_inline int rv_maybe_foreign(__u8 event) {
  return event == RV_EV_THREAD_STARTED || event == RV_EV_THREAD_READY;
}

/* The current task's tid in the target's pid namespace (rv_pidns set), 0 when the kernel cannot say: the tid the
 * VM knows this thread by. One helper call, made only for targets in their own pid namespace. */
static __always_inline __u32 rv_ns_tid(const struct rv_pidns *ns) {
  struct bpf_pidns_info info = {};
  if (bpf_get_ns_current_pid_tgid(ns->dev, ns->ino, &info, sizeof(info)) != 0) return 0;
  return info.pid;
}

/* Keeps ns_tids' entry of the current thread (namespace tid ns_tid, host tid tid) current; an EXITED removes it. A
 * lookup per hit; the map is written only when the entry is missing or names another host tid. */
static __always_inline void rv_note_ns_tid(__u32 tgid, __u32 ns_tid, __u32 tid, __u8 event) {
  struct rv_ns_tid_key k = {.tgid = tgid, .ns_tid = ns_tid};
  if (ns_tid == 0) return;
  if (event == RV_EV_THREAD_EXITED) {
    bpf_map_delete_elem(&ns_tids, &k);
    return;
  }
  __u32 *known = bpf_map_lookup_elem(&ns_tids, &k);
  if (!known || *known != tid) bpf_map_update_elem(&ns_tids, &k, &tid, BPF_ANY);
}

/* A READY of thread th (binary bin, process tgid): when another thread holds the GVL of th's VM, writes the READY as
 * a struct rv_holder_record with the holder and the holder's stack, walked from holder->ec, and returns 1; returns 0
 * (nothing written, nothing walked) when the GVL is free or held by th, or the holder cannot be read. The walk is
 * charged to the target like any stack walk. */
static __always_inline int rv_output_holder(__u32 bin, __u64 th, __u32 tgid, __u64 ts, __u32 serial, __u32 about_tid,
                                            __u32 tid, __u16 site, __u32 flags, struct rv_pid_traps *traps,
                                            struct rv_counters *c) {
  struct rv_walk_config *wc = bpf_map_lookup_elem(&walk_config, &bin);
  __u64 holder = 0, vm_ptr = 0, ec = 0;
  if (!wc || !wc->valid || wc->gvl.base == RV_GVL_BASE_NONE) return 0;
  if (wc->gvl.base == RV_GVL_BASE_VM) {
    struct rv_proc_ec *pe = bpf_map_lookup_elem(&proc_ec, &tgid);
    if (!pe) return 0;
    vm_ptr = pe->vm_ptr;
  }
  if (rv_read_gvl_holder_subprog(&wc->gvl, vm_ptr, th, &holder) != 0 || holder == 0 || holder == th) return 0;
  __u32 slot = bpf_get_smp_processor_id() * 2; /* the uprobes' slot */
  struct rv_holder_record *s = bpf_map_lookup_elem(&stack_scratch, &slot);
  if (!s) return 0;
  __u64 w0 = bpf_ktime_get_ns();
  rv_fill_record(&s->rec, ts, th, serial, about_tid, tid, tgid, RV_EV_THREAD_READY, site,
                 flags | RV_REC_HAS_STACK | RV_REC_HAS_HOLDER);
  s->holder.holder = holder;
  s->holder.flags = 0;
  s->holder.pad = 0;
  if (bpf_probe_read_user(&ec, sizeof(ec), (const void *)(unsigned long)(holder + wc->thread_ec)) != 0) ec = 0;
  __u32 fresh = 0; /* a holder frame not seen before wakes the daemon like any other stack's */
  const __u32 size = sizeof(struct rv_record) + sizeof(struct rv_holder_info) +
                     rv_walk_ec_stack_into(wc, ec, &s->hdr, s->frames, &fresh);
  rv_output_stack(s, size, 0, fresh);
  __u64 walk = bpf_ktime_get_ns() - w0; /* the target's time, like the trap: --max-overhead charges it */
  __sync_fetch_and_add(&traps->stack_ns, walk);
  if (c) {
    c->stack_ns += walk;
    c->holder_stacks++;
  }
  return 1;
}

/* A hit that becomes no record: the trap was paid all the same, so it is counted. */
static __always_inline int rv_discard(struct rv_counters *c) {
  if (c) c->hits_discarded++;
  return 0;
}

static __always_inline int rv_handle(struct pt_regs *ctx) {
  __u64 pid_tgid = bpf_get_current_pid_tgid();
  __u32 tgid = pid_tgid >> 32;
  __u32 tid = (__u32)pid_tgid;
  struct rv_target *target = bpf_map_lookup_elem(&target_pids, &tgid);
  if (!target) return 0;
  struct rv_pid_traps *traps = bpf_map_lookup_elem(&pid_traps, &target->slot);
  if (!traps) return 0; /* never: userspace gives slots below RV_MAX_TARGETS */

  /* Every hit past the pid filter is one trap the target paid for, whatever happens below: counted first, in total,
   * per site and per process (threads of one process trap on several CPUs at once: atomic), as cold when it is the
   * first on its CPU for cold_gap_ns, and as stepped at a single-stepped site (both cost more: see rv_config and
   * rv_site_flags). */
  __u32 zero = 0;
  int cold = 0;
  __u64 now = bpf_ktime_get_ns(); /* also the event's time, except at GC_EXIT (below) */
  __u64 *last = bpf_map_lookup_elem(&last_trap, &zero);
  if (last) {
    cold = rv_cfg.cold_gap_ns != 0 && now - *last >= rv_cfg.cold_gap_ns;
    *last = now;
  }
  __u32 key = (__u32)bpf_get_attach_cookie(ctx);
  struct rv_site *site = bpf_map_lookup_elem(&sites, &key);
  int stepped = site && (site->flags & RV_SITE_SINGLE_STEP);
  __sync_fetch_and_add(&traps->traps, 1);
  if (cold) __sync_fetch_and_add(&traps->cold, 1);
  if (stepped) __sync_fetch_and_add(&traps->stepped, 1);
  struct rv_counters *c = bpf_map_lookup_elem(&counters, &zero);
  if (c) {
    c->probe_hits++;
    if (cold) c->cold_hits++;
    if (stepped) c->stepped_hits++;
  }
  __u64 *site_hit = bpf_map_lookup_elem(&site_hits, &key);
  if (site_hit) (*site_hit)++;
  if (site && (site->flags & RV_SITE_TEARDOWN)) {
    /* Only the held process (the one rvbpfd traces, --hold) gets the signal: the tracer takes it off and drains the
     * ring before the VM frees its heap. A followed child or another process mapping the binary is not traced, so the
     * signal would reach it (and a handler it installed) for nothing. */
    struct rv_held *teardown_held = bpf_map_lookup_elem(&held, &zero);
    if (teardown_held && teardown_held->pid == (__u32)(bpf_get_current_pid_tgid() >> 32))
      bpf_send_signal_thread(RV_TEARDOWN_SIGNAL);
    return rv_discard(c);
  }
  if (!site || site->event == RV_EV_NONE) return rv_discard(c);
  __u32 bin = site->binary;
  struct rv_offsets *off = bpf_map_lookup_elem(&offsets, &bin);
  if (!off) return rv_discard(c);

  /* GC state for samples. Cleared before the event's time is read and set after it, so a sample that interrupts this
   * program is flagged only if its time lies inside [gc_enter, gc_exit] (a sample at the very edge loses the flag
   * rather than gaining a wrong one). */
  if (site->event == RV_EV_GC_EXIT) {
    struct rv_native_thread *nt = bpf_map_lookup_elem(&native_threads, &tid);
    if (nt) nt->in_gc = 0;
  }

  /* The event's time: the hit's, so neither the checks below nor a full ring skew it; read again at GC_EXIT, after
   * the GC flag is cleared (above). */
  __u64 ts = site->event == RV_EV_GC_EXIT ? bpf_ktime_get_ns() : now;
  __u64 th = 0;
  __u32 flags = 0;
  {
    if (site->exclude_caller_end != 0) {
      __u64 ret = 0;
      if (bpf_probe_read_user(&ret, sizeof(ret), (void *)ctx->sp) != 0) return rv_discard(c);
      __u64 caller = ret - (ctx->ip - site->vaddr); /* runtime address -> ELF vaddr */
      if (caller >= site->exclude_caller_start && caller < site->exclude_caller_end) return rv_discard(c);
    }
    __u64 reg = 0;
    switch (site->loc_kind) {
      case RV_LOC_REG:
        if (rv_reg_value(ctx, site->loc_reg, &reg) == 0) th = reg + (__s64)site->loc_offset;
        break;
      case RV_LOC_MEM: {
        if (rv_reg_value(ctx, site->loc_reg, &reg) != 0) break;
        __u64 addr = reg + (__s64)site->loc_offset;
        if (bpf_probe_read_user(&th, sizeof(th), (void *)addr) != 0) th = 0;
        break;
      }
      case RV_LOC_CURRENT: {
        struct rv_native_thread *nt = bpf_map_lookup_elem(&native_threads, &tid);
        if (nt) th = nt->th;
        break;
      }
      default:
        break;
    }
  }

  /* A target in its own pid namespace: the tids in its memory are that namespace's (rv_ns_tid). Host targets skip
   * all of this on the one flag test. */
  const int pidns = target->pidns.ino != 0;
  const __u32 ns_tid = pidns ? rv_ns_tid(&target->pidns) : 0;
  __u32 serial = 0;
  __u32 about_tid = tid;
  if (th == 0) {
    flags |= RV_REC_TH_UNKNOWN | RV_REC_SERIAL_UNKNOWN;
    /* Without th, a possibly-foreign event's subject tid is unknown; the others run on their own thread. */
    if (rv_maybe_foreign(site->event)) {
      about_tid = 0;
      flags |= RV_REC_TID_UNKNOWN;
    }
  } else {
    if (!(off->flags & RV_OFF_HAS_SERIAL) ||
        bpf_probe_read_user(&serial, sizeof(serial), (void *)(th + off->th_serial)) != 0) {
      flags |= RV_REC_SERIAL_UNKNOWN;
    }
    if (rv_maybe_foreign(site->event)) {
      __u64 nt = 0;
      __s32 nt_tid = 0;
      if (bpf_probe_read_user(&nt, sizeof(nt), (void *)(th + off->th_nt)) != 0 || nt == 0 ||
          bpf_probe_read_user(&nt_tid, sizeof(nt_tid), (void *)(nt + off->nt_tid)) != 0 || nt_tid <= 0) {
        about_tid = 0;
        flags |= RV_REC_TID_UNKNOWN;
      } else if (!pidns) {
        about_tid = (__u32)nt_tid;
      } else if (ns_tid != 0 && (__u32)nt_tid == ns_tid) {
        about_tid = tid; /* the thread itself */
      } else {
        /* Another thread (or the current one, when the kernel could not give its namespace tid): its host tid only if
         * one of its own hits (or userspace) recorded it; never the namespace tid. */
        struct rv_ns_tid_key k = {.tgid = tgid, .ns_tid = (__u32)nt_tid};
        __u32 *host = ns_tid != 0 ? bpf_map_lookup_elem(&ns_tids, &k) : 0;
        if (host && *host != 0) {
          about_tid = *host;
        } else {
          about_tid = 0;
          flags |= RV_REC_TID_UNKNOWN;
        }
      }
    }
    if (about_tid == tid && site->loc_kind != RV_LOC_CURRENT) {
      /* The event runs on the thread it is about: remember which th this native thread runs. */
      struct rv_native_thread *nt = rv_native_thread_of(tid);
      if (nt) {
        nt->th = th;
        nt->bin = bin;
      }
    }
  }
  /* Every event that certainly runs on its own thread teaches ns_tids this thread's pair: all but STARTED/READY,
   * and those when they named this thread. */
  if (pidns && about_tid == tid) {
    rv_note_ns_tid(tgid, ns_tid, tid, site->event);
  }
  if (site->event == RV_EV_GC_ENTER) {
    struct rv_native_thread *nt = rv_native_thread_of(tid);
    if (nt) nt->in_gc = 1;
    /* The held process waits, before this GC can free anything, until the daemon has named the stacks with new
     * frames already in the ring (rv_held). Only its main thread is traced: a GC run by another thread is not held. */
    struct rv_held *h = bpf_map_lookup_elem(&held, &zero);
    if (h && h->pid == tgid && tid == tgid && bpf_ringbuf_query(&events, BPF_RB_CONS_POS) < h->fresh_end)
      bpf_send_signal_thread(RV_TEARDOWN_SIGNAL);
  }

  /* A READY while another thread holds the GVL: the holder's stack goes with it (rv_holder_record), what the holder
   * runs when the wait begins. Uncontended READYs only pay the holder read. */
  if (rv_cfg.holder_stacks && site->event == RV_EV_THREAD_READY && th != 0 &&
      rv_output_holder(bin, th, tgid, ts, serial, about_tid, tid, (__u16)key, flags, traps, c)) {
    return 0;
  }

  /* Events configured to carry a stack (gvl_released by default): the thread giving up the lock is the one running
   * this probe, so its VM stack is stable while we walk it. */
  if (th != 0 && about_tid == tid && (rv_cfg.stack_events & (1u << (site->event & 31)))) {
    struct rv_walk_config *wc = bpf_map_lookup_elem(&walk_config, &bin);
    __u32 slot = bpf_get_smp_processor_id() * 2;
    struct rv_stack_record *s = bpf_map_lookup_elem(&stack_scratch, &slot); /* the slot's stack-record view */
    if (wc && wc->valid && s) {
      rv_fill_record(&s->rec, ts, th, serial, about_tid, tid, tgid, site->event, (__u16)key, flags | RV_REC_HAS_STACK);
      __u64 w0 = bpf_ktime_get_ns();
      __u32 fresh = 0;
      __u32 size = rv_walk_thread_stack(wc, th, s, &fresh);
      rv_output_stack(s, size, 0, fresh);
      __u64 walk = bpf_ktime_get_ns() - w0; /* the target's time, like the trap: --max-overhead charges it */
      __sync_fetch_and_add(&traps->stack_ns, walk);
      if (c) c->stack_ns += walk;
      return 0;
    }
  }

  struct rv_record *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
  if (!r) {
    rv_count_drop(c);
    return 0;
  }
  rv_fill_record(r, ts, th, serial, about_tid, tid, tgid, site->event, (__u16)key, flags);
  rv_submit_record(r, c);
  return 0;
}

/* Attached one link per site (kernels without multi-uprobe links). */
SEC("uprobe")
int rv_site_single(struct pt_regs *ctx) { return rv_handle(ctx); }

/* Attached with one BPF_TRACE_UPROBE_MULTI link for many sites (kernel >= 6.6); userspace sets the expected attach
 * type before load, since libbpf 1.1 does not know the "uprobe.multi" section. */
SEC("uprobe")
int rv_site_multi(struct pt_regs *ctx) { return rv_handle(ctx); }

/* On-CPU sampling: attached to a software cpu-clock perf event on every CPU at --hz. A sample is kept only when the
 * interrupted task belongs to a target and runs Ruby. Its EC comes from the thread's own ruby_current_ec (TLS), else
 * from the main ractor's running EC when this native thread holds the GVL (bpf/ruby_ec.h), else, only while the TLS
 * route cannot be evaluated for this process (not set up yet, unreadable), from native_threads' th, the thread the last
 * scheduler event on this native thread named. The counters say which route each sample took. Between GC_ENTER and
 * GC_EXIT the sample is flagged so the daemon adds a GC frame. With rv_config.gvl_readings the sample also carries
 * its VM's GVL holder and queue (a bounded walk of at most RV_GVL_MAX_QUEUED nodes). */
SEC("perf_event")
int rv_sample(struct bpf_perf_event_data *ctx) {
  __u64 pid_tgid = bpf_get_current_pid_tgid();
  __u32 tgid = pid_tgid >> 32;
  __u32 tid = (__u32)pid_tgid;
  __u32 zero = 0;
  (void)ctx;
  struct rv_target *target = bpf_map_lookup_elem(&target_pids, &tgid);
  if (!target) return 0;
  if (!rv_cfg.sampling) return 0;
  if (target->flags & RV_TARGET_FOLLOW_ONLY) return 0; /* followed for its children only (not the traced VM) */
  struct rv_pid_traps *traps = bpf_map_lookup_elem(&pid_traps, &target->slot);
  if (!traps) return 0; /* never: userspace gives slots below RV_MAX_TARGETS */
  __u64 ts = bpf_ktime_get_ns();
  struct rv_counters *c = bpf_map_lookup_elem(&counters, &zero);
  __u64 ec = 0, th = 0;
  __u32 bin = 0;
  __u32 route = RV_EC_ROUTE_NONE;
  int tls_unavailable = 1;
  struct rv_walk_config *wc = 0;
  struct rv_proc_ec *pe = bpf_map_lookup_elem(&proc_ec, &tgid);
  if (pe) {
    bin = pe->binary;
    wc = bpf_map_lookup_elem(&walk_config, &bin);
    struct rv_offsets *off = bpf_map_lookup_elem(&offsets, &bin);
    if (wc && wc->valid && off) {
      /* The thread pointer of the interrupted task: glibc sets it with arch_prctl/clone, which record it here. */
      __u64 fsbase = 0;
      if (rv_kernel.task_fsbase != 0)
        bpf_probe_read_kernel(&fsbase, sizeof(fsbase), (const void *)(bpf_get_current_task() + rv_kernel.task_fsbase));
      /* The ractor route compares the VM's rb_native_thread.tid with this thread's: in the target's namespace. */
      struct rv_ec_query q = {.tp = fsbase,
                              .tid = target->pidns.ino != 0 ? rv_ns_tid(&target->pidns) : tid,
                              .th_nt = off->th_nt,
                              .nt_tid = off->nt_tid};
      route = rv_find_ec_subprog(pe, wc, &q);
      ec = q.ec;
      th = q.th;
      tls_unavailable = q.tls_unavailable != 0;
    }
  }
  const struct rv_native_thread *nt = bpf_map_lookup_elem(&native_threads, &tid);
  if (route == RV_EC_ROUTE_NONE && tls_unavailable) {
    if (nt && nt->th != 0) {
      th = nt->th;
      bin = nt->bin;
      wc = bpf_map_lookup_elem(&walk_config, &bin);
      if (wc && bpf_probe_read_user(&ec, sizeof(ec), (const void *)(unsigned long)(th + wc->thread_ec)) == 0 && ec)
        route = RV_EC_ROUTE_CURRENT_TH;
    }
  }
  if (c) {
    if (route == RV_EC_ROUTE_TLS) c->samples_ec_tls++;
    else if (route == RV_EC_ROUTE_RACTOR) c->samples_ec_ractor++;
    else if (route == RV_EC_ROUTE_CURRENT_TH) c->samples_ec_current_th++;
    else c->samples_no_ec++;
  }
  /* No EC: the timer thread, a C library's own thread, or a native thread between Ruby threads. */
  if (route == RV_EC_ROUTE_NONE || !wc || !wc->valid) return 0;
  __u32 slot = bpf_get_smp_processor_id() * 2 + 1;
  struct rv_sample_record *s = bpf_map_lookup_elem(&stack_scratch, &slot);
  if (!s) return 0;
  __u32 flags = RV_REC_HAS_STACK | RV_REC_SERIAL_UNKNOWN;
  if (nt && nt->in_gc) flags |= RV_REC_IN_GC;
  /* Who holds the GVL of the sampled thread's VM and who is queued for it, read from memory (bpf/ruby_gvl.h): the
   * contention this shows stays visible while --max-overhead has the scheduler sites detached. */
  if (rv_cfg.gvl_readings && wc->gvl.base != RV_GVL_BASE_NONE &&
      rv_read_gvl_subprog(&wc->gvl, pe ? pe->vm_ptr : 0, th, &s->gvl) == 0) {
    if (c) {
      c->gvl_readings++;
      if (s->gvl.flags & (RV_GVL_F_QUEUE_TRUNCATED | RV_GVL_F_QUEUE_UNREADABLE)) c->gvl_queue_truncated++;
    }
    rv_fill_record(&s->rec, ts, th, 0, tid, tid, tgid, RV_EV_SAMPLE, 0xffff, flags | RV_REC_HAS_GVL);
    __u32 fresh = 0;
    __u32 size = sizeof(struct rv_record) + sizeof(struct rv_gvl_reading) +
                 rv_walk_ec_stack_into(wc, ec, &s->hdr, s->frames, &fresh);
    rv_output_stack(s, size, 1, fresh);
  } else {
    struct rv_stack_record *plain = (struct rv_stack_record *)s; /* no reading: the entry is a plain stack record */
    rv_fill_record(&plain->rec, ts, th, 0, tid, tid, tgid, RV_EV_SAMPLE, 0xffff, flags);
    __u32 fresh = 0;
    __u32 size = rv_walk_ec_stack(wc, ec, plain, &fresh);
    rv_output_stack(plain, size, 1, fresh);
  }
  /* The whole sample ran in the target's context (an interrupt of it): --max-overhead charges it. */
  __u64 spent = bpf_ktime_get_ns() - ts;
  __sync_fetch_and_add(&traps->stack_ns, spent);
  if (c) c->stack_ns += spent;
  return 0;
}

/* ---- Fleet agent: process lifecycle ------------------------------------------------------------------------------
 * Loaded and attached only when the daemon asks (BpfSession::WatchProcesses); the single-process recorder never
 * loads them. Each writes one fixed-size rv_record, counted in events/dropped like a probe record, with the same
 * wakeup rule (only once the ring is a quarter full): the agent reads the ring every 500 ms anyway. They are raw
 * tracepoints on sched_process_exec / sched_process_exit: attaching needs no tracefs (often not mounted on hosts
 * and never inside a DaemonSet's container), and both run in the context of the task concerned, so
 * bpf_get_current_pid_tgid() is all they read. */
static __always_inline void rv_output_proc(__u16 kind, __u32 tgid, __u32 tid, __u32 serial, __u32 flags) {
  __u32 zero = 0;
  struct rv_counters *c = bpf_map_lookup_elem(&counters, &zero);
  struct rv_record *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
  if (!r) {
    rv_count_drop(c); /* the agent rescans /proc after any drop, so a lost exec is found late, not never */
    return;
  }
  rv_fill_record(r, bpf_ktime_get_ns(), 0, serial, tid, tid, tgid, kind, 0xffff,
                 RV_REC_TH_UNKNOWN | RV_REC_SERIAL_UNKNOWN | flags);
  rv_submit_record(r, c);
}

/* Every exec on the host (the new image is mapped, its dynamic loader has not run yet): the agent inspects the
 * process, several times with backoff, since a dynamically linked ruby maps libruby only after this point. The pid
 * is the host tgid whatever pid namespace the process lives in.
 * With rv_config.follow_forks (the recorder) only the execs of targets are reported: the new image keeps its place in
 * the filter (it may be the traced VM again, whose first events must not be missed; userspace takes out what is not),
 * loses FOLLOW_ONLY, and forgets what BPF knew of the old image (its EC route, its thread pointers). */
SEC("raw_tp/sched_process_exec")
int rv_proc_exec(void *ctx) {
  (void)ctx;
  __u64 pid_tgid = bpf_get_current_pid_tgid();
  __u32 tgid = pid_tgid >> 32;
  __u32 tid = (__u32)pid_tgid;
  if (rv_cfg.watch_exec) {
    rv_output_proc(RV_EV_PROC_EXEC, tgid, tid, 0, 0);
    return 0;
  }
  if (!rv_cfg.follow_forks) return 0;
  struct rv_target *target = bpf_map_lookup_elem(&target_pids, &tgid);
  if (!target) return 0;
  target->flags &= ~(__u32)RV_TARGET_FOLLOW_ONLY;
  bpf_map_delete_elem(&proc_ec, &tgid);
  bpf_map_delete_elem(&native_threads, &tid); /* the execing thread is the leader now: tid == tgid */
  /* The new image's comm (the base name of the file exec'd), its first 12 bytes in th and serial: what names a
   * process that is gone before userspace can read its /proc/PID/exe. */
  char comm[16] = {};
  bpf_get_current_comm(comm, sizeof(comm));
  __u32 zero = 0;
  struct rv_counters *c = bpf_map_lookup_elem(&counters, &zero);
  struct rv_record *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
  if (!r) {
    rv_count_drop(c);
    return 0;
  }
  rv_fill_record(r, bpf_ktime_get_ns(), 0, 0, tid, tid, tgid, RV_EV_PROC_EXEC, 0xffff,
                 RV_REC_TH_UNKNOWN | RV_REC_SERIAL_UNKNOWN);
  __builtin_memcpy(&r->th, comm, 8);
  __builtin_memcpy(&r->serial, comm + 8, 4);
  rv_submit_record(r, c);
  return 0;
}

/* Exit of a watched process: only its group leader (pid == tgid) reports, and the pid leaves the filter here so no
 * sample or event of the dying process is recorded after its exit record. The leader's exit_code (do_exit sets it
 * before this tracepoint; for exit_group and a fatal signal every thread gets the group's) goes in serial: the wait
 * status its parent will see. */
SEC("raw_tp/sched_process_exit")
int rv_proc_exit(void *ctx) {
  (void)ctx;
  __u64 pid_tgid = bpf_get_current_pid_tgid();
  __u32 tgid = pid_tgid >> 32;
  __u32 tid = (__u32)pid_tgid;
  if (tgid != tid || !bpf_map_lookup_elem(&target_pids, &tgid)) return 0;
  bpf_map_delete_elem(&target_pids, &tgid);
  bpf_map_delete_elem(&proc_ec, &tgid); /* a reused pid must not inherit this process's EC route */
  __u32 status = 0, flags = 0;
  if (rv_kernel.task_exit_code != 0) {
    int code = 0;
    const __u64 task = bpf_get_current_task();
    if (bpf_probe_read_kernel(&code, sizeof(code), (const void *)(task + rv_kernel.task_exit_code)) == 0) {
      status = (__u32)code;
      flags = RV_REC_EXIT_STATUS;
    }
  }
  rv_output_proc(RV_EV_PROC_EXIT, tgid, tid, status, flags);
  return 0;
}

/* A new process forked by a watched one (Puma/Unicorn workers are forked from the booted master and never exec):
 * the agent watches it too. Threads (CLONE_THREAD: child pid != tgid) are not processes. Runs in the parent, before
 * the child can run. With rv_config.follow_forks (the recorder) the child joins the filter here, with its parent's
 * rv_target (its traps count in its parent's pid_traps slot: the recorder budgets on the totals) and its parent's EC
 * route (a forked child has its parent's memory layout), so its first event is recorded; userspace learns of it from
 * the record (serial: the parent's tgid). */
SEC("raw_tp/sched_process_fork")
int rv_proc_fork(struct bpf_raw_tracepoint_args *ctx) {
  __u32 parent = bpf_get_current_pid_tgid() >> 32;
  struct rv_target *ptarget = bpf_map_lookup_elem(&target_pids, &parent);
  if (!ptarget) return 0;
  if (rv_kernel.task_pid == 0 || rv_kernel.task_tgid == 0) return 0;
  const __u64 child = ctx->args[1]; /* struct task_struct * */
  __u32 child_pid = 0, child_tgid = 0;
  if (bpf_probe_read_kernel(&child_pid, sizeof(child_pid), (const void *)(child + rv_kernel.task_pid)) != 0 ||
      bpf_probe_read_kernel(&child_tgid, sizeof(child_tgid), (const void *)(child + rv_kernel.task_tgid)) != 0 ||
      child_pid != child_tgid)
    return 0;
  if (rv_cfg.follow_forks) {
    struct rv_target t = *ptarget;
    bpf_map_update_elem(&target_pids, &child_tgid, &t, BPF_ANY);
    struct rv_proc_ec *pe = bpf_map_lookup_elem(&proc_ec, &parent);
    if (pe) {
      struct rv_proc_ec route = *pe;
      bpf_map_update_elem(&proc_ec, &child_tgid, &route, BPF_ANY);
    } else {
      bpf_map_delete_elem(&proc_ec, &child_tgid); /* a reused pid must not keep another process's route */
    }
  }
  __u32 zero = 0;
  struct rv_counters *c = bpf_map_lookup_elem(&counters, &zero);
  struct rv_record *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
  if (!r) {
    rv_count_drop(c);
    return 0;
  }
  rv_fill_record(r, bpf_ktime_get_ns(), 0, parent, child_pid, child_pid, child_tgid, RV_EV_PROC_FORK, 0xffff,
                 RV_REC_TH_UNKNOWN | RV_REC_SERIAL_UNKNOWN);
  rv_submit_record(r, c);
  return 0;
}
