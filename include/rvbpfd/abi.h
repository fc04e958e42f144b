/* The ABI shared by the BPF programs (bpf/rvbpfd.bpf.c) and the C++ daemon.
 *
 * Everything here is fixed-width and laid out explicitly; the RV_ABI_ASSERTs at the bottom pin sizes and offsets so
 * that clang -target bpf and the host compiler agree. The walker's types (ruby_walker_types.h) and the counters
 * (counters.h) are the other headers of this boundary. Userspace computes every per-binary fact (probe sites, where
 * `th` lives at each site, struct offsets) and hands it over through the maps declared in the BPF object; the BPF
 * side has no version knowledge of its own. */
#ifndef RVBPFD_INCLUDE_RVBPFD_ABI_H_
#define RVBPFD_INCLUDE_RVBPFD_ABI_H_

#include "rvbpfd/abi_base.h"
#include "rvbpfd/counters.h"
#include "rvbpfd/ruby_walker_types.h"

/* What a probe observed. Values are stable: they appear in the ring buffer records. */
enum rv_event_kind {
  RV_EV_NONE = 0,
  RV_EV_THREAD_STARTED = 1,   /* RUBY_INTERNAL_THREAD_EVENT_STARTED */
  RV_EV_THREAD_READY = 2,     /* RUBY_INTERNAL_THREAD_EVENT_READY: wants the GVL */
  RV_EV_THREAD_RESUMED = 3,   /* RUBY_INTERNAL_THREAD_EVENT_RESUMED: got the GVL */
  RV_EV_THREAD_SUSPENDED = 4, /* RUBY_INTERNAL_THREAD_EVENT_SUSPENDED: released the GVL */
  RV_EV_THREAD_EXITED = 5,    /* RUBY_INTERNAL_THREAD_EVENT_EXITED */
  RV_EV_GC_ENTER = 6,         /* RUBY_INTERNAL_EVENT_GC_ENTER */
  RV_EV_GC_EXIT = 7,          /* RUBY_INTERNAL_EVENT_GC_EXIT */
  RV_EV_SLEEP_ENTER = 8,      /* entry of Kernel#sleep (rb_f_sleep) */
  RV_EV_MUTEX_LOCK_ENTER = 9, /* entry of Thread::Mutex#lock's worker (do_mutex_lock / rb_mut_lock) */
  RV_EV_KIND_COUNT = 10,
  /* Not a site event: an on-CPU sample taken by the perf_event program (rv_sample). Kept outside RV_EV_KIND_COUNT
   * because no probe site carries it; the daemon decodes it before the scheduler-event conversion. */
  RV_EV_SAMPLE = 32,
  /* Not site events either: process lifecycle records of the fleet agent (tracepoints, loaded only when the daemon
   * asks for them). rv_record.pid is the host tgid; th, serial and site are 0. */
  RV_EV_PROC_EXEC = 33, /* sched/sched_process_exec, every exec on the host while rv_config.watch_exec is 1; with
                         * rv_config.follow_forks instead, the execs of processes in target_pids, with the
                         * first 12 bytes of the new comm in th (8) and serial (4), NUL-padded */
  RV_EV_PROC_EXIT = 34, /* sched/sched_process_exit of a group leader whose tgid was in target_pids; flagged
                         * RV_REC_EXIT_STATUS, serial is the leader's task_struct.exit_code (a wait status:
                         * exit code << 8, or the terminating signal) */
  RV_EV_PROC_FORK = 35, /* sched/sched_process_fork of a new process (not a thread) by a process in target_pids
                         * (a preforking server's workers never exec); pid is the CHILD's tgid, serial the parent's */
};

