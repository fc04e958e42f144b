// A small protobuf wire-format decoder and a synthetic-trace builder for the pprof/folded export tests. The decoder
// is written independently of src/export/pprof.cc (it reads the wire format, it does not share the encoder).
#ifndef RVBPFD_TESTS_EXPORT_PPROF_TEST_UTIL_H_
#define RVBPFD_TESTS_EXPORT_PPROF_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "trace/reader.h"
#include "trace/writer.h"

namespace rvbpfd::testing {

// One decoded field: varint value (wire type 0) or bytes (wire type 2). Other wire types fail the decode.
struct WireField {
  uint32_t number = 0;
  uint32_t wire_type = 0;
  uint64_t varint = 0;
  std::string bytes;
};

// Returns nullopt on malformed input (truncated varint or length, unsupported wire type).
inline std::optional<std::vector<WireField>> DecodeMessage(std::string_view data) {
  std::vector<WireField> out;
  size_t pos = 0;
  auto read_varint = [&](uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos >= data.size()) return false;
      const auto byte = static_cast<uint8_t>(data[pos++]);
      *v |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  };
  while (pos < data.size()) {
    uint64_t key = 0;
    if (!read_varint(&key)) return std::nullopt;
    WireField f;
    f.number = static_cast<uint32_t>(key >> 3);
    f.wire_type = static_cast<uint32_t>(key & 7);
    if (f.number == 0) return std::nullopt;
    if (f.wire_type == 0) {
      if (!read_varint(&f.varint)) return std::nullopt;
    } else if (f.wire_type == 2) {
      uint64_t len = 0;
      if (!read_varint(&len) || len > data.size() - pos) return std::nullopt;
      f.bytes = std::string(data.substr(pos, len));
      pos += len;
    } else {
      return std::nullopt;
    }
    out.push_back(std::move(f));
  }
  return out;
}

// Repeated varints, accepting both packed (one length-delimited field) and unpacked encodings.
inline std::vector<uint64_t> RepeatedVarints(const std::vector<WireField>& fields, uint32_t number) {
  std::vector<uint64_t> out;
  for (const WireField& f : fields) {
    if (f.number != number) continue;
    if (f.wire_type == 0) {
      out.push_back(f.varint);
      continue;
    }
    size_t pos = 0;
    while (pos < f.bytes.size()) {
      uint64_t v = 0;
      int shift = 0;
      while (pos < f.bytes.size()) {
        const auto byte = static_cast<uint8_t>(f.bytes[pos++]);
        v |= static_cast<uint64_t>(byte & 0x7f) << shift;
        shift += 7;
        if ((byte & 0x80) == 0) break;
      }
      out.push_back(v);
    }
  }
  return out;
}

inline uint64_t Varint(const std::vector<WireField>& fields, uint32_t number) {
  for (const WireField& f : fields) {
    if (f.number == number && f.wire_type == 0) return f.varint;
  }
  return 0;  // proto3: absent means zero
}

inline std::vector<std::string> Submessages(const std::vector<WireField>& fields, uint32_t number) {
  std::vector<std::string> out;
  for (const WireField& f : fields) {
    if (f.number == number && f.wire_type == 2) out.push_back(f.bytes);
  }
  return out;
}

// The decoded profile, with names resolved through the string table.
struct DecodedSample {
  std::vector<std::string> frames;  // function names, leaf first
  std::vector<int64_t> values;
  std::map<std::string, std::string> str_labels;
  std::map<std::string, int64_t> num_labels;
};
struct DecodedProfile {
  std::vector<std::string> strings;
  std::vector<std::pair<std::string, std::string>> sample_types;
  std::vector<DecodedSample> samples;
  std::pair<std::string, std::string> period_type;
  int64_t period = 0;
  int64_t time_nanos = 0;
  int64_t duration_nanos = 0;
  std::string default_sample_type;
  std::vector<std::string> comments;
  std::map<uint64_t, std::pair<std::string, std::string>> functions;  // id -> (name, filename)
  std::map<uint64_t, std::pair<uint64_t, int64_t>> locations;         // id -> (function id, line)
  std::vector<std::string> errors;                                    // structural problems found while decoding
};

