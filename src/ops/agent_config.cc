#include "ops/agent_config.h"

#include <cctype>
#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "common/json_dump.h"
#include "common/json_read.h"
#include "common/url_redact.h"
#include "ops/file_read.h"
#include "ops/log.h"
#include "ops/metrics.h"
#include "ops/process_filter.h"

namespace rvbpfd {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

// Each Parse returns "" or what was expected ("an integer"); the caller adds the key, the source and the JSON type.
std::string Parse(const json& j, double* out) {
  if (!j.is_number()) return "a number";
  *out = j.get<double>();
  return "";
}

template <typename T>
  requires(std::is_integral_v<T>)
std::string Parse(const json& j, T* out) {
  if (std::optional<T> v = JsonInteger<T>(j)) {
    *out = *v;
    return "";
  }
  if (!j.is_number_integer()) return "an integer";
  if (std::is_unsigned_v<T> && !j.is_number_unsigned()) return "a non-negative integer";
  return "an integer in " + std::to_string(std::numeric_limits<T>::min()) + ".." +
         std::to_string(std::numeric_limits<T>::max());
}

std::string Parse(const json& j, bool* out) {
  if (!j.is_boolean()) return "true or false";
  *out = j.get<bool>();
  return "";
}

std::string Parse(const json& j, std::string* out) {
  if (!j.is_string()) return "a string";
  *out = j.get<std::string>();
  return "";
}

std::string Parse(const json& j, std::vector<std::string>* out) {
  if (!j.is_array()) return "an array of strings";
  std::vector<std::string> v;
  for (const json& e : j) {
    if (!e.is_string()) return "an array of strings";
    v.push_back(e.get<std::string>());
  }
  *out = std::move(v);
  return "";
}

struct KeySpec {
  std::string_view key;
  std::string_view flag;
  bool reloadable;
  std::function<std::string(const json&, AgentConfig*)> apply;  // "" or what was expected
  std::function<void(const AgentConfig&, ordered_json*)> to_json;
  std::function<bool(const AgentConfig&, const AgentConfig&)> equal;
  std::function<void(const AgentConfig& from, AgentConfig* to)> copy;
};

template <typename T>
KeySpec Spec(std::string_view key, std::string_view flag, bool reloadable, T AgentConfig::*member) {
  return KeySpec{
      key,
      flag,
      reloadable,
      [member](const json& j, AgentConfig* c) { return Parse(j, &(c->*member)); },
      [member, key](const AgentConfig& c, ordered_json* o) { (*o)[std::string(key)] = c.*member; },
      [member](const AgentConfig& a, const AgentConfig& b) { return a.*member == b.*member; },
      [member](const AgentConfig& from, AgentConfig* to) { to->*member = from.*member; },
  };
}

// memory-budget: bytes as an integer, or a string with a K/M/G/T suffix (ParseByteSize).
KeySpec MemoryBudgetSpec() {
  KeySpec spec = Spec("memory-budget", "--memory-budget", false, &AgentConfig::memory_budget);
  spec.apply = [](const json& j, AgentConfig* c) -> std::string {
    if (!j.is_string()) return Parse(j, &c->memory_budget).empty() ? "" : "bytes (an integer or \"192M\")";
    Result<uint64_t> v = ParseByteSize(j.get<std::string>());
    if (!v) return "bytes (an integer or \"192M\")";
    c->memory_budget = *v;
    return "";
  };
  return spec;
}

// The one table of file keys: order = documentation order; reloadable per the ReloadPlan comment in the header.
const std::vector<KeySpec>& Specs() {
  static const std::vector<KeySpec>* specs = new std::vector<KeySpec>{
      Spec("interval", "--interval", true, &AgentConfig::interval_s),
      Spec("hz", "--hz", false, &AgentConfig::hz),
      Spec("stacks", "--stacks", false, &AgentConfig::stacks),
      Spec("max-overhead", "--max-overhead", false, &AgentConfig::max_overhead_pct),
      Spec("output-dir", "--output-dir", true, &AgentConfig::output_dir),
      Spec("output-max-mb", "--output-max-mb", true, &AgentConfig::output_max_mb),
      Spec("output-service-max-mb", "--output-service-max-mb", true, &AgentConfig::output_service_max_mb),
      Spec("push-url", "--push-url", true, &AgentConfig::push_url),
      Spec("push-queue", "--push-queue", true, &AgentConfig::push_queue),
      Spec("metrics-listen", "--metrics-listen", false, &AgentConfig::metrics_listen),
      Spec("include", "--include", true, &AgentConfig::include),
      Spec("exclude", "--exclude", true, &AgentConfig::exclude),
      Spec("service-pin", "--service-pin", true, &AgentConfig::service_pins),
      Spec("ignore-env-service", "--ignore-env-service", true, &AgentConfig::ignore_env_service),
      Spec("log-format", "--log-format", true, &AgentConfig::log_format),
      Spec("host", "--host", false, &AgentConfig::host),
      Spec("ring-buffer-kb", "--ring-buffer-kb", false, &AgentConfig::ring_buffer_kb),
      Spec("cache-dir", "--cache-dir", false, &AgentConfig::cache_dir),
      MemoryBudgetSpec(),
  };
  return *specs;
}

const KeySpec* FindSpec(std::string_view key) {
  for (const KeySpec& s : Specs()) {
    if (s.key == key) return &s;
  }
  return nullptr;
}

std::string KnownKeys() {
  std::string out;
  for (const KeySpec& s : Specs()) {
    if (!out.empty()) out += ", ";
    out += s.key;
  }
  return out;
}

std::string FormatNumber(double v) {
  ordered_json j = v;
  return DumpJson(j);
}

bool HasControlChars(std::string_view s) {
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) return true;
  }
  return false;
}

