/* C interface to the host build of bpf/ruby_ec.h and bpf/ruby_gvl.h (ruby_ec_host.c); reads go through rv_host_read
 * (walker.cc). */
#ifndef RVBPFD_SRC_STACKS_RUBY_EC_HOST_H_
#define RVBPFD_SRC_STACKS_RUBY_EC_HOST_H_

#include <linux/types.h>

#include "rvbpfd/abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* rv_find_ec of bpf/ruby_ec.h, with ctx a MemoryReader*. */
__u32 rv_host_find_ec(void *ctx, const struct rv_proc_ec *pe, const struct rv_walk_config *wc, __u32 th_nt,
                      __u32 nt_tid, __u64 tp, __u32 tid, __u64 *ec, __u64 *th, int *tls_unavailable);

/* rv_ec_from_tls of bpf/ruby_ec.h (enum rv_ec_tls_result). */
int rv_host_ec_from_tls(void *ctx, const struct rv_proc_ec *pe, __u64 tp, __u64 *ec);

/* rv_read_gvl of bpf/ruby_gvl.h, with ctx a MemoryReader*. */
int rv_host_read_gvl(void *ctx, const struct rv_gvl_offsets *g, __u64 vm_ptr, __u64 th, struct rv_gvl_reading *out);

/* rv_read_gvl_holder of bpf/ruby_gvl.h (the holder a READY reads), with ctx a MemoryReader*. */
int rv_host_read_gvl_holder(void *ctx, const struct rv_gvl_offsets *g, __u64 vm_ptr, __u64 th, __u64 *holder);

#ifdef __cplusplus
}
#endif

#endif /* RVBPFD_SRC_STACKS_RUBY_EC_HOST_H_ */
