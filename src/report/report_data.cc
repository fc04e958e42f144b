#include "report/report_data.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "model/attribution.h"
#include "model/blockers.h"
#include "model/endpoint.h"

#include "trace/event.h"
#include "trace/stacks.h"
#include "trace/json_format.h"
#include "trace/reader.h"

namespace rvbpfd {
namespace {

// The top blockers embedded (the table shows the first few), and the C functions listed under each.
constexpr size_t kReportBlockers = 20;
constexpr size_t kReportBlockerCalls = 5;

// The last enumerators, so the name tables cover every value the columns can hold.
constexpr auto kLastRule = static_cast<ModelRule>(static_cast<int>(ModelRule::kCount) - 1);
constexpr auto kLastOwnerEnd = OwnerEnd::kGap;
constexpr auto kLastOwnerKind = OwnerKind::kUnknown;
constexpr auto kLastProvenance = Provenance::kInferred;

template <typename E>
uint64_t Idx(E e) {
  return static_cast<uint64_t>(e);
}

void AppendInt(std::string* out, int64_t v) {
  if (v < 0) {
    out->push_back('-');
    // Negating INT64_MIN overflows; go through unsigned arithmetic.
    AppendUint(out, ~static_cast<uint64_t>(v) + 1);
  } else {
    AppendUint(out, static_cast<uint64_t>(v));
  }
}

uint64_t RefPlusOne(EventRef ref) { return ref ? *ref + 1 : 0; }
uint64_t OptPlusOne(std::optional<uint32_t> v) { return v ? static_cast<uint64_t>(*v) + 1 : 0; }

class DataWriter {
 public:
  DataWriter(const Model& model, const ReportOptions& options, std::string* out)
      : model_(model), options_(options), out_(*out) {}

  void Write() {
    // Blame is the attribution module's, over the model's own spans: the report draws it, it does not derive it.
    // Waits the --max-overhead pauses hid are estimated from the samples' GVL readings, as the pprof export does.
    const uint32_t hz = options_.sample_hz.value_or(0);
    const uint64_t period_ns = 1'000'000'000ULL / (hz == 0 ? kDefaultSampleHz : hz);
    auto in_gc = [this](uint32_t stack) {
      return options_.frames != nullptr && options_.stacks != nullptr &&
             StackTakenInGc(*options_.frames, *options_.stacks, stack);
    };
    blame_ = AttributeTrace(model_.spans(), model_.events(), model_.end_ns(),
                            AttributionOptions{.per_wait = true,
                                               .wall = false,
                                               .estimate_paused = true,
                                               .sample_period_ns = period_ns},
                            in_gc);
    IndexTids();
    IndexStacksAndReasons();
    out_.append("{\"v\":");
    AppendUint(&out_, kReportDataVersion);
    WriteMeta();
    WriteNames();
    out_.append(",\"tids\":[");
    for (size_t i = 0; i < tids_.size(); ++i) {
      if (i > 0) out_.push_back(',');
      AppendUint(&out_, tids_[i]);
    }
    out_.push_back(']');
    WriteThreads();
    WriteOwner();
    WriteGc();
    WriteUnknown();
    WriteNative();
    WriteMarkers();
    WriteEvents();
    WriteBlame();
    WriteStacks();
    out_.append("}");
  }

 private:
  // Native tids repeat millions of times; the columns hold a small index into this table instead.
  void IndexTid(std::optional<uint32_t> tid) {
    if (!tid) return;
    if (tid_index_.emplace(*tid, tids_.size()).second) tids_.push_back(*tid);
  }
  void IndexTids() {
    for (const TraceEvent& e : model_.events()) {
      IndexTid(e.native_tid);
      IndexTid(e.probe_tid);
    }
    for (const RubyThread& t : model_.threads()) {
      for (const StateBlock& b : t.blocks) IndexTid(b.native_tid);
    }
  }
  uint64_t TidPlusOne(std::optional<uint32_t> tid) const { return tid ? tid_index_.at(*tid) + 1 : 0; }

  // A gvl_released's release reason travels in the "rr"/"rp" event columns; other events' reasons in "extra".
  static bool HasReleaseReason(const TraceEvent& e) {
    return e.event == EventName::kGvlReleased && !e.reason.empty();
  }

