/*
 * rvgolden: what CRuby itself says the Ruby stacks are, for rvbpfd's walker and symbolizer tests.
 *
 * RvGolden.capture(path, stop) runs, for every thread in Thread.list, rb_profile_thread_frames (the per-thread form
 * of rb_profile_frames, same walk) and, per frame, rb_profile_frame_full_label / _path / _absolute_path /
 * _first_lineno plus the line rb_profile_frames returned, and writes them as JSON to `path`. With stop == true it then
 * sends SIGSTOP to its own process while still holding the GVL, so no Ruby thread can run between the capture and the
 * stop: a debugger, process_vm_readv or a core dump then sees exactly the stacks that were captured.
 *
 * Per thread it writes the rb_thread_t address (RTYPEDDATA_DATA of the Thread: public API) so the tests can find the
 * thread's execution context through rb_thread_t.ec, and Thread#native_thread_id.
 *
 * CRuby before 3.3 has no rb_profile_thread_frames; rb_profile_frames walks GET_EC(), the thread-local
 * ruby_current_ec. Where libruby exports that variable (Debian's libruby-3.1 does; extconf.rb checks that it links),
 * RVGOLDEN_EC_SWAP is defined and each thread's frames are taken by pointing this native thread's ruby_current_ec at
 * the other thread's EC for the duration of one rb_profile_frames call (GVL held, nothing allocates or switches in
 * between), then restoring it: CRuby's own walk over the other thread's stack. The EC is rb_thread_t.ec, whose offset
 * is found, not assumed: the one word of the current thread's rb_thread_t equal to its own ruby_current_ec. The
 * offset goes to the output ("th_ec_offset") so the tests can check their table against it.
 *
 * Output (one object):
 *   {"ruby_version": "3.3.8", "pid": N, "threads": [{"name": ..., "native_tid": N, "th": "0x...", "status": ...,
 *     "main": bool, "frames": [{"label": ..., "path": ..., "absolute_path": ..., "first_lineno": N|null,
 *     "line": N}]}]}
 * nil values are JSON null. Strings are written byte for byte (escaped for JSON).
 */
#include <ruby.h>
#include <ruby/debug.h>
#include <ruby/version.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Deeper than any test scenario (1,000-deep recursion is ~3 frames per level with blocks). */
#define RVGOLDEN_MAX_FRAMES 16384

#ifdef RVGOLDEN_EC_SWAP
extern __thread void *ruby_current_ec;

/* Bytes of rb_thread_t searched for the ec pointer (it is at 40 in 3.1, 48 in 3.2+). */
#define RVGOLDEN_TH_SCAN_BYTES 256

static long rvgolden_th_ec_offset(void) {
  const char *th = (const char *)RTYPEDDATA_DATA(rb_thread_current());
  void *ec = ruby_current_ec;
  long found = -1;
  for (long off = 0; off < RVGOLDEN_TH_SCAN_BYTES; off += (long)sizeof(void *)) {
    void *word;
    memcpy(&word, th + off, sizeof(word));
    if (word != ec) continue;
    if (found >= 0) {
      rb_raise(rb_eRuntimeError, "rvgolden: rb_thread_t.ec is ambiguous (offsets %ld and %ld)", found, off);
    }
    found = off;
  }
  if (found < 0) {
    rb_raise(rb_eRuntimeError, "rvgolden: rb_thread_t.ec not found in the first %d bytes", RVGOLDEN_TH_SCAN_BYTES);
  }
  return found;
}

static int rvgolden_thread_frames(VALUE thread, long ec_offset, int limit, VALUE *buff, int *lines) {
  void *ec;
  memcpy(&ec, (const char *)RTYPEDDATA_DATA(thread) + ec_offset, sizeof(ec));
  if (ec == NULL) return 0;
  void *saved = ruby_current_ec;
  ruby_current_ec = ec;
  int n = rb_profile_frames(0, limit, buff, lines);
  ruby_current_ec = saved;
  return n;
}
#endif

static void put_json_string(FILE *f, VALUE v) {
  if (NIL_P(v)) {
    fputs("null", f);
    return;
  }
  v = rb_obj_as_string(v);
  const unsigned char *p = (const unsigned char *)RSTRING_PTR(v);
  long n = RSTRING_LEN(v);
  fputc('"', f);
  for (long i = 0; i < n; i++) {
    unsigned char c = p[i];
    if (c == '"' || c == '\\') {
      fputc('\\', f);
      fputc(c, f);
    } else if (c < 0x20) {
      fprintf(f, "\\u%04x", c);
    } else {
      fputc(c, f);
    }
  }
  fputc('"', f);
}

