/* Host build of bpf/ruby_ec.h and bpf/ruby_gvl.h: the EC lookup and the GVL reading the sampler runs, with reads
 * served by a C++ MemoryReader (a live process, a test's own memory) through rv_host_read, so tests exercise the exact
 * code BPF runs. */
#include <linux/types.h>

#include "ruby_ec_host.h"
#include "ruby_walker_host.h"

#define RV_WALKER_READ(ctx, dst, len, addr) rv_host_read((ctx), (dst), (len), (addr))
#include "ruby_ec.h"
#include "ruby_gvl.h"

__u32 rv_host_find_ec(void *ctx, const struct rv_proc_ec *pe, const struct rv_walk_config *wc, __u32 th_nt,
                      __u32 nt_tid, __u64 tp, __u32 tid, __u64 *ec, __u64 *th, int *tls_unavailable) {
  return rv_find_ec(ctx, pe, wc, th_nt, nt_tid, tp, tid, ec, th, tls_unavailable);
}

int rv_host_ec_from_tls(void *ctx, const struct rv_proc_ec *pe, __u64 tp, __u64 *ec) {
  return rv_ec_from_tls(ctx, pe, tp, ec);
}

int rv_host_read_gvl(void *ctx, const struct rv_gvl_offsets *g, __u64 vm_ptr, __u64 th, struct rv_gvl_reading *out) {
  return rv_read_gvl(ctx, g, vm_ptr, th, out);
}

int rv_host_read_gvl_holder(void *ctx, const struct rv_gvl_offsets *g, __u64 vm_ptr, __u64 th, __u64 *holder) {
  return rv_read_gvl_holder(ctx, g, vm_ptr, th, holder);
}