  // The stacks the events use, densely renumbered in order of first use, with their frames and the frames' paths;
  // dictionary entries no event uses are left out. Also numbers the distinct release reasons and counts samples.
  void IndexStacksAndReasons() {
    for (const TraceEvent& e : model_.events()) {
      if (e.event == EventName::kSample) ++samples_;
      if (HasReleaseReason(e) && reason_index_.emplace(e.reason, reasons_.size()).second) {
        reasons_.push_back(e.reason);
      }
      if (!e.stack || options_.stacks == nullptr || options_.frames == nullptr) continue;
      if (stack_index_.contains(*e.stack)) continue;
      const auto st = options_.stacks->find(*e.stack);
      if (st == options_.stacks->end()) continue;
      // A stack naming a frame the dictionary lacks (only a hand-built dictionary can) is shown without it.
      std::vector<uint32_t> frames;
      frames.reserve(st->second.size());
      for (uint32_t frame_id : st->second) {
        const auto fr = options_.frames->find(frame_id);
        if (fr == options_.frames->end()) continue;
        auto [it, is_new] = frame_index_.emplace(frame_id, frames_.size());
        if (is_new) {
          frames_.push_back(&fr->second);
          if (path_index_.emplace(fr->second.path, paths_.size()).second) paths_.push_back(fr->second.path);
        }
        frames.push_back(it->second);
      }
      stack_index_.emplace(*e.stack, stacks_.size());
      stacks_.push_back(std::move(frames));
      if (!endpoints_) endpoints_.emplace(*options_.frames, *options_.stacks);
      stack_endpoint_.push_back(endpoints_->Of(*e.stack));
    }
  }
  uint64_t StackPlusOne(const TraceEvent& e) const { return e.stack ? StackIdPlusOne(*e.stack) : 0; }
  // A trace stack id as index + 1 into "stacks"; 0 for none or one not embedded (not in the dictionary).
  uint64_t StackIdPlusOne(uint32_t id) const {
    if (id == 0) return 0;
    const auto it = stack_index_.find(id);
    return it == stack_index_.end() ? 0 : it->second + 1;
  }

  void Key(std::string_view key) {
    out_.push_back('"');
    out_.append(key);
    out_.append("\":");
  }
  void Str(std::string_view s) { AppendScriptSafeJsonString(&out_, s); }

  // "key":[f(row0),f(row1),...]
  template <typename Rows, typename F>
  void Column(std::string_view key, const Rows& rows, F value, bool comma = true) {
    if (comma) out_.push_back(',');
    Key(key);
    out_.push_back('[');
    bool first = true;
    for (const auto& row : rows) {
      if (!first) out_.push_back(',');
      first = false;
      AppendUint(&out_, static_cast<uint64_t>(value(row)));
    }
    out_.push_back(']');
  }
  // As Column, each value written as the difference to the previous row's (the first as is).
  template <typename Rows, typename F>
  void DeltaColumn(std::string_view key, const Rows& rows, F value, bool comma = true) {
    if (comma) out_.push_back(',');
    Key(key);
    out_.push_back('[');
    uint64_t prev = 0;
    bool first = true;
    for (const auto& row : rows) {
      if (!first) out_.push_back(',');
      first = false;
      const uint64_t v = static_cast<uint64_t>(value(row));
      AppendInt(&out_, static_cast<int64_t>(v - prev));
      prev = v;
    }
    out_.push_back(']');
  }
  // Start (delta-encoded) and duration columns of a span type.
  template <typename Rows>
  void SpanColumns(const Rows& rows) {
    DeltaColumn("s", rows, [](const auto& r) { return r.start_ns; }, false);
    Column("d", rows, [](const auto& r) { return r.end_ns - r.start_ns; });
  }

  void WriteMeta() {
    const ModelOptions& o = model_.options();
    out_.append(",\"meta\":{\"title\":");
    Str(options_.title);
    out_.append(",\"ruby_version\":");
    Str(o.ruby_version);
    out_.append(",\"pid\":");
    AppendInt(&out_, o.pid);
    out_.append(",\"main_thread\":");
    if (o.main_thread) {
      AppendUint(&out_, *o.main_thread);
    } else {
      out_.append("null");
    }
    out_.append(model_.is_ruby_3_2() ? ",\"ruby_3_2\":true" : ",\"ruby_3_2\":false");
    out_.append(",\"start_ns\":");
    AppendUint(&out_, model_.start_ns());
    out_.append(",\"end_ns\":");
    AppendUint(&out_, model_.end_ns());
    out_.append(",\"event_count\":");
    AppendUint(&out_, model_.events().size());
    out_.append(",\"unattributed_events\":");
    AppendUint(&out_, model_.unattributed_events());
    out_.append(",\"samples\":");
    AppendUint(&out_, samples_);
    out_.append(",\"sample_hz\":");
    if (options_.sample_hz) {
      AppendUint(&out_, *options_.sample_hz);
    } else {
      out_.append("null");
    }
    out_.append(",\"stacks\":");
    AppendUint(&out_, stacks_.size());
    out_.push_back('}');
  }