/* Where the `th` (rb_thread_t *) of a site's event is, at the probed instruction. */
enum rv_loc_kind {
  RV_LOC_CURRENT = 0, /* not recoverable at the site: use the thread last RESUMED on this native thread */
  RV_LOC_REG = 1,     /* th = reg + offset (offset 0: th is in the register) */
  RV_LOC_MEM = 2,     /* th = *(u64 *)(reg + offset), e.g. a stack slot at CFA-72 expressed as rsp+N */
  RV_LOC_NONE = 3,    /* the event has no thread (GC, probes use CURRENT; this is for completeness) */
};

/* Registers in DWARF x86-64 numbering, which is also what the site finder produces. */
enum rv_reg {
  RV_REG_RAX = 0, RV_REG_RDX = 1, RV_REG_RCX = 2, RV_REG_RBX = 3,
  RV_REG_RSI = 4, RV_REG_RDI = 5, RV_REG_RBP = 6, RV_REG_RSP = 7,
  RV_REG_R8 = 8, RV_REG_R9 = 9, RV_REG_R10 = 10, RV_REG_R11 = 11,
  RV_REG_R12 = 12, RV_REG_R13 = 13, RV_REG_R14 = 14, RV_REG_R15 = 15,
  RV_REG_COUNT = 16,
};

/* Maximum number of probe sites across all binaries the daemon attached (array map size). */
#define RV_MAX_SITES 1024
/* Maximum number of distinct VM binaries (libruby.so / static ruby) with their own struct offsets. */
#define RV_MAX_BINARIES 64
/* Maximum number of processes recorded at once (target_pids entries, and pid_traps slots, one per entry). */
#define RV_MAX_TARGETS 4096

/* rv_site.flags */
enum rv_site_flags {
  /* The probed instruction is single-stepped by the kernel (not emulated): each hit takes a second exception, ~7x the
   * cost of an emulated one on a VM (benchmarks/uprobe_cost.cc). Counted apart for the --max-overhead estimate. */
  RV_SITE_SINGLE_STEP = 1,
  /* The VM's teardown (the entry of ruby_vm_destruct, which frees the heap every frame points into): no event; the
   * hit raises RV_TEARDOWN_SIGNAL in the thread, whose tracer (the recorder's hold, src/record/exit_hold.h)
   * stops it there until the ring is drained and named, then passes the signal on. Only a recorder that traces the
   * process attaches such a site. */
  RV_SITE_TEARDOWN = 2,
};
/* SIGURG: ignored by default, so should the tracer be gone the signal changes nothing. */
#define RV_TEARDOWN_SIGNAL 23

/* The process a recorder holds (--hold, launch or attach mode; the `held` map's one value, bpf/rvbpfd.bpf.c), set
 * while it is traced and cleared before it is let go: at each of its GC_ENTER
 * hits, while the daemon has not consumed the ring past the last stack with a new frame (fresh_end), the thread is
 * stopped the same way (RV_TEARDOWN_SIGNAL) until it has: no GC frees an iseq a recorded stack names before the
 * daemon names it. pid 0: none. */
struct rv_held {
  __u64 fresh_end; /* ring producer position after the last entry submitted with a new frame (any process) */
  __u32 pid;       /* host tgid of the held process, 0: none */
  __u32 pad;
};
RV_ABI_ASSERT(sizeof(struct rv_held) == 16, "rv_held ABI");

/* One probe site. Indexed by the uprobe's BPF cookie. */
struct rv_site {
  __u8 event;      /* enum rv_event_kind */
  __u8 loc_kind;   /* enum rv_loc_kind */
  __u8 loc_reg;    /* enum rv_reg */
  __u8 binary;     /* index into the offsets map */
  __s32 loc_offset;
  /* Function-entry sites only: a hit whose return address lies in [exclude_caller_start, exclude_caller_end)
   * (ELF virtual addresses) is not an event. Mutex#lock's function is also called by the C API
   * rb_mutex_synchronize (IO write locks), which is not a Ruby-level Mutex#lock. 0/0: no exclusion. */
  __u64 vaddr;     /* the site's own ELF virtual address: ip - vaddr is the load bias */
  __u64 exclude_caller_start;
  __u64 exclude_caller_end;
  __u32 flags; /* enum rv_site_flags */
  __u32 pad;
};

