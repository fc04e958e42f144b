#include "model/blockers.h"

#include <algorithm>
#include <utility>

namespace rvbpfd {
namespace {

// What a blamed stack is grouped by: the innermost program frame's label and the leaf library frame above it.
struct MethodAndCall {
  std::string method;
  std::string call;  // "" when the method's own code was running
};

MethodAndCall OfStack(const std::vector<uint32_t>& ids, const std::unordered_map<uint32_t, FrameInfo>& frames) {
  MethodAndCall out;
  for (size_t i = 0; i < ids.size(); ++i) {
    auto it = frames.find(ids[i]);
    if (it == frames.end()) continue;  // an undefined frame names nothing
    const FrameInfo& f = it->second;
    if (f.kind == FrameKind::kRuby && !IsVmLibraryFrame(f)) {
      out.method = f.label;
      return out;
    }
    if (out.call.empty() && IsVmLibraryFrame(f)) out.call = f.label;
  }
  // No program frame: the leaf is all that is known.
  for (uint32_t id : ids) {
    if (auto it = frames.find(id); it != frames.end()) {
      out.method = it->second.label;
      break;
    }
  }
  out.call.clear();
  return out;
}

template <typename T>
void SortHeaviestFirst(std::vector<T>* v) {
  std::stable_sort(v->begin(), v->end(), [](const T& a, const T& b) { return a.ns > b.ns; });
}

}  // namespace

std::vector<Blocker> GroupBlockers(const AttributionResult& a, const std::unordered_map<uint32_t, FrameInfo>& frames,
                                   const std::unordered_map<uint32_t, std::vector<uint32_t>>& stacks) {
  std::unordered_map<uint32_t, MethodAndCall> of_stack;  // each stack is looked at once
  std::map<std::string, Blocker> rows;
  std::map<std::string, std::map<uint64_t, uint64_t>> holders;        // method -> holder -> ns
  std::map<std::string, std::map<std::string, uint64_t>> calls;       // method -> call -> ns
  for (const auto& [key, ns] : a.blame_ns) {
    if (ns == 0) continue;
    MethodAndCall mc;
    auto st = key.stack != 0 ? stacks.find(key.stack) : stacks.end();
    if (key.gc) {
      mc.method = kGcFrame;
    } else if (st == stacks.end()) {
      mc.method = BlameStandInFrame(key.source);
    } else {
      auto [it, fresh] = of_stack.try_emplace(key.stack);
      if (fresh) it->second = OfStack(st->second, frames);
      mc = it->second;
      if (mc.method.empty()) mc.method = BlameStandInFrame(key.source);
    }
    Blocker& row = rows[mc.method];
    row.ns += ns;
    row.by_source[key.provenance == Provenance::kInferred ? ProvenanceString(Provenance::kInferred)
                                                          : BlameSourceName(key.source)] += ns;
    holders[mc.method][key.holder] += ns;
    if (!mc.call.empty()) calls[mc.method][mc.call] += ns;
  }
  std::vector<Blocker> out;
  out.reserve(rows.size());
  for (auto& [method, row] : rows) {
    row.method = method;
    for (const auto& [holder, ns] : holders[method]) row.holders.push_back({holder, ns});
    for (auto& [call, ns] : calls[method]) row.calls.push_back({call, ns});
    SortHeaviestFirst(&row.holders);
    SortHeaviestFirst(&row.calls);
    out.push_back(std::move(row));
  }
  SortHeaviestFirst(&out);  // stable over the map's order: ties by method
  return out;
}

}  // namespace rvbpfd
