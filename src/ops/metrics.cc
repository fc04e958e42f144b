#include "ops/metrics.h"

#include <unistd.h>

#include <charconv>
#include <cmath>
#include <cstdlib>

#include "ops/file_read.h"

namespace rvbpfd {
namespace {

// [a-zA-Z_:][a-zA-Z0-9_:]* for metric names (`colon`), [a-zA-Z_][a-zA-Z0-9_]* for label names.
bool ValidName(std::string_view n, bool colon) {
  if (n.empty()) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    char c = n[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':') ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

bool ValidMetricName(std::string_view n) { return ValidName(n, /*colon=*/true); }
// Names beginning with "__" are reserved for the scraper's own labels.
bool ValidLabelName(std::string_view n) { return ValidName(n, /*colon=*/false) && n.substr(0, 2) != "__"; }

// Exposition format 0.0.4: HELP text escapes \ and newline; label values (`quote`) also escape the double quote.
std::string ExpositionEscape(std::string_view s, bool quote) {
  std::string out;
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (quote && c == '"') {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

// Integers exactly (counters of events reach 1e9+ and must not turn into 1e+09), other values shortest round-trip,
// and the spellings the format defines for the special values.
std::string FormatSampleValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 9007199254740992.0) {  // 2^53: every integer below is exact
    return std::to_string(static_cast<int64_t>(v));
  }
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  if (ec != std::errc()) return "NaN";
  return std::string(buf, end);
}

// Parses "NAME:   <number> kB" lines of /proc/PID/status; false when absent.
bool StatusKb(std::string_view status, std::string_view name, uint64_t* kb) {
  size_t pos = 0;
  while (pos < status.size()) {
    size_t nl = status.find('\n', pos);
    std::string_view line = status.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    pos = nl == std::string_view::npos ? status.size() : nl + 1;
    if (line.size() <= name.size() || line.substr(0, name.size()) != name || line[name.size()] != ':') continue;
    std::string_view rest = line.substr(name.size() + 1);
    size_t i = rest.find_first_not_of(" \t");
    if (i == std::string_view::npos) return false;
    rest = rest.substr(i);
    uint64_t v = 0;
    auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), v);
    if (ec != std::errc() || end == rest.data()) return false;
    std::string_view unit(end, rest.data() + rest.size() - end);
    if (unit != " kB") return false;
    *kb = v;
    return true;
  }
  return false;
}

}  // namespace

MetricsRegistry::Family* MetricsRegistry::FamilyFor(std::string_view name, std::string_view help, Type type,
                                                    const MetricLabels& labels) {
  bool ok = ValidMetricName(name);
  for (const auto& [k, v] : labels) ok = ok && ValidLabelName(k);
  if (!ok) {
    ++rejected_writes_;
    return nullptr;
  }
  auto it = families_.find(name);
  if (it == families_.end()) {
    it = families_.emplace(std::string(name), Family{type, std::string(help), {}}).first;
  } else if (it->second.type != type) {
    ++rejected_writes_;
    return nullptr;
  }
  return &it->second;
}

void MetricsRegistry::SetCounter(std::string_view name, std::string_view help, const MetricLabels& labels,
                                 double value) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Family* f = FamilyFor(name, help, Type::kCounter, labels)) f->series[labels] = value;
}

void MetricsRegistry::SetGauge(std::string_view name, std::string_view help, const MetricLabels& labels,
                               double value) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Family* f = FamilyFor(name, help, Type::kGauge, labels)) f->series[labels] = value;
}

void MetricsRegistry::AddCounter(std::string_view name, std::string_view help, const MetricLabels& labels,
                                 double delta) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!(delta >= 0)) {  // also rejects NaN: a counter never goes down
    ++rejected_writes_;
    return;
  }
  if (Family* f = FamilyFor(name, help, Type::kCounter, labels)) f->series[labels] += delta;
}

size_t MetricsRegistry::rejected_writes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rejected_writes_;
}

void MetricsRegistry::AddCollector(Collector collect) {
  std::lock_guard<std::mutex> lock(mu_);
  collectors_.push_back(std::move(collect));
}

std::string MetricsRegistry::RenderPrometheus() {
  std::vector<Collector> collectors;
  {
    std::lock_guard<std::mutex> lock(mu_);
    collectors = collectors_;
  }
  for (const Collector& collect : collectors) collect(*this);
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const auto& [name, family] : families_) {
    out += "# HELP " + name + " " + ExpositionEscape(family.help, /*quote=*/false) + "\n";
    out += "# TYPE " + name + (family.type == Type::kCounter ? " counter\n" : " gauge\n");
    for (const auto& [labels, value] : family.series) {
      out += name;
      if (!labels.empty()) {
        out += '{';
        bool first = true;
        for (const auto& [k, v] : labels) {
          if (!first) out += ',';
          first = false;
          out += k + "=\"" + ExpositionEscape(v, /*quote=*/true) + "\"";
        }
        out += '}';
      }
      out += ' ';
      out += FormatSampleValue(value);
      out += '\n';
    }
  }
  return out;
}

