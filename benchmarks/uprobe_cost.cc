// Measures the bare cost of one uprobe hit on this machine with rvbpfd's own BPF program, for both kinds of probed
// instruction (needs root). The probed function has the shape of a CRuby hook check, `cmpq $0, flag(%rip); jne`,
// and is called N times without and with a probe (one multi-uprobe link, pid-filtered):
//   - on the jne, an instruction the kernel emulates: where rvbpfd puts its probes (sites/placement.h);
//   - on the cmpq, which the kernel single-steps out of line (a second exception, #DB, after the int3): where a probe
//     sits when no emulated instruction follows its check closely enough.
// The difference per call is printed in microseconds. benchmarks/overhead.py compares the daemon's cost per Ruby
// event with the emulated figure measured in the same run; the recorder's --probe-cost-us and
// --stepped-probe-cost-us defaults come from these figures.
#include <time.h>

#include <cstdio>
#include <cstdlib>

#include "self_probe.h"

namespace {
double NowS() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

double TimeCalls(int n) {
  uint64_t th = 1;
  double t0 = NowS();
  for (int i = 0; i < n; ++i) RvBenchCheck(&th);
  return NowS() - t0;
}
}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 200000;
  uint64_t received = 0;
  std::optional<rvbpfd_bench::SelfProbe> self = rvbpfd_bench::OpenSelfProbe(&received);
  if (!self) return 1;

  // us per hit of a probe `at` bytes into RvBenchCheck: the probed loop against an unprobed one just before it.
  auto measure = [&](uint64_t at) -> double {
    const double base = TimeCalls(n);
    auto group = self->session->Attach(self->exe, {self->Site(at)}, getpid());
    if (!group) {
      fprintf(stderr, "%s\n", group.error().ToString().c_str());
      exit(1);
    }
    // Drain in chunks so the ring never fills during the timed loop.
    double probed = 0;
    const int chunk = 10000;
    for (int done = 0; done < n; done += chunk) {
      probed += TimeCalls(chunk);
      (void)self->session->Poll(0);
    }
    while (self->session->Poll(0).value() > 0) {
    }
    return (probed - base) / n * 1e6;
  };
  const double emulated_us = measure(rvbpfd_bench::kCheckJneOffset);
  const double stepped_us = measure(0);
  printf("{\"calls\":%d,\"uprobe_us_per_hit\":%.3f,\"single_step_us_per_hit\":%.3f,\"records\":%llu}\n", n,
         emulated_us, stepped_us, static_cast<unsigned long long>(received));
  return received == 2 * static_cast<uint64_t>(n) ? 0 : 1;
}