  template <typename E, typename F>
  void NameTable(std::string_view key, E last, F name) {
    out_.push_back(',');
    Key(key);
    out_.push_back('[');
    for (uint64_t i = 0; i <= Idx(last); ++i) {
      if (i > 0) out_.push_back(',');
      Str(name(static_cast<E>(i)));
    }
    out_.push_back(']');
  }

  void WriteNames() {
    out_.append(",\"names\":{");
    Key("state");
    out_.push_back('[');
    for (size_t i = 0; i < kThreadStateCount; ++i) {
      if (i > 0) out_.push_back(',');
      Str(ThreadStateName(static_cast<ThreadState>(i)));
    }
    out_.push_back(']');
    NameTable("reason", static_cast<ReleaseReason>(kReleaseReasonCount - 1), ReleaseReasonName);
    NameTable("rule", kLastRule, ModelRuleName);
    NameTable("prov", kLastProvenance, ProvenanceString);
    NameTable("event", static_cast<EventName>(kEventNameCount - 1), EventNameString);
    NameTable("cruby", static_cast<EventName>(kEventNameCount - 1), CrubyEventConstant);
    NameTable("owner_kind", kLastOwnerKind, [](OwnerKind k) -> std::string_view {
      switch (k) {
        case OwnerKind::kOwned: return "owned";
        case OwnerKind::kIdle: return "idle";
        case OwnerKind::kUnknown: return "unknown";
      }
      return "unknown";
    });
    NameTable("owner_end", kLastOwnerEnd, OwnerEndName);
    NameTable("frame_kind", FrameKind::kUnresolved, FrameKindString);
    NameTable("blame_source", static_cast<BlameSource>(static_cast<int>(BlameSource::kCount) - 1), BlameSourceName);
    // Sources are opaque labels (foreign recorders name their own channels): a table of the distinct ones.
    out_.append(",\"source\":[");
    for (const TraceEvent& e : model_.events()) {
      if (source_index_.emplace(e.source, source_index_.size()).second) {
        if (source_index_.size() > 1) out_.push_back(',');
        Str(e.source);
      }
    }
    out_.append("]}");
  }

  void WriteThreads() {
    out_.append(",\"threads\":[");
    bool first = true;
    for (const RubyThread& t : model_.threads()) {
      if (!first) out_.push_back(',');
      first = false;
      out_.append("{\"id\":");
      AppendUint(&out_, t.ruby_thread);
      out_.append(",\"label\":");
      Str(model_.ThreadLabel(t.ruby_thread));
      out_.append(t.main ? ",\"main\":true" : ",\"main\":false");
      if (const ThreadInfo* info = model_.FindThreadInfo(t.ruby_thread); info != nullptr && info->ns_tid) {
        out_.append(",\"ns_tid\":");
        AppendUint(&out_, *info->ns_tid);
      }
      out_.append(",\"tids\":[");
      for (size_t i = 0; i < t.native_tids.size(); ++i) {
        if (i > 0) out_.push_back(',');
        AppendUint(&out_, t.native_tids[i]);
      }
      out_.append("],\"totals\":{\"state_ns\":[");
      for (size_t i = 0; i < kThreadStateCount; ++i) {
        if (i > 0) out_.push_back(',');
        AppendUint(&out_, t.totals.ns_by_state[i]);
      }
      out_.append("],\"wait_total_ns\":");
      AppendUint(&out_, t.totals.wait_total_ns);
      out_.append(",\"wait_longest_ns\":");
      AppendUint(&out_, t.totals.wait_longest_ns);
      out_.append(",\"waits\":");
      AppendUint(&out_, t.totals.waits);
      out_.append(",\"acquisitions\":");
      AppendUint(&out_, t.totals.acquisitions);
      out_.append(",\"reasons\":[");
      for (size_t i = 0; i < t.totals.release_reasons.size(); ++i) {
        const ReasonTotal& r = t.totals.release_reasons[i];
        if (i > 0) out_.push_back(',');
        out_.push_back('[');
        AppendUint(&out_, Idx(r.reason));
        out_.push_back(',');
        AppendUint(&out_, r.ns);
        out_.push_back(',');
        AppendUint(&out_, r.count);
        out_.push_back(']');
      }
      out_.append("]},\"blocks\":{");
      const auto& b = t.blocks;
      SpanColumns(b);
      Column("st", b, [](const StateBlock& x) { return Idx(x.state); });
      Column("rs", b, [](const StateBlock& x) { return Idx(x.reason); });
      Column("pv", b, [](const StateBlock& x) { return Idx(x.provenance); });
      Column("ru", b, [](const StateBlock& x) { return Idx(x.rule); });
      DeltaColumn("o", b, [](const StateBlock& x) { return RefPlusOne(x.opened_by); });
      DeltaColumn("c", b, [](const StateBlock& x) { return RefPlusOne(x.closed_by); });
      Column("nt", b, [this](const StateBlock& x) { return TidPlusOne(x.native_tid); });
      Column("rp", b, [](const StateBlock& x) { return x.repeats; });
      Column("rw", b, [](const StateBlock& x) { return RefPlusOne(x.ready_while_running); });
      out_.append("}}");
    }
    out_.push_back(']');
  }

