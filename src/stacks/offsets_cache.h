// The stack layout of a VM binary (OffsetsForBinary) cached per binary content, beside the probe-site cache.
//
// Reading the layout from DWARF opens the binary's debug sections, which libdw inflates whole when they are
// compressed (as Debian and most distributions build them): ~200 ms for a 3.3 libruby, paid by every run before its
// first event. Only a layout DWARF gave is cached (the version table alone costs nothing), under
// `<cache_dir>/<key>.stacks.json`, keyed like the sites (SiteSet::AnalysisKey) by the SHA-256 of the binary's whole
// content and of the debug file whose DWARF was read (a debug file a tenant planted keys its own entry), and it is
// looked up only while the binary (or its debug file by build-id) has DWARF, so a hit gives what recomputing would.
// Nothing in the file is trusted: a format, a key or a version that differs, a missing field, or an offset out of
// range means "recompute and rewrite".
//
// Threading: callable from any thread; concurrent writers of one entry each rename a complete file into place.
#ifndef RVBPFD_SRC_STACKS_OFFSETS_CACHE_H_
#define RVBPFD_SRC_STACKS_OFFSETS_CACHE_H_

#include <string>

#include "common/error.h"
#include "elf/elf_file.h"
#include "stacks/ruby_offsets.h"

namespace rvbpfd {

// OffsetsForBinary(elf, major, minor), from the cache when it holds the entry of `content_sha256` (the analysis key:
// SiteSet::AnalysisKey of the binary with the debug file attached to `elf`), else computed and, when DWARF gave any
// field, written there. cache_dir "" or content_sha256 "": no cache.
Result<RubyOffsets> CachedOffsetsForBinary(const ElfFile& elf, int major, int minor, const std::string& content_sha256,
                                           const std::string& cache_dir);

// The entry's text and its reader (exposed for tests). The reader checks the format, the key and the version, and
// that every field is present and in range (an offset below kMaxCachedOffset, or RV_GVL_NO_FIELD in the GVL reading).
inline constexpr uint32_t kMaxCachedOffset = 1u << 16;  // bytes; CRuby's structs are a few hundred
std::string OffsetsCacheEntry(const RubyOffsets& offsets, const std::string& content_sha256);
Result<RubyOffsets> ParseOffsetsCacheEntry(const std::string& text, const std::string& content_sha256, int major,
                                           int minor);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_STACKS_OFFSETS_CACHE_H_
