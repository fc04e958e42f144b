// Measures what detaching and reattaching the high-rate probe group (what --max-overhead does at each paused
// window) costs a running Ruby process, for OverheadBudget's reattach charge (src/session/overhead_budget.h).
//
//   bench_reattach_cost VM_ELF RUBY [period_ms=10] [phases=6] [phase_ms=1000] [cpu|io|io-detached] [target_cpu]
//
// VM_ELF is the file the probes go into (libruby.so for a shared Ruby, the ruby executable for a static one). A
// single-threaded CPU-bound Ruby loop reports its progress every 20 ms; with the probe groups attached it takes no
// probe hit (one thread, no GVL hand-off), so any slowdown comes from the attach/detach work itself: uprobe
// (un)registration replaces the probed text pages of the target under its mmap lock and flushes its TLB. Phases
// alternate between "attached, still" and "detach + reattach every period_ms". With `io`, the target is two threads
// passing bytes through a pipe instead (six GVL-site hits per byte, the probes' traps counted in both kinds of phase
// alike): what a cycle costs a target that is trapping while the sites come and go. With `io-detached` the high group
// is detached in the still phases and a cycle is reattach + detach (the --max-overhead pattern seen from a paused
// window); the probe hits taken during the cycles are printed, so their cost can be told from the cycle's own.
// target_cpu pins the target to one CPU (as benchmarks/overhead.py pins io_heavy). Prints JSON: the target's progress
// rate in each kind of phase, the target time lost per cycle (us), and the daemon's wall and CPU time per detach and
// reattach (us). On a machine whose cores are all busy, the daemon's CPU time competes with the target as well.
// Needs root. Not a test: the numbers depend on the machine.
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "elf/elf_file.h"
#include "probe/bpf_session.h"
#include "session/vm_binary.h"
#include "sites/sites.h"
#include "target/target.h"

namespace {

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

uint64_t ThreadCpuNs() {
  rusage ru;
  getrusage(RUSAGE_THREAD, &ru);
  return (static_cast<uint64_t>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1'000'000ull +
          static_cast<uint64_t>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec)) *
         1000ull;
}

// Progress line of the target: "<CLOCK_MONOTONIC ns at the end of the slice> <work units in the slice> <slice ns>".
constexpr const char* kTargetScript =
    "$stdout.sync = true\n"
    "def now = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)\n"
    "loop do\n"
    "  t0 = now; n = 0\n"
    "  while (t = now) - t0 < 20_000_000\n"
    "    x = 0; 2000.times { |i| x += i }; n += 1\n"
    "  end\n"
    "  puts \"#{t} #{n} #{t - t0}\"\n"
    "end\n";

// The same progress lines from a trapping target: the main thread reads bytes a second thread writes, one at a time.
constexpr const char* kIoTargetScript =
    "$stdout.sync = true\n"
    "def now = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)\n"
    "r, w = IO.pipe\n"
    "Thread.new { loop { w.write('x') } }\n"
    "loop do\n"
    "  t0 = now; n = 0\n"
    "  while (t = now) - t0 < 20_000_000\n"
    "    r.read(1); n += 1\n"
    "  end\n"
    "  puts \"#{t} #{n} #{t - t0}\"\n"
    "end\n";

