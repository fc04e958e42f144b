/*
 * rvref: the in-process reference recorder for rvbpfd's end-to-end tests.
 *
 * It records exactly what CRuby's own instrumentation delivers to an extension:
 *   - rb_internal_thread_add_event_hook: STARTED, READY, RESUMED, SUSPENDED, EXITED;
 *   - an internal TracePoint on RUBY_INTERNAL_EVENT_GC_ENTER / GC_EXIT;
 *   - with RVREF_PROBES=1, a C-call TracePoint that records Kernel#sleep (sleep_enter) and
 *     Thread::Mutex#lock / #synchronize (mutex_lock_enter).
 * and writes them, at process exit, as an .rvtrace v1 file with "recorder":"in-process". The tests compare rvbpfd's
 * trace against it.
 *
 * Recording starts when the extension is loaded (`-rrvref`) and RVREF_OUT is set; it is never stopped or
 * unregistered. The file is written from an atexit handler, which runs after main() returned, i.e. after
 * ruby_cleanup() has finished with the VM, so every event the VM reports is in memory by then.
 *
 * The handler does not write the file itself: it forks, and the child (one thread, a copy of the records) sorts and
 * writes it while the process goes on exiting at once. CRuby 3.3's M:N scheduler (RUBY_MN_THREADS=1) leaves shared
 * native threads running after ruby_cleanup() has freed the VM: any exit-time work that takes a few milliseconds
 * gives them time to switch to freed coroutine stacks and SIGSEGV in coroutine_transfer. Measured on 3.3.8-shared
 * with gc_threads.rb under load: 33 of 300 runs crashed when this handler wrote the file in-process, and 21 of 150
 * runs crashed with no rvref at all but an LD_PRELOADed atexit handler that only sleeps 20 ms; 0 of 40 crashed with
 * neither. The file appears (by rename) a few milliseconds after the process has exited; readers wait for it.
 * The cause is in thread_pthread_mn.c (co_start): a finished Ruby thread's shared native thread sets
 * th->sched.finished = true and only then switches off the thread's coroutine stack; a task preempted between the two
 * (common on a loaded machine) touches that stack after the VM has freed it. The fork alone still left 19 of 300 runs
 * crashing, so the end proc (which runs before ruby_cleanup frees anything) also waits, at most 2 s, until no other
 * task of the process is runnable: a native thread that has finished its switch is blocked in the scheduler.
 *
 * Environment:
 *   RVREF_OUT       output path (written as OUT.tmp, then renamed, so a reader never sees a partial file)
 *   RVREF_PROBES=1  also record the Kernel#sleep and Mutex#lock probes
 *   RVREF_CAPACITY  number of event slots (default 1048576); events beyond it are counted as dropped
 *
 * Context of the callbacks:
 *   - The thread event hook is called from thread_pthread.c, often WITHOUT the GVL and while the caller holds the
 *     scheduler lock (sched->lock). STARTED runs on the creating thread, READY on whichever thread wakes the target
 *     (a mutex unlocker, a queue pusher, the timer thread), RESUMED/SUSPENDED/EXITED on the thread itself. Calling
 *     into Ruby there could deadlock or corrupt the VM, allocating could take malloc's lock in the middle of the
 *     scheduler, and I/O would stall every thread. So the callback only reads the clock, reads two fields of the
 *     rb_thread_t, claims a slot with one atomic increment and stores into preallocated memory.
 *   - The GC TracePoint runs inside gc_enter/gc_exit with the VM lock held: no allocation either. It only asks for
 *     the current thread (a field read).
 *   - The C-call TracePoint runs with the GVL on the calling thread; it compares the method id and the defining
 *     class with values computed at load time, and stores a record the same way.
 */
/* ruby.h includes ruby/config.h first, which defines _GNU_SOURCE (needed for syscall numbers). */
#include <ruby.h>
#include <ruby/debug.h>
#include <ruby/thread.h>
#include <ruby/version.h>

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Offset of `serial` in rb_thread_t (vm_core.h), measured with `ptype /o` on the test builds: 3.3 has it at 200,
 * 3.4 inserted `mn_schedulable` before it.
 *
 * FINDING: on release builds of 3.3.8 and 3.4.5 this field is never assigned (it reads 0 for every thread, the main
 * thread included; CRuby only numbers threads there for its debug log). So it cannot be the id of a Ruby thread.
 * rvref reports it as "vm_serial" on each thread line, and numbers Ruby threads itself, the way the in-process
 * recorder does: the main thread is 1, every later thread gets the next number at its STARTED event (threads that
 * were already running when recording began get one at their first event). Identity is the rb_thread_t pointer
 * between a STARTED and the next STARTED for the same pointer (CRuby reuses freed rb_thread_t memory). The numbering
 * happens when the file is written, so the callbacks stay minimal. */