inline DecodedProfile DecodeProfile(std::string_view data) {
  DecodedProfile p;
  auto top = DecodeMessage(data);
  if (!top) {
    p.errors.push_back("profile does not decode");
    return p;
  }
  for (const std::string& s : Submessages(*top, 6)) p.strings.push_back(s);
  if (p.strings.empty() || !p.strings[0].empty()) p.errors.push_back("string_table[0] must be \"\"");
  auto str = [&](uint64_t i) -> std::string {
    if (i >= p.strings.size()) {
      p.errors.push_back("string index " + std::to_string(i) + " out of range");
      return "";
    }
    return p.strings[i];
  };
  auto decode = [&](const std::string& bytes) {
    auto m = DecodeMessage(bytes);
    if (!m) p.errors.push_back("submessage does not decode");
    return m.value_or(std::vector<WireField>{});
  };
  for (const std::string& vt : Submessages(*top, 1)) {
    auto m = decode(vt);
    p.sample_types.emplace_back(str(Varint(m, 1)), str(Varint(m, 2)));
  }
  for (const std::string& fn : Submessages(*top, 5)) {
    auto m = decode(fn);
    const uint64_t id = Varint(m, 1);
    if (id == 0) p.errors.push_back("function id 0");
    if (!p.functions.emplace(id, std::make_pair(str(Varint(m, 2)), str(Varint(m, 4)))).second) {
      p.errors.push_back("duplicate function id");
    }
  }
  std::map<uint64_t, bool> mappings;
  for (const std::string& mp : Submessages(*top, 3)) mappings[Varint(decode(mp), 1)] = true;
  for (const std::string& loc : Submessages(*top, 4)) {
    auto m = decode(loc);
    const uint64_t id = Varint(m, 1);
    if (id == 0) p.errors.push_back("location id 0");
    const uint64_t mapping = Varint(m, 2);
    if (mapping != 0 && !mappings.contains(mapping)) p.errors.push_back("location names an undefined mapping");
    auto lines = Submessages(m, 4);
    if (lines.size() != 1) p.errors.push_back("location without exactly one line");
    auto line = lines.empty() ? std::vector<WireField>{} : decode(lines[0]);
    const uint64_t fn = Varint(line, 1);
    if (!p.functions.contains(fn)) p.errors.push_back("line names an undefined function");
    p.locations[id] = {fn, static_cast<int64_t>(Varint(line, 2))};
  }
  for (const std::string& s : Submessages(*top, 2)) {
    auto m = decode(s);
    DecodedSample ds;
    for (uint64_t loc : RepeatedVarints(m, 1)) {
      auto it = p.locations.find(loc);
      if (it == p.locations.end()) {
        p.errors.push_back("sample names an undefined location");
        continue;
      }
      ds.frames.push_back(p.functions[it->second.first].first);
    }
    for (uint64_t v : RepeatedVarints(m, 2)) ds.values.push_back(static_cast<int64_t>(v));
    if (ds.values.size() != Submessages(*top, 1).size()) p.errors.push_back("sample value count != sample types");
    for (const std::string& l : Submessages(m, 3)) {
      auto lm = decode(l);
      const std::string key = str(Varint(lm, 1));
      bool has_num = false;
      for (const WireField& f : lm) has_num |= f.number == 3;
      if (has_num) {
        ds.num_labels[key] = static_cast<int64_t>(Varint(lm, 3));
      } else {
        ds.str_labels[key] = str(Varint(lm, 2));
      }
    }
    p.samples.push_back(std::move(ds));
  }
  auto pt = decode(Submessages(*top, 11).empty() ? std::string() : Submessages(*top, 11)[0]);
  p.period_type = {str(Varint(pt, 1)), str(Varint(pt, 2))};
  p.period = static_cast<int64_t>(Varint(*top, 12));
  p.time_nanos = static_cast<int64_t>(Varint(*top, 9));
  p.duration_nanos = static_cast<int64_t>(Varint(*top, 10));
  p.default_sample_type = str(Varint(*top, 14));
  for (uint64_t c : RepeatedVarints(*top, 13)) p.comments.push_back(str(c));
  return p;
}

inline std::string Gunzip(std::string_view gz) {
  z_stream zs{};
  if (inflateInit2(&zs, 15 + 16) != Z_OK) return "";
  std::string out;
  char buf[65536];
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(gz.data()));
  zs.avail_in = static_cast<uInt>(gz.size());
  int rc = Z_OK;
  while (rc == Z_OK) {
    zs.next_out = reinterpret_cast<Bytef*>(buf);
    zs.avail_out = sizeof(buf);
    rc = inflate(&zs, Z_NO_FLUSH);
    out.append(buf, sizeof(buf) - zs.avail_out);
  }
  inflateEnd(&zs);
  return rc == Z_STREAM_END ? out : "";
}

