#include "top/top_render.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/text_escape.h"
#include "common/utf8.h"
#include "model/endpoint.h"

namespace rvbpfd {
namespace {

// Percent of the interval, rounded.
int Pct(uint64_t ns, uint64_t interval_ns) {
  if (interval_ns == 0) return 0;
  return static_cast<int>((ns * 100 + interval_ns / 2) / interval_ns);
}

std::string Format(const char* fmt, auto... args) {
  char buf[256];
  snprintf(buf, sizeof(buf), fmt, args...);
  return buf;
}

std::string ThreadList(const std::vector<uint32_t>& threads) {
  if (threads.empty()) return "-";
  std::string s;
  for (uint32_t t : threads) s += (s.empty() ? "" : ",") + std::to_string(t);
  return s;
}

std::string Tid(const std::optional<uint32_t>& tid) { return tid ? std::to_string(*tid) : "?"; }

// A thread's name in a column of kNameColumns characters: cut (whole UTF-8 sequences) and padded; "-" when none.
constexpr size_t kNameColumns = 16;
std::string NameColumn(const std::string& name) {
  std::string cell = CutToWidth(name.empty() ? "-" : EscapeControlBytes(name), kNameColumns);
  size_t cols = 0;
  for (size_t i = 0; i < cell.size(); ++cols) {
    const size_t len = Utf8SequenceLength(cell, i);
    i += len == 0 ? 1 : len;
  }
  return cell + std::string(kNameColumns - std::min(cols, kNameColumns), ' ');
}

std::string HeaderLine(const TopSnapshot& snap) {
  std::string holder = "nobody or not known";
  if (snap.gvl_holder) {
    holder = "thread " + std::to_string(*snap.gvl_holder);
    for (const TopThread& t : snap.threads) {
      if (t.ruby_thread == *snap.gvl_holder) holder += " (tid " + Tid(t.native_tid) + ")";
    }
  }
  return Format("rvbpfd top  pid %d  ruby %s  #%llu  %.2f s  GVL holder: %s  events %llu  dropped %llu", snap.pid,
                EscapeControlBytes(snap.ruby_version).c_str(), static_cast<unsigned long long>(snap.number),
                static_cast<double>(snap.interval_ns()) / 1e9, holder.c_str(),
                static_cast<unsigned long long>(snap.events), static_cast<unsigned long long>(snap.dropped));
}

std::string ThreadRow(const TopThread& t, uint64_t interval_ns) {
  std::string blocked_by;
  for (const auto& [reason, ns] : t.blocked_ns) {
    if (!blocked_by.empty()) blocked_by += ",";
    blocked_by += EscapeControlBytes(reason) + " " + std::to_string(Pct(ns, interval_ns)) + "%";
  }
  std::string state = t.state;
  if (!t.reason.empty()) state += ":" + EscapeControlBytes(t.reason);
  return Format("%s%6u %8s  %s  %-14s %4d %4d %5d %5d %5d  %-16s ", t.holds_gvl ? "*" : " ", t.ruby_thread,
                Tid(t.native_tid).c_str(), NameColumn(t.name).c_str(), state.c_str(), Pct(t.running_ns, interval_ns), Pct(t.gc_ns, interval_ns),
                Pct(t.gvl_wait_ns, interval_ns), Pct(t.blocked_total_ns(), interval_ns), Pct(t.idle_ns, interval_ns),
                blocked_by.c_str()) +
         EscapeControlBytes(t.where) + (t.endpoint != kNoEndpoint ? "  @ " + EscapeControlBytes(t.endpoint) : "");
}

std::vector<std::string> BlockerLines(const TopSnapshot& snap, size_t rows) {
  std::vector<std::string> out;
  if (snap.blockers.empty() || rows == 0) return out;
  out.push_back("");
  out.push_back("TOP BLOCKERS (others' GVL wait while these ran)");
  out.push_back("  WAIT ms  HOLDERS      METHOD");
  for (size_t i = 0; i < snap.blockers.size() && i < rows; ++i) {
    const TopBlocker& b = snap.blockers[i];
    out.push_back(Format("  %7.1f  %-12s ", static_cast<double>(b.wait_ns) / 1e6, ThreadList(b.holders).c_str()) +
                  EscapeControlBytes(b.method));
  }
  return out;
}

std::vector<std::string> BlockedStackLines(const TopSnapshot& snap, size_t rows) {
  std::vector<std::string> out;
  if (snap.blocked_stacks.empty() || rows == 0) return out;
  out.push_back("");
  out.push_back("TOP BLOCKED STACKS (where threads waited)");
  out.push_back("  TIME ms  STATE            THREADS      WHERE");
  for (size_t i = 0; i < snap.blocked_stacks.size() && i < rows; ++i) {
    const TopBlockedStack& s = snap.blocked_stacks[i];
    out.push_back(Format("  %7.1f  %-16s %-12s ", static_cast<double>(s.ns) / 1e6,
                         EscapeControlBytes(s.state).c_str(), ThreadList(s.threads).c_str()) +
                  (s.where.empty() ? std::string("[no stack]") : EscapeControlBytes(s.where)));
  }
  return out;
}

}  // namespace

std::string CutToWidth(std::string_view line, size_t width) {
  if (width == 0) return std::string(line);
  size_t i = 0, cols = 0;
  while (i < line.size() && cols < width) {
    const size_t len = Utf8SequenceLength(line, i);
    i += len == 0 ? 1 : len;
    ++cols;
  }
  return std::string(line.substr(0, i));
}

std::vector<std::string> RenderTop(const TopSnapshot& snap, const TopLayout& layout) {
  const uint64_t interval_ns = snap.interval_ns();
  std::vector<std::string> head = {
      HeaderLine(snap),
      "  THREAD      TID  NAME              STATE          RUN%  GC% WAIT%  BLK% IDLE%  BLOCKED BY       WHERE"};
  size_t table_rows = layout.max_table_rows;
  size_t thread_rows = snap.threads.size();
  if (layout.height > 0) {
    // Each table takes a blank line, a title and a heading besides its rows; the tables give way to the threads.
    const size_t avail = layout.height > head.size() ? layout.height - head.size() : 0;
    auto tables = [&](size_t rows) {
      return (snap.blockers.empty() || rows == 0 ? 0 : 3 + std::min(rows, snap.blockers.size())) +
             (snap.blocked_stacks.empty() || rows == 0 ? 0 : 3 + std::min(rows, snap.blocked_stacks.size()));
    };
    while (table_rows > 0 && thread_rows + tables(table_rows) > avail) --table_rows;
    thread_rows = std::min(thread_rows, avail);
  }
  std::vector<std::string> out = head;
  for (size_t i = 0; i < thread_rows; ++i) {
    if (i + 1 == thread_rows && thread_rows < snap.threads.size()) {
      out.push_back("  ... " + std::to_string(snap.threads.size() - i) + " more threads");
      break;
    }
    out.push_back(ThreadRow(snap.threads[i], interval_ns));
  }
  for (auto& section : {BlockerLines(snap, table_rows), BlockedStackLines(snap, table_rows)}) {
    out.insert(out.end(), section.begin(), section.end());
  }
  if (layout.height > 0 && out.size() > layout.height) out.resize(layout.height);
  for (std::string& line : out) line = CutToWidth(line, layout.width);
  return out;
}

std::string TopJson(const TopSnapshot& snap) {
  using nlohmann::json;
  json j;
  j["pid"] = snap.pid;
  j["ruby_version"] = snap.ruby_version;
  j["interval"] = snap.number;
  j["start_ns"] = snap.start_ns;
  j["end_ns"] = snap.end_ns;
  j["gvl_holder"] = snap.gvl_holder ? json(*snap.gvl_holder) : json(nullptr);
  j["events"] = snap.events;
  j["dropped"] = snap.dropped;
  json threads = json::array();
  for (const TopThread& t : snap.threads) {
    json blocked = json::object();
    for (const auto& [reason, ns] : t.blocked_ns) blocked[reason] = ns;
    threads.push_back({{"ruby_thread", t.ruby_thread},
                       {"native_tid", t.native_tid ? json(*t.native_tid) : json(nullptr)},
                       {"name", t.name.empty() ? json(nullptr) : json(t.name)},
                       {"state", t.state},
                       {"reason", t.reason.empty() ? json(nullptr) : json(t.reason)},
                       {"holds_gvl", t.holds_gvl},
                       {"running_ns", t.running_ns},
                       {"gc_ns", t.gc_ns},
                       {"gvl_wait_ns", t.gvl_wait_ns},
                       {"blocked_ns", blocked},
                       {"idle_ns", t.idle_ns},
                       {"where", t.where},
                       {"endpoint", t.endpoint}});
  }
  j["threads"] = threads;
  json blockers = json::array();
  for (const TopBlocker& b : snap.blockers) {
    blockers.push_back({{"method", b.method}, {"wait_ns", b.wait_ns}, {"holders", b.holders}});
  }
  j["blockers"] = blockers;
  json stacks = json::array();
  for (const TopBlockedStack& s : snap.blocked_stacks) {
    stacks.push_back({{"state", s.state}, {"where", s.where}, {"ns", s.ns}, {"threads", s.threads}});
  }
  j["blocked_stacks"] = stacks;
  // Labels are the target's bytes: invalid UTF-8 is replaced rather than failing the dump.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace rvbpfd