  void WriteOwner() {
    const auto& b = model_.owner_lane();
    out_.append(",\"owner\":{");
    SpanColumns(b);
    Column("k", b, [](const OwnerBlock& x) { return Idx(x.kind); });
    Column("ow", b, [](const OwnerBlock& x) { return OptPlusOne(x.owner); });
    Column("pv", b, [](const OwnerBlock& x) { return Idx(x.provenance); });
    Column("ru", b, [](const OwnerBlock& x) { return Idx(x.rule); });
    Column("en", b, [](const OwnerBlock& x) { return Idx(x.end); });
    DeltaColumn("o", b, [](const OwnerBlock& x) { return RefPlusOne(x.opened_by); });
    DeltaColumn("c", b, [](const OwnerBlock& x) { return RefPlusOne(x.closed_by); });
    out_.push_back('}');
  }

  void WriteGc() {
    const auto& g = model_.gc_spans();
    out_.append(",\"gc\":{");
    SpanColumns(g);
    Column("th", g, [](const GcSpan& x) { return OptPlusOne(x.ruby_thread); });
    Column("tp", g, [](const GcSpan& x) { return Idx(x.thread_provenance); });
    Column("ok", g, [](const GcSpan& x) { return x.complete ? 1 : 0; });
    DeltaColumn("o", g, [](const GcSpan& x) { return RefPlusOne(x.opened_by); });
    DeltaColumn("c", g, [](const GcSpan& x) { return RefPlusOne(x.closed_by); });
    out_.push_back('}');
  }

  void WriteUnknown() {
    const auto& u = model_.unknown_windows();
    out_.append(",\"unknown\":{");
    SpanColumns(u);
    Column("ru", u, [](const UnknownWindow& x) { return Idx(x.cause); });
    Column("ev", u, [](const UnknownWindow& x) { return RefPlusOne(x.event); });
    Column("n", u, [](const UnknownWindow& x) { return x.dropped; });
    out_.push_back('}');
  }

  void WriteNative() {
    out_.append(",\"native\":[");
    bool first = true;
    for (const NativeThread& n : model_.native_threads()) {
      if (!first) out_.push_back(',');
      first = false;
      out_.append("{\"tid\":");
      AppendUint(&out_, n.native_tid);
      out_.append(",\"threads\":[");
      for (size_t i = 0; i < n.ruby_threads.size(); ++i) {
        if (i > 0) out_.push_back(',');
        AppendUint(&out_, n.ruby_threads[i]);
      }
      out_.append("],\"spans\":{");
      SpanColumns(n.spans);
      Column("th", n.spans, [](const NativeSpan& x) { return x.ruby_thread; });
      Column("pv", n.spans, [](const NativeSpan& x) { return Idx(x.provenance); });
      out_.append("}}");
    }
    out_.push_back(']');
  }