// http(s)://HOST[:PORT][/PATH] with a non-empty host and no whitespace or control characters. The sink reports
// connection failures later; this only catches values that can never work.
std::string CheckPushUrl(std::string_view url) {
  std::string_view rest;
  if (url.substr(0, 7) == "http://") {
    rest = url.substr(7);
  } else if (url.substr(0, 8) == "https://") {
    rest = url.substr(8);
  } else {
    return "must start with http:// or https://";
  }
  for (unsigned char c : url) {
    if (c <= 0x20 || c == 0x7f) return "must not contain spaces or control characters";
  }
  size_t host_end = rest.find_first_of("/?#");
  std::string_view authority = rest.substr(0, host_end);
  if (authority.find('@') != std::string_view::npos) authority = authority.substr(authority.rfind('@') + 1);
  if (authority.empty() || authority[0] == ':') return "has no host";
  if (url.find_first_of("?#") != std::string_view::npos) {
    return "must not have a query or fragment (the sink adds its own)";
  }
  return "";
}

}  // namespace

const std::vector<std::string_view>& AgentConfigKeys() {
  static const std::vector<std::string_view>* keys = [] {
    auto* v = new std::vector<std::string_view>();
    for (const KeySpec& s : Specs()) v->push_back(s.key);
    return v;
  }();
  return *keys;
}

Result<AgentConfig> ApplyConfigJson(const AgentConfig& base, std::string_view json_text, std::string_view source) {
  const std::string where = "config " + std::string(source);
  // Duplicate top-level keys would silently keep the last value (nlohmann's behaviour): caught in the parser callback.
  std::set<std::string> seen;
  std::string duplicate;
  json doc;
  try {
    doc = json::parse(
        json_text.begin(), json_text.end(),
        [&](int depth, json::parse_event_t event, json& parsed) {
          if (event == json::parse_event_t::key && depth == 1 && parsed.is_string()) {
            std::string k = parsed.get<std::string>();
            if (!seen.insert(k).second && duplicate.empty()) duplicate = k;
          }
          return true;
        },
        /*allow_exceptions=*/true);
  } catch (const json::exception& e) {
    std::string what = e.what();
    size_t close = what.find("] ");
    if (what.rfind("[json.exception", 0) == 0 && close != std::string::npos) what = what.substr(close + 2);
    return Error(ErrorCode::kUsage, where + ": not valid JSON: " + what);
  }
  if (!doc.is_object()) {
    return Error(ErrorCode::kUsage, where + ": expected a JSON object {\"key\": value, ...}, got " +
                                        std::string(doc.type_name()));
  }
  if (!duplicate.empty()) return Error(ErrorCode::kUsage, where + ": key \"" + duplicate + "\" appears twice");

  AgentConfig config = base;
  for (const auto& [key, value] : doc.items()) {
    const KeySpec* spec = FindSpec(key);
    if (spec == nullptr) {
      std::string hint;
      if (key.rfind("--", 0) == 0 && FindSpec(key.substr(2)) != nullptr) {
        hint = " (write keys without the leading \"--\": \"" + key.substr(2) + "\")";
      } else {
        hint = " (known keys: " + KnownKeys() + ")";
      }
      return Error(ErrorCode::kUsage, where + ": unknown key \"" + key + "\"" + hint);
    }
    std::string expected = spec->apply(value, &config);
    if (!expected.empty()) {
      return Error(ErrorCode::kUsage, where + ": key \"" + key + "\": expected " + expected + ", got " +
                                          (value.is_number() ? DumpJson(value) : std::string(value.type_name())));
    }
  }
  return config;
}

