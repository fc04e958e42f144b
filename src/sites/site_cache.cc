// The per-binary JSON cache of FindSites results, keyed by the SHA-256 of the binary's content and of its debug file. The cache lives on the
// host and may outlive binaries, be edited or be truncated by a crash; so nothing in it is trusted: every field is
// range-checked, and anything odd means "recompute and rewrite".
#include <algorithm>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/cache_file.h"
#include "common/json_dump.h"
#include "common/json_read.h"
#include "common/sha256.h"
#include "elf/debug_lookup.h"
#include "sites/code_check.h"
#include "sites/disasm.h"
#include "sites/sites.h"

namespace rvbpfd {
namespace {

// Bump when the meaning of any field changes, so old caches are recomputed rather than misread.
// 2: exclude_caller range on function-entry sites. 3: function-level GC probes where a binary has no GC hook check.
// 4: probes moved to emulated instructions (check_vaddr); older caches hold single-stepped probe addresses.
// 5: keyed by the binary's SHA-256 (content_sha256), no longer by its build-id; provenance of each fact (binaries
// without .symtab are analysed too). 6: no code fingerprint (the SHA-256 of the whole file already names the code).
// 7: GC sites at calls of rb_gc_event_hook (3.4+ builds that do not inline its flag test). 8: STARTED and RESUMED
// sites must locate th (a 3.2 binary without DWARF is refused, no longer cached as all "current"). 9: a 3.2 binary
// without DWARF is analysed (th at STARTED/RESUMED from the code, its GC checks, thread_start_func_1/2 named).
// 10: keyed by the binary's and the debug file's SHA-256 (debug_sha256; entries of 9 could hold a result computed with
// a debug file a tenant planted, under the binary's hash alone). 11: rb_thread_main's route found behind an endbr64
// (Debian's -fcf-protection builds: entries of 10 have no main_ractor_vaddr for them, so no live layout check).
constexpr int kCacheFormat = 11;
// A cache value that is not what its field holds (thrown by Int, reported as a corrupt cache).
struct BadValue {
  std::string what;
};

// An integer field as T (see common/json_read.h); anything else is a corrupt cache.
template <typename T>
T Int(const nlohmann::json& v) {
  if (std::optional<T> i = JsonInteger<T>(v)) return *i;
  throw BadValue{std::string("a field holds ") + v.type_name() + " where an integer in range belongs"};
}

nlohmann::json LocToJson(const ThLocation& l) { return {{"kind", l.kind}, {"reg", l.reg}, {"offset", l.offset}}; }

ThLocation LocFromJson(const nlohmann::json& j) {
  return ThLocation{Int<uint8_t>(j.at("kind")), Int<uint8_t>(j.at("reg")), Int<int32_t>(j.at("offset"))};
}

}  // namespace

std::string SiteSetToJson(const SiteSet& set) {
  nlohmann::json sites = nlohmann::json::array();
  for (const ProbeSite& s : set.sites) {
    nlohmann::json j = {{"vaddr", s.vaddr},       {"file_offset", s.file_offset}, {"event", s.event},
                        {"th", LocToJson(s.th)},   {"function", s.function},       {"method", s.method},
                        {"th_source", s.th_source}, {"check_vaddr", s.check_vaddr},
                        {"single_step", s.single_step}};
    if (s.th_disasm) j["th_disasm"] = LocToJson(*s.th_disasm);
    if (s.exclude_caller_end != 0) {
      j["exclude_caller"] = {s.exclude_caller_start, s.exclude_caller_end};
    }
    sites.push_back(std::move(j));
  }
  nlohmann::json doc = {
      {"format", kCacheFormat},
      {"build_id", set.build_id},
      {"content_sha256", set.content_sha256},
      {"debug_sha256", set.debug_sha256},
      {"ruby_version", set.ruby_version},
      {"main_thread_serial", set.main_thread_serial},
      {"offsets_source", set.offsets_source},
      {"symbols_source", set.symbols_source},
      {"analysed_with_symtab", set.analysed_with_symtab},
      {"hooks_vaddr", set.hooks_vaddr},
      {"main_ractor_vaddr", set.main_ractor_vaddr},
      {"ractor_main_thread", set.ractor_main_thread},
      {"offsets",
       {{"th_serial", set.offsets.th_serial}, {"th_nt", set.offsets.th_nt}, {"nt_tid", set.offsets.nt_tid},
        {"flags", set.offsets.flags}}},
      {"sites", std::move(sites)}};
  nlohmann::json prov = nlohmann::json::array();
  for (const auto& [fact, source] : set.provenance) prov.push_back({fact, source});
  doc["provenance"] = std::move(prov);
  return DumpJson(doc, 1) + "\n";
}

Result<SiteSet> SiteSetFromJson(const std::string& text) {
  auto bad = [](const std::string& why) { return Error(ErrorCode::kIo, "site cache: " + why); };
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return bad("not a JSON object");
  try {
    if (Int<int>(doc.at("format")) != kCacheFormat) return bad("format version differs");
    SiteSet set;
    set.build_id = doc.at("build_id").get<std::string>();
    set.content_sha256 = doc.at("content_sha256").get<std::string>();
    set.debug_sha256 = doc.at("debug_sha256").get<std::string>();
    set.ruby_version = doc.at("ruby_version").get<std::string>();
    set.main_thread_serial = Int<uint32_t>(doc.at("main_thread_serial"));
    set.offsets_source = doc.at("offsets_source").get<std::string>();
    if (doc.contains("symbols_source")) set.symbols_source = doc.at("symbols_source").get<std::string>();
    set.analysed_with_symtab = doc.at("analysed_with_symtab").get<bool>();
    set.hooks_vaddr = Int<uint64_t>(doc.at("hooks_vaddr"));
    set.main_ractor_vaddr = Int<uint64_t>(doc.at("main_ractor_vaddr"));
    set.ractor_main_thread = Int<uint32_t>(doc.at("ractor_main_thread"));
    const nlohmann::json& off = doc.at("offsets");
    set.offsets = rv_offsets{Int<uint32_t>(off.at("th_serial")), Int<uint32_t>(off.at("th_nt")),
                             Int<uint32_t>(off.at("nt_tid")), Int<uint32_t>(off.at("flags"))};
    const nlohmann::json& prov = doc.at("provenance");
    if (!prov.is_array() || prov.size() > kMaxSiteProvenance) return bad("provenance is not a bounded array");
    for (const nlohmann::json& p : prov) {
      set.provenance.emplace_back(p.at(0).get<std::string>(), p.at(1).get<std::string>());
    }
    const nlohmann::json& sites = doc.at("sites");
    if (!sites.is_array() || sites.size() > RV_MAX_SITES) return bad("sites is not a bounded array");
    for (const nlohmann::json& j : sites) {
      ProbeSite s;
      s.vaddr = Int<uint64_t>(j.at("vaddr"));
      s.file_offset = Int<uint64_t>(j.at("file_offset"));
      s.event = Int<uint8_t>(j.at("event"));
      s.th = LocFromJson(j.at("th"));
      s.function = j.at("function").get<std::string>();
      s.method = j.at("method").get<std::string>();
      s.th_source = j.at("th_source").get<std::string>();
      s.check_vaddr = Int<uint64_t>(j.at("check_vaddr"));
      s.single_step = j.at("single_step").get<bool>();
      s.return_probe = s.method == "gc-function-return";
      if (j.contains("th_disasm")) s.th_disasm = LocFromJson(j.at("th_disasm"));
      if (j.contains("exclude_caller")) {
        s.exclude_caller_start = Int<uint64_t>(j.at("exclude_caller").at(0));
        s.exclude_caller_end = Int<uint64_t>(j.at("exclude_caller").at(1));
      }
      set.sites.push_back(std::move(s));
    }
    // The rules FindSites' own results meet (CheckSiteSet): a cache entry is only used if the finder could have
    // written it.
    if (Status st = CheckSiteSet(set); !st) return bad(st.error().message());
    return set;
  } catch (const nlohmann::json::exception& e) {
    return bad(e.what());
  } catch (const BadValue& e) {
    return bad(e.what);
  }
}

namespace {

// The content-hash entry of a file identity: <cache_dir>/file-<dev>-<ino>.json. Bump the format when a field changes.
constexpr int kFileHashFormat = 1;
bool IsSha256Hex(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

}  // namespace

std::string FileHashEntryPath(const std::string& cache_dir, const FileIdentity& id) {
  return cache_dir + "/file-" + std::to_string(id.dev) + "-" + std::to_string(id.ino) + ".json";
}

std::string ContentSha256Of(const ElfFile& elf, const std::string& cache_dir, int64_t settle_ns) {
  const FileIdentity& id = elf.identity();
  const bool cacheable = !cache_dir.empty() && id.ino != 0 && id.size == elf.content_size();
  const std::string path = FileHashEntryPath(cache_dir, id);
  if (cacheable) {
    if (std::optional<std::string> text = ReadCacheFile(path, 4096)) {
      const nlohmann::json doc = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
      if (doc.is_object()) {
        auto u64 = [&](const char* k) { return doc.contains(k) ? JsonInteger<uint64_t>(doc[k]) : std::nullopt; };
        auto i64 = [&](const char* k) { return doc.contains(k) ? JsonInteger<int64_t>(doc[k]) : std::nullopt; };
        const std::optional<int64_t> format = i64("format");
        const std::optional<uint64_t> dev = u64("dev"), ino = u64("ino"), size = u64("size");
        const std::optional<int64_t> mtime = i64("mtime_ns"), ctime = i64("ctime_ns");
        auto sha = doc.find("content_sha256");
        if (format == kFileHashFormat && dev && ino && size && mtime && ctime && sha != doc.end() &&
            sha->is_string() && IsSha256Hex(sha->get<std::string>()) &&
            FileIdentity{*dev, *ino, *size, *mtime, *ctime, 0} == id) {
          return sha->get<std::string>();
        }
      }
    }
  }
  // The whole content: the deferred debug sections are read now. A file that changed since it was opened has no
  // hash ("": the caller's error).
  if (!elf.LoadDeferredSections().ok()) return "";
  std::string sha = SparseContentSha256Hex(elf.content(), elf.content_written_ranges());
  if (cacheable && id.Settled(settle_ns)) {
    nlohmann::json doc = {{"format", kFileHashFormat}, {"dev", id.dev},           {"ino", id.ino},
                          {"size", id.size},           {"mtime_ns", id.mtime_ns}, {"ctime_ns", id.ctime_ns},
                          {"content_sha256", sha}};
    try {
      WriteCacheFile(cache_dir, path, DumpJson(doc, 1) + "\n");
    } catch (const std::exception&) {
      // Only allocation can throw here; the hash itself is still good.
    }
  }
  return sha;
}

Result<SiteSet> LoadOrFindSites(const std::string& elf_path, const std::string& ruby_version,
                                const std::string& cache_dir) {
  Result<ElfFile> elf = ElfFile::Open(elf_path);
  if (!elf.ok()) return elf.error();
  return LoadOrFindSites(*elf, ruby_version, cache_dir);
}

Result<SiteSet> LoadOrFindSites(ElfFile& elf, const std::string& ruby_version, const std::string& cache_dir) {
  // The debug file first: what the analysis reads is the binary and that file (symbols, DWARF), so both key it.
  DebugLookupResult lookup = AttachDebugInfo(&elf);
  // The key is what the analysis reads: the whole file (its zero blocks cost nothing: a sparse file is cheap). A
  // binary claiming another's build-id, or a modified copy keeping it, only ever finds or writes its own entry.
  const std::string content_sha256 = ContentSha256Of(elf, cache_dir);
  if (content_sha256.empty()) {
    Status st = elf.LoadDeferredSections();
    return Error(ErrorCode::kIo, "hashing " + elf.path() + ": " + (st.ok() ? "unreadable" : st.error().message()));
  }
  // A debug file a tenant planted in its own root keys its own entry: no other process of the binary (analysed with
  // another debug file, or none) is ever served what it made the analysis find.
  std::string debug_sha256 = "none";
  if (const ElfFile* debug = elf.debug_file()) {
    debug_sha256 = ContentSha256Of(*debug, cache_dir);
    if (debug_sha256.empty()) {
      Status st = debug->LoadDeferredSections();
      return Error(ErrorCode::kIo,
                   "hashing " + debug->path() + ": " + (st.ok() ? "unreadable" : st.error().message()));
    }
  }
  SiteSet keyed;
  keyed.content_sha256 = content_sha256;
  keyed.debug_sha256 = debug_sha256;
  const bool cacheable = !cache_dir.empty();
  const std::string cache_path = cache_dir + "/" + keyed.AnalysisKey() + ".json";
  if (cacheable) {
    // RV_MAX_SITES sites of a few hundred bytes each; anything larger is not ours.
    constexpr uint64_t kMaxCacheBytes = 16u << 20;
    if (std::optional<std::string> text = ReadCacheFile(cache_path, kMaxCacheBytes)) {
      Result<SiteSet> cached = SiteSetFromJson(*text);
      if (cached.ok() && cached->content_sha256 == content_sha256 && cached->debug_sha256 == debug_sha256 &&
          cached->build_id == elf.build_id() && cached->ruby_version == ruby_version) {
        bool in_file = true;
        for (const ProbeSite& s : cached->sites) {
          std::optional<uint64_t> off = elf.VaddrToFileOffset(s.vaddr);
          in_file &= off.has_value() && *off == s.file_offset;
        }
        // Nothing in the cache places a probe the code does not allow (an edited entry is recomputed).
        Result<Disassembler> dis = Disassembler::Create();
        if (in_file && dis.ok() && CheckSitesAgainstCode(elf, *dis, cached->sites).ok()) return cached;
      }
    }
  }
  // Not cached: the analysis uses .symtab/DWARF when the binary or its debug file by build-id has them.
  Result<SiteSet> found = FindSites(elf, ruby_version);
  if (!found.ok() && found.error().code() == ErrorCode::kNoSymbols && !lookup.tried.empty()) {
    return Error(ErrorCode::kNoSymbols, found.error().message() + " (debug info by build-id: " + lookup.Summary() +
                                            "; see --debug-dir, DEBUGINFOD_URLS)");
  }
  if (!found.ok()) return found;
  found->content_sha256 = content_sha256;
  found->debug_sha256 = debug_sha256;
  if (!cacheable) return found;
  // Best effort: a cache we cannot write only costs the next run the analysis time.
  try {
    WriteCacheFile(cache_dir, cache_path, SiteSetToJson(*found));
  } catch (const std::exception&) {
    // Only allocation can throw here; the sites themselves are still good.
  }
  return found;
}

}  // namespace rvbpfd
