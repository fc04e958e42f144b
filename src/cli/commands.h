// The subcommands of the command line, one Add/Run pair per group (cli.cc only wires them): Add* registers a
// command's flags on the CLI11 app, storing them in the command's own struct; Run* executes it once parsed and returns
// the process exit status (errors were printed as one line by Fail).
//
// Threading: everything here runs on the main thread, once.
#ifndef RVBPFD_SRC_CLI_COMMANDS_H_
#define RVBPFD_SRC_CLI_COMMANDS_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "common/error.h"
#include "dump/dump_command.h"
#include "elf/debug_lookup.h"
#include "export/folded.h"
#include "ops/agent_config.h"
#include "record/recorder.h"
#include "top/top_command.h"
#include "trace/inspect.h"

namespace rvbpfd::cli {

// Prints `e` as one line on stderr and returns its exit status.
int Fail(const Error& e);
// Prints a multi-line report whose text quotes what target processes controlled (thread names, frame labels, paths,
// reasons) with their control bytes escaped, so a trace cannot drive the terminal that inspects it.
void PrintEscaped(const std::function<void(std::ostream&)>& print);

// The top-level flags: recording (attach or launch) and what other commands share with it (--cache-dir, the debug
// lookup).
struct RecordFlags {
  RecordOptions rec;
  std::string trace_format = "zstd";
  bool no_status = false;
  bool follow = false;     // --follow (attach mode: the target's descendants too)
  bool no_follow = false;  // --no-follow (launch mode: the launched process only)
  std::string hold = "on";  // --hold on|off (RecordOptions::hold)
  CLI::Option* cache_dir_opt = nullptr;
  DebugLookupConfig debug_lookup;
  // An explicit --cache-dir others could write is refused (exit 13); the default one is then only not used.
  Status CheckCacheDir() const;
};
void AddRecordFlags(CLI::App& app, RecordFlags* flags);
// --debug-dir and --debuginfod-timeout on `app` (the top level and `sites`), into *config.
void AddDebugLookupFlags(CLI::App* app, DebugLookupConfig* config);
// --stacks, for recording and top.
CLI::Validator StacksValidator();
// Runs the recording once no subcommand was given; `command` is what followed "--".
int RunRecord(CLI::App& app, RecordFlags& flags, std::vector<std::string> command);

// inspect, stats, report, export: the commands that read a trace.
struct TraceCommands {
  CLI::App* inspect = nullptr;
  std::string inspect_file;
  bool inspect_events = false;
  EventFilter event_filter;
  CLI::App* stats = nullptr;
  std::string stats_file;
  CLI::App* report = nullptr;
  std::string report_file, report_out;
  std::optional<uint32_t> report_process;  // --process: which process of a multi-process trace to draw
  CLI::App* exp = nullptr;
  std::string export_file, export_out;
  bool perfetto = false, speedscope = false, pprof = false, folded = false;
  std::string folded_weight = "cpu";
  uint64_t max_output_bytes = 0;  // set by AddTraceCommands (kDefaultMaxOutputBytes)
};
void AddTraceCommands(CLI::App& app, TraceCommands* commands);
// The trace command that was parsed, if any: true and its status in *status.
bool RunTraceCommand(const TraceCommands& commands, int* status);

// sites: the probe sites of a VM binary.
struct SitesCommand {
  CLI::App* app = nullptr;
  int pid = 0;
  std::string binary;
};
void AddSitesCommand(CLI::App& app, SitesCommand* command, DebugLookupConfig* debug_lookup);
int RunSites(const SitesCommand& command, const RecordFlags& flags);

// agent: fleet mode. Every flag is also a key of the --config file; flags given on the command line win over it.
struct AgentCommand {
  CLI::App* app = nullptr;
  AgentConfig flags;
  std::string memory_budget;
  std::vector<CLI::Option*> options;  // the flags, to tell which were given
};
void AddAgentCommand(CLI::App& app, AgentCommand* command);
int RunAgentCommand(const AgentCommand& command);

// dump and top (src/dump, src/top run them).
CLI::App* AddDumpCommand(CLI::App& app, DumpOptions* options);
CLI::App* AddTopCommand(CLI::App& app, TopOptions* options);
// own_cache_dir: `dump --cache-dir` was given (it wins over the global one).
int RunDumpCommand(DumpOptions options, const RecordFlags& flags, bool own_cache_dir);
int RunTopCommand(TopOptions options, const RecordFlags& flags);

}  // namespace rvbpfd::cli

#endif  // RVBPFD_SRC_CLI_COMMANDS_H_
