// Measures the bare cost of one uprobe hit on this machine with rvbpfd's own BPF program: a local noinline function
// is called N times without and with the probe attached (one multi-uprobe link, pid-filtered), and the difference per
// call is printed in microseconds. benchmarks/overhead.py compares the daemon's cost per Ruby event with this figure
// measured in the same run. Needs root.
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "elf/elf_file.h"
#include "probe/bpf_session.h"

namespace {
volatile uint64_t g_sink;
extern "C" __attribute__((noinline)) void RvBenchTarget(uint64_t* th) { g_sink = g_sink + *th; }

double NowS() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

double TimeCalls(int n) {
  uint64_t th = 1;
  double t0 = NowS();
  for (int i = 0; i < n; ++i) RvBenchTarget(&th);
  return NowS() - t0;
}
}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 200000;
  uint64_t received = 0;
  auto session = rvbpfd::BpfSession::Open(rvbpfd::SessionOptions{}, [&](const rv_record&) { ++received; });
  if (!session) {
    fprintf(stderr, "%s\n", session.error().ToString().c_str());
    return 1;
  }
  auto self = rvbpfd::ElfFile::Open("/proc/self/exe");
  if (!self) return 1;
  auto sym = self->FindSymbol("RvBenchTarget");
  auto off = sym ? self->VaddrToFileOffset(sym->value) : std::nullopt;
  char exe[4096];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (!off || len <= 0) return 1;
  exe[len] = 0;
  auto bin = (*session)->AddBinary(rv_offsets{0, 0, 0, RV_OFF_HAS_SERIAL});
  if (!bin || !(*session)->AddPid(static_cast<uint32_t>(getpid()))) return 1;
  const double base = TimeCalls(n);
  auto group = (*session)->Attach(exe, {{*off, rv_site{RV_EV_THREAD_RESUMED, RV_LOC_REG, RV_REG_RDI, *bin, 0}}},
                                  getpid());
  if (!group) {
    fprintf(stderr, "%s\n", group.error().ToString().c_str());
    return 1;
  }
  // Drain concurrently in chunks so the ring never fills during the timed loop.
  double probed = 0;
  const int chunk = 10000;
  for (int done = 0; done < n; done += chunk) {
    probed += TimeCalls(chunk);
    (void)(*session)->Poll(0);
  }
  while ((*session)->Poll(0).value() > 0) {
  }
  const double us_per_hit = (probed - base) / n * 1e6;
  printf("{\"calls\":%d,\"base_ns_per_call\":%.2f,\"probed_us_per_call\":%.3f,\"uprobe_us_per_hit\":%.3f,"
         "\"records\":%llu}\n",
         n, base / n * 1e9, probed / n * 1e6, us_per_hit, static_cast<unsigned long long>(received));
  return received == static_cast<uint64_t>(n) ? 0 : 1;
}
