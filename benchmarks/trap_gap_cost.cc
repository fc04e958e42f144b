// What one uprobe hit costs as a function of the work the CPU did since the previous one (needs root).
//
// A loop alternates blocks of work (random reads over a 16 MiB buffer: the memory traffic of a real program between
// two scheduler events) with a call of one of two identical hook-check functions, only one of which is probed (one
// multi-uprobe link, rvbpfd's BPF program). Probed and unprobed blocks interleave, so drift in the machine's speed
// cancels; the difference of their mean times is the trap's cost after that much work. Back to back (no work) this
// is the bare figure of bench_uprobe_cost; after tens of microseconds of other work the trap path (kernel entry, the
// hypervisor's exit handling on a VM, the BPF program, its maps and ring) has left the caches and the same trap costs
// more. OverheadBudget charges a trap that follows kColdGapNs without one on its CPU at --cold-probe-cost-us; this
// prints the figures behind that default. Output: one JSON object, gaps in microseconds of work, costs in
// microseconds per trap. Usage: bench_trap_gap_cost [BLOCKS] [mem|sys] [emulated|stepped]
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "self_probe.h"

namespace {
volatile uint64_t g_sink;

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

constexpr size_t kBufferBytes = 16u << 20;  // larger than the L2 caches, like a Ruby heap's live part
constexpr size_t kLine = 64;
constexpr int kItersPerSyscall = 250;

// `iters` dependent random reads over the buffer (xorshift index): ~5-20 ns each depending on cache hits.
uint64_t Work(const std::vector<uint8_t>& buf, uint64_t* state, int iters) {
  uint64_t x = *state, acc = 0;
  const size_t lines = buf.size() / kLine;
  for (int i = 0; i < iters; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    acc += buf[(x % lines) * kLine];
  }
  *state = x;
  return acc;
}
}  // namespace

int main(int argc, char** argv) {
  const int blocks = argc > 1 ? atoi(argv[1]) : 4000;  // per gap and kind
  // "sys": the work also makes a pipe write + read per kItersPerSyscall reads, as an IO-bound program does between
  // GVL hand-offs (kernel paths evict more of the trap path than user-space reads do).
  const bool syscalls = argc > 2 && std::string(argv[2]) == "sys";
  // "stepped": the probe on the cmpq (single-stepped) instead of the jne (emulated, where rvbpfd puts its probes).
  const bool stepped = argc > 3 && std::string(argv[3]) == "stepped";
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return 1;
  uint64_t received = 0;
  std::optional<rvbpfd_bench::SelfProbe> self = rvbpfd_bench::OpenSelfProbe(&received);
  if (!self) return 1;
  auto group = self->session->Attach(self->exe, {self->Site(stepped ? 0 : rvbpfd_bench::kCheckJneOffset)}, getpid());
  if (!group) {
    fprintf(stderr, "%s\n", group.error().ToString().c_str());
    return 1;
  }
  std::vector<uint8_t> buf(kBufferBytes);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(i);
  uint64_t state = 88172645463325252ull;
  uint64_t th = 1;

  // Work per block in loop iterations; the printed gap is measured, not assumed.
  const std::vector<int> iters = {0, 100, 500, 2000, 5000, 20000};
  printf("{\"blocks\":%d,\"work\":\"%s\",\"probe\":\"%s\",\"gaps\":[", blocks, syscalls ? "sys" : "mem",
         stepped ? "single-stepped" : "emulated");
  for (size_t g = 0; g < iters.size(); ++g) {
    uint64_t ns[2] = {0, 0};
    uint64_t acc = 0;
    for (int b = 0; b < 2 * blocks; ++b) {
      const int kind = b & 1;  // 1: probed
      // The call first, then the work: what the trap evicted slows the work after it, which is part of its cost.
      const uint64_t t0 = NowNs();
      if (kind) {
        RvBenchCheck(&th);
      } else {
        RvBenchCheckTwin(&th);
      }
      acc += Work(buf, &state, iters[g]);
      if (syscalls) {
        for (int k = 0; k < iters[g] / kItersPerSyscall; ++k) {
          char c = 'x';
          if (write(pipe_fds[1], &c, 1) != 1 || read(pipe_fds[0], &c, 1) != 1) return 1;
        }
      }
      ns[kind] += NowNs() - t0;
      if (b % 2000 == 1999) (void)self->session->Poll(0);  // keep the ring from filling; outside any timed block
    }
    g_sink = g_sink + acc;
    const double work_us = static_cast<double>(ns[0]) / blocks / 1000.0;
    const double trap_us = static_cast<double>(ns[1] - std::min(ns[1], ns[0])) / blocks / 1000.0;
    printf("%s{\"work_us\":%.1f,\"trap_us\":%.2f}", g ? "," : "", work_us, trap_us);
    fflush(stdout);
  }
  while (self->session->Poll(0).value() > 0) {
  }
  printf("],\"records\":%llu}\n", static_cast<unsigned long long>(received));
  return received == static_cast<uint64_t>(blocks) * iters.size() ? 0 : 1;
}