/* Struct offsets of one VM binary, in bytes. Zero means "not available" where noted. */
struct rv_offsets {
  __u32 th_serial;   /* rb_thread_t.serial: assigned only in USE_RUBY_DEBUG_LOG builds (vm.c th_init), so BPF reads it
                      * only when RV_OFF_HAS_SERIAL says the binary assigns it; release builds leave it 0 */
  __u32 th_nt;       /* rb_thread_t.nt (struct rb_native_thread *) */
  __u32 nt_tid;      /* rb_native_thread.tid (int) */
  __u32 flags;       /* RV_OFF_* */
};
#define RV_OFF_HAS_SERIAL 0x1u /* the binary assigns th->serial (debug-log builds); the daemon numbers threads itself */

/* Record flags. */
#define RV_REC_TH_UNKNOWN 0x1u  /* th could not be determined (CURRENT with no RESUMED seen yet) */
/* The host tid of the thread the event is about is not known: th->nt NULL, or a target in its own pid namespace
 * names a thread by a namespace tid that no hit of that thread has translated yet. */
#define RV_REC_TID_UNKNOWN 0x2u
#define RV_REC_SERIAL_UNKNOWN 0x4u
#define RV_REC_HAS_STACK 0x8u /* an rv_stack_header and its frames follow the rv_record in the same ring entry */
#define RV_REC_IN_GC 0x10u    /* samples: the native thread was between GC_ENTER and GC_EXIT */
/* samples: an rv_gvl_reading follows the rv_record, before the rv_stack_header (struct rv_sample_record) */
#define RV_REC_HAS_GVL 0x20u
/* READY while another thread held the GVL (rv_config.holder_stacks): an rv_holder_info follows the rv_record, then
 * the rv_stack_header and frames of the HOLDER's stack (struct rv_holder_record), not the waiter's */
#define RV_REC_HAS_HOLDER 0x40u
/* RV_EV_PROC_EXIT: serial holds the exiting leader's wait status (rv_kernel.task_exit_code known) */
#define RV_REC_EXIT_STATUS 0x80u

/* One ring buffer record: fixed size, written by every probe. */
struct rv_record {
  __u64 ts_ns;       /* bpf_ktime_get_ns(): CLOCK_MONOTONIC nanoseconds */
  __u64 th;          /* rb_thread_t * of the thread the event is about (0 if unknown) */
  __u32 serial;      /* th->serial when RV_OFF_HAS_SERIAL, else 0 (see rv_offsets) */
  __u32 tid;         /* host tid of the thread the event is about (0 if unknown) */
  __u32 probe_tid;   /* native tid that ran the probe */
  __u32 pid;         /* tgid of the target process (host pid namespace) */
  __u16 kind;        /* enum rv_event_kind */
  __u16 site;        /* the cookie (index into the sites map) */
  __u32 flags;       /* RV_REC_* */
};

/* ---- Stacks ----------------------------------------------------------------------------------------------------
 * A stack travels in the same ring entry as its event: struct rv_record (flags has RV_REC_HAS_STACK), then
 * struct rv_stack_header, then nframes struct rv_ruby_frame (rvbpfd/ruby_walker_types.h), newest frame first. The
 * whole entry is written with one bpf_ringbuf_output from a per-CPU scratch slot, so an event and its stack are never
 * separated and a full ring drops both together (one drop counted). */

/* Frames per stack (>= 4096 so deep recursion unwinds completely); a deeper stack is cut and flagged truncated.
 * A power of two: the BPF side masks indexes with it. */
#define RV_MAX_STACK_FRAMES 4096
/* Control frames visited per walk: C frames CRuby skips (IFUNC, dummy) also cost a bpf_loop iteration. */
#define RV_MAX_STACK_STEPS (2 * RV_MAX_STACK_FRAMES)