#if RUBY_API_VERSION_MAJOR == 3 && RUBY_API_VERSION_MINOR == 3
#define RVREF_SERIAL_OFFSET 200
#elif RUBY_API_VERSION_MAJOR == 3 && RUBY_API_VERSION_MINOR == 4
#define RVREF_SERIAL_OFFSET 204
#else
#error "rvref supports CRuby 3.3 and 3.4 only: the rb_thread_t serial offset of this version is not known"
#endif
/* th->self, the Thread object; used once at load time to check that the layout assumption holds. */
#define RVREF_SELF_OFFSET 16

enum rvref_event {
    EV_NONE = 0, /* slot claimed but not yet published */
    EV_THREAD_STARTED,
    EV_WANTS_GVL,
    EV_GVL_ACQUIRED,
    EV_GVL_RELEASED,
    EV_THREAD_EXITED,
    EV_GC_ENTER,
    EV_GC_EXIT,
    EV_SLEEP_ENTER,
    EV_MUTEX_LOCK_ENTER,
    EV_COUNT
};

static const struct {
    const char *name, *cruby_event, *source, *method;
    int native_tid_known; /* the callback runs on the thread the event is about */
} event_info[EV_COUNT] = {
    [EV_THREAD_STARTED] = {"thread_started", "RUBY_INTERNAL_THREAD_EVENT_STARTED", "thread_hook", NULL, 0},
    [EV_WANTS_GVL] = {"wants_gvl", "RUBY_INTERNAL_THREAD_EVENT_READY", "thread_hook", NULL, 0},
    [EV_GVL_ACQUIRED] = {"gvl_acquired", "RUBY_INTERNAL_THREAD_EVENT_RESUMED", "thread_hook", NULL, 1},
    [EV_GVL_RELEASED] = {"gvl_released", "RUBY_INTERNAL_THREAD_EVENT_SUSPENDED", "thread_hook", NULL, 1},
    [EV_THREAD_EXITED] = {"thread_exited", "RUBY_INTERNAL_THREAD_EVENT_EXITED", "thread_hook", NULL, 1},
    [EV_GC_ENTER] = {"gc_enter", "RUBY_INTERNAL_EVENT_GC_ENTER", "gc_hook", NULL, 1},
    [EV_GC_EXIT] = {"gc_exit", "RUBY_INTERNAL_EVENT_GC_EXIT", "gc_hook", NULL, 1},
    [EV_SLEEP_ENTER] = {"sleep_enter", NULL, "probe", "Kernel#sleep", 1},
    [EV_MUTEX_LOCK_ENTER] = {"mutex_lock_enter", NULL, "probe", "Thread::Mutex#lock", 1},
};

struct rvref_record {
    uint64_t t_ns;      /* CLOCK_MONOTONIC, absolute */
    uint64_t th;        /* rb_thread_t * */
    uint64_t seq;       /* claim order, breaks timestamp ties when sorting */
    uint32_t serial;    /* th->serial as the VM holds it (0 on release builds, see above) */
    int32_t probe_tid;  /* gettid() of the thread that ran the callback */
    _Atomic uint32_t event; /* published last */
    uint32_t pad;
};

static struct rvref_record *records;
static size_t capacity;
static _Atomic uint64_t next_slot;
static _Atomic uint64_t dropped;
static uint64_t origin_ns;
static uint64_t tracepoints_started_ns;          /* after the TracePoints were enabled */
static _Atomic uint64_t tracepoints_stopped_ns; /* when our end proc ran: CRuby clears TracePoints right after */
static char out_path[4096];
static char ruby_version_str[32];
static uintptr_t main_th;
static uint32_t main_vm_serial;
static int main_tid;
static int recording;