  void WriteMarkers() {
    const auto& m = model_.markers();
    out_.append(",\"markers\":{");
    DeltaColumn("t", m, [](const ModelMarker& x) { return x.t_ns; }, false);
    Column("e", m, [](const ModelMarker& x) { return Idx(x.event); });
    Column("th", m, [](const ModelMarker& x) { return OptPlusOne(x.ruby_thread); });
    DeltaColumn("ev", m, [](const ModelMarker& x) { return x.event_index; });
    out_.push_back('}');
  }

  void WriteEvents() {
    const auto& e = model_.events();
    out_.append(",\"events\":{");
    DeltaColumn("t", e, [](const TraceEvent& x) { return x.t_ns; }, false);
    Column("e", e, [](const TraceEvent& x) { return Idx(x.event); });
    Column("th", e, [](const TraceEvent& x) { return OptPlusOne(x.ruby_thread); });
    Column("nt", e, [this](const TraceEvent& x) { return TidPlusOne(x.native_tid); });
    Column("pt", e, [this](const TraceEvent& x) { return TidPlusOne(x.probe_tid); });
    Column("pv", e, [](const TraceEvent& x) { return Idx(x.provenance); });
    Column("src", e, [this](const TraceEvent& x) { return source_index_.at(x.source); });
    // Columns only traces with stacks or release reasons need (a trace without them pays nothing).
    if (!stacks_.empty()) Column("sk", e, [this](const TraceEvent& x) { return StackPlusOne(x); });
    if (!reasons_.empty()) {
      Column("rr", e, [this](const TraceEvent& x) { return HasReleaseReason(x) ? reason_index_.at(x.reason) + 1 : 0; });
      Column("rp", e, [](const TraceEvent& x) { return HasReleaseReason(x) ? Idx(x.reason_provenance) : 0; });
    }
    out_.append("},\"extra\":[");
    // The few fields only daemon events carry, keyed by event index, instead of a mostly-empty column each.
    bool first = true;
    for (size_t i = 0; i < e.size(); ++i) {
      const TraceEvent& x = e[i];
      const bool has_count = x.event == EventName::kEventsDropped;
      const bool has_reason = !x.reason.empty() && !HasReleaseReason(x);
      if (!has_count && !has_reason && x.overhead_pct < 0) continue;
      if (!first) out_.push_back(',');
      first = false;
      out_.push_back('[');
      AppendUint(&out_, i);
      out_.append(",{");
      bool comma = false;
      if (has_count) {
        out_.append("\"count\":");
        AppendUint(&out_, x.count);
        comma = true;
      }
      if (has_reason) {
        if (comma) out_.push_back(',');
        out_.append("\"reason\":");
        Str(x.reason);
        comma = true;
      }
      if (x.overhead_pct >= 0) {
        if (comma) out_.push_back(',');
        out_.append("\"overhead_pct\":");
        AppendFixed(&out_, x.overhead_pct, 3);
      }
      out_.append("}]");
    }
    out_.push_back(']');
  }

