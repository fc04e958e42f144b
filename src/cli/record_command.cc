// The top-level flags (recording: attach or launch) and running a recording.
#include <unistd.h>

#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "common/cache_file.h"

namespace rvbpfd::cli {

Status RecordFlags::CheckCacheDir() const {
  return cache_dir_opt != nullptr && cache_dir_opt->count() > 0 ? rvbpfd::CheckCacheDir(rec.cache_dir) : Status::Ok();
}

CLI::Validator StacksValidator() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        if (v == "release" || v == "release,ready" || v == "ready,release" || v == "off") return "";
        return "--stacks must be release, release,ready or off";
      },
      "MODE");
}

void AddDebugLookupFlags(CLI::App* app, DebugLookupConfig* config) {
  app->add_option("--debug-dir", config->debug_dir,
                  "Where split debug files are looked up by build-id (<dir>/.build-id/xx/rest.debug), in the "
                  "target's root and on the host (default /usr/lib/debug, or RVBPFD_DEBUG_DIR)")
      ->check([](const std::string& v) { return !v.empty() && v[0] == '/' ? "" : "--debug-dir must be absolute"; });
  app->add_option("--debuginfod-timeout", config->debuginfod_timeout_s,
                  "Seconds one debuginfod query (servers from DEBUGINFOD_URLS) may take (default 30; 0: no "
                  "debuginfod)")
      ->check(CLI::Range(0, 3600));
}

void AddRecordFlags(CLI::App& app, RecordFlags* flags) {
  app.add_option("-p,--pid", flags->rec.pid, "Attach to this running CRuby process")->check(CLI::PositiveNumber);
  app.add_option("-o,--output", flags->rec.output, "Trace file to write (default rvbpfd-<pid>-<time>.rvtrace)");
  app.add_option("--trace-format", flags->trace_format,
                 "How the trace's JSON Lines are stored: zstd (default: compressed, read by every rvbpfd command, "
                 "zstdcat prints the lines) or jsonl (plain text, to grep while recording)")
      ->check(CLI::IsMember({"zstd", "jsonl"}));
  app.add_option("-d,--duration", flags->rec.duration_s,
                 "Stop after this many seconds (default: until the target exits)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-overhead", flags->rec.max_overhead_pct,
                 "Bound the target's estimated time in probe traps (every uprobe hit, including those that write "
                 "no event) to PERCENT of each 250 ms budget window: once spent, the high-rate sites (GVL "
                 "transitions, GC enter/exit, Kernel#sleep, Mutex#lock) are detached until the window ends and the "
                 "trace records tracing_paused/tracing_resumed (default: off, complete recording; a warning is "
                 "printed above 10%)")
      ->check(CLI::Range(0.1, 100.0));
  app.add_option("--probe-cost-us", flags->rec.probe_cost_us,
                 "Cost of one uprobe hit in microseconds, for the overhead estimate: rvbpfd probes instructions the "
                 "kernel emulates (default 1.5, measured on a VM)")
      ->check(CLI::Range(0.01, 1000.0));
  app.add_option("--stepped-probe-cost-us", flags->rec.stepped_probe_cost_us,
                 "Cost of a hit of a probe the kernel single-steps (a site with no emulated instruction near its "
                 "check; `rvbpfd sites` marks them), microseconds (default 10.5, measured on a VM)")
      ->check(CLI::Range(0.01, 1000.0));
  app.add_option("--cold-probe-extra-us", flags->rec.cold_probe_extra_us,
                 "What a hit costs beyond --probe-cost-us or --stepped-probe-cost-us when it comes 50 us or more "
                 "after the previous one on its CPU (its path has left the caches), microseconds (default 3, measured "
                 "on a VM)")
      ->check(CLI::Range(0.0, 1000.0));
  app.add_option("--pause-cost-us", flags->rec.cycle_cost_us,
                 "What one pause and resume of the high-rate probes costs the target, microseconds, for "
                 "--max-overhead (default 4000: measured for a trapping target on a VM, 200 for a CPU-bound one)")
      ->check(CLI::Range(0.0, 1000000.0));
  app.add_option("--ring-buffer-kb", flags->rec.ring_buffer_kb,
                 "BPF ring buffer size in KiB, rounded up to a power of two (default 4096); events that do not fit "
                 "are counted in events_dropped records")
      ->check(CLI::Range(4u, 1u << 20));
  app.add_option("--stacks", flags->rec.stacks,
                 "Which events carry the Ruby stack of their thread: release (gvl_released, default), "
                 "release,ready (also wants_gvl), off")
      ->check(StacksValidator());
  app.add_option("--holder-stacks", flags->rec.holder_stacks,
                 "A wants_gvl that finds another thread holding the GVL carries the holder's Ruby stack, which GVL "
                 "blame names the holder's work by whatever --hz is: on (default, with --stacks) or off")
      ->transform(CLI::CheckedTransformer(std::map<std::string, bool>{{"on", true}, {"off", false}}));
  app.add_option("--hz", flags->rec.hz,
                 "On-CPU sampling frequency of the target's threads, samples per second of CPU time (default 99; "
                 "0: no sampling)")
      ->check(CLI::Range(0, 1000));
  flags->cache_dir_opt =
      app.add_option("--cache-dir", flags->rec.cache_dir,
                     "Where probe sites are cached (by the binary's content hash); it and the directories above it "
                     "must be owned by root and not writable by others (exit 13 otherwise)")
          ->capture_default_str();
  flags->debug_lookup = DebugLookupSettings();
  AddDebugLookupFlags(&app, &flags->debug_lookup);
  app.add_option("--gc-probes", flags->rec.gc_probes,
                 "Diagnostic: how GC enter/exit are probed. auto (default): the VM's GC hook checks, entry/return of "
                 "the GC functions only in a binary that has none; fallback: always the GC functions (to test that "
                 "path; docs/design.md lists how it differs)")
      ->check(CLI::IsMember({"auto", "fallback"}));
  app.add_flag("--single-links", flags->rec.force_single_links,
               "Attach one uprobe link per site even when the kernel has multi-uprobe links");
  app.add_option("--user", flags->rec.user,
                 "Launch mode: run the command as this user (name or uid), with that user's groups, HOME, USER and "
                 "SHELL. Default: under sudo, the user who ran sudo (SUDO_UID/SUDO_GID), never root; without sudo, "
                 "rvbpfd's own user. --user root runs it as root. The probes are attached before the command "
                 "starts either way.");
  app.add_flag("--follow", flags->follow,
               "Attach mode: also record the target's descendants, those it has forked already and those it forks "
               "or execs while recorded (a Puma cluster: --pid MASTER --follow records every worker), until the "
               "target exits or --duration ends. Launch mode follows the command's process tree by default");
  app.add_flag("--no-follow", flags->no_follow,
               "Launch mode: record the launched process only, not the processes it forks or execs");
  app.add_option("--hold", flags->hold,
                 "Trace the target's main thread with ptrace and hold it a few ms where its last frames would "
                 "otherwise go unnamed (its exit, its VM's teardown, a GC while rvbpfd is behind): on (default; a "
                 "debugger cannot attach to it while it is recorded) or off")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_flag("--no-status", flags->no_status, "No live status line on stderr");
  app.add_flag("-q,--quiet", flags->rec.quiet, "Only print errors");
}

