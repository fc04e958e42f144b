// The commands that look at a live process or a VM binary without recording: sites, dump, top.
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "common/cache_file.h"
#include "common/deadline.h"
#include "common/text_escape.h"
#include "elf/elf_file.h"
#include "session/vm_binary.h"
#include "sites/sites.h"
#include "target/target.h"

namespace rvbpfd::cli {

void AddSitesCommand(CLI::App& app, SitesCommand* command, DebugLookupConfig* debug_lookup) {
  CLI::App* sites = command->app =
      app.add_subcommand("sites", "List the probe sites rvbpfd finds in a CRuby VM binary");
  sites->add_option("--pid", command->pid, "Of the VM of this process")->check(CLI::PositiveNumber);
  sites->add_option("--binary", command->binary, "Of this libruby.so or static ruby executable");
  AddDebugLookupFlags(sites, debug_lookup);
}

int RunSites(const SitesCommand& command, const RecordFlags& flags) {
  if (Status st = flags.CheckCacheDir(); !st) return Fail(st.error());
  // One parse of the VM binary serves the sites and the stack facts.
  std::string path = command.binary, version;
  std::shared_ptr<ElfFile> vm;
  if (command.pid > 0) {
    // Bounded: the target's files may lie on a mount that never answers (Ctrl-C ends a wait for it as well).
    Result<RubyTarget> t = DiscoverTargetBounded(command.pid, nullptr);
    if (!t) return Fail(t.error());
    path = t->vm_host_path;
    version = t->ruby_version;
    vm = t->vm_elf;
  } else if (!path.empty()) {
    Result<ElfFile> elf = ElfFile::Open(path);
    if (!elf) return Fail(elf.error());
    std::optional<std::string> v = ReadRubyVersion(*elf);
    if (!v) return Fail(Error(ErrorCode::kNotRuby, path + " defines no ruby_version: not a CRuby VM binary"));
    version = *v;
    vm = std::make_shared<ElfFile>(std::move(elf.value()));
  } else {
    return Fail(Error(ErrorCode::kUsage, "sites needs --pid PID or --binary PATH"));
  }
  const std::string cache_dir = flags.rec.cache_dir;
  Result<SiteSet> set =
      RunBounded<SiteSet>("finding the probe sites of " + path, kAnalysisTimeout, nullptr,
                          [vm, version, cache_dir] { return LoadOrFindSites(*vm, version, cache_dir); });
  if (!set) return Fail(set.error());
  PrintEscaped([&](std::ostream& out) {
    out << "# " << path << " ruby " << set->ruby_version << " build-id " << set->build_id << "\n"
        << "# symbols: " << set->symbols_source << "\n"
        << FormatProvenance(*set);
    for (const auto& [fact, source] : StackProvenance(*vm, version)) out << "# " << fact << ": " << source << "\n";
    out << FormatSites(*set);
  });
  return 0;
}

// `rvbpfd dump`: the subcommand and its flags (src/dump/dump_command.h runs it).
CLI::App* AddDumpCommand(CLI::App& app, DumpOptions* options) {
  CLI::App* dump = app.add_subcommand(
      "dump",
      "Print every Ruby thread of a live process (--pid) or of a core file (--core) now: its state (running, "
      "holding or waiting for the GVL, blocked and why), its stack as rb_profile_frames names it, the GVL "
      "holder and queue, what each blocked thread waits for and whom (a Mutex's owner, a joined thread), and "
      "deadlocks. Reads the process's memory with process_vm_readv without stopping it; needs no BPF, only "
      "ptrace access to the target (root, or CAP_SYS_PTRACE for another user's process). A core (gcore's or "
      "the kernel's, plain or gzip) needs the VM binary it ran: the libruby or executable its NT_FILE note "
      "names, read from this host and checked by build-id, or the files given with --libruby / --exe. "
      "docs/dump.md describes the output.");
  CLI::Option* pid = dump->add_option("-p,--pid", options->pid, "The CRuby process")->check(CLI::PositiveNumber);
  CLI::Option* core = dump->add_option("--core", options->core, "Dump this core file of a CRuby process instead");
  pid->excludes(core);
  dump->add_option("--exe", options->exe,
                   "With --core: the core's executable as a file on this host (default: the path the core names)")
      ->needs(core);
  dump->add_option("--libruby", options->libruby,
                   "With --core: the core's libruby as a file on this host (default: the path the core names)")
      ->needs(core);
  dump->add_flag("--json", options->json, "One JSON object (docs/dump.md) instead of text");
  dump->add_option("--cache-dir", options->cache_dir, "Where the VM binary's stack layout is cached")
      ->capture_default_str();
  dump->callback([options] {
    if (options->pid == 0 && options->core.empty()) throw CLI::RequiredError("--pid or --core");
  });
  return dump;
}

// `rvbpfd top`: the subcommand and its flags (src/top/top_command.h runs it).
CLI::App* AddTopCommand(CLI::App& app, TopOptions* options) {
  CLI::App* top = app.add_subcommand(
      "top",
      "Live view of a CRuby process from the probes, refreshed every --interval: per thread the share of "
      "the last interval running (holding the GVL), in GC, waiting for the GVL, blocked (by reason: sleep, "
      "io, mutex, queue, ...) and unknown/idle, most waiting first, the GVL holder (*), the top blockers "
      "(the holders' Ruby methods others waited for) and the top blocked stacks. On a terminal the screen "
      "is redrawn in place and q quits; otherwise one plain-text snapshot per interval is printed (--json: "
      "one JSON object per line). Nothing is written to disk unless -o is given. Needs what recording needs "
      "(root, or CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE). docs/top.md describes the view.");
  RecordOptions& rec = options->record;
  top->add_option("-p,--pid", rec.pid, "The CRuby process")->required()->check(CLI::PositiveNumber);
  top->add_option("--interval", options->interval_s, "Seconds per refresh (default 1)")->check(CLI::Range(0.1, 3600.0));
  top->add_option("--iterations", options->iterations,
                  "Stop after this many snapshots (default: until q, Ctrl-C "
                  "or the target's exit)")
      ->check(CLI::PositiveNumber);
  top->add_flag("--json", options->json, "One JSON object per interval on stdout (docs/top.md), never full-screen");
  top->add_option("-o,--output", rec.output, "Also write the .rvtrace file (default: nothing is written)");
  top->add_option("--stacks", rec.stacks, "Which events carry stacks: release (default), release,ready, off")
      ->check(StacksValidator());
  top->add_option("--hz", rec.hz, "On-CPU samples per second of CPU time (default 99; 0: none)")
      ->check(CLI::Range(0, 1000));
  top->add_option("--ring-buffer-kb", rec.ring_buffer_kb, "BPF ring buffer size in KiB (default 4096)")
      ->check(CLI::Range(4u, 1u << 20));
  top->add_option("--max-overhead", rec.max_overhead_pct,
                  "Bound the probes' estimated cost as the recorder does (default: off)")
      ->check(CLI::Range(0.1, 100.0));
  return top;
}

int RunDumpCommand(DumpOptions options, const RecordFlags& flags, bool own_cache_dir) {
  if (own_cache_dir) {
    // Root trusts an analysis it finds there as it trusts its own: the same ownership and mode checks (exit 13).
    if (Status st = CheckCacheDir(options.cache_dir); !st) return Fail(st.error());
  } else {
    if (Status st = flags.CheckCacheDir(); !st) return Fail(st.error());
    options.cache_dir = flags.rec.cache_dir;  // the global --cache-dir, as parsed
  }
  Status st = RunDump(options, std::cout);
  return st ? 0 : Fail(st.error());
}

int RunTopCommand(TopOptions options, const RecordFlags& flags) {
  if (Status st = flags.CheckCacheDir(); !st) return Fail(st.error());
  options.record.cache_dir = flags.rec.cache_dir;  // the global --cache-dir, as parsed
  options.record.trace_format = TraceFormat::kZstd;
  Result<int> r = RunTop(options);
  return r ? *r : Fail(r.error());
}

}  // namespace rvbpfd::cli