  // "blame": what each GVL wait was blamed on (model/attribution.h), see report_data.h.
  void WriteBlame() {
    const AttributionResult& b = blame_;
    out_.append(",\"blame\":{\"total_ns\":");
    AppendUint(&out_, b.total_gvl_wait_ns);
    out_.append(",\"estimated_ns\":");
    AppendUint(&out_, b.estimated_gvl_wait_ns);
    // Waits by waiter, then start, so the page finds a thread's waits by binary search.
    std::vector<size_t> order(b.wait_blame.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
      const WaitBlame &p = b.wait_blame[x], &q = b.wait_blame[y];
      return std::tie(p.waiter, p.start_ns) < std::tie(q.waiter, q.start_ns);
    });
    std::vector<const WaitBlame*> waits;
    std::vector<const BlameSegment*> segments;
    std::vector<const BlamePart*> parts;
    for (size_t i : order) {
      const WaitBlame& w = b.wait_blame[i];
      waits.push_back(&w);
      for (uint32_t k = 0; k < w.segments; ++k) {
        const BlameSegment& seg = b.wait_segments[w.first_segment + k];
        segments.push_back(&seg);
        for (uint32_t j = 0; j < seg.parts; ++j) parts.push_back(&b.wait_parts[seg.first_part + j]);
      }
    }
    out_.append(",\"waits\":{");
    Column("th", waits, [](const WaitBlame* w) { return w->waiter; }, false);
    DeltaColumn("s", waits, [](const WaitBlame* w) { return w->start_ns; });
    Column("d", waits, [](const WaitBlame* w) { return w->end_ns - w->start_ns; });
    Column("ns", waits, [](const WaitBlame* w) { return w->segments; });
    out_.append("},\"segs\":{");
    Column("h", segments, [](const BlameSegment* x) { return x->holder; }, false);
    DeltaColumn("s", segments, [](const BlameSegment* x) { return x->from_ns; });
    Column("d", segments, [](const BlameSegment* x) { return x->to_ns - x->from_ns; });
    Column("rs", segments, [this](const BlameSegment* x) { return StackIdPlusOne(x->release_stack); });
    DeltaColumn("rt", segments, [](const BlameSegment* x) { return x->release_ns; });
    Column("np", segments, [](const BlameSegment* x) { return x->parts; });
    out_.append("},\"parts\":{");
    Column("sk", parts, [this](const BlamePart* x) { return StackIdPlusOne(x->stack); }, false);
    Column("src", parts, [](const BlamePart* x) { return Idx(x->source); });
    Column("gc", parts, [](const BlamePart* x) { return x->gc ? 1 : 0; });
    Column("ns", parts, [](const BlamePart* x) { return x->ns; });
    Column("n", parts, [](const BlamePart* x) { return x->samples; });
    // The flame graph's weights: blame by holder and what it ran, summed over the waiters; estimated blame apart.
    std::map<std::tuple<uint64_t, uint64_t, bool, BlameSource, bool>, uint64_t> flame;
    for (const auto& [key, ns] : b.blame_ns) {
      if (ns > 0) {
        flame[{key.holder, StackIdPlusOne(key.stack), key.gc, key.source,
               key.provenance == Provenance::kInferred}] += ns;
      }
    }
    using FlameRow = std::pair<const std::tuple<uint64_t, uint64_t, bool, BlameSource, bool>, uint64_t>;
    out_.append("},\"flame\":{");
    Column("h", flame, [](const FlameRow& x) { return std::get<0>(x.first); }, false);
    Column("sk", flame, [](const FlameRow& x) { return std::get<1>(x.first); });
    Column("gc", flame, [](const FlameRow& x) { return std::get<2>(x.first) ? 1 : 0; });
    Column("src", flame, [](const FlameRow& x) { return Idx(std::get<3>(x.first)); });
    Column("inf", flame, [](const FlameRow& x) { return std::get<4>(x.first) ? 1 : 0; });
    Column("ns", flame, [](const FlameRow& x) { return x.second; });
    out_.append("}");
    WriteBlockers();
    out_.append("}");
  }

  // "blockers": the top blockers (model/blockers.h), as `inspect` prints them.
  void WriteBlockers() {
    static const std::unordered_map<uint32_t, FrameInfo> kNoFrames;
    static const std::unordered_map<uint32_t, std::vector<uint32_t>> kNoStacks;
    const std::vector<Blocker> rows = GroupBlockers(blame_, options_.frames ? *options_.frames : kNoFrames,
                                                    options_.stacks ? *options_.stacks : kNoStacks);
    out_.append(",\"blockers\":[");
    for (size_t i = 0; i < rows.size() && i < kReportBlockers; ++i) {
      const Blocker& b = rows[i];
      if (i > 0) out_.push_back(',');
      out_.append("{\"m\":");
      Str(b.method);
      out_.append(",\"ns\":");
      AppendUint(&out_, b.ns);
      out_.append(",\"h\":[");
      for (size_t k = 0; k < b.holders.size(); ++k) {
        if (k > 0) out_.push_back(',');
        out_.push_back('[');
        AppendUint(&out_, b.holders[k].key);
        out_.push_back(',');
        AppendUint(&out_, b.holders[k].ns);
        out_.push_back(']');
      }
      out_.append("],\"c\":[");
      for (size_t k = 0; k < b.calls.size() && k < kReportBlockerCalls; ++k) {
        if (k > 0) out_.push_back(',');
        out_.push_back('[');
        Str(b.calls[k].label);
        out_.push_back(',');
        AppendUint(&out_, b.calls[k].ns);
        out_.push_back(']');
      }
      out_.append("]}");
    }
    out_.push_back(']');
  }

