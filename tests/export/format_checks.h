// Validators for the two export formats, written from the formats' specifications (the Trace Event Format document
// for Chrome/Perfetto JSON; speedscope's file-format-schema.json). Each returns the list of violations, so the
// tests can also prove the validators catch what they claim to.
#ifndef RVBPFD_TESTS_EXPORT_FORMAT_CHECKS_H_
#define RVBPFD_TESTS_EXPORT_FORMAT_CHECKS_H_

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace rvbpfd::testing {

// Trace event format: every event has ph, name, pid, tid and (except metadata) a numeric ts; "X" has a
// non-negative dur; "B"/"E" match per (pid, tid) like a stack with the same name; "i" has scope t/p/g; "M" is one
// of the metadata names and has args; per track, timestamps never decrease in file order and complete events nest
// (no partial overlap).
inline std::vector<std::string> CheckTraceEventFormat(const nlohmann::json& doc) {
  std::vector<std::string> errors;
  if (!doc.is_object() || !doc.contains("traceEvents") || !doc["traceEvents"].is_array()) {
    return {"no traceEvents array"};
  }
  using Track = std::pair<long long, long long>;
  std::map<Track, std::vector<std::string>> open_b;      // B names not yet ended
  std::map<Track, double> last_ts;
  std::map<Track, std::vector<double>> x_ends;           // end times of enclosing X events
  const std::set<std::string> metadata = {"process_name", "process_labels", "process_sort_index", "thread_name",
                                          "thread_sort_index"};
  size_t i = 0;
  for (const auto& e : doc["traceEvents"]) {
    const std::string at = "event " + std::to_string(i++) + ": ";
    if (!e.is_object()) {
      errors.push_back(at + "not an object");
      continue;
    }
    for (const char* key : {"ph", "name", "pid", "tid"}) {
      if (!e.contains(key)) errors.push_back(at + "missing " + key);
    }
    if (!e.contains("ph") || !e["ph"].is_string() || !e.contains("pid") || !e.contains("tid")) continue;
    if (!e["pid"].is_number_integer() || !e["tid"].is_number_integer()) errors.push_back(at + "pid/tid not integers");
    const std::string ph = e["ph"];
    if (ph == "M") {
      if (!metadata.count(e.value("name", ""))) errors.push_back(at + "unknown metadata " + e.value("name", ""));
      if (!e.contains("args") || !e["args"].is_object()) errors.push_back(at + "metadata without args");
      continue;
    }
    if (!e.contains("ts") || !e["ts"].is_number()) {
      errors.push_back(at + "missing numeric ts");
      continue;
    }
    const Track track{e["pid"].get<long long>(), e["tid"].get<long long>()};
    const double ts = e["ts"].get<double>();
    auto last = last_ts.find(track);
    if (last != last_ts.end() && ts < last->second) errors.push_back(at + "ts decreases on its track");
    last_ts[track] = ts;
    if (ph == "B") {
      open_b[track].push_back(e.value("name", ""));
    } else if (ph == "E") {
      auto& stack = open_b[track];
      if (stack.empty()) {
        errors.push_back(at + "E without a matching B");
      } else {
        if (e.contains("name") && e["name"] != stack.back()) errors.push_back(at + "E name differs from its B");
        stack.pop_back();
      }
    } else if (ph == "X") {
      if (!e.contains("dur") || !e["dur"].is_number() || e["dur"].get<double>() < 0) {
        errors.push_back(at + "X without a non-negative dur");
        continue;
      }
      const double end = ts + e["dur"].get<double>();
      auto& ends = x_ends[track];
      while (!ends.empty() && ends.back() <= ts) ends.pop_back();
      if (!ends.empty() && end > ends.back() + 1e-9) errors.push_back(at + "X overlaps its enclosing slice");
      ends.push_back(end);
    } else if (ph == "i" || ph == "I") {
      const std::string scope = e.value("s", "t");
      if (scope != "t" && scope != "p" && scope != "g") errors.push_back(at + "bad instant scope " + scope);
    } else if (ph != "C") {
      errors.push_back(at + "unexpected ph " + ph);
    }
  }
  for (const auto& [track, stack] : open_b) {
    if (!stack.empty()) errors.push_back("track " + std::to_string(track.second) + ": B without E");
  }
  return errors;
}

// speedscope file-format-schema.json: the file has "$schema" (the schema URL), "shared" with "frames" (objects
// with a string "name"), and "profiles"; an evented profile has type "evented", name, unit (one of the schema's
// units), numeric startValue/endValue and events of type "O"/"C" with a numeric "at" and an integer frame index.
// Events must be ordered by "at" within [startValue, endValue], and every "C" closes the innermost open frame;
// nothing stays open at the end. A sampled profile has type "sampled", name, unit, startValue/endValue, "samples"
// (arrays of frame indices) and as many non-negative numeric "weights", summing to endValue - startValue.
inline std::vector<std::string> CheckSpeedscope(const nlohmann::json& doc) {
  std::vector<std::string> errors;
  if (!doc.is_object()) return {"not an object"};
  if (doc.value("$schema", "") != "https://www.speedscope.app/file-format-schema.json") errors.push_back("$schema");
  if (!doc.contains("shared") || !doc["shared"].contains("frames") || !doc["shared"]["frames"].is_array()) {
    return {"no shared.frames"};
  }
  const auto& frames = doc["shared"]["frames"];
  for (const auto& f : frames) {
    if (!f.contains("name") || !f["name"].is_string()) errors.push_back("frame without a name");
  }
  if (!doc.contains("profiles") || !doc["profiles"].is_array()) return {"no profiles"};
  const std::set<std::string> units = {"none", "nanoseconds", "microseconds", "milliseconds", "seconds", "bytes"};
  size_t p = 0;
  for (const auto& prof : doc["profiles"]) {
    const std::string at = "profile " + std::to_string(p++) + ": ";
    if (!prof.contains("name") || !prof["name"].is_string()) errors.push_back(at + "no name");
    if (!units.count(prof.value("unit", ""))) errors.push_back(at + "bad unit");
    if (prof.value("type", "") == "sampled") {
      if (!prof.contains("startValue") || !prof["startValue"].is_number() || !prof.contains("endValue") ||
          !prof["endValue"].is_number() || !prof.contains("samples") || !prof["samples"].is_array() ||
          !prof.contains("weights") || !prof["weights"].is_array() ||
          prof["samples"].size() != prof["weights"].size()) {
        errors.push_back(at + "sampled profile without startValue/endValue or matching samples/weights");
        continue;
      }
      double sum = 0;
      for (const auto& w : prof["weights"]) {
        if (!w.is_number() || w.get<double>() < 0) errors.push_back(at + "bad weight");
        else sum += w.get<double>();
      }
      if (sum != prof["endValue"].get<double>() - prof["startValue"].get<double>()) {
        errors.push_back(at + "weights do not sum to endValue - startValue");
      }
      for (const auto& st : prof["samples"]) {
        if (!st.is_array()) {
          errors.push_back(at + "a sample is not an array");
          continue;
        }
        for (const auto& f : st) {
          if (!f.is_number_integer() || f.get<long long>() < 0 || f.get<long long>() >= static_cast<long long>(frames.size())) {
            errors.push_back(at + "sample frame out of range");
          }
        }
      }
      continue;
    }
    if (prof.value("type", "") != "evented") errors.push_back(at + "type is neither evented nor sampled");
    if (!prof.contains("startValue") || !prof["startValue"].is_number() || !prof.contains("endValue") ||
        !prof["endValue"].is_number() || !prof.contains("events") || !prof["events"].is_array()) {
      errors.push_back(at + "missing startValue/endValue/events");
      continue;
    }
    const double start = prof["startValue"].get<double>(), end = prof["endValue"].get<double>();
    double last = start;
    std::vector<long long> stack;
    for (const auto& ev : prof["events"]) {
      const std::string type = ev.value("type", "");
      if ((type != "O" && type != "C") || !ev.contains("at") || !ev["at"].is_number() || !ev.contains("frame") ||
          !ev["frame"].is_number_integer()) {
        errors.push_back(at + "malformed event");
        continue;
      }
      const double t = ev["at"].get<double>();
      const long long frame = ev["frame"].get<long long>();
      if (frame < 0 || frame >= static_cast<long long>(frames.size())) errors.push_back(at + "frame out of range");
      if (t < last) errors.push_back(at + "events out of order");
      if (t > end) errors.push_back(at + "event after endValue");
      last = t;
      if (type == "O") {
        stack.push_back(frame);
      } else if (stack.empty() || stack.back() != frame) {
        errors.push_back(at + "C does not close the innermost open frame");
      } else {
        stack.pop_back();
      }
    }
    if (!stack.empty()) errors.push_back(at + "frames left open");
  }
  return errors;
}

}  // namespace rvbpfd::testing

#endif  // RVBPFD_TESTS_EXPORT_FORMAT_CHECKS_H_