// Builds a trace through the real writer and reads it back through the real reader, so the exporters are tested
// on exactly what rvbpfd writes.
class SyntheticTrace {
 public:
  explicit SyntheticTrace(std::optional<uint32_t> sample_hz) {
    char tmpl[] = "/tmp/rvpprof-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
    path_ = dir_ + "/t.rvtrace";
    TraceHeader h;
    h.pid = 777;
    h.ruby_version = "3.4.5";
    h.started_at = "2025-01-31T12:00:00.250000Z";
    h.main_thread = 1;
    h.sample_hz = sample_hz;
    auto w = TraceWriter::Create(path_, h);
    EXPECT_TRUE(w.ok());
    writer_.emplace(std::move(*w));
  }
  ~SyntheticTrace() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  SyntheticTrace(const SyntheticTrace&) = delete;
  SyntheticTrace& operator=(const SyntheticTrace&) = delete;

  // Interns a stack given root first (as one reads it) and returns its id.
  uint32_t Stack(std::vector<std::string> root_first) {
    std::vector<uint32_t> ids;
    for (auto it = root_first.rbegin(); it != root_first.rend(); ++it) {
      const int32_t line = static_cast<int32_t>(10 + it->size());
      ids.push_back(writer_->InternFrame(FrameInfo{*it, "/app/" + *it + ".rb", line, FrameKind::kRuby}));
    }
    return writer_->InternStack(ids);
  }
  // Interns a stack of the given frames, root first.
  uint32_t StackOf(std::vector<FrameInfo> root_first) {
    std::vector<uint32_t> ids;
    for (auto it = root_first.rbegin(); it != root_first.rend(); ++it) ids.push_back(writer_->InternFrame(*it));
    return writer_->InternStack(ids);
  }
  // A gvl_released of `thread` carrying the recorder's derived `reason` (a trace name: "io", "idle", ...).
  void Released(uint64_t t_ns, uint32_t thread, uint32_t stack, std::string_view reason) {
    TraceEvent e = MakeEvent(t_ns, EventName::kGvlReleased, thread, stack);
    e.reason = std::string(reason);
    e.reason_provenance = Provenance::kDerived;
    EXPECT_TRUE(writer_->Write(e).ok());
  }
  void Event(uint64_t t_ns, EventName name, std::optional<uint32_t> thread, std::optional<uint32_t> stack = {}) {
    EXPECT_TRUE(writer_->Write(MakeEvent(t_ns, name, thread, stack)).ok());
  }
  static TraceEvent MakeEvent(uint64_t t_ns, EventName name, std::optional<uint32_t> thread,
                              std::optional<uint32_t> stack) {
    TraceEvent e;
    e.t_ns = t_ns;
    e.event = name;
    e.ruby_thread = thread;
    e.stack = stack;
    e.count = name == EventName::kEventsDropped ? 3 : 0;
    e.source = name == EventName::kSample ? kSourcePerfEvent : kSourceThreadHookSite;
    return e;
  }
  // A sample of `thread` on `stack` that read the GVL: held by `holder` (nullopt: nobody), `queued` waiting.
  void Reading(uint64_t t_ns, uint32_t thread, uint32_t stack, std::optional<uint32_t> holder,
               std::vector<uint32_t> queued) {
    TraceEvent e;
    e.t_ns = t_ns;
    e.event = EventName::kSample;
    e.ruby_thread = thread;
    e.stack = stack;
    e.source = kSourcePerfEvent;
    e.gvl = std::make_shared<GvlReading>();
    e.gvl->held = holder.has_value();
    e.gvl->holder = holder;
    e.gvl->waiting = static_cast<uint32_t>(queued.size());
    e.gvl->queued = std::move(queued);
    EXPECT_TRUE(writer_->Write(e).ok());
  }
  // Interns the stack of a sample taken in GC: the recorder's GC pseudo-frame on top of `root_first`.
  uint32_t GcStack(std::vector<std::string> root_first) {
    std::vector<uint32_t> ids{writer_->InternFrame(FrameInfo{"(garbage collection)", "", 0, FrameKind::kGc})};
    for (auto it = root_first.rbegin(); it != root_first.rend(); ++it) {
      ids.push_back(writer_->InternFrame(FrameInfo{*it, "/app/" + *it + ".rb", static_cast<int32_t>(10 + it->size()),
                                                  FrameKind::kRuby}));
    }
    return writer_->InternStack(ids);
  }
  TraceFile Finish(uint64_t end_ns) {
    EXPECT_TRUE(writer_->Finish(FinishInfo{.end_t_ns = end_ns}).ok());
    auto file = TraceReader::ReadFile(path_);
    EXPECT_TRUE(file.ok()) << (file.ok() ? "" : file.error().message());
    return file.ok() ? std::move(*file) : TraceFile{};
  }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::string path_;
  std::optional<TraceWriter> writer_;
};

}  // namespace rvbpfd::testing

#endif  // RVBPFD_TESTS_EXPORT_PPROF_TEST_UTIL_H_