/* Slots of the BPF set of frames the daemon was woken for (bpf/ruby_stack.bpf.h, seen_frames): a power of two. */
#define RV_SEEN_FRAME_SLOTS (1u << 15)

#define RV_STACK_F_TRUNCATED 0x1u /* more frames than RV_MAX_STACK_FRAMES (or steps): the oldest ones are missing */
#define RV_STACK_F_NO_EC 0x2u     /* th->ec could not be read: no frames */

struct rv_stack_header {
  __u32 nframes;     /* frames that follow */
  __u32 walk_status; /* enum rv_ruby_walk_status of the walk */
  __u32 visited;     /* control frames visited */
  __u32 flags;       /* RV_STACK_F_* */
};

/* The full ring entry as the scratch slot holds it. Only the used prefix is submitted. */
struct rv_stack_record {
  struct rv_record rec;
  struct rv_stack_header hdr;
  struct rv_ruby_frame frames[RV_MAX_STACK_FRAMES];
};

/* ---- The GVL as the sampler reads it (bpf/ruby_gvl.h) -------------------------------------------------------------
 * At each sample the sampler reads, from the sampled thread's VM, who holds the GVL and which threads are queued for
 * it, so that contention stays visible while --max-overhead has the scheduler probes detached (no trap involved).
 * CRuby 3.3+: the GVL of a ractor is its rb_ractor_t.threads.sched (struct rb_thread_sched): `running` is the holder,
 * `readyq` the ccan list of queued rb_thread_t (linked through rb_thread_t.sched.node.readyq), `readyq_cnt` their
 * number. Other layouts are other values of struct rv_gvl_offsets, never code. */

/* Queued threads a reading names (the count is always the VM's own). A power of two: BPF masks indexes with it. */
#define RV_GVL_MAX_QUEUED 32
/* An offset of struct rv_gvl_offsets the VM does not have. */
#define RV_GVL_NO_FIELD 0xffffffffu

/* Where the scheduler state of the sampled thread's VM lives. */
enum rv_gvl_base {
  RV_GVL_BASE_NONE = 0,          /* not known for this binary: samples carry no reading */
  RV_GVL_BASE_THREAD_RACTOR = 1, /* the sampled thread's ractor (*(th + th_ractor)): 3.2+ keep a GVL per ractor */
  RV_GVL_BASE_VM = 2,            /* the VM (*ruby_current_vm_ptr, rv_proc_ec.vm_ptr): one GVL per process */
};

/* Per-binary layout, in bytes (part of rv_walk_config). holder/queue/queue_count are offsets from the base. */
struct rv_gvl_offsets {
  __u32 base;          /* enum rv_gvl_base */
  __u32 th_ractor;     /* rb_thread_t.ractor (RV_GVL_BASE_THREAD_RACTOR) */
  __u32 holder;        /* the holder's rb_thread_t * (rb_ractor_t.threads.sched.running); NULL: nobody holds it */
  __u32 queue;         /* the list head of the queued threads (threads.sched.readyq: struct ccan_list_head) */
  __u32 queue_count;   /* int, the number of queued threads (threads.sched.readyq_cnt); RV_GVL_NO_FIELD: the walk
                        * counts them (at most RV_GVL_MAX_QUEUED, then the reading is flagged truncated) */
  __u32 th_queue_node; /* rb_thread_t: the list node that links a thread into the queue (sched.node.readyq) */
};

/* rv_gvl_reading.flags */
#define RV_GVL_F_QUEUE_TRUNCATED 0x1u  /* the queue goes on past RV_GVL_MAX_QUEUED entries: queued[] holds the first */
#define RV_GVL_F_QUEUE_UNREADABLE 0x2u /* a queue node could not be read: queued[] stops before it */