Result<AgentConfig> ApplyConfigFile(const AgentConfig& base, const std::string& path) {
  SmallFile file = ReadSmallFile(path, kMaxConfigFileBytes);
  if (file.err != 0) {
    return Error(ErrorCode::kIo, ErrnoMessage("reading config file " + path, file.err) + " (check --config)");
  }
  if (file.truncated) {
    return Error(ErrorCode::kIo, "reading config file " + path + ": larger than " +
                                     std::to_string(kMaxConfigFileBytes) + " bytes");
  }
  Result<AgentConfig> config = ApplyConfigJson(base, file.data, path);
  if (!config.ok()) return config.error();
  config->config_file = path;
  return config;
}

std::string AgentConfigToJson(const AgentConfig& config) {
  ordered_json o = ordered_json::object();
  for (const KeySpec& s : Specs()) s.to_json(config, &o);
  return DumpJson(o);
}

bool MetricsDisabled(const std::string& metrics_listen) {
  return metrics_listen.empty() || metrics_listen == "off";
}

Status ValidateAgentConfig(const AgentConfig& c) {
  auto bad = [](std::string_view key, std::string_view flag, const std::string& what) {
    return Status(Error(ErrorCode::kUsage, "config: " + std::string(key) + " (" + std::string(flag) + ") " + what));
  };
  if (!std::isfinite(c.interval_s) || c.interval_s < kMinIntervalS || c.interval_s > kMaxIntervalS) {
    return bad("interval", "--interval", "must be between 1 and 3600 seconds, not " + FormatNumber(c.interval_s));
  }
  if (c.hz < 1 || c.hz > kMaxAgentHz) {
    return bad("hz", "--hz", "must be between 1 and 1000 samples per second, not " + std::to_string(c.hz));
  }
  if (c.stacks != "release" && c.stacks != "release,ready" && c.stacks != "ready,release" && c.stacks != "off") {
    return bad("stacks", "--stacks", "must be release, release,ready or off, not \"" + c.stacks + "\"");
  }
  if (!std::isfinite(c.max_overhead_pct) || c.max_overhead_pct < 0 || c.max_overhead_pct > 100) {
    return bad("max-overhead", "--max-overhead",
               "must be between 0 and 100 percent (0: never pause), not " + FormatNumber(c.max_overhead_pct));
  }
  if (c.output_max_mb < 1 || c.output_max_mb > kMaxOutputMb) {
    return bad("output-max-mb", "--output-max-mb",
               "must be between 1 and " + std::to_string(kMaxOutputMb) + " MiB, not " +
                   std::to_string(c.output_max_mb));
  }
  if (c.output_service_max_mb > kMaxOutputMb) {
    return bad("output-service-max-mb", "--output-service-max-mb",
               "must be between 0 (no cap of its own) and " + std::to_string(kMaxOutputMb) + " MiB, not " +
                   std::to_string(c.output_service_max_mb));
  }
  if (!c.push_url.empty()) {
    std::string why = CheckPushUrl(c.push_url);
    if (!why.empty()) return bad("push-url", "--push-url", "\"" + RedactUrl(c.push_url) + "\" " + why);
  }
  if (c.push_queue < 1 || c.push_queue > kMaxPushQueue) {
    return bad("push-queue", "--push-queue",
               "must be between 1 and " + std::to_string(kMaxPushQueue) + " uploads, not " +
                   std::to_string(c.push_queue));
  }
  if (!MetricsDisabled(c.metrics_listen)) {
    Result<ListenAddress> addr = ParseListenAddress(c.metrics_listen);
    if (!addr.ok()) return bad("metrics-listen", "--metrics-listen", addr.error().message());
  }
  Result<ProcessFilter> filter = ProcessFilter::Create(c.include, c.exclude);
  if (!filter.ok()) return Status(Error(ErrorCode::kUsage, "config: " + filter.error().message()));
  Result<ServiceNamePolicy> policy = ServiceNamePolicy::Create(c.service_pins, c.ignore_env_service);
  if (!policy.ok()) return Status(Error(ErrorCode::kUsage, "config: " + policy.error().message()));
  if (c.log_format != "json" && c.log_format != "text") {
    return bad("log-format", "--log-format", "must be json or text, not \"" + c.log_format + "\"");
  }
  if (c.host.size() > 255 || HasControlChars(c.host) || !IsValidUtf8(c.host)) {
    return bad("host", "--host", "must be at most 255 bytes of UTF-8 without control characters");
  }
  if (c.ring_buffer_kb < kMinRingBufferKb || c.ring_buffer_kb > kMaxRingBufferKb) {
    return bad("ring-buffer-kb", "--ring-buffer-kb",
               "must be between 4 and " + std::to_string(kMaxRingBufferKb) + " KiB, not " +
                   std::to_string(c.ring_buffer_kb));
  }
  if (c.cache_dir.empty()) return bad("cache-dir", "--cache-dir", "must not be empty");
  if (c.memory_budget < kMinMemoryBudget) {
    return bad("memory-budget", "--memory-budget",
               "must be at least 4 MiB (4194304 bytes), not " + std::to_string(c.memory_budget));
  }
  if (c.proc_root.empty()) return Status(Error(ErrorCode::kUsage, "config: proc root must not be empty"));
  return Status::Ok();
}

