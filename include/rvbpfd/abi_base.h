/* What every header of the BPF/C++ boundary (include/rvbpfd/) builds on: the fixed-width types and one spelling of a
 * compile-time layout check for both compilers. Under clang -target bpf the types come from vmlinux.h, which the BPF
 * program includes first; on the host from <linux/types.h>. */
#ifndef RVBPFD_INCLUDE_RVBPFD_ABI_BASE_H_
#define RVBPFD_INCLUDE_RVBPFD_ABI_BASE_H_

#ifndef __bpf__
#include <linux/types.h>
#endif

/* A size or offset both sides rely on: a mismatch between the BPF and the host layout fails the build. */
#ifdef __cplusplus
#define RV_ABI_ASSERT(cond, what) static_assert(cond, what)
#else
#define RV_ABI_ASSERT(cond, what) _Static_assert(cond, what)
#endif

#endif /* RVBPFD_INCLUDE_RVBPFD_ABI_BASE_H_ */