/* One reading, taken at a sample (an entry flagged RV_REC_HAS_GVL). */
struct rv_gvl_reading {
  __u64 holder;  /* rb_thread_t * of the GVL holder; 0: nobody held it */
  __u32 waiting; /* queued threads, the VM's count (or the walk's, see queue_count) */
  __u32 nqueued; /* entries of queued[] filled, in queue order (the next to run first) */
  __u32 flags;   /* RV_GVL_F_* */
  __u32 pad;
  __u64 queued[RV_GVL_MAX_QUEUED]; /* rb_thread_t * of the queued threads */
};

/* Per-binary walker layout (indexed like `offsets`). */
struct rv_walk_config {
  struct rv_ruby_walk_offsets walk;
  __u32 thread_ec; /* rb_thread_t.ec */
  __u32 valid;     /* 1 once userspace filled it; 0: stacks are not taken for this binary */
  /* How a sample gets from an EC to its thread, and the ractor route (bpf/ruby_ec.h). 0 = not available. */
  __u32 ec_thread_ptr;     /* rb_execution_context_t.thread_ptr */
  __u32 vm_main_ractor;    /* rb_vm_t.ractor.main_ractor */
  __u32 ractor_running_ec; /* rb_ractor_t.threads.running_ec: the EC holding the ractor's GVL */
  __u32 ec_reserved;
  struct rv_gvl_offsets gvl; /* the GVL reading of samples (base NONE: none) */
};

/* A sample's ring entry as the sampler's scratch slot holds it: the reading sits between the record and the stack
 * header when the record is flagged RV_REC_HAS_GVL; without it the entry is laid out as struct rv_stack_record. */
struct rv_sample_record {
  struct rv_record rec;
  struct rv_gvl_reading gvl;
  struct rv_stack_header hdr;
  struct rv_ruby_frame frames[RV_MAX_STACK_FRAMES];
};

/* ---- The GVL holder at a contended READY (rv_config.holder_stacks) ---------------------------------------------------
 * When a thread starts waiting for the GVL (READY) while another thread holds it, the program reads the holder from
 * the waiting thread's VM (rv_read_gvl_holder, the sampler's layout) and walks the holder's Ruby stack from the
 * holder's own control frames (holder->ec): what the holder runs at the moment the wait begins. The entry is laid out
 * as struct rv_holder_record and flagged RV_REC_HAS_STACK | RV_REC_HAS_HOLDER; its stack is the holder's (the
 * waiter's own READY stack, --stacks=release,ready, is not taken for such a READY). A READY that finds the GVL free,
 * or held by its own thread, or whose holder cannot be read, is written as before. The holder runs on another CPU
 * while it is walked: the stack is a snapshot whose oldest frames may be read a moment after its newest (every read
 * bounded and checked like any walk). */
struct rv_holder_info {
  __u64 holder; /* rb_thread_t * of the GVL holder (never 0, never the record's th) */
  __u32 flags;  /* 0: none defined */
  __u32 pad;
};

struct rv_holder_record {
  struct rv_record rec;
  struct rv_holder_info holder;
  struct rv_stack_header hdr;
  struct rv_ruby_frame frames[RV_MAX_STACK_FRAMES];
};

/* ---- How a sample finds the execution context (EC) of the thread it interrupted (bpf/ruby_ec.h) -----------------
 * The route is decided per process by userspace (src/stacks/ec_route.cc) from the VM binary and, where ld.so decides
 * the numbers, from the process's memory; BPF only follows it. */
enum rv_ec_tls_mode {
  RV_EC_TLS_NONE = 0,      /* not known (yet): only the ractor and current_th fallbacks */
  RV_EC_TLS_TP_OFFSET = 1, /* &ruby_current_ec = fsbase + tp_offset: local-exec in a static ruby, or a TLSDESC that
                            * ld.so resolved to static TLS */
  RV_EC_TLS_DTV = 2,       /* &ruby_current_ec = DTV[dtv_module].val + tls_offset, DTV = *(fsbase + dtv_offset):
                            * general-dynamic TLS in a shared libruby (glibc's dtv_t layout) */
};