static inline uint64_t
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline int
current_tid(void)
{
    /* A raw syscall: no TLS (dynamic TLS of a dlopen'ed object may allocate on first use), no lock. */
    return (int)syscall(SYS_gettid);
}

static inline uint32_t
th_serial(uintptr_t th)
{
    uint32_t serial;
    memcpy(&serial, (const char *)th + RVREF_SERIAL_OFFSET, sizeof serial);
    return serial;
}

static inline void
store(enum rvref_event ev, uintptr_t th)
{
    uint64_t t = now_ns();
    uint64_t slot = atomic_fetch_add_explicit(&next_slot, 1, memory_order_relaxed);
    if (slot >= capacity) {
        atomic_fetch_add_explicit(&dropped, 1, memory_order_relaxed);
        return;
    }
    struct rvref_record *r = &records[slot];
    r->t_ns = t;
    r->th = th;
    r->seq = slot;
    r->serial = th ? th_serial(th) : 0;
    r->probe_tid = current_tid();
    atomic_store_explicit(&r->event, (uint32_t)ev, memory_order_release);
}

static inline uintptr_t
thread_value_to_th(VALUE thread)
{
    /* Thread objects are never embedded typed data, so this is a plain field read. */
    return (uintptr_t)RTYPEDDATA_DATA(thread);
}

/* Thread event hook. See the header comment: no GVL, scheduler lock held, no Ruby calls, no allocation, no I/O. */
static void
on_thread_event(rb_event_flag_t event, const rb_internal_thread_event_data_t *data, void *user_data)
{
    enum rvref_event ev;
    switch (event) {
      case RUBY_INTERNAL_THREAD_EVENT_STARTED: ev = EV_THREAD_STARTED; break;
      case RUBY_INTERNAL_THREAD_EVENT_READY: ev = EV_WANTS_GVL; break;
      case RUBY_INTERNAL_THREAD_EVENT_RESUMED: ev = EV_GVL_ACQUIRED; break;
      case RUBY_INTERNAL_THREAD_EVENT_SUSPENDED: ev = EV_GVL_RELEASED; break;
      case RUBY_INTERNAL_THREAD_EVENT_EXITED: ev = EV_THREAD_EXITED; break;
      default: return;
    }
    store(ev, (data && data->thread) ? thread_value_to_th(data->thread) : 0);
}

/* GC enter/exit: runs inside gc_enter()/gc_exit() on the thread that holds the GVL; no allocation allowed. */
static void
on_gc_event(VALUE tpval, void *data)
{
    rb_trace_arg_t *arg = rb_tracearg_from_tracepoint(tpval);
    rb_event_flag_t flag = rb_tracearg_event_flag(arg);
    enum rvref_event ev = (flag & RUBY_INTERNAL_EVENT_GC_ENTER) ? EV_GC_ENTER : EV_GC_EXIT;
    store(ev, thread_value_to_th(rb_thread_current()));
}

static VALUE sym_sleep, sym_lock, sym_synchronize, kernel_module, mutex_class;

/* C-call probe: runs with the GVL on the calling thread. Compares against values computed at load time. */
static void
on_c_call(VALUE tpval, void *data)
{
    rb_trace_arg_t *arg = rb_tracearg_from_tracepoint(tpval);
    VALUE mid = rb_tracearg_method_id(arg);
    enum rvref_event ev;
    if (mid == sym_sleep) {
        if (rb_tracearg_defined_class(arg) != kernel_module) return;
        ev = EV_SLEEP_ENTER;
    }
    else if (mid == sym_lock || mid == sym_synchronize) {
        if (rb_tracearg_defined_class(arg) != mutex_class) return;
        ev = EV_MUTEX_LOCK_ENTER;
    }
    else {
        return;
    }
    store(ev, thread_value_to_th(rb_thread_current()));
}

/* A Ruby end proc registered at load time runs after the program's own at_exit blocks; right after the end procs
 * CRuby's rb_ec_teardown() clears every TracePoint (rb_ec_clear_all_trace_func), so GC and probe events after this
 * moment are invisible to any in-process TracePoint (the thread event hook is not cleared). */
/* 1 if some task of this process other than the caller is runnable (state R in /proc/self/task/TID/stat), 0 if none,
 * -1 if /proc cannot be read. Runs with the GVL at end-proc time: allocation is allowed, no Ruby calls are made. */