static void put_json_int_or_null(FILE *f, VALUE v) {
  if (NIL_P(v)) fputs("null", f);
  else fprintf(f, "%ld", NUM2LONG(v));
}

static VALUE rvgolden_capture(VALUE self, VALUE path, VALUE stop) {
#ifdef RVGOLDEN_EC_SWAP
  const long ec_offset = rvgolden_th_ec_offset(); /* may raise: before anything is allocated or opened */
#endif
  VALUE threads = rb_funcall(rb_cThread, rb_intern("list"), 0);
  VALUE main_thread = rb_thread_main();
  VALUE *buff = ALLOC_N(VALUE, RVGOLDEN_MAX_FRAMES);
  int *lines = ALLOC_N(int, RVGOLDEN_MAX_FRAMES);
  VALUE tmp_path = rb_str_plus(path, rb_str_new_cstr(".tmp"));
  FILE *f = fopen(StringValueCStr(tmp_path), "w");
  if (f == NULL) {
    xfree(buff);
    xfree(lines);
    rb_sys_fail(StringValueCStr(tmp_path));
  }
#ifdef RVGOLDEN_EC_SWAP
  fprintf(f, "{\"ruby_version\":\"%s\",\"pid\":%ld,\"capture\":\"ec-swap\",\"th_ec_offset\":%ld,\"threads\":[",
          ruby_version, (long)getpid(), ec_offset);
#else
  fprintf(f, "{\"ruby_version\":\"%s\",\"pid\":%ld,\"threads\":[", ruby_version, (long)getpid());
#endif
  for (long t = 0; t < RARRAY_LEN(threads); t++) {
    VALUE th = RARRAY_AREF(threads, t);
    /* The frames are taken first, before anything allocates: rb_profile_frame_* may allocate, but other threads cannot
     * run (we hold the GVL), so their stacks do not change either way. */
#ifdef RVGOLDEN_EC_SWAP
    int n = rvgolden_thread_frames(th, ec_offset, RVGOLDEN_MAX_FRAMES, buff, lines);
#else
    int n = rb_profile_thread_frames(th, 0, RVGOLDEN_MAX_FRAMES, buff, lines);
#endif
    fprintf(f, "%s{\"name\":", t ? "," : "");
    put_json_string(f, rb_funcall(th, rb_intern("name"), 0));
    fputs(",\"native_tid\":", f);
    put_json_int_or_null(f, rb_funcall(th, rb_intern("native_thread_id"), 0));
    fprintf(f, ",\"th\":\"0x%lx\",\"main\":%s,\"status\":", (unsigned long)RTYPEDDATA_DATA(th),
            th == main_thread ? "true" : "false");
    put_json_string(f, rb_funcall(th, rb_intern("status"), 0));
    fputs(",\"frames\":[", f);
    for (int i = 0; i < n; i++) {
      fputs(i ? ",{\"label\":" : "{\"label\":", f);
      put_json_string(f, rb_profile_frame_full_label(buff[i]));
      fputs(",\"path\":", f);
      put_json_string(f, rb_profile_frame_path(buff[i]));
      fputs(",\"absolute_path\":", f);
      put_json_string(f, rb_profile_frame_absolute_path(buff[i]));
      fputs(",\"first_lineno\":", f);
      put_json_int_or_null(f, rb_profile_frame_first_lineno(buff[i]));
      fprintf(f, ",\"line\":%d}", lines[i]);
    }
    fputs("]}", f);
  }
  fputs("]}\n", f);
  fclose(f);
  xfree(buff);
  xfree(lines);
  if (rename(StringValueCStr(tmp_path), StringValueCStr(path)) != 0) rb_sys_fail(StringValueCStr(path));
  RB_GC_GUARD(threads);
  if (RTEST(stop)) {
    fflush(NULL);
    /* The process stops here, inside this C method, GVL held; the recorder or test takes over (and kills it). */
    kill(getpid(), SIGSTOP);
  }
  return Qnil;
}

void Init_rvgolden(void) {
  VALUE mod = rb_define_module("RvGolden");
  rb_define_singleton_method(mod, "capture", rvgolden_capture, 2);
}
