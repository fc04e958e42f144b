#include "ops/process_filter.h"

namespace rvbpfd {
namespace {

constexpr std::string_view kAcceptedForms =
    "expected comm:NAME (glob * ?), cgroup:/PREFIX or label:KEY=VALUE (KEY service or container)";

bool StartsWith(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

}  // namespace

bool GlobMatch(std::string_view pattern, std::string_view text) {
  // Iterative matcher with one backtrack point (the last '*'): O(|pattern| * |text|) worst case, no recursion, so a
  // long hostile comm or service name cannot blow the stack.
  size_t p = 0, t = 0;
  size_t star = std::string_view::npos, star_t = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || (pattern[p] != '*' && pattern[p] == text[t]))) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      star_t = t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++star_t;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

Result<ProcessFilter::Rule> ProcessFilter::ParseRule(std::string_view flag, const std::string& text) {
  auto bad = [&](std::string_view why) {
    return Error(ErrorCode::kUsage, std::string(flag) + " rule \"" + text + "\": " + std::string(why) + "; " +
                                        std::string(kAcceptedForms));
  };
  std::string_view t = text;
  if (StartsWith(t, "comm:")) {
    std::string_view name = t.substr(5);
    if (name.empty()) return bad("empty command name");
    // The kernel keeps 15 bytes of a command name: a longer literal part could never match.
    size_t literal = 0;
    for (char c : name) literal += c != '*' ? 1 : 0;
    if (literal > 15) return bad("a command name has at most 15 bytes (/proc/PID/comm)");
    return Rule{Field::kComm, std::string(name)};
  }
  if (StartsWith(t, "cgroup:")) {
    std::string_view prefix = t.substr(7);
    if (prefix.empty() || prefix[0] != '/') return bad("the cgroup prefix must start with '/'");
    return Rule{Field::kCgroup, std::string(prefix)};
  }
  if (StartsWith(t, "label:")) {
    std::string_view kv = t.substr(6);
    size_t eq = kv.find('=');
    if (eq == std::string_view::npos) return bad("missing '=' in the label rule");
    std::string_view key = kv.substr(0, eq);
    std::string value(kv.substr(eq + 1));
    if (key == "service") {
      if (value.empty()) return bad("empty service name");
      return Rule{Field::kService, value};
    }
    if (key == "container") return Rule{Field::kContainer, value};  // empty: processes outside containers
    return bad("unknown label key \"" + std::string(key) + "\"");
  }
  return bad("unknown rule kind");
}

Result<ProcessFilter> ProcessFilter::Create(const std::vector<std::string>& include,
                                            const std::vector<std::string>& exclude) {
  ProcessFilter filter;
  for (const std::string& text : include) {
    Result<Rule> rule = ParseRule("--include", text);
    if (!rule.ok()) return rule.error();
    filter.include_.push_back(std::move(rule).value());
  }
  for (const std::string& text : exclude) {
    Result<Rule> rule = ParseRule("--exclude", text);
    if (!rule.ok()) return rule.error();
    filter.exclude_.push_back(std::move(rule).value());
  }
  return filter;
}

bool ProcessFilter::RuleMatches(const Rule& rule, const ProcessLabels& p) {
  switch (rule.field) {
    case Field::kComm: return GlobMatch(rule.pattern, p.comm);
    case Field::kCgroup: return StartsWith(p.cgroup, rule.pattern);
    case Field::kService: return GlobMatch(rule.pattern, p.service_name);
    case Field::kContainer: return GlobMatch(rule.pattern, p.container_id);
  }
  return false;
}

bool ProcessFilter::Matches(const ProcessLabels& p) const {
  for (const Rule& r : exclude_) {
    if (RuleMatches(r, p)) return false;
  }
  if (include_.empty()) return true;
  for (const Rule& r : include_) {
    if (RuleMatches(r, p)) return true;
  }
  return false;
}

}  // namespace rvbpfd
