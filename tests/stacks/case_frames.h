// Walker + symbolizer output for one Ruby thread, in the frame schema of rvgolden's captures ({"label", "path",
// "absolute_path", "first_lineno", "line"}; nil is null). Shared by the coredump suite, the live test and
// rvbpfd_coredump_tool (tools/record-coredump-case --rebase), so all three compare and print the same thing.
// No gtest here: the tool links only the stacks module.
#ifndef RVBPFD_TESTS_STACKS_CASE_FRAMES_H_
#define RVBPFD_TESTS_STACKS_CASE_FRAMES_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "stacks/memory_reader.h"
#include "stacks/ruby_offsets.h"
#include "stacks/symbolizer.h"
#include "stacks/walker.h"

namespace rvbpfd::testing {

struct ThreadFrames {
  bool ec_readable = false;      // rb_thread_t.ec could be read
  bool complete = false;         // the walk reached the end of the VM stack
  uint32_t status = RV_WALK_OK;  // rv_ruby_walk_status when !complete
  nlohmann::json frames = nlohmann::json::array();
};

inline nlohmann::json FrameJson(const SymbolizedFrame& f) {
  auto opt = [](const auto& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  return {{"label", opt(f.full_label)},
          {"path", opt(f.path)},
          {"absolute_path", opt(f.absolute_path)},
          {"first_lineno", opt(f.first_lineno)},
          {"line", f.line}};
}

// Walks the thread whose rb_thread_t is at `th` and symbolizes every frame.
inline ThreadFrames WalkThreadFrames(MemoryReader& mem, const RubyOffsets& off, uint64_t global_symbols, uint64_t th) {
  ThreadFrames out;
  std::optional<uint64_t> ec = ThreadEc(mem, th, off.thread_ec);
  if (!ec) return out;
  out.ec_readable = true;
  WalkResult walk = WalkRubyStack(mem, off.walk, *ec);
  out.complete = walk.complete;
  out.status = walk.status;
  Symbolizer sym(&mem, off, global_symbols);
  for (const rv_ruby_frame& f : walk.frames) out.frames.push_back(FrameJson(sym.Symbolize(f)));
  return out;
}

}  // namespace rvbpfd::testing

#endif  // RVBPFD_TESTS_STACKS_CASE_FRAMES_H_