static int
other_task_runnable(void)
{
    int self = current_tid();
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    int runnable = 0;
    struct dirent *e;
    while (!runnable && (e = readdir(d)) != NULL) {
        int tid = atoi(e->d_name);
        if (tid <= 0 || tid == self) continue;
        char path[64], buf[512];
        snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
        FILE *f = fopen(path, "r");
        if (!f) continue; /* the task exited */
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        const char *close_paren = strrchr(buf, ')'); /* comm may contain spaces and parentheses */
        if (close_paren && close_paren[1] == ' ' && close_paren[2] == 'R') runnable = 1;
    }
    closedir(d);
    return runnable;
}

static void
on_end_proc(VALUE unused)
{
    atomic_store(&tracepoints_stopped_ns, now_ns());
    /* See the header: let every native thread finish switching off a finished Ruby thread's stack before the VM frees
     * it. Two idle readings 1 ms apart, or 2 s at most. */
    int idle_readings = 0;
    for (int i = 0; i < 2000 && idle_readings < 2; i++) {
        int r = other_task_runnable();
        if (r < 0) break;
        idle_readings = r ? 0 : idle_readings + 1;
        struct timespec ms = {0, 1000 * 1000};
        nanosleep(&ms, NULL);
    }
}

static int
cmp_records(const void *a, const void *b)
{
    const struct rvref_record *x = a, *y = b;
    if (x->t_ns != y->t_ns) return x->t_ns < y->t_ns ? -1 : 1;
    return x->seq < y->seq ? -1 : (x->seq > y->seq ? 1 : 0);
}

/* Writes the records as an .rvtrace file; runs in the child forked by write_trace (or in-process if fork failed).
 * pid and stop_tid are the exiting process's, taken before the fork. */