Result<uint64_t> ParseByteSize(std::string_view text) {
  const std::string_view original = text;
  auto bad = [&](const char* why) {
    return Error(ErrorCode::kUsage, "\"" + std::string(original) + "\" " + why +
                                        " (bytes, or a number with a K, M, G or T suffix: 192M)");
  };
  uint64_t n = 0;
  size_t digits = 0;
  for (; digits < text.size() && text[digits] >= '0' && text[digits] <= '9'; ++digits) {
    if (n > (std::numeric_limits<uint64_t>::max() - 9) / 10) return bad("is too large");
    n = n * 10 + static_cast<uint64_t>(text[digits] - '0');
  }
  if (digits == 0) return bad("is not a size");
  std::string unit;
  for (char ch : text.substr(digits)) unit += static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (unit.ends_with("IB")) unit.resize(unit.size() - 2);
  else if (unit.size() > 1 && unit.ends_with("B")) unit.resize(unit.size() - 1);
  else if (unit == "B") unit.clear();
  int shift = 0;
  if (unit == "K") shift = 10;
  else if (unit == "M") shift = 20;
  else if (unit == "G") shift = 30;
  else if (unit == "T") shift = 40;
  else if (!unit.empty()) return bad("has an unknown unit");
  if (shift > 0 && n > (std::numeric_limits<uint64_t>::max() >> shift)) return bad("is too large");
  return n << shift;
}

bool IsReloadableKey(std::string_view key) {
  const KeySpec* spec = FindSpec(key);
  return spec != nullptr && spec->reloadable;
}

ReloadPlan PlanReload(const AgentConfig& running, const AgentConfig& loaded) {
  ReloadPlan plan;
  plan.next = running;
  for (const KeySpec& s : Specs()) {
    if (s.equal(running, loaded)) continue;
    plan.changed.emplace_back(s.key);
    if (s.reloadable) {
      s.copy(loaded, &plan.next);
      plan.applied.emplace_back(s.key);
    } else {
      plan.needs_restart.emplace_back(s.key);
    }
  }
  return plan;
}

}  // namespace rvbpfd
