// Which processes the fleet agent watches: --include / --exclude rules over a process's labels.
//
// Rules (docs/deploy.md):
//   comm:PATTERN         the command name (/proc/PID/comm, at most 15 bytes) matches PATTERN as a whole; '*' matches
//                        any run of bytes, '?' one byte (comm:puma*, comm:ruby)
//   cgroup:PREFIX        the cgroup path starts with PREFIX (must start with '/'); plain string prefix, so
//                        cgroup:/system.slice/docker- matches every Docker scope
//   label:KEY=PATTERN    KEY is "service" (the service name: RVBPF_SERVICE, OTEL_SERVICE_NAME or comm) or
//                        "container" (the 64-hex container id, "" outside containers); PATTERN as for comm, so
//                        label:container=3f2a* matches a short id and label:container= the processes outside containers
// No include rule = every process is included; a process matching any exclude rule is excluded (exclude wins).
#ifndef RVBPFD_SRC_OPS_PROCESS_FILTER_H_
#define RVBPFD_SRC_OPS_PROCESS_FILTER_H_

#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "ops/process_labels.h"

namespace rvbpfd {

// '*' = any run of bytes (also empty), '?' = exactly one byte, everything else literal; the whole text must match.
bool GlobMatch(std::string_view pattern, std::string_view text);

class ProcessFilter {
 public:
  ProcessFilter() = default;  // no rules: matches everything
  // Errors (kUsage) name the flag and the rule: `--include rule "comm:": expected comm:NAME, cgroup:PREFIX or
  // label:KEY=VALUE (KEY service or container)`.
  static Result<ProcessFilter> Create(const std::vector<std::string>& include, const std::vector<std::string>& exclude);
  bool Matches(const ProcessLabels& p) const;
  bool empty() const { return include_.empty() && exclude_.empty(); }

 private:
  enum class Field { kComm, kCgroup, kService, kContainer };
  struct Rule {
    Field field;
    std::string pattern;  // glob (comm, service, container) or prefix (cgroup)
  };
  static Result<Rule> ParseRule(std::string_view flag, const std::string& text);
  static bool RuleMatches(const Rule& rule, const ProcessLabels& p);

  std::vector<Rule> include_;
  std::vector<Rule> exclude_;
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_OPS_PROCESS_FILTER_H_
