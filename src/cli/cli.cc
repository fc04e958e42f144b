// The command line: parses it and hands the chosen command to its module (cli/commands.h: one Add/Run pair per
// command group). Only wiring lives here.
#include "cli/cli.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <functional>
#include <iostream>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "common/error.h"
#include "common/text_escape.h"
#include "elf/debug_lookup.h"
#include "session/isolated_prepare.h"

namespace rvbpfd {
namespace cli {

void PrintEscaped(const std::function<void(std::ostream&)>& print) {
  std::ostringstream text;
  print(text);
  std::cout << EscapeControlBytes(text.str(), /*keep_newlines=*/true);
}

int Fail(const Error& e) {
  fprintf(stderr, "%s\n", e.ToString().c_str());
  return ExitStatus(e.code());
}

}  // namespace cli

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

// Everything after "--" is the command to launch; CLI11 only sees what comes before (args keeps argv[0]).
void SplitAtDoubleDash(int argc, char** argv, std::vector<char*>* args, std::vector<std::string>* command) {
  for (int i = 0; i < argc; ++i) {
    if (i > 0 && std::string(argv[i]) == "--") {
      for (int j = i + 1; j < argc; ++j) command->emplace_back(argv[j]);
      return;
    }
    args->push_back(argv[i]);
  }
}

// Parses; returns the exit status when parsing ends the run (help, version, a usage error), else nullopt.
std::optional<int> Parse(CLI::App& app, std::vector<char*>& args) {
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
  return std::nullopt;
}

int RunCliUnguarded(int argc, char** argv) {
  std::vector<char*> args;
  std::vector<std::string> command;
  SplitAtDoubleDash(argc, argv, &args, &command);

  CLI::App app{kDescription, "rvbpfd"};
  app.set_version_flag("--version", "rvbpfd 0.1.0");
  cli::RecordFlags record;
  cli::AddRecordFlags(app, &record);
  cli::TraceCommands trace_commands;
  cli::AddTraceCommands(app, &trace_commands);
  cli::SitesCommand sites;
  cli::AddSitesCommand(app, &sites, &record.debug_lookup);
  cli::AgentCommand agent;
  cli::AddAgentCommand(app, &agent);
  DumpOptions dump_options;
  CLI::App* dump = cli::AddDumpCommand(app, &dump_options);
  TopOptions top_options;
  CLI::App* top = cli::AddTopCommand(app, &top_options);
  app.require_subcommand(0, 1);
  if (std::optional<int> status = Parse(app, args)) return *status;

  ConfigureDebugLookup(record.debug_lookup);
  if (dump->parsed()) {
    return cli::RunDumpCommand(std::move(dump_options), record, dump->get_option("--cache-dir")->count() > 0);
  }
  if (top->parsed()) return cli::RunTopCommand(std::move(top_options), record);
  if (agent.app->parsed()) return cli::RunAgentCommand(agent);
  if (int status = 0; cli::RunTraceCommand(trace_commands, &status)) return status;
  if (sites.app->parsed()) return cli::RunSites(sites, record);
  return cli::RunRecord(app, record, std::move(command));
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
    return cli::Fail(Error(ErrorCode::kInternal, std::string("uncaught exception: ") + e.what()));
  }
}

}  // namespace rvbpfd
