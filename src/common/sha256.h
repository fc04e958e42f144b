// SHA-256 (FIPS 180-4), for keys an attacker must not be able to collide: the site cache is keyed by the hash of the
// binary it was computed from, so a binary claiming another's build-id cannot hand its sites to the real one.
#ifndef RVBPFD_SRC_COMMON_SHA256_H_
#define RVBPFD_SRC_COMMON_SHA256_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

namespace rvbpfd {

class Sha256 {
 public:
  // The block function: kAuto uses the CPU's SHA extensions (SHA-NI) when it has them, about 8x faster than portable
  // C++ (the site cache hashes every VM binary it sees: 46 MB for a static ruby); kPortable forces plain C++ (tests
  // compare the two).
  enum class Impl { kAuto, kPortable };
  explicit Sha256(Impl impl = Impl::kAuto);
  void Update(std::span<const uint8_t> data);
  // The digest; the object must not be updated afterwards.
  std::array<uint8_t, 32> Finish();
  // Whether this CPU has the SHA extensions (and the SSSE3/SSE4.1 the routine also uses).
  static bool CpuHasShaExtensions();

 private:
  // `n` consecutive 64-byte blocks at p.
  void Blocks(const uint8_t* p, size_t n);
  void Block(const uint8_t* p);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_{};
  size_t buf_len_ = 0;
  uint64_t total_ = 0;  // bytes hashed
  bool use_ni_ = false;
};

// Lower-case hex digest of `data`.
std::string Sha256Hex(std::span<const uint8_t> data);

// Lower-case hex SHA-256 of an encoding of `data` that leaves out its all-zero 4 KiB blocks: the size, then each
// non-zero block's index and bytes. The encoding is injective (the size and the non-zero blocks determine the content),
// so this identifies content as strongly as Sha256Hex, but a sparse 1 GiB file costs the hash of its data only.
std::string SparseContentSha256Hex(std::span<const uint8_t> data);
// The same hash when every byte of `data` outside the byte ranges `written` ([begin, end), sorted, disjoint) is zero:
// blocks no range overlaps are taken as zero and never read. For a MappedFile (MappedFile::written_ranges), whose
// holes are untouched anonymous memory: some kernels give such a page real memory when it is read, so reading the
// holes of a sparse 1 GiB file would cost 1 GiB of RSS.
std::string SparseContentSha256Hex(std::span<const uint8_t> data,
                                   std::span<const std::pair<uint64_t, uint64_t>> written);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_COMMON_SHA256_H_