  // "reasons":[release reason strings],"paths":[..],"frames":{"l":[labels],"p":[path index],"ln":[lines],
  // "k":[kind]},"stacks":{"n":[frame count],"f":[frame indexes of every stack, concatenated, leaf first]}
  void WriteStacks() {
    out_.append(",\"reasons\":[");
    for (size_t i = 0; i < reasons_.size(); ++i) {
      if (i > 0) out_.push_back(',');
      Str(reasons_[i]);
    }
    out_.append("],\"paths\":[");
    for (size_t i = 0; i < paths_.size(); ++i) {
      if (i > 0) out_.push_back(',');
      Str(paths_[i]);
    }
    out_.append("],\"frames\":{\"l\":[");
    for (size_t i = 0; i < frames_.size(); ++i) {
      if (i > 0) out_.push_back(',');
      Str(frames_[i]->label);
    }
    out_.push_back(']');
    Column("p", frames_, [this](const FrameInfo* f) { return path_index_.at(f->path); });
    out_.append(",\"ln\":[");
    for (size_t i = 0; i < frames_.size(); ++i) {
      if (i > 0) out_.push_back(',');
      AppendInt(&out_, frames_[i]->line);
    }
    out_.push_back(']');
    Column("k", frames_, [](const FrameInfo* f) { return Idx(f->kind); });
    out_.append("},\"stacks\":{");
    Column("n", stacks_, [](const std::vector<uint32_t>& st) { return st.size(); }, false);
    Column("e", stack_endpoint_, [](uint32_t e) { return e; });
    out_.append(",\"f\":[");
    bool first = true;
    for (const std::vector<uint32_t>& st : stacks_) {
      for (uint32_t f : st) {
        if (!first) out_.push_back(',');
        first = false;
        AppendUint(&out_, f);
      }
    }
    out_.append("]}");
    // The endpoints the stacks' "e" index (model/endpoint.h; [0] is "-"), with the rule that named each.
    out_.append(",\"endpoints\":[");
    const size_t n = endpoints_ ? endpoints_->size() : 1;
    for (uint32_t i = 0; i < n; ++i) {
      if (i > 0) out_.push_back(',');
      Str(endpoints_ ? std::string_view(endpoints_->endpoint(i).name) : kNoEndpoint);
    }
    out_.append("],\"endpoint_rules\":[");
    for (uint32_t i = 0; i < n; ++i) {
      if (i > 0) out_.push_back(',');
      Str(EndpointRuleName(endpoints_ ? endpoints_->endpoint(i).rule : EndpointRule::kNone));
    }
    out_.push_back(']');
  }

  const Model& model_;
  const ReportOptions& options_;
  std::string& out_;
  AttributionResult blame_;
  std::vector<uint32_t> tids_;
  std::unordered_map<uint32_t, uint64_t> tid_index_;
  std::unordered_map<std::string_view, uint64_t> source_index_;
  uint64_t samples_ = 0;
  std::vector<std::string_view> reasons_;  // views of the model's events' reasons
  std::unordered_map<std::string_view, uint64_t> reason_index_;
  std::unordered_map<uint32_t, uint32_t> stack_index_;  // trace stack id -> index in stacks_
  std::vector<std::vector<uint32_t>> stacks_;           // frame indexes (into frames_), leaf first
  std::optional<TraceEndpoints> endpoints_;             // the stacks' endpoints, derived once per stack
  std::vector<uint32_t> stack_endpoint_;                // index in stacks_ -> endpoint id
  std::unordered_map<uint32_t, uint32_t> frame_index_;  // trace frame id -> index in frames_
  std::vector<const FrameInfo*> frames_;
  std::unordered_map<std::string_view, uint64_t> path_index_;
  std::vector<std::string_view> paths_;
};

}  // namespace

void AppendScriptSafeJsonString(std::string* out, std::string_view s) {
  const size_t from = out->size();
  AppendJsonString(out, s);
  // Rare in practice: only rewrite when one of the three characters is present.
  if (out->find_first_of("<>&", from) == std::string::npos) return;
  std::string escaped;
  escaped.reserve(out->size() - from + 16);
  for (size_t i = from; i < out->size(); ++i) {
    const char c = (*out)[i];
    if (c == '<') {
      escaped.append("\\u003c");
    } else if (c == '>') {
      escaped.append("\\u003e");
    } else if (c == '&') {
      escaped.append("\\u0026");
    } else {
      escaped.push_back(c);
    }
  }
  out->resize(from);
  out->append(escaped);
}

void AppendReportData(const Model& model, const ReportOptions& options, std::string* out) {
  DataWriter(model, options, out).Write();
}

}  // namespace rvbpfd