int RunRecord(CLI::App& app, RecordFlags& flags, std::vector<std::string> command) {
  if (flags.rec.pid > 0 && !command.empty()) {
    return Fail(Error(ErrorCode::kUsage, "give either --pid PID or -- COMMAND, not both"));
  }
  if (!flags.rec.user.empty() && command.empty()) {
    return Fail(Error(ErrorCode::kUsage, "--user applies to launch mode only: rvbpfd --user NAME -- COMMAND"));
  }
  if (flags.rec.pid <= 0 && command.empty()) {
    fprintf(stderr, "%s\n", app.help().c_str());
    return Fail(Error(ErrorCode::kUsage, "nothing to record: give --pid PID or -- COMMAND [ARGS...]"));
  }
  if (flags.follow && flags.no_follow) {
    return Fail(Error(ErrorCode::kUsage, "give either --follow or --no-follow, not both"));
  }
  if (Status st = flags.CheckCacheDir(); !st) return Fail(st.error());
  flags.rec.follow = command.empty() ? flags.follow : !flags.no_follow;
  flags.rec.hold = flags.hold == "on";
  flags.rec.command = std::move(command);
  flags.rec.status_line = !flags.no_status && !flags.rec.quiet && isatty(STDERR_FILENO);
  flags.rec.trace_format = flags.trace_format == "jsonl" ? TraceFormat::kJsonl : TraceFormat::kZstd;
  Result<int> r = Record(flags.rec);
  if (!r) return Fail(r.error());
  return *r;
}

}  // namespace rvbpfd::cli
