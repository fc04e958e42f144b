// Shared by the coredump suite and the live test: walk + symbolize every thread of a golden capture and compare.
#ifndef RVBPFD_TESTS_STACKS_STACKS_TEST_UTIL_H_
#define RVBPFD_TESTS_STACKS_STACKS_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "case_frames.h"
#include "stacks/memory_reader.h"
#include "stacks/ruby_offsets.h"
#include "stacks/symbolizer.h"
#include "stacks/walker.h"

namespace rvbpfd::testing {

inline std::optional<std::string> JsonOptString(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  return j[key].get<std::string>();
}

inline std::optional<int> JsonOptInt(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  return j[key].get<int>();
}

inline std::string Show(const std::optional<std::string>& s) { return s ? "\"" + *s + "\"" : "nil"; }
inline std::string Show(const std::optional<int>& s) { return s ? std::to_string(*s) : "nil"; }

// Walks and symbolizes one golden thread and returns the differences (empty when every frame matches: label, path,
// absolute path, first line and line, frame for frame, and the walk reached the end of the stack). `thread` is a
// golden thread object (or one whose "frames" were replaced by a case's expectation). `frames_out` gets the number of
// frames the walker produced.
inline std::vector<std::string> CompareThread(MemoryReader& mem, const RubyOffsets& off, uint64_t global_symbols,
                                              const nlohmann::json& thread, size_t* frames_out = nullptr) {
  std::vector<std::string> diffs;
  const uint64_t th = std::stoull(thread["th"].get<std::string>(), nullptr, 16);
  ThreadFrames walk = WalkThreadFrames(mem, off, global_symbols, th);
  if (!walk.ec_readable) return {"rb_thread_t.ec unreadable"};
  if (frames_out != nullptr) *frames_out = walk.frames.size();
  if (!walk.complete) diffs.push_back("walk incomplete, status " + std::to_string(walk.status));
  const nlohmann::json& golden = thread["frames"];
  if (walk.frames.size() != golden.size()) {
    diffs.push_back("frame count: walker " + std::to_string(walk.frames.size()) + ", CRuby " +
                    std::to_string(golden.size()));
  }
  for (size_t i = 0; i < std::min(walk.frames.size(), golden.size()); i++) {
    const nlohmann::json& got = walk.frames[i];
    const nlohmann::json& want = golden[i];
    auto check = [&](const char* what, const std::string& g, const std::string& w) {
      if (g != w) diffs.push_back("frame " + std::to_string(i) + " " + what + ": got " + g + ", want " + w);
    };
    check("label", Show(JsonOptString(got, "label")), Show(JsonOptString(want, "label")));
    check("path", Show(JsonOptString(got, "path")), Show(JsonOptString(want, "path")));
    check("absolute_path", Show(JsonOptString(got, "absolute_path")), Show(JsonOptString(want, "absolute_path")));
    check("first_lineno", Show(JsonOptInt(got, "first_lineno")), Show(JsonOptInt(want, "first_lineno")));
    check("line", std::to_string(got["line"].get<int>()), std::to_string(want["line"].get<int>()));
    if (diffs.size() > 40) {
      diffs.push_back("...");
      break;
    }
  }
  return diffs;
}

}  // namespace rvbpfd::testing

#endif  // RVBPFD_TESTS_STACKS_STACKS_TEST_UTIL_H_