/* Per process (map proc_ec, key: host tgid). */
struct rv_proc_ec {
  __u32 binary;         /* index into offsets / walk_config: samples have no probe site to say which VM runs */
  __u32 mode;           /* enum rv_ec_tls_mode */
  __s64 tp_offset;      /* RV_EC_TLS_TP_OFFSET, bytes (negative on x86-64: TLS blocks lie below the thread pointer) */
  __u64 dtv_module;     /* RV_EC_TLS_DTV: the VM binary's TLS module id, as ld.so assigned it in this process */
  __u64 tls_offset;     /* RV_EC_TLS_DTV: offset of ruby_current_ec in the module's TLS block, bytes */
  __u32 dtv_offset;     /* RV_EC_TLS_DTV: the DTV pointer's offset from the thread pointer (glibc x86-64: 8) */
  __u32 dtv_entry_size; /* RV_EC_TLS_DTV: bytes per DTV entry (glibc dtv_t: 16) */
  __u64 vm_ptr;         /* runtime address of ruby_current_vm_ptr (0: no ractor route) */
};

/* Largest module id accepted (it is read from a target's memory): glibc numbers modules from 1, a process has at
 * most a few thousand. */
#define RV_EC_MAX_DTV_MODULE (1ull << 20)

/* Which route gave a sample its EC (the per-CPU counters count each). */
enum rv_ec_route {
  RV_EC_ROUTE_NONE = 0,       /* no EC: the sample is dropped */
  RV_EC_ROUTE_TLS = 1,        /* the interrupted native thread's ruby_current_ec */
  RV_EC_ROUTE_RACTOR = 2,     /* main ractor's running_ec, whose thread runs on this native thread (the GVL holder) */
  RV_EC_ROUTE_CURRENT_TH = 3, /* the rb_thread_t the last scheduler event on this native thread named */
};

/* Global switches, fixed for the life of a loaded object: the BPF programs read them from read-only data
 * (`const volatile struct rv_config rv_cfg`) that userspace sets through the skeleton before loading, so the verifier
 * knows their values and drops the code they switch off. Per-target facts that change after load live in maps. */
struct rv_config {
  __u32 stack_events; /* bit (1 << rv_event_kind): events that carry the stack of the thread they are about */
  __u32 sampling;     /* 1: the perf_event program records samples */
  __u32 watch_exec;   /* 1: the exec tracepoint (fleet agent) records every exec on the host */
  /* A uprobe hit with no other target hit on its CPU for at least this many ns is "cold" (rv_pid_traps.cold,
   * rv_counters.cold_hits): its path has left the caches and it costs the target more (benchmarks/trap_gap_cost.cc).
   * 0: no hit is cold. */
  __u32 cold_gap_ns;
  /* 1: samples carry a reading of the GVL (holder, queue) where the binary's rv_walk_config.gvl says how */
  __u32 gvl_readings;
  /* 1: a READY that finds another thread holding the GVL carries the holder and its stack (struct rv_holder_record)
   * where the binary's rv_walk_config.gvl says how to read the holder; never a walk for an uncontended READY */
  __u32 holder_stacks;
  /* 1: the recorder follows its targets' process trees (rvbpfd record's default in launch mode, --follow when
   * attaching): the fork tracepoint puts a forked child of a target into target_pids itself, with its parent's
   * rv_target and proc_ec entry, before the child can run (so no event of it is missed), and the exec tracepoint
   * reports the execs of targets (RV_EV_PROC_EXEC) and forgets their EC route. 0: the agent's behaviour. */
  __u32 follow_forks;
};