static void
write_trace_file(uint64_t stopped, int pid, int stop_tid)
{
    uint64_t claimed = atomic_load(&next_slot);
    size_t n = claimed < capacity ? (size_t)claimed : capacity;
    uint64_t drops = atomic_load(&dropped);

    /* Compact away slots that were claimed but never published (cannot happen once every thread is gone, but a
     * half-written record must never reach the file). */
    size_t m = 0;
    uint64_t unpublished = 0;
    for (size_t i = 0; i < n; i++) {
        if (atomic_load_explicit(&records[i].event, memory_order_acquire) == EV_NONE) { unpublished++; continue; }
        if (m != i) {
            records[m] = records[i];
        }
        m++;
    }
    qsort(records, m, sizeof records[0], cmp_records);

    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", out_path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        fprintf(stderr, "rvref: cannot write %s: %s\n", tmp, strerror(errno));
        return;
    }
    static char buf[1 << 16];
    setvbuf(f, buf, _IOFBF, sizeof buf);
    fprintf(f,
            "{\"rvtrace\":1,\"recorder\":\"in-process\",\"recorder_version\":\"rvref-1\",\"pid\":%d,"
            "\"ruby_version\":\"%s\",\"clock\":\"monotonic\",\"origin_ns\":%" PRIu64 ","
            "\"channels\":[\"thread_hook\",\"gc_hook\"%s]}\n",
            pid, ruby_version_str, origin_ns, getenv("RVREF_PROBES") && !strcmp(getenv("RVREF_PROBES"), "1") ? ",\"probe\"" : "");

    /* Ruby thread ids: th pointer -> id, (re)assigned at STARTED, in timestamp order. The VM is gone, so plain
     * malloc is fine here. */
    size_t live_cap = 64, live_n = 0;
    struct { uint64_t th; uint32_t id; } *live = malloc(live_cap * sizeof *live);
    uint32_t next_id = 2;
    uint64_t counts[EV_COUNT] = {0};
    uint64_t nthreads = 0;
    if (!live) { fclose(f); unlink(tmp); return; }
    live[live_n].th = main_th;
    live[live_n].id = 1;
    live_n++;

    nthreads++;
    fprintf(f, "{\"thread\":{\"ruby_thread\":1,\"main\":true,\"th\":\"0x%" PRIx64 "\",\"vm_serial\":%" PRIu32 "}}\n",
            (uint64_t)main_th, main_vm_serial);
    fprintf(f, "{\"t_ns\":0,\"ruby_thread\":1,\"native_tid\":%d,\"probe_tid\":%d,\"event\":\"tracing_started\","
               "\"cruby_event\":null,\"source\":\"recorder\",\"provenance\":\"observed\"}\n",
            main_tid, main_tid);
    for (size_t i = 0; i < m; i++) {
        const struct rvref_record *r = &records[i];
        uint32_t ev = atomic_load_explicit(&r->event, memory_order_relaxed);
        if (ev >= EV_COUNT) continue;
        counts[ev]++;
        size_t k = live_n;
        for (size_t j = 0; j < live_n; j++) {
            if (live[j].th == r->th) { k = j; break; }
        }
        int fresh = 0;
        if (k == live_n) {
            if (live_n == live_cap) {
                live_cap *= 2;
                void *grown = realloc(live, live_cap * sizeof *live);
                if (!grown) { free(live); fclose(f); unlink(tmp); return; }
                live = grown;
            }
            live_n++;
            live[k].th = r->th;
            fresh = 1;
        }
        else if (ev == EV_THREAD_STARTED && r->th != main_th) {
            fresh = 1; /* a new thread in reused rb_thread_t memory */
        }
        if (fresh) {
            live[k].id = next_id++;
            nthreads++;
            fprintf(f, "{\"thread\":{\"ruby_thread\":%" PRIu32 ",\"main\":false,\"th\":\"0x%" PRIx64 "\",\"vm_serial\":%" PRIu32 "}}\n",
                    live[k].id, r->th, r->serial);
        }
        uint32_t rid = live[k].id;
        int64_t t = (int64_t)(r->t_ns - origin_ns);
        fprintf(f, "{\"t_ns\":%" PRId64 ",\"ruby_thread\":%" PRIu32 ",", t, rid);
        if (event_info[ev].native_tid_known) fprintf(f, "\"native_tid\":%d,", r->probe_tid);
        else fputs("\"native_tid\":null,", f);
        fprintf(f, "\"probe_tid\":%d,\"event\":\"%s\",", r->probe_tid, event_info[ev].name);
        if (event_info[ev].cruby_event) fprintf(f, "\"cruby_event\":\"%s\",", event_info[ev].cruby_event);
        else fputs("\"cruby_event\":null,", f);
        if (event_info[ev].method) fprintf(f, "\"method\":\"%s\",", event_info[ev].method);
        fprintf(f, "\"source\":\"%s\",\"provenance\":\"observed\",\"th\":\"0x%" PRIx64 "\"}\n", event_info[ev].source,
                r->th);
    }
    free(live);
    uint64_t tp_stop = atomic_load(&tracepoints_stopped_ns);
    fprintf(f, "{\"t_ns\":%" PRId64 ",\"ruby_thread\":null,\"native_tid\":null,\"probe_tid\":%d,"
               "\"event\":\"tracing_stopped\",\"cruby_event\":null,\"source\":\"recorder\",\"provenance\":\"observed\"}\n",
            (int64_t)(stopped - origin_ns), stop_tid);
    fprintf(f, "{\"summary\":{\"events\":%zu,\"events_dropped\":%" PRIu64 ",\"unpublished\":%" PRIu64
               ",\"capacity\":%zu,\"threads\":%" PRIu64 ",\"stopped_t_ns\":%" PRId64 ",",
            m, drops, unpublished, capacity, nthreads, (int64_t)(stopped - origin_ns));
    fprintf(f, "\"tracepoints_started_t_ns\":%" PRId64 ",", (int64_t)(tracepoints_started_ns - origin_ns));
    if (tp_stop) fprintf(f, "\"tracepoints_stopped_t_ns\":%" PRId64 ",", (int64_t)(tp_stop - origin_ns));
    else fputs("\"tracepoints_stopped_t_ns\":null,", f);
    fputs("\"counts\":{", f);
    for (int e = 1; e < EV_COUNT; e++) fprintf(f, "%s\"%s\":%" PRIu64, e > 1 ? "," : "", event_info[e].name, counts[e]);
    fputs("}}}\n", f);
    if (fclose(f) != 0 || rename(tmp, out_path) != 0) {
        fprintf(stderr, "rvref: cannot write %s: %s\n", out_path, strerror(errno));
        unlink(tmp);
    }
}