Result<ListenAddress> ParseListenAddress(std::string_view listen) {
  constexpr std::string_view kNotIpv4 =
      "not an IPv4 address (hostnames other than localhost and IPv6 are not supported)";
  auto bad = [&](std::string_view why) {
    return Error(ErrorCode::kUsage, "listen address \"" + std::string(listen) + "\": " + std::string(why) +
                                        " (expected IPV4:PORT, e.g. 127.0.0.1:9464, or localhost:PORT; \"off\" "
                                        "disables the endpoint)");
  };
  size_t colon = listen.rfind(':');
  if (colon == std::string_view::npos) return bad("no port");
  std::string_view host = listen.substr(0, colon);
  std::string_view port_text = listen.substr(colon + 1);
  ListenAddress addr;
  unsigned port = 0;
  auto [pend, pec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || pec != std::errc() || pend != port_text.data() + port_text.size() || port > 65535) {
    return bad("the port must be a number 0..65535");
  }
  addr.port = static_cast<uint16_t>(port);
  if (host == "localhost") {
    addr.ipv4_host_order = 0x7f000001;
    return addr;
  }
  // Four decimal octets 0..255, nothing else (inet_aton would also take "127.1" and hex forms).
  uint32_t ip = 0;
  std::string_view rest = host;
  for (int i = 0; i < 4; ++i) {
    unsigned octet = 0;
    auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), octet);
    if (ec != std::errc() || end == rest.data() || octet > 255 || end - rest.data() > 3) {
      return bad(kNotIpv4);
    }
    ip = (ip << 8) | octet;
    rest = rest.substr(static_cast<size_t>(end - rest.data()));
    if (i < 3) {
      if (rest.empty() || rest[0] != '.') return bad(kNotIpv4);
      rest.remove_prefix(1);
    }
  }
  if (!rest.empty()) return bad(kNotIpv4);
  addr.ipv4_host_order = ip;
  return addr;
}

Result<SelfUsage> ReadSelfUsage(const std::string& proc_root) {
  SelfUsage usage;
  std::string stat_path = proc_root + "/self/stat";
  SmallFile stat = ReadSmallFile(stat_path, 4096);
  if (stat.err != 0) return Error(ErrorCode::kIo, ErrnoMessage("reading " + stat_path, stat.err));
  // "pid (comm) state ppid ..." : comm may hold spaces and ')', so fields are counted after the LAST ')'.
  size_t close = stat.data.rfind(')');
  if (close == std::string::npos) return Error(ErrorCode::kIo, stat_path + ": no \")\" after the command name");
  std::string_view rest = std::string_view(stat.data).substr(close + 1);
  // Fields after ')' start at field 3 (state); utime and stime are fields 14 and 15 (proc(5)).
  uint64_t utime = 0, stime = 0;
  int field = 3;
  bool have_utime = false, have_stime = false;
  size_t pos = 0;
  while (pos < rest.size() && field <= 15) {
    size_t begin = rest.find_first_not_of(' ', pos);
    if (begin == std::string_view::npos) break;
    size_t end = rest.find(' ', begin);
    if (end == std::string_view::npos) end = rest.size();
    std::string_view tok = rest.substr(begin, end - begin);
    if (field == 14 || field == 15) {
      uint64_t v = 0;
      auto [p, ec] = std::from_chars(tok.data(), tok.data() + tok.size(), v);
      if (ec != std::errc() || p != tok.data() + tok.size()) {
        // A trailing newline can only follow the last field; fields 14/15 are never last.
        return Error(ErrorCode::kIo, stat_path + ": field " + std::to_string(field) + " is not a number");
      }
      if (field == 14) {
        utime = v;
        have_utime = true;
      } else {
        stime = v;
        have_stime = true;
      }
    }
    ++field;
    pos = end;
  }
  if (!have_utime || !have_stime) return Error(ErrorCode::kIo, stat_path + ": fewer than 15 fields");
  long ticks = sysconf(_SC_CLK_TCK);
  if (ticks <= 0) ticks = 100;
  usage.cpu_seconds = static_cast<double>(utime + stime) / static_cast<double>(ticks);

  std::string status_path = proc_root + "/self/status";
  SmallFile status = ReadSmallFile(status_path, 64 * 1024);
  if (status.err != 0) return Error(ErrorCode::kIo, ErrnoMessage("reading " + status_path, status.err));
  uint64_t rss_kb = 0, hwm_kb = 0;
  if (!StatusKb(status.data, "VmRSS", &rss_kb)) return Error(ErrorCode::kIo, status_path + ": no VmRSS line");
  if (!StatusKb(status.data, "VmHWM", &hwm_kb)) return Error(ErrorCode::kIo, status_path + ": no VmHWM line");
  usage.rss_bytes = rss_kb * 1024;
  usage.rss_peak_bytes = hwm_kb * 1024;
  return usage;
}

void ExportSelfUsage(const SelfUsage& usage, MetricsRegistry* registry) {
  registry->SetCounter(kMetricAgentCpuSeconds, "CPU time used by the agent itself (user + system), seconds", {},
                       usage.cpu_seconds);
  registry->SetGauge(kMetricAgentRssBytes, "Resident set size of the agent, bytes", {},
                     static_cast<double>(usage.rss_bytes));
}

MetricsRegistry::Collector SelfUsageCollector(std::function<Result<SelfUsage>()> read) {
  return [read = std::move(read)](MetricsRegistry& registry) {
    if (Result<SelfUsage> usage = read ? read() : ReadSelfUsage("/proc"); usage) ExportSelfUsage(*usage, &registry);
  };
}

}  // namespace rvbpfd
