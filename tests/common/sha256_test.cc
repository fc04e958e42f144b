// SHA-256 against the FIPS 180-4 example vectors and split updates.
#include "common/sha256.h"

#include <algorithm>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace rvbpfd {
namespace {

std::string Hex(const std::string& s) {
  return Sha256Hex({reinterpret_cast<const uint8_t*>(s.data()), s.size()});
}

TEST(Sha256Test, KnownVectors) {
  EXPECT_EQ(Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Hex(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256Test, SplitUpdatesEqualOneUpdate) {
  std::string text;
  for (int i = 0; i < 1000; ++i) text += static_cast<char>(i * 7);
  for (size_t cut : {size_t{1}, size_t{55}, size_t{56}, size_t{63}, size_t{64}, size_t{65}, size_t{999}}) {
    Sha256 h;
    h.Update({reinterpret_cast<const uint8_t*>(text.data()), cut});
    h.Update({reinterpret_cast<const uint8_t*>(text.data()) + cut, text.size() - cut});
    std::string hex;
    for (uint8_t b : h.Finish()) {
      static constexpr char kHex[] = "0123456789abcdef";
      hex += kHex[b >> 4];
      hex += kHex[b & 0xf];
    }
    EXPECT_EQ(hex, Hex(text)) << cut;
  }
}

std::string Digest(Sha256::Impl impl, const std::vector<uint8_t>& data, size_t cut) {
  Sha256 h(impl);
  h.Update({data.data(), cut});
  h.Update({data.data() + cut, data.size() - cut});
  std::string hex;
  for (uint8_t b : h.Finish()) {
    static constexpr char kHex[] = "0123456789abcdef";
    hex += kHex[b >> 4];
    hex += kHex[b & 0xf];
  }
  return hex;
}

// The SHA-NI routine (used where the CPU has it, as here) against the portable one: the FIPS vectors on the portable
// path, then random lengths (0 - 5000 bytes, so 0 - 78 blocks per call and every tail length) split at random.
TEST(Sha256Test, ShaExtensionsEqualPortableCode) {
  std::printf("CPU SHA extensions: %s\n", Sha256::CpuHasShaExtensions() ? "yes (both paths compared)"
                                                                         : "no (the portable path runs twice)");
  const std::string abc = "abc";
  EXPECT_EQ(Digest(Sha256::Impl::kPortable, std::vector<uint8_t>(abc.begin(), abc.end()), 1),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Digest(Sha256::Impl::kPortable, std::vector<uint8_t>(1000000, 'a'), 4099),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  std::mt19937_64 rng(20261202);
  for (int i = 0; i < 300; ++i) {
    std::vector<uint8_t> data(rng() % 5001);
    for (uint8_t& b : data) b = static_cast<uint8_t>(rng());
    const size_t cut = data.empty() ? 0 : rng() % (data.size() + 1);
    ASSERT_EQ(Digest(Sha256::Impl::kAuto, data, cut), Digest(Sha256::Impl::kPortable, data, cut))
        << data.size() << " bytes, cut at " << cut;
  }
}

TEST(SparseContentSha256Test, ZeroBlocksCountButOtherContentDiffers) {
  std::vector<uint8_t> a(3 * 4096 + 100, 0);
  a[5000] = 1;
  std::vector<uint8_t> b = a;
  const std::string ha = SparseContentSha256Hex(a);
  EXPECT_EQ(SparseContentSha256Hex(b), ha);
  b[5000] = 2;  // other bytes in the same block
  EXPECT_NE(SparseContentSha256Hex(b), ha);
  b = a;
  b[5000] = 0;
  b[9000] = 1;  // the same byte in another block
  EXPECT_NE(SparseContentSha256Hex(b), ha);
  b = a;
  b.push_back(0);  // one more zero byte: another size
  EXPECT_NE(SparseContentSha256Hex(b), ha);
  EXPECT_NE(SparseContentSha256Hex({}), SparseContentSha256Hex(std::vector<uint8_t>(4096, 0)));
}

// With the ranges of a MappedFile: bytes outside them are never read (a page there could cost memory), so garbage
// put there must not change the hash, and the hash equals the one of the content with those bytes zero.
TEST(SparseContentSha256Test, BlocksOutsideTheWrittenRangesAreNotRead) {
  std::vector<uint8_t> data(10 * 4096 + 123, 0);
  data[100] = 1;             // block 0
  data[4096 * 3 + 7] = 2;    // block 3
  data[4096 * 4 - 1] = 3;    // block 3, its last byte
  data[4096 * 10 + 5] = 4;   // the partial last block
  const std::string whole = SparseContentSha256Hex(data);
  // Ranges as a MappedFile has them, one not page-aligned and two sharing block 3.
  const std::vector<std::pair<uint64_t, uint64_t>> written = {
      {0, 200}, {4096 * 3, 4096 * 3 + 100}, {4096 * 3 + 100, 4096 * 4}, {4096 * 10, data.size()}};
  std::vector<uint8_t> garbage = data;
  for (size_t b : {1, 2, 5, 6, 7, 8, 9}) std::fill_n(garbage.begin() + b * 4096, 4096, 0xAB);
  EXPECT_EQ(SparseContentSha256Hex(garbage, written), whole);
  // A written block's content still counts, also where a range only touches the block.
  garbage[4096 * 3 + 2000] = 9;
  EXPECT_NE(SparseContentSha256Hex(garbage, written), whole);
  // Nothing written: the hash of all zeros of that size.
  EXPECT_EQ(SparseContentSha256Hex(garbage, {}), SparseContentSha256Hex(std::vector<uint8_t>(data.size(), 0)));
  // A range past the end is clipped.
  const std::vector<std::pair<uint64_t, uint64_t>> past = {{0, data.size() + 99999}};
  EXPECT_EQ(SparseContentSha256Hex(data, past), whole);
}

}  // namespace
}  // namespace rvbpfd
