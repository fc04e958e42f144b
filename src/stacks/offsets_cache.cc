#include "stacks/offsets_cache.h"

#include <optional>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "common/cache_file.h"
#include "common/json_dump.h"
#include "common/json_read.h"

namespace rvbpfd {
namespace {

// Bump when the meaning of a field changes, so old entries are recomputed rather than misread.
// 2: keyed by the binary's and its debug file's content hashes (SiteSet::AnalysisKey); entries of 1 were keyed by
// the binary alone, whatever debug file gave the DWARF.
// 3: thread_name (rb_thread_t.name) added.
constexpr int kOffsetsCacheFormat = 3;
// An entry holds ~60 small numbers (~2 KiB); anything much larger is not ours.
constexpr uint64_t kMaxEntryBytes = 64u << 10;

// Calls f(name, field) for every field of RubyOffsets but major/minor (the entry's key), const or not: the one list
// the writer and the reader share. A field added to RubyOffsets changes its size and stops the build here until it
// is listed (and the format bumped).
static_assert(sizeof(RubyOffsets) == 280, "RubyOffsets changed: list the new field in ForEachField, bump the format");
template <typename Offsets, typename F>
void ForEachField(Offsets& o, F&& f) {
  f("walk.ec_vm_stack", o.walk.ec_vm_stack);
  f("walk.ec_vm_stack_size", o.walk.ec_vm_stack_size);
  f("walk.ec_cfp", o.walk.ec_cfp);
  f("walk.cfp_pc", o.walk.cfp_pc);
  f("walk.cfp_iseq", o.walk.cfp_iseq);
  f("walk.cfp_ep", o.walk.cfp_ep);
  f("walk.cfp_jit_return", o.walk.cfp_jit_return);
  f("walk.cfp_size", o.walk.cfp_size);
  f("walk.cme_def", o.walk.cme_def);
  f("walk.svar_cref_or_me", o.walk.svar_cref_or_me);
  f("walk.flags", o.walk.flags);
  f("walk.reserved", o.walk.reserved);
  f("thread_ec", o.thread_ec);
  f("thread_name", o.thread_name);
  f("ec_thread_ptr", o.ec_thread_ptr);
  f("vm_main_ractor", o.vm_main_ractor);
  f("ractor_running_ec", o.ractor_running_ec);
  f("gvl.base", o.gvl.base);
  f("gvl.th_ractor", o.gvl.th_ractor);
  f("gvl.holder", o.gvl.holder);
  f("gvl.queue", o.gvl.queue);
  f("gvl.queue_count", o.gvl.queue_count);
  f("gvl.th_queue_node", o.gvl.th_queue_node);
  f("iseq_body", o.iseq_body);
  f("body_type", o.body_type);
  f("body_iseq_size", o.body_iseq_size);
  f("body_iseq_encoded", o.body_iseq_encoded);
  f("body_location", o.body_location);
  f("loc_pathobj", o.loc_pathobj);
  f("loc_base_label", o.loc_base_label);
  f("loc_label", o.loc_label);
  f("loc_first_lineno", o.loc_first_lineno);
  f("loc_first_lineno_is_fixnum", o.loc_first_lineno_is_fixnum);
  f("body_insns_info_body", o.body_insns_info_body);
  f("body_insns_info_size", o.body_insns_info_size);
  f("body_succ_index_table", o.body_succ_index_table);
  f("body_local_iseq", o.body_local_iseq);
  f("cme_defined_class", o.cme_defined_class);
  f("cme_def", o.cme_def);
  f("def_iseqptr", o.def_iseqptr);
  f("def_original_id", o.def_original_id);
  f("klass_super", o.klass_super);
  f("klass_attached_object", o.klass_attached_object);
  f("klass_classpath", o.klass_classpath);
  f("fl_singleton", o.fl_singleton);
  f("singleton_requires_t_class", o.singleton_requires_t_class);
  f("klass_ext_ptr", o.klass_ext_ptr);
  f("classext_iv_tbl", o.classext_iv_tbl);
  f("klass_ext_inline", o.klass_ext_inline);
  f("classext_iv_ptr", o.classext_iv_ptr);
  f("vm_shape_list", o.vm_shape_list);
  f("vm_next_shape_id", o.vm_next_shape_id);
  f("shape_size", o.shape_size);
  f("shape_edge_name", o.shape_edge_name);
  f("shape_next_iv_index", o.shape_next_iv_index);
  f("shape_type", o.shape_type);
  f("shape_parent_id", o.shape_parent_id);
  f("string_embed_bytes", o.string_embed_bytes);
  f("string_embed_len_mask", o.string_embed_len_mask);
  f("array_embed_len_mask", o.array_embed_len_mask);
  f("symbols_last_id", o.symbols_last_id);
  f("symbols_ids", o.symbols_ids);
  f("last_op_id", o.last_op_id);
}

// Fields that are bit masks, flags or an ID bound rather than a byte offset: any value of their type is valid.
bool IsUnboundedField(std::string_view name) {
  return name == "walk.flags" || name == "walk.reserved" || name == "gvl.base" || name == "fl_singleton" ||
         name == "string_embed_len_mask" || name == "array_embed_len_mask" || name == "last_op_id";
}

}  // namespace

std::string OffsetsCacheEntry(const RubyOffsets& offsets, const std::string& content_sha256) {
  nlohmann::json fields = nlohmann::json::object();
  ForEachField(offsets, [&](const char* name, const auto& v) { fields[name] = v; });
  nlohmann::json doc = {{"format", kOffsetsCacheFormat},
                        {"content_sha256", content_sha256},
                        {"major", offsets.major},
                        {"minor", offsets.minor},
                        {"offsets", std::move(fields)}};
  return DumpJson(doc, 1) + "\n";
}

Result<RubyOffsets> ParseOffsetsCacheEntry(const std::string& text, const std::string& content_sha256, int major,
                                           int minor) {
  auto bad = [](const std::string& why) { return Error(ErrorCode::kIo, "stack layout cache: " + why); };
  const nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return bad("not a JSON object");
  auto int_at = [&](const char* key) -> std::optional<int64_t> {
    auto it = doc.find(key);
    return it == doc.end() ? std::nullopt : JsonInteger<int64_t>(*it);
  };
  if (int_at("format") != kOffsetsCacheFormat) return bad("format version differs");
  auto sha = doc.find("content_sha256");
  if (sha == doc.end() || !sha->is_string() || sha->get<std::string>() != content_sha256) {
    return bad("entry of other content");
  }
  if (int_at("major") != major || int_at("minor") != minor) return bad("entry of another Ruby version");
  auto fields = doc.find("offsets");
  if (fields == doc.end() || !fields->is_object()) return bad("no offsets object");
  RubyOffsets o;
  o.major = major;
  o.minor = minor;
  std::string missing;
  ForEachField(o, [&](const char* name, auto& v) {
    using T = std::remove_reference_t<decltype(v)>;
    auto it = fields->find(name);
    if (!missing.empty()) return;
    if (it == fields->end()) {
      missing = name;
      return;
    }
    if constexpr (std::is_same_v<T, bool>) {
      if (!it->is_boolean()) {
        missing = name;
        return;
      }
      v = it->template get<bool>();
    } else {
      std::optional<T> n = JsonInteger<T>(*it);
      const bool in_range = n && (IsUnboundedField(name) || *n < kMaxCachedOffset ||
                                  ((std::string_view(name).starts_with("gvl.") || std::string_view(name) == "thread_name") &&
                                   *n == RV_GVL_NO_FIELD));
      if (!in_range) {
        missing = name;
        return;
      }
      v = *n;
    }
  });
  if (!missing.empty()) return bad("field " + missing + " is missing or out of range");
  return o;
}

Result<RubyOffsets> CachedOffsetsForBinary(const ElfFile& elf, int major, int minor, const std::string& content_sha256,
                                           const std::string& cache_dir) {
  // Without DWARF the table is the answer and costs nothing; with it, a cached entry is what DWARF would say.
  const bool has_dwarf = elf.dwarf_file().FindSection(".debug_info").has_value();
  const bool cacheable = has_dwarf && !cache_dir.empty() && !content_sha256.empty();
  const std::string path = cache_dir + "/" + content_sha256 + ".stacks.json";
  if (cacheable) {
    if (std::optional<std::string> text = ReadCacheFile(path, kMaxEntryBytes)) {
      if (Result<RubyOffsets> cached = ParseOffsetsCacheEntry(*text, content_sha256, major, minor)) return cached;
    }
  }
  OffsetsReport report;
  Result<RubyOffsets> computed = OffsetsForBinary(elf, major, minor, &report);
  if (computed && cacheable && report.from_dwarf > 0) {
    try {
      WriteCacheFile(cache_dir, path, OffsetsCacheEntry(*computed, content_sha256));
    } catch (const std::exception&) {
      // Only allocation can throw here; the layout itself is still good.
    }
  }
  return computed;
}

}  // namespace rvbpfd
