#include "cli/cli.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "agent/agent_main.h"
#include "common/cache_file.h"
#include "common/deadline.h"
#include "common/error.h"
#include "common/safe_file.h"
#include "common/text_escape.h"
#include "dump/dump_command.h"
#include "elf/debug_lookup.h"
#include "elf/elf_file.h"
#include "export/folded.h"
#include "export/perfetto.h"
#include "export/pprof.h"
#include "export/run_summary.h"
#include "export/speedscope.h"
#include "model/model.h"
#include "model/model_summary.h"
#include "ops/agent_config.h"
#include "record/recorder.h"
#include "report/report.h"
#include "session/isolated_prepare.h"
#include "session/vm_binary.h"
#include "sites/sites.h"
#include "target/target.h"
#include "top/top_command.h"
#include "trace/inspect.h"
#include "trace/reader.h"

namespace rvbpfd {
namespace {

constexpr const char* kDescription =
    "rvbpfd: record CRuby's thread scheduler (GVL wants/acquired/released, thread start/exit), GC and\n"
    "Kernel#sleep / Mutex#lock from outside the process, with eBPF uprobes on the VM's own hook sites.\n"
    "\n"
    "  rvbpfd --pid PID [-o FILE] [--duration SECONDS]   attach to a running Ruby process (--follow: and its\n"
    "                                                    descendants, present and future: a forking server)\n"
    "  rvbpfd [-o FILE] [--user U] -- COMMAND [ARGS...]  launch a program and record from its first instruction,\n"
    "                                                    with every process it forks or execs (--no-follow: not)\n"
    "                                                    (under sudo: as the user who ran sudo; see --user)\n"
    "  rvbpfd inspect FILE [--events]                    one-screen summary: time by thread and state, who\n"
    "                                                    held the GVL while others waited (--events: event table)\n"
    "  rvbpfd stats FILE                                 counts by event, drops, ring high-water, GVL blame\n"
    "  rvbpfd report FILE [-o report.html]               self-contained HTML timeline (opens from disk)\n"
    "  rvbpfd export --perfetto|--speedscope FILE -o OUT  Chrome trace JSON (ui.perfetto.dev) or speedscope\n"
    "  rvbpfd export --pprof|--folded FILE -o OUT        pprof (CPU, GVL wait, GVL blame, wall) or folded\n"
    "  rvbpfd sites (--pid PID | --binary PATH)          the probe sites found in a Ruby VM binary\n"
    "  rvbpfd dump --pid PID | --core FILE [--json]      every Ruby thread now: state, stack, GVL, who waits\n"
    "                                                    for whom, deadlocks (reads memory; no BPF, never stops it)\n"
    "  rvbpfd top --pid PID [--interval S] [--json]      live view from the probes: each thread's share running,\n"
    "                                                    waiting for the GVL, blocked; top blockers (q quits)\n"
    "  rvbpfd agent (--output-dir DIR | --push-url URL)  fleet mode: profile every Ruby process on the host\n"
    "                                                    continuously (cpu, GVL wait/held, GC pprof per --interval)\n"
    "\n"
    "Needs root (or CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE; dump needs only ptrace access: CAP_SYS_PTRACE for\n"
    "another user's process). Exit status: 0 ok, 2 usage, 3 no such process,\n"
    "4 not Ruby, 5 unsupported Ruby version, 6 no symbols, 7 no privileges, 8 output unwritable, 9 target exited\n"
    "during attach, 10 BPF failure, 11 bad trace file, 12 other I/O error, 13 a --cache-dir others could write,\n"
    "14 export or report output past --max-output-bytes.";

// Prints a multi-line report whose text quotes what target processes controlled (thread names, frame labels, paths,
// reasons) with their control bytes escaped, so a trace cannot drive the terminal that inspects it.
void PrintEscaped(const std::function<void(std::ostream&)>& print) {
  std::ostringstream text;
  print(text);
  std::cout << EscapeControlBytes(text.str(), /*keep_newlines=*/true);
}

int Fail(const Error& e) {
  fprintf(stderr, "%s\n", e.ToString().c_str());
  return ExitStatus(e.code());
}

// Exports are written through a temporary file renamed into place (common/safe_file), so a failed export never
// leaves a partial file behind and a planted symlink is never followed; under sudo the invoking user owns them.
// A file past `max_bytes` is removed too (exit 14, kOutputTooLarge).
Status WriteOutput(const std::string& path, uint64_t max_bytes, const std::function<Status(std::ostream&)>& write) {
  OutputFileOptions options;
  options.owner = SudoInvokerOfProcess();
  options.allow_fifo_or_device = true;
  options.max_bytes = max_bytes;
  return WriteOutputFile(path, options, write);
}

int RunCliUnguarded(int argc, char** argv);

// --stacks, for recording and top.
CLI::Validator StacksValidator() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        if (v == "release" || v == "release,ready" || v == "ready,release" || v == "off") return "";
        return "--stacks must be release, release,ready or off";
      },
      "MODE");
}