static void
write_trace(void)
{
    if (!recording) return;
    recording = 0;
    uint64_t stopped = now_ns();
    int pid = (int)getpid();
    int stop_tid = current_tid();
    pid_t child = fork();
    if (child == 0) {
        write_trace_file(stopped, pid, stop_tid);
        _exit(0);
    }
    if (child < 0) write_trace_file(stopped, pid, stop_tid); /* no child: write it here, slower exit */
}

void
Init_rvref(void)
{
    const char *out = getenv("RVREF_OUT");
    if (!out || !*out) return;
    if (strlen(out) >= sizeof out_path) rb_raise(rb_eArgError, "rvref: RVREF_OUT too long");
    strcpy(out_path, out);

    VALUE main_thread = rb_thread_main();
    main_th = thread_value_to_th(main_thread);
    VALUE self_field;
    memcpy(&self_field, (const char *)main_th + RVREF_SELF_OFFSET, sizeof self_field);
    if (self_field != main_thread) {
        rb_raise(rb_eRuntimeError, "rvref: rb_thread_t layout mismatch (th->self is not the Thread); refusing to record");
    }

    capacity = 1u << 20;
    const char *cap = getenv("RVREF_CAPACITY");
    if (cap && *cap) capacity = strtoull(cap, NULL, 10);
    if (capacity == 0) capacity = 1;
    /* Preallocated and prefaulted, so a callback never takes a page fault on first touch. */
    records = mmap(NULL, capacity * sizeof *records, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                   -1, 0);
    if (records == MAP_FAILED) rb_raise(rb_eNoMemError, "rvref: cannot map %zu records", capacity);

    VALUE v = rb_const_get(rb_cObject, rb_intern("RUBY_VERSION"));
    snprintf(ruby_version_str, sizeof ruby_version_str, "%s", StringValueCStr(v));
    main_tid = current_tid();
    main_vm_serial = th_serial(main_th);

    sym_sleep = ID2SYM(rb_intern("sleep"));
    sym_lock = ID2SYM(rb_intern("lock"));
    sym_synchronize = ID2SYM(rb_intern("synchronize"));
    kernel_module = rb_mKernel;
    mutex_class = rb_const_get(rb_cThread, rb_intern("Mutex"));
    rb_gc_register_mark_object(mutex_class);

    if (atexit(write_trace) != 0) rb_raise(rb_eRuntimeError, "rvref: atexit failed");
    rb_set_end_proc(on_end_proc, Qnil);

    /* Allocate the TracePoints first: an allocation can start a GC, which must not fall inside the recorded window
     * unseen. */
    VALUE gc_tp = rb_tracepoint_new(0, RUBY_INTERNAL_EVENT_GC_ENTER | RUBY_INTERNAL_EVENT_GC_EXIT, on_gc_event, NULL);
    rb_gc_register_mark_object(gc_tp);
    VALUE call_tp = Qnil;
    const char *probes = getenv("RVREF_PROBES");
    if (probes && !strcmp(probes, "1")) {
        call_tp = rb_tracepoint_new(0, RUBY_EVENT_C_CALL, on_c_call, NULL);
        rb_gc_register_mark_object(call_tp);
    }

    origin_ns = now_ns();
    recording = 1;
    /* Only the main thread exists and it holds the GVL: no thread event can fire between origin_ns and the hook (a
     * GC can, but GC is no scheduler transition). */
    rb_internal_thread_add_event_hook(on_thread_event,
                                      RUBY_INTERNAL_THREAD_EVENT_STARTED | RUBY_INTERNAL_THREAD_EVENT_READY |
                                          RUBY_INTERNAL_THREAD_EVENT_RESUMED | RUBY_INTERNAL_THREAD_EVENT_SUSPENDED |
                                          RUBY_INTERNAL_THREAD_EVENT_EXITED,
                                      NULL);
    /* Enabling a TracePoint allocates its hook entry, which can run a GC before the hook is live; so the TracePoint
     * events (GC, probes) are complete only from tracepoints_started_ns on, and the summary says so. */
    rb_tracepoint_enable(gc_tp);
    if (call_tp != Qnil) rb_tracepoint_enable(call_tp);
    tracepoints_started_ns = now_ns();
}