/* Byte offsets of the fields of the running kernel's struct task_struct that the programs read (the sampler's thread
 * pointer, a forked child's pid and tgid). Userspace takes them from the kernel's BTF (src/probe/kernel_layout.h) and
 * sets them as read-only data (`const volatile struct rv_kernel_layout rv_kernel`) before loading, so the object has
 * no CO-RE relocation and libbpf never parses the kernel's BTF (~10 ms for each instance of the object). 0: not
 * known; the program that needs the field does not read it. */
struct rv_kernel_layout {
  __u32 task_pid;    /* task_struct.pid (pid_t, 4 bytes) */
  __u32 task_tgid;   /* task_struct.tgid (pid_t, 4 bytes) */
  __u32 task_fsbase; /* task_struct.thread.fsbase (unsigned long, 8 bytes): the user thread pointer on x86-64 */
  __u32 task_exit_code; /* task_struct.exit_code (int, 4 bytes): set before sched_process_exit fires */
};

/* A target's pid namespace, for bpf_get_ns_current_pid_tgid: the nsfs inode of /proc/PID/ns/pid and its device as
 * the kernel encodes a dev_t (major << 20 | minor, not stat's st_dev encoding). Both 0: the process lives in the
 * namespace BPF's tids are numbered in (the host's), so the tids the VM writes into its memory are host tids. */
struct rv_pidns {
  __u64 dev;
  __u64 ino;
};

/* Key of the ns_tids map: a thread of a target in its own pid namespace, by the tid the VM knows it by there. */
struct rv_ns_tid_key {
  __u32 tgid;   /* host tgid of the process */
  __u32 ns_tid; /* the thread's tid in the process's pid namespace (rb_native_thread.tid) */
};

/* rv_target.flags */
enum rv_target_flags {
  /* A followed process that is not traced (rv_config.follow_forks): not Ruby, or another VM binary. It stays in the
   * filter only so that its forks and execs are still reported (a shell's child may exec the traced Ruby); samples
   * skip it. Its forked children inherit the flag; an exec clears it (the new image may be the traced VM). */
  RV_TARGET_FOLLOW_ONLY = 1,
};

/* Value of the target_pids map: a process being recorded. Set by userspace when it adds the process; with
 * rv_config.follow_forks, BPF copies it to a forked child and clears FOLLOW_ONLY at an exec. */
struct rv_target {
  __u32 slot;  /* its entry in the pid_traps array, < RV_MAX_TARGETS (a forked child shares its parent's) */
  __u32 flags; /* RV_TARGET_*; 0 when userspace adds a process */
  struct rv_pidns pidns;
};

/* An entry of the pid_traps array: one process's uprobe hits since userspace added it (each an int3 trap it paid
 * for). BPF adds to it atomically; userspace zeroes it before it hands the slot to a process and reads it through the
 * map's shared pages (the fleet agent's --max-overhead is per process). */
struct rv_pid_traps {
  __u64 traps;
  __u64 cold;    /* of those, hits after rv_config.cold_gap_ns without a target hit on their CPU */
  __u64 stepped; /* of those, hits of RV_SITE_SINGLE_STEP sites */
  /* ns the BPF programs spent walking and writing this process's Ruby stacks (stacked events, samples), in its own
   * context: a cost on top of its traps that grows with stack depth (~0.4 us a frame). */
  __u64 stack_ns;
};

/* Per-CPU counters (include/rvbpfd/counters.h says what each is); the daemon folds them over CPUs. */
struct rv_counters {
#define RV_COUNTER_FIELD(field, fold, label, ...) __u64 field;
  RV_COUNTERS(RV_COUNTER_FIELD)
#undef RV_COUNTER_FIELD
};

