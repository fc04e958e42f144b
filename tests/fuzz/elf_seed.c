/* Seed for the ELF fuzzer (fuzz_elf): a tiny stand-in for a CRuby VM binary with the shapes rvbpfd's analysis
 * looks for, compiled at build time in several link modes (tests/fuzz/CMakeLists.txt). Not Ruby code: only the
 * symbol names, struct names and code shapes match what the site finder, the DWARF queries, the EC route and the
 * global_symbols search read.
 *   - thread-event hook checks: a test of `rb_internal_thread_event_hooks` guarding a call to
 *     rb_thread_execute_hooks(event, th), for the five event bits, with `th` in different registers;
 *   - GC functions (gc_start, gc_rest with a .part.0 body, gc_continue) and a flag word with a hook-event byte;
 *   - Kernel#sleep and Mutex#lock workers;
 *   - the structs whose members are looked up in DWARF;
 *   - a thread-local ruby_current_ec read by rb_current_ec_noinline, ruby_current_vm_ptr;
 *   - a symbol table (ruby_global_symbols) read by rb_id2str the way symbol.c's code does. */
#include <stddef.h>
#include <stdint.h>

struct rb_native_thread { long pad0[3]; int tid; };
struct rb_execution_context_struct;
struct rb_thread_struct {
  void *pad0[5];
  struct rb_native_thread *nt;
  struct rb_execution_context_struct *ec;
  char pad1[144];
  uint32_t serial;
};
struct rb_execution_context_struct {
  uintptr_t *vm_stack;
  size_t vm_stack_size;
  void *cfp;
  char pad[24];
  struct rb_thread_struct *thread_ptr;
};
struct rb_ractor_struct { char pad[384]; struct rb_execution_context_struct *running_ec; };
struct rb_vm_struct { void *self; char pad[24]; struct { struct rb_ractor_struct *main_ractor; } ractor; };
struct rb_objspace { uint32_t flags; uint32_t hook_events; int during_gc; };
typedef struct { uint32_t last_id; uint32_t pad; void *str_sym; void *ids; } rb_symbols_t;

static void *rb_internal_thread_event_hooks;  /* static, as in CRuby: a RIP-relative test, no GOT */
uint32_t ruby_vm_event_flags;
struct rb_vm_struct *ruby_current_vm_ptr;
__thread struct rb_execution_context_struct *ruby_current_ec;
static rb_symbols_t ruby_global_symbols;
void *volatile seed_sink;
extern struct rb_thread_struct *seed_lookup_thread(int which);

__attribute__((noinline)) static void rb_thread_execute_hooks(unsigned event, struct rb_thread_struct *th) {
  seed_sink = th;
  seed_sink = (void *)(uintptr_t)event;
}

#define THREAD_HOOK(ev, th)                                                  \
  do {                                                                       \
    if (__builtin_expect(rb_internal_thread_event_hooks != NULL, 0))         \
      rb_thread_execute_hooks((ev), (th));                                   \
  } while (0)

void rb_internal_thread_add_event_hook(void *hook) { rb_internal_thread_event_hooks = hook; }
void thread_start_func(struct rb_thread_struct *th) { THREAD_HOOK(1u << 0, th); seed_sink = th->ec; }
void thread_sched_to_ready(long spin, struct rb_thread_struct *th) { seed_sink = (void *)spin; THREAD_HOOK(1u << 1, th); }
void thread_sched_to_running(struct rb_thread_struct *th) { seed_sink = th->nt; THREAD_HOOK(1u << 2, th); }
void thread_sched_to_waiting(struct rb_thread_struct *th) { THREAD_HOOK(1u << 3, th); }
void thread_do_exit(void) { THREAD_HOOK(1u << 4, seed_lookup_thread(4)); }
int thread_layout(struct rb_thread_struct *th) { return th->nt->tid + (int)th->serial; }

void rb_f_sleep(void) { seed_sink = 0; }
void rb_mutex_lock(void) { seed_sink = (void *)1; }
void rb_mutex_synchronize(void) { rb_mutex_lock(); seed_sink = 0; }

void gc_rest_part(struct rb_objspace *objspace) __asm__("gc_rest.part.0");
__attribute__((noinline)) void gc_rest_part(struct rb_objspace *objspace) { objspace->during_gc = 0; }
int gc_start(struct rb_objspace *objspace, unsigned reason) {
  objspace->during_gc = 1;
  if (objspace->hook_events & 0x2000000u) seed_sink = objspace;
  objspace->during_gc = 0;
  if (objspace->hook_events & 0x4000000u) seed_sink = objspace;
  return (int)reason;
}
void gc_rest(struct rb_objspace *objspace) { if (objspace->during_gc) gc_rest_part(objspace); }
void gc_continue(struct rb_objspace *objspace) { seed_sink = objspace; }

__attribute__((noinline)) struct rb_execution_context_struct *rb_current_ec_noinline(void) { return ruby_current_ec; }
struct rb_ractor_struct *seed_main_ractor(void) { return ruby_current_vm_ptr->ractor.main_ractor; }

void *rb_id2str(uintptr_t id) {
  uint32_t serial = (uint32_t)(id >> 4);
  if (serial > ruby_global_symbols.last_id) return NULL;
  void **chunks = (void **)ruby_global_symbols.ids;
  return chunks[serial / 512];
}

#ifdef SEED_EXECUTABLE
struct rb_thread_struct *seed_lookup_thread(int which) { return (struct rb_thread_struct *)(uintptr_t)which; }
int main(void) {
  seed_sink = rb_current_ec_noinline();
  seed_sink = rb_id2str(42);
  return 0;
}
#endif
