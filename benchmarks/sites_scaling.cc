// Site-finder scaling: the time FindSites takes on crafted VM look-alikes (tests/sites/crafted_vm_elf.h) with 1,000,
// 3,000 and 30,000 function symbols, each shape twice: symbols of their own extent, and every symbol's extent running
// to the end of .text (what a hostile binary does). The finder must stay O(text + symbols): 30,000 symbols well under
// 2 s. Prints one line per case; figures go to docs/benchmarks.md ("Site finder scaling").
// Usage: bench_sites_scaling [MAX_FUNCTIONS]   (default 30000; cases above it are skipped)
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "elf/elf_file.h"
#include "sites/crafted_vm_elf.h"
#include "sites/sites.h"

int main(int argc, char** argv) {
  using namespace rvbpfd;
  const size_t max_functions = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 30000;
  char dir[] = "/tmp/rvbpfd-sites-scaling-XXXXXX";
  if (mkdtemp(dir) == nullptr) return 1;
  std::printf("%-9s %-12s %10s %12s  %s\n", "symbols", "extents", ".text KiB", "analysis ms", "result");
  for (const size_t n : {1000u, 3000u, 30000u}) {
    if (n > max_functions) continue;
    for (const bool overlapping : {false, true}) {
      testing::CraftedVmSpec spec;
      spec.functions = n;
      spec.overlapping = overlapping;
      const std::string bytes = testing::CraftVmElf(spec);
      const std::string path = std::string(dir) + "/vm-" + std::to_string(n) + (overlapping ? "-o" : "");
      std::ofstream(path, std::ios::binary) << bytes;
      Result<ElfFile> elf = ElfFile::Open(path);
      if (!elf.ok()) {
        std::fprintf(stderr, "%s\n", elf.error().ToString().c_str());
        return 1;
      }
      const auto start = std::chrono::steady_clock::now();
      Result<SiteSet> sites = FindSites(*elf, "3.3.8");
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      const std::string result = sites.ok() ? std::to_string(sites->sites.size()) + " sites"
                                            : sites.error().ToString();
      std::printf("%-9zu %-12s %10zu %12.1f  %s\n", n, overlapping ? "to-text-end" : "own", (spec.fn_bytes * n) / 1024,
                  ms, result.c_str());
      std::fflush(stdout);
      unlink(path.c_str());
    }
  }
  rmdir(dir);
  return 0;
}