struct Slice {
  uint64_t end_ns;
  double rate;  // work units per second
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s VM_ELF RUBY [period_ms=10] [phases=6] [phase_ms=1000] [cpu|io] [target_cpu]\n",
            argv[0]);
    return 2;
  }
  const std::string vm_path = argv[1];
  const std::string ruby = argv[2];
  const int period_ms = argc > 3 ? atoi(argv[3]) : 10;
  const std::string workload = argc > 6 ? argv[6] : "cpu";
  const bool io_target = workload == "io" || workload == "io-detached";
  const bool detached_still = workload == "io-detached";
  const int target_cpu = argc > 7 ? atoi(argv[7]) : -1;
  const int phases = argc > 4 ? atoi(argv[4]) : 6;
  const int phase_ms = argc > 5 ? atoi(argv[5]) : 1000;

  auto vm = rvbpfd::ElfFile::Open(vm_path);
  if (!vm) {
    fprintf(stderr, "%s\n", vm.error().ToString().c_str());
    return 1;
  }
  std::optional<std::string> version = rvbpfd::ReadRubyVersion(*vm);
  if (!version) {
    fprintf(stderr, "%s: no ruby_version\n", vm_path.c_str());
    return 1;
  }
  auto sites = rvbpfd::FindSites(*vm, *version);
  if (!sites) {
    fprintf(stderr, "%s\n", sites.error().ToString().c_str());
    return 1;
  }

  int out_pipe[2];
  if (pipe(out_pipe) != 0) return 1;
  const pid_t child = fork();
  if (child == 0) {
    dup2(out_pipe[1], 1);
    close(out_pipe[0]);
    if (target_cpu >= 0) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(target_cpu, &one);
      if (sched_setaffinity(0, sizeof(one), &one) != 0) _exit(126);
    }
    execl(ruby.c_str(), ruby.c_str(), "-e", io_target ? kIoTargetScript : kTargetScript, static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out_pipe[1]);
  FILE* progress = fdopen(out_pipe[0], "r");

  auto session = rvbpfd::BpfSession::Open(rvbpfd::SessionOptions{}, [](const rv_record&) {});
  if (!session) {
    fprintf(stderr, "%s\n", session.error().ToString().c_str());
    kill(child, SIGKILL);
    return 1;
  }
  auto bin = (*session)->AddBinary(sites->offsets);
  if (!bin || !(*session)->AddPid(static_cast<uint32_t>(child))) return 1;
  rvbpfd::SplitSiteSpecs split = rvbpfd::SplitSites(*sites, *bin);
  // Wait until the Ruby VM runs (first progress line), so the VM binary is mapped in the child.
  char line[256];
  if (!fgets(line, sizeof(line), progress)) return 1;
  auto low = (*session)->Attach(vm_path, split.low, child);
  auto high = (*session)->Attach(vm_path, split.high, child);
  if (!low || !high) {
    fprintf(stderr, "attach failed\n");
    kill(child, SIGKILL);
    return 1;
  }

  // Phases are timed by the daemon; the target's slices are read afterwards and assigned to the phase they end in.
  struct Phase {
    bool cycling;
    uint64_t start_ns, end_ns;
    int cycles = 0;
  };
  std::vector<Phase> plan;
  uint64_t detach_wall = 0, reattach_wall = 0, detach_cpu = 0, reattach_cpu = 0;
  int cycles = 0;
  uint64_t cycling_hits = 0;  // probe hits taken during the cycling phases
  if (detached_still) (*session)->Detach(**high);
  for (int p = 0; p < phases; ++p) {
    Phase ph{p % 2 == 1, NowNs(), 0};
    const uint64_t end = ph.start_ns + static_cast<uint64_t>(phase_ms) * 1'000'000ull;
    const uint64_t hits0 = (*session)->ReadCounters().probe_hits;
    while (NowNs() < end) {
      if (ph.cycling && detached_still) {
        uint64_t w0 = NowNs(), c0 = ThreadCpuNs();
        if (!(*session)->Reattach(**high)) {
          fprintf(stderr, "reattach failed\n");
          kill(child, SIGKILL);
          return 1;
        }
        uint64_t w1 = NowNs(), c1 = ThreadCpuNs();
        (*session)->Detach(**high);
        uint64_t w2 = NowNs(), c2 = ThreadCpuNs();
        reattach_wall += w1 - w0;
        detach_wall += w2 - w1;
        reattach_cpu += c1 - c0;
        detach_cpu += c2 - c1;
        ++ph.cycles;
        ++cycles;
      } else if (ph.cycling) {
        uint64_t w0 = NowNs(), c0 = ThreadCpuNs();
        (*session)->Detach(**high);
        uint64_t w1 = NowNs(), c1 = ThreadCpuNs();
        if (!(*session)->Reattach(**high)) {
          fprintf(stderr, "reattach failed\n");
          kill(child, SIGKILL);
          return 1;
        }
        uint64_t w2 = NowNs(), c2 = ThreadCpuNs();
        detach_wall += w1 - w0;
        reattach_wall += w2 - w1;
        detach_cpu += c1 - c0;
        reattach_cpu += c2 - c1;
        ++ph.cycles;
        ++cycles;
      }
      usleep(static_cast<useconds_t>(period_ms) * 1000);
    }
    ph.end_ns = NowNs();
    if (ph.cycling) cycling_hits += (*session)->ReadCounters().probe_hits - hits0;
    plan.push_back(ph);
  }
  kill(child, SIGTERM);
  std::vector<Slice> slices;
  while (fgets(line, sizeof(line), progress)) {
    unsigned long long end_ns = 0, n = 0, len = 0;
    if (sscanf(line, "%llu %llu %llu", &end_ns, &n, &len) == 3 && len > 0) {
      slices.push_back({end_ns, static_cast<double>(n) * 1e9 / static_cast<double>(len)});
    }
  }
  int status = 0;
  waitpid(child, &status, 0);

  double rate[2] = {0, 0};
  int count[2] = {0, 0};
  for (const Slice& s : slices) {
    for (const Phase& ph : plan) {
      // Skip the first slice of each phase: it may straddle the phase boundary.
      if (s.end_ns > ph.start_ns + 40'000'000ull && s.end_ns <= ph.end_ns) {
        rate[ph.cycling] += s.rate;
        count[ph.cycling]++;
      }
    }
  }
  if (count[0] == 0 || count[1] == 0 || cycles == 0) {
    fprintf(stderr, "not enough progress samples\n");
    return 1;
  }
  const double still = rate[0] / count[0], cycling = rate[1] / count[1];
  int cycling_phases = 0;
  for (const Phase& ph : plan) cycling_phases += ph.cycling ? 1 : 0;
  // Share of the target's time lost while cycling, spread over the cycles of those phases.
  const double lost_share = (still - cycling) / still;
  const double cycling_s = static_cast<double>(cycling_phases) * phase_ms / 1000.0;
  const double lost_us_per_cycle = lost_share * cycling_s * 1e6 / cycles;
  printf("{\"vm\":\"%s\",\"ruby_version\":\"%s\",\"high_sites\":%zu,\"period_ms\":%d,\"cycles\":%d,"
         "\"rate_still\":%.1f,\"rate_cycling\":%.1f,\"target_lost_us_per_cycle\":%.1f,"
         "\"detach_wall_us\":%.1f,\"reattach_wall_us\":%.1f,\"detach_cpu_us\":%.1f,\"reattach_cpu_us\":%.1f,"
         "\"hits_per_cycle\":%.1f}\n",
         vm_path.c_str(), version->c_str(), split.high.size(), period_ms, cycles, still, cycling, lost_us_per_cycle,
         detach_wall / 1e3 / cycles, reattach_wall / 1e3 / cycles, detach_cpu / 1e3 / cycles,
         reattach_cpu / 1e3 / cycles, static_cast<double>(cycling_hits) / cycles);
  return 0;
}