RV_ABI_ASSERT(sizeof(struct rv_site) == 40, "rv_site ABI");
RV_ABI_ASSERT(__builtin_offsetof(struct rv_site, flags) == 32, "rv_site ABI");
RV_ABI_ASSERT(sizeof(struct rv_offsets) == 16, "rv_offsets ABI");
RV_ABI_ASSERT(sizeof(struct rv_record) == 40, "rv_record ABI");
RV_ABI_ASSERT(__builtin_offsetof(struct rv_record, kind) == 32, "rv_record ABI");
RV_ABI_ASSERT(sizeof(struct rv_counters) == 8 * RV_COUNTER_COUNT, "rv_counters ABI");
RV_ABI_ASSERT(sizeof(struct rv_stack_header) == 16, "rv_stack_header ABI");
RV_ABI_ASSERT(__builtin_offsetof(struct rv_stack_record, hdr) == 40, "rv_stack_record ABI");
RV_ABI_ASSERT(__builtin_offsetof(struct rv_stack_record, frames) == 56, "rv_stack_record ABI");
RV_ABI_ASSERT(sizeof(struct rv_walk_config) == 96, "rv_walk_config ABI");
RV_ABI_ASSERT(__builtin_offsetof(struct rv_walk_config, gvl) == 72, "rv_walk_config ABI");
RV_ABI_ASSERT(sizeof(struct rv_gvl_offsets) == 24, "rv_gvl_offsets ABI");
RV_ABI_ASSERT(sizeof(struct rv_gvl_reading) == 24 + 8 * RV_GVL_MAX_QUEUED, "rv_gvl_reading ABI");
RV_ABI_ASSERT(__builtin_offsetof(struct rv_sample_record, gvl) == 40, "rv_sample_record ABI");
RV_ABI_ASSERT(__builtin_offsetof(struct rv_sample_record, hdr) == 40 + 24 + 8 * RV_GVL_MAX_QUEUED,
              "rv_sample_record ABI");
RV_ABI_ASSERT(__builtin_offsetof(struct rv_sample_record, frames) ==
                  __builtin_offsetof(struct rv_sample_record, hdr) + 16, "rv_sample_record ABI");
RV_ABI_ASSERT((RV_GVL_MAX_QUEUED & (RV_GVL_MAX_QUEUED - 1)) == 0, "RV_GVL_MAX_QUEUED is a power of two");
RV_ABI_ASSERT(sizeof(struct rv_proc_ec) == 48, "rv_proc_ec ABI");
RV_ABI_ASSERT(__builtin_offsetof(struct rv_proc_ec, vm_ptr) == 40, "rv_proc_ec ABI");
RV_ABI_ASSERT(sizeof(struct rv_config) == 28, "rv_config ABI");
RV_ABI_ASSERT(sizeof(struct rv_holder_info) == 16, "rv_holder_info ABI");
RV_ABI_ASSERT(__builtin_offsetof(struct rv_holder_record, holder) == 40, "rv_holder_record ABI");
RV_ABI_ASSERT(__builtin_offsetof(struct rv_holder_record, hdr) == 56, "rv_holder_record ABI");
RV_ABI_ASSERT(__builtin_offsetof(struct rv_holder_record, frames) == 72, "rv_holder_record ABI");
RV_ABI_ASSERT(sizeof(struct rv_holder_record) <= sizeof(struct rv_sample_record), "a holder entry fits a scratch slot");
RV_ABI_ASSERT(sizeof(struct rv_kernel_layout) == 16, "rv_kernel_layout ABI");
RV_ABI_ASSERT(sizeof(struct rv_target) == 24, "rv_target ABI");
RV_ABI_ASSERT(__builtin_offsetof(struct rv_target, pidns) == 8, "rv_target ABI");
RV_ABI_ASSERT(sizeof(struct rv_pid_traps) == 32, "rv_pid_traps ABI");
RV_ABI_ASSERT(sizeof(struct rv_pidns) == 16, "rv_pidns ABI");
RV_ABI_ASSERT(sizeof(struct rv_ns_tid_key) == 8, "rv_ns_tid_key ABI");

#endif /* RVBPFD_INCLUDE_RVBPFD_ABI_H_ */