// `rvbpfd dump`: the subcommand and its flags (src/dump/dump_command.h runs it).
CLI::App* AddDumpCommand(CLI::App& app, DumpOptions* options) {
  CLI::App* dump = app.add_subcommand(
      "dump", "Print every Ruby thread of a live process (--pid) or of a core file (--core) now: its state (running, "
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
      "top", "Live view of a CRuby process from the probes, refreshed every --interval: per thread the share of "
             "the last interval running (holding the GVL), in GC, waiting for the GVL, blocked (by reason: sleep, "
             "io, mutex, queue, ...) and unknown/idle, most waiting first, the GVL holder (*), the top blockers "
             "(the holders' Ruby methods others waited for) and the top blocked stacks. On a terminal the screen "
             "is redrawn in place and q quits; otherwise one plain-text snapshot per interval is printed (--json: "
             "one JSON object per line). Nothing is written to disk unless -o is given. Needs what recording needs "
             "(root, or CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE). docs/top.md describes the view.");
  RecordOptions& rec = options->record;
  top->add_option("-p,--pid", rec.pid, "The CRuby process")->required()->check(CLI::PositiveNumber);
  top->add_option("--interval", options->interval_s, "Seconds per refresh (default 1)")
      ->check(CLI::Range(0.1, 3600.0));
  top->add_option("--iterations", options->iterations, "Stop after this many snapshots (default: until q, Ctrl-C "
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

}  // namespace

int RunCli(int argc, char** argv) {
  // Hostile input must never abort the daemon with an uncaught exception (exit 134 and a core as root): whatever
  // escapes is one line and the internal-error status.
  try {
    // The fleet agent's binary-analysis child (session/isolated_prepare.h), not a user command.
    if (argc >= 2 && argv[1] == kPrepareChildCommand) {
      return RunPrepareChild(std::span<char* const>(argv + 2, static_cast<size_t>(argc - 2)));
    }
    return RunCliUnguarded(argc, argv);
  } catch (const std::exception& e) {
    return Fail(Error(ErrorCode::kInternal, std::string("uncaught exception: ") + e.what()));
  }
}

namespace {

int RunCliUnguarded(int argc, char** argv) {
  // Everything after "--" is the command to launch; CLI11 only sees what comes before.
  std::vector<std::string> command;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (i > 0 && std::string(argv[i]) == "--") {
      for (int j = i + 1; j < argc; ++j) command.emplace_back(argv[j]);
      break;
    }
    args.push_back(argv[i]);
  }

  CLI::App app{kDescription, "rvbpfd"};
  app.set_version_flag("--version", "rvbpfd 0.1.0");
  RecordOptions rec;
  app.add_option("-p,--pid", rec.pid, "Attach to this running CRuby process")->check(CLI::PositiveNumber);
  app.add_option("-o,--output", rec.output, "Trace file to write (default rvbpfd-<pid>-<time>.rvtrace)");
  std::string trace_format = "zstd";
  app.add_option("--trace-format", trace_format,
                 "How the trace's JSON Lines are stored: zstd (default: compressed, read by every rvbpfd command, "
                 "zstdcat prints the lines) or jsonl (plain text, to grep while recording)")
      ->check(CLI::IsMember({"zstd", "jsonl"}));
  app.add_option("-d,--duration", rec.duration_s, "Stop after this many seconds (default: until the target exits)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-overhead", rec.max_overhead_pct,
                 "Bound the target's estimated time in probe traps (every uprobe hit, including those that write "
                 "no event) to PERCENT of each 250 ms budget window: once spent, the high-rate sites (GVL "
                 "transitions, GC enter/exit, Kernel#sleep, Mutex#lock) are detached until the window ends and the "
                 "trace records tracing_paused/tracing_resumed (default: off, complete recording; a warning is "
                 "printed above 10%)")
      ->check(CLI::Range(0.1, 100.0));
  app.add_option("--probe-cost-us", rec.probe_cost_us,
                 "Cost of one uprobe hit in microseconds, for the overhead estimate: rvbpfd probes instructions the "
                 "kernel emulates (default 1.5, measured on a VM)")
      ->check(CLI::Range(0.01, 1000.0));
  app.add_option("--stepped-probe-cost-us", rec.stepped_probe_cost_us,
                 "Cost of a hit of a probe the kernel single-steps (a site with no emulated instruction near its "
                 "check; `rvbpfd sites` marks them), microseconds (default 10.5, measured on a VM)")
      ->check(CLI::Range(0.01, 1000.0));
  app.add_option("--cold-probe-extra-us", rec.cold_probe_extra_us,
                 "What a hit costs beyond --probe-cost-us or --stepped-probe-cost-us when it comes 50 us or more "
                 "after the previous one on its CPU (its path has left the caches), microseconds (default 3, measured "
                 "on a VM)")
      ->check(CLI::Range(0.0, 1000.0));
  app.add_option("--pause-cost-us", rec.cycle_cost_us,
                 "What one pause and resume of the high-rate probes costs the target, microseconds, for "
                 "--max-overhead (default 4000: measured for a trapping target on a VM, 200 for a CPU-bound one)")
      ->check(CLI::Range(0.0, 1000000.0));
  app.add_option("--ring-buffer-kb", rec.ring_buffer_kb,
                 "BPF ring buffer size in KiB, rounded up to a power of two (default 4096); events that do not fit "
                 "are counted in events_dropped records")
      ->check(CLI::Range(4u, 1u << 20));
  app.add_option("--stacks", rec.stacks,
                 "Which events carry the Ruby stack of their thread: release (gvl_released, default), "
                 "release,ready (also wants_gvl), off")
      ->check(StacksValidator());
  app.add_option("--hz", rec.hz,
                 "On-CPU sampling frequency of the target's threads, samples per second of CPU time (default 99; "
                 "0: no sampling)")
      ->check(CLI::Range(0, 1000));
  CLI::Option* cache_dir_opt =
      app.add_option("--cache-dir", rec.cache_dir,
                     "Where probe sites are cached (by the binary's content hash); it and the directories above it "
                     "must be owned by root and not writable by others (exit 13 otherwise)")
          ->capture_default_str();
  // An explicit --cache-dir others could write is refused; the default one is then only not used (with a warning).
  auto check_cache_dir = [&]() -> Status {
    return cache_dir_opt->count() > 0 ? CheckCacheDir(rec.cache_dir) : Status::Ok();
  };
  // Debug info by build-id for a stripped VM binary (src/elf/debug_lookup.h); also for `sites`.
  DebugLookupConfig debug_lookup = DebugLookupSettings();
  auto add_debug_options = [&debug_lookup](CLI::App* a) {
    a->add_option("--debug-dir", debug_lookup.debug_dir,
                  "Where split debug files are looked up by build-id (<dir>/.build-id/xx/rest.debug), in the "
                  "target's root and on the host (default /usr/lib/debug, or RVBPFD_DEBUG_DIR)")
        ->check([](const std::string& v) { return !v.empty() && v[0] == '/' ? "" : "--debug-dir must be absolute"; });
    a->add_option("--debuginfod-timeout", debug_lookup.debuginfod_timeout_s,
                  "Seconds one debuginfod query (servers from DEBUGINFOD_URLS) may take (default 30; 0: no "
                  "debuginfod)")
        ->check(CLI::Range(0, 3600));
  };
  add_debug_options(&app);
  app.add_option("--gc-probes", rec.gc_probes,
                 "Diagnostic: how GC enter/exit are probed. auto (default): the VM's GC hook checks, entry/return of "
                 "the GC functions only in a binary that has none; fallback: always the GC functions (to test that "
                 "path; docs/design.md lists how it differs)")
      ->check(CLI::IsMember({"auto", "fallback"}));
  app.add_flag("--single-links", rec.force_single_links,
               "Attach one uprobe link per site even when the kernel has multi-uprobe links");
  app.add_option("--user", rec.user,
                 "Launch mode: run the command as this user (name or uid), with that user's groups, HOME, USER and "
                 "SHELL. Default: under sudo, the user who ran sudo (SUDO_UID/SUDO_GID), never root; without sudo, "
                 "rvbpfd's own user. --user root runs it as root. The probes are attached before the command "
                 "starts either way.");
  bool follow = false, no_follow = false;
  app.add_flag("--follow", follow,
               "Attach mode: also record the target's descendants, those it has forked already and those it forks "
               "or execs while recorded (a Puma cluster: --pid MASTER --follow records every worker), until the "
               "target exits or --duration ends. Launch mode follows the command's process tree by default");
  app.add_flag("--no-follow", no_follow,
               "Launch mode: record the launched process only, not the processes it forks or execs");
  bool no_status = false;
  app.add_flag("--no-status", no_status, "No live status line on stderr");
  app.add_flag("-q,--quiet", rec.quiet, "Only print errors");

  std::string inspect_file;
  bool inspect_events = false;
  EventFilter event_filter;
  CLI::App* inspect = app.add_subcommand(
      "inspect", "Summarize a trace on one screen: wall clock by thread and state, GVL contention, the top blockers "
                 "(the holders' Ruby method across threads, the C function beneath it), the top blocked stacks by "
                 "release reason (idle pool threads apart), lost events (--events: the event table)");
  inspect->add_option("file", inspect_file, "The .rvtrace file")->required();
  auto* events_flag = inspect->add_flag("--events", inspect_events,
                                        "Print the event table, per-thread running time and state table instead of the summary");
  inspect->add_option("--thread", event_filter.thread, "With --events: only this Ruby thread's events (its id)")
      ->needs(events_flag);
  inspect->add_option("--from", event_filter.from_ms, "With --events: only events at or after MS (ms into the trace)")
      ->needs(events_flag);
  inspect->add_option("--to", event_filter.to_ms, "With --events: only events at or before MS (ms into the trace)")
      ->needs(events_flag);
  inspect->add_option("--limit", event_filter.limit, "With --events: at most N rows")->needs(events_flag);
  std::string stats_file;
  CLI::App* stats = app.add_subcommand("stats", "Print event counts, dropped events and ring high-water of a trace");
  stats->add_option("file", stats_file, "The .rvtrace file")->required();
  std::string report_file, report_out;
  CLI::App* report = app.add_subcommand("report", "Write a self-contained HTML timeline of a trace");
  report->add_option("file", report_file, "The .rvtrace file")->required();
  report->add_option("-o,--output", report_out, "HTML file to write (default: the trace's name with .html)");
  uint64_t max_output_bytes = kDefaultMaxOutputBytes;
  const std::string max_output_help =
      "Stop with exit 14 and remove the output once it passes this size (bytes, or with a K/M/G suffix; 0 = no "
      "cap): what a trace holds can make an export far larger than the trace";
  report->add_option("--max-output-bytes", max_output_bytes, max_output_help)
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  std::string export_file, export_out;
  bool export_perfetto = false, export_speedscope = false, export_pprof = false, export_folded = false;
  std::string folded_weight = "cpu";
  CLI::App* exp = app.add_subcommand("export", "Convert a trace for other viewers");
  exp->add_option("file", export_file, "The .rvtrace file")->required();
  exp->add_option("-o,--output", export_out, "Output file")->required();
  exp->add_option("--max-output-bytes", max_output_bytes, max_output_help)
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  auto* perfetto_flag = exp->add_flag("--perfetto", export_perfetto,
                                      "Chrome trace event JSON for ui.perfetto.dev and chrome://tracing");
  auto* speedscope_flag =
      exp->add_flag("--speedscope", export_speedscope, "speedscope's file format: thread states per Ruby thread, GVL blame and wall clock by stack")
          ->excludes(perfetto_flag);
  auto* pprof_flag = exp->add_flag("--pprof", export_pprof,
                                   "gzipped pprof profile: CPU samples and GVL wait time by Ruby stack "
                                   "(go tool pprof, Pyroscope, Parca)")
                         ->excludes(perfetto_flag)
                         ->excludes(speedscope_flag);
  auto* folded_flag = exp->add_flag("--folded", export_folded, "collapsed stacks for flame graphs (root first)")
                          ->excludes(perfetto_flag)
                          ->excludes(speedscope_flag)
                          ->excludes(pprof_flag);
  exp->add_option("--weight", folded_weight,
                  "With --folded: cpu (samples), gvl_wait (ns waiting for the GVL), gvl_blame (ns others waited, "
                  "at the holder's stack) or wall (every thread's ns by state)")
      ->check(CLI::IsMember({"cpu", "gvl_wait", "gvl_blame", "wall"}))
      ->needs(folded_flag);
  int sites_pid = 0;
  std::string sites_binary;
  CLI::App* sites = app.add_subcommand("sites", "List the probe sites rvbpfd finds in a CRuby VM binary");
  sites->add_option("--pid", sites_pid, "Of the VM of this process")->check(CLI::PositiveNumber);
  sites->add_option("--binary", sites_binary, "Of this libruby.so or static ruby executable");
  add_debug_options(sites);
  // Fleet mode. Every flag is also a key of the --config file; flags given on the command line win over the file.
  AgentConfig agent_flags;
  CLI::App* agent = app.add_subcommand(
      "agent", "Fleet mode: profile every CRuby process on this host continuously and ship pprof profiles to "
               "--output-dir and/or a Pyroscope-compatible --push-url (docs/deploy.md)");
  agent->add_option("--config", agent_flags.config_file,
                    "JSON config file whose keys are these flags' long names without \"--\"; reloaded on SIGHUP");
  std::vector<CLI::Option*> agent_opts;
  agent_opts.push_back(agent->add_option("--interval", agent_flags.interval_s,
                                         "Profile period in seconds (default 15)"));
  agent_opts.push_back(agent->add_option("--hz", agent_flags.hz,
                                         "On-CPU samples per second of CPU time per thread (default 19)"));
  agent_opts.push_back(agent->add_option("--stacks", agent_flags.stacks,
                                         "Stacks on gvl_released: release (default), release,ready, off"));
  agent_opts.push_back(agent->add_option("--max-overhead", agent_flags.max_overhead_pct,
                                         "Bound each probed process's estimated time in probe traps to PERCENT of "
                                         "each budget window by pausing the high-rate probes (GVL, GC, sleep, "
                                         "Mutex#lock; default 5; 0: never pause)"));
  agent_opts.push_back(agent->add_option("--output-dir", agent_flags.output_dir,
                                         "Write profiles as <dir>/<service>/<type>-<pid>-<from>-<until>.pb.gz"));
  agent_opts.push_back(agent->add_option("--output-max-mb", agent_flags.output_max_mb,
                                         "Cap of --output-dir's total size in MiB; past it the service holding the "
                                         "most bytes loses its oldest file (default 1024)"));
  agent_opts.push_back(agent->add_option("--output-service-max-mb", agent_flags.output_service_max_mb,
                                         "Cap of one service's files in --output-dir, MiB; its oldest go first "
                                         "(default 0: only --output-max-mb)"));
  agent_opts.push_back(agent->add_option("--push-url", agent_flags.push_url,
                                         "Pyroscope base URL to push profiles to (its push API, many a request; "
                                         "/ingest, one a request, if it has none), e.g. http://pyroscope:4040"));
  agent_opts.push_back(agent->add_option("--push-queue", agent_flags.push_queue,
                                         "Profiles kept while the push backend is down; beyond it the oldest are "
                                         "dropped (default 256)"));
  agent_opts.push_back(agent->add_option("--metrics-listen", agent_flags.metrics_listen,
                                         "Prometheus /metrics endpoint, ADDR:PORT (default 127.0.0.1:9464; off: "
                                         "none)"));
  agent_opts.push_back(agent->add_option("--include", agent_flags.include,
                                         "Only processes matching RULE: comm:GLOB, cgroup:PREFIX, "
                                         "label:service=GLOB, label:container=GLOB (repeatable)"));
  agent_opts.push_back(agent->add_option("--exclude", agent_flags.exclude,
                                         "Never processes matching RULE (same syntax, repeatable; wins over "
                                         "--include)"));
  agent_opts.push_back(agent->add_option("--service-pin", agent_flags.service_pins,
                                         "CGROUP_PREFIX=SERVICE: processes whose cgroup path starts with the prefix "
                                         "are that service, whatever their environment says (repeatable; the "
                                         "longest prefix wins)"));
  agent_opts.push_back(agent->add_flag("--ignore-env-service", agent_flags.ignore_env_service,
                                       "Do not take service names from a process's RVBPF_SERVICE or "
                                       "OTEL_SERVICE_NAME (its own claim): use --service-pin or the command name"));
  agent_opts.push_back(agent->add_option("--log-format", agent_flags.log_format,
                                         "Structured logs on stderr: json (default) or text"));
  agent_opts.push_back(agent->add_option("--host", agent_flags.host, "The host label (default: the hostname)"));
  agent_opts.push_back(agent->add_option("--ring-buffer-kb", agent_flags.ring_buffer_kb,
                                         "BPF ring buffer size in KiB (default 8192)"));
  agent_opts.push_back(agent->add_option(
      "--cache-dir", agent_flags.cache_dir,
      "Where probe sites are cached by content hash (default /var/cache/rvbpfd/sites); it and the directories above "
      "it must be root's and not writable by others (exit 13)"));
  std::string memory_budget_flag;
  agent_opts.push_back(agent->add_option(
      "--memory-budget", memory_budget_flag,
      "Bytes the per-process caches (frame names, stack tables) may hold together, with a K/M/G suffix (default 192M, "
      "under the shipped units' 256M limit); each process gets a fair share, and the caches of the process holding "
      "the most are evicted first (frames are named again later); docs/deploy.md \"Budgets\""));
  DumpOptions dump_options;
  CLI::App* dump = AddDumpCommand(app, &dump_options);
  TopOptions top_options;
  CLI::App* top = AddTopCommand(app, &top_options);
  app.require_subcommand(0, 1);

  try {
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fprintf(stderr, "rvbpfd: usage: %s (see rvbpfd --help)\n", e.what());
    return ExitStatus(ErrorCode::kUsage);
  }

  ConfigureDebugLookup(debug_lookup);
  if (dump->parsed()) {
    if (Status st = check_cache_dir(); !st) return Fail(st.error());
    dump_options.cache_dir = rec.cache_dir;  // the global --cache-dir, as parsed
    Status st = RunDump(dump_options, std::cout);
    return st ? 0 : Fail(st.error());
  }
  if (top->parsed()) {
    if (Status st = check_cache_dir(); !st) return Fail(st.error());
    top_options.record.cache_dir = rec.cache_dir;  // the global --cache-dir, as parsed
    top_options.record.trace_format = TraceFormat::kZstd;
    Result<int> r = RunTop(top_options);
    return r ? *r : Fail(r.error());
  }
  if (agent->parsed()) {
    // Defaults, then the config file, then the flags given on the command line. SIGHUP runs the same again.
    auto build_config = [&]() -> Result<AgentConfig> {
      AgentConfig config;
      if (!agent_flags.config_file.empty()) {
        Result<AgentConfig> f = ApplyConfigFile(config, agent_flags.config_file);
        if (!f) return f.error();
        config = std::move(f.value());
      }
      AgentConfig flags_only = agent_flags;
      for (CLI::Option* opt : agent_opts) {
        if (opt->count() == 0) continue;
        const std::string name = opt->get_name();
        if (name == "--interval") config.interval_s = flags_only.interval_s;
        else if (name == "--hz") config.hz = flags_only.hz;
        else if (name == "--stacks") config.stacks = flags_only.stacks;
        else if (name == "--max-overhead") config.max_overhead_pct = flags_only.max_overhead_pct;
        else if (name == "--output-dir") config.output_dir = flags_only.output_dir;
        else if (name == "--output-max-mb") config.output_max_mb = flags_only.output_max_mb;
        else if (name == "--output-service-max-mb") config.output_service_max_mb = flags_only.output_service_max_mb;
        else if (name == "--push-url") config.push_url = flags_only.push_url;
        else if (name == "--push-queue") config.push_queue = flags_only.push_queue;
        else if (name == "--metrics-listen") config.metrics_listen = flags_only.metrics_listen;
        else if (name == "--include") config.include = flags_only.include;
        else if (name == "--exclude") config.exclude = flags_only.exclude;
        else if (name == "--service-pin") config.service_pins = flags_only.service_pins;
        else if (name == "--ignore-env-service") config.ignore_env_service = flags_only.ignore_env_service;
        else if (name == "--log-format") config.log_format = flags_only.log_format;
        else if (name == "--host") config.host = flags_only.host;
        else if (name == "--ring-buffer-kb") config.ring_buffer_kb = flags_only.ring_buffer_kb;
        else if (name == "--cache-dir") config.cache_dir = flags_only.cache_dir;
        else if (name == "--memory-budget") {
          Result<uint64_t> bytes = ParseByteSize(memory_budget_flag);
          if (!bytes) return Error(ErrorCode::kUsage, "--memory-budget: " + bytes.error().message());
          config.memory_budget = *bytes;
        }
      }
      config.config_file = agent_flags.config_file;
      if (Status st = ValidateAgentConfig(config); !st) return st.error();
      if (config.output_dir.empty() && config.push_url.empty()) {
        return Error(ErrorCode::kUsage, "agent needs somewhere to send profiles: give --output-dir DIR and/or "
                                        "--push-url URL (or output-dir/push-url in the --config file)");
      }
      return config;
    };
    Result<AgentConfig> config = build_config();
    if (!config) return Fail(config.error());
    Result<int> r = RunAgent(*config, build_config);
    if (!r) return Fail(r.error());
    return *r;
  }
  if (inspect->parsed()) {
    Result<TraceFile> trace = TraceReader::ReadFile(inspect_file);
    if (!trace) return Fail(trace.error());
    if (inspect_events) {
      PrintEscaped([&](std::ostream& out) { PrintInspect(*trace, out, event_filter); });
      Result<Model> model = Model::FromTrace(std::move(trace.value()));
      if (!model) return Fail(model.error());
      PrintEscaped([&](std::ostream& out) {
        out << "\n";
        PrintModelSummary(*model, out);
      });
      return 0;
    }
    const StackProfile agg = AggregateStacks(*trace);
    Result<Model> model = Model::FromTrace(*trace);
    if (!model) return Fail(model.error());
    PrintEscaped([&](std::ostream& out) { PrintRunSummary(*trace, agg, *model, out); });
    return 0;
  }
  if (report->parsed()) {
    if (report_out.empty()) {
      const size_t dot = report_file.rfind(".rvtrace");
      report_out = (dot != std::string::npos && dot + 8 == report_file.size() ? report_file.substr(0, dot)
                                                                                : report_file) + ".html";
    }
    Status st = WriteReport(report_file, report_out, max_output_bytes);
    if (!st) return Fail(st.error());
    fprintf(stderr, "rvbpfd: wrote %s\n", EscapeControlBytes(report_out).c_str());
    return 0;
  }
  if (exp->parsed()) {
    if (!export_perfetto && !export_speedscope && !export_pprof && !export_folded) {
      return Fail(Error(ErrorCode::kUsage, "export needs --perfetto, --speedscope, --pprof or --folded"));
    }
    if (export_pprof || export_folded) {
      // Stack-based formats read the trace's frame and stack dictionaries directly (the model has no stacks).
      Result<TraceFile> trace = TraceReader::ReadFile(export_file);
      if (!trace) return Fail(trace.error());
      const FoldedWeight weight = folded_weight == "gvl_wait"    ? FoldedWeight::kGvlWaitNs
                                  : folded_weight == "gvl_blame" ? FoldedWeight::kGvlBlameNs
                                  : folded_weight == "wall"      ? FoldedWeight::kWallNs
                                                                 : FoldedWeight::kCpuSamples;
      Status st = WriteOutput(export_out, max_output_bytes, [&](std::ostream& out) {
        return export_pprof ? ExportPprof(*trace, out) : ExportFolded(*trace, out, weight);
      });
      return st ? 0 : Fail(st.error());
    }
    Status st = WriteOutput(export_out, max_output_bytes, [&](std::ostream& out) {
      return export_perfetto ? ExportPerfetto(export_file, out) : ExportSpeedscope(export_file, out);
    });
    return st ? 0 : Fail(st.error());
  }
  if (stats->parsed()) {
    Result<TraceFile> trace = TraceReader::ReadFile(stats_file);
    if (!trace) return Fail(trace.error());
    PrintEscaped([&](std::ostream& out) {
      PrintStats(*trace, out);
      PrintBlameTotals(*trace, AggregateStacks(*trace), out);
    });
    Result<Model> model = Model::FromTrace(std::move(trace.value()));
    if (!model) return Fail(model.error());
    PrintEscaped([&](std::ostream& out) { PrintContentionSummary(*model, out); });
    return 0;
  }
  if (sites->parsed()) {
    if (Status st = check_cache_dir(); !st) return Fail(st.error());
    // One parse of the VM binary serves the sites and the stack facts.
    std::string path = sites_binary, version;
    std::shared_ptr<ElfFile> vm;
    if (sites_pid > 0) {
      // Bounded: the target's files may lie on a mount that never answers (Ctrl-C ends a wait for it as well).
      Result<RubyTarget> t = DiscoverTargetBounded(sites_pid, nullptr);
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
    const std::string cache_dir = rec.cache_dir;
    Result<SiteSet> set = RunBounded<SiteSet>("finding the probe sites of " + path, kAnalysisTimeout, nullptr,
                                              [vm, version, cache_dir] {
                                                return LoadOrFindSites(*vm, version, cache_dir);
                                              });
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

  if (rec.pid > 0 && !command.empty()) {
    return Fail(Error(ErrorCode::kUsage, "give either --pid PID or -- COMMAND, not both"));
  }
  if (!rec.user.empty() && command.empty()) {
    return Fail(Error(ErrorCode::kUsage, "--user applies to launch mode only: rvbpfd --user NAME -- COMMAND"));
  }
  if (rec.pid <= 0 && command.empty()) {
    fprintf(stderr, "%s\n", app.help().c_str());
    return Fail(Error(ErrorCode::kUsage, "nothing to record: give --pid PID or -- COMMAND [ARGS...]"));
  }
  if (follow && no_follow) return Fail(Error(ErrorCode::kUsage, "give either --follow or --no-follow, not both"));
  if (Status st = check_cache_dir(); !st) return Fail(st.error());
  rec.command = command;
  rec.follow = command.empty() ? follow : !no_follow;
  rec.status_line = !no_status && !rec.quiet && isatty(STDERR_FILENO);
  rec.trace_format = trace_format == "jsonl" ? TraceFormat::kJsonl : TraceFormat::kZstd;
  Result<int> r = Record(rec);
  if (!r) return Fail(r.error());
  return *r;
}

}  // namespace
}  // namespace rvbpfd
