#include "common/sha256.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>

namespace rvbpfd {
namespace {

// The first 32 bits of the fractional parts of the cube roots of the first 64 primes (FIPS 180-4, 4.2.2).
constexpr uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

constexpr uint32_t Rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

// The compression function on `n` blocks with the x86 SHA extensions. The state is kept as the two registers
// sha256rnds2 works on, ABEF and CDGH; each step of the loop does four rounds: the message words W[4g..4g+3] (loaded
// byte-swapped for g < 4, else from the schedule W[t] = s1(W[t-2]) + W[t-7] + s0(W[t-15]) + W[t-16] built by
// sha256msg1 (the s0 term), an alignr (W[t-7]) and sha256msg2 (the s1 term)), plus K, two rounds per sha256rnds2.
__attribute__((target("sha,sse4.1,ssse3"))) void BlocksNi(uint32_t state[8], const uint8_t* p, size_t n) {
  const __m128i kByteSwap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
  __m128i tmp = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&state[0]));    // DCBA
  __m128i state1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&state[4]));  // HGFE
  tmp = _mm_shuffle_epi32(tmp, 0xB1);                 // CDAB
  state1 = _mm_shuffle_epi32(state1, 0x1B);           // EFGH
  __m128i state0 = _mm_alignr_epi8(tmp, state1, 8);   // ABEF
  state1 = _mm_blend_epi16(state1, tmp, 0xF0);        // CDGH
  for (; n > 0; --n, p += 64) {
    const __m128i abef = state0, cdgh = state1;
    __m128i w[4];
    for (int g = 0; g < 16; ++g) {
      __m128i& cur = w[g % 4];
      if (g < 4) {
        cur = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * g)), kByteSwap);
      } else {
        const __m128i w1 = w[(g + 3) % 4], w2 = w[(g + 2) % 4], w3 = w[(g + 1) % 4];  // W[g-1], W[g-2], W[g-3]
        __m128i x = _mm_sha256msg1_epu32(cur, w3);                                 // cur is still W[g-4]
        x = _mm_add_epi32(x, _mm_alignr_epi8(w1, w2, 4));
        cur = _mm_sha256msg2_epu32(x, w1);
      }
      __m128i msg = _mm_add_epi32(cur, _mm_loadu_si128(reinterpret_cast<const __m128i*>(&kRound[4 * g])));
      state1 = _mm_sha256rnds2_epu32(state1, state0, msg);
      msg = _mm_shuffle_epi32(msg, 0x0E);
      state0 = _mm_sha256rnds2_epu32(state0, state1, msg);
    }
    state0 = _mm_add_epi32(state0, abef);
    state1 = _mm_add_epi32(state1, cdgh);
  }
  tmp = _mm_shuffle_epi32(state0, 0x1B);              // FEBA
  state1 = _mm_shuffle_epi32(state1, 0xB1);           // DCHG
  state0 = _mm_blend_epi16(tmp, state1, 0xF0);        // DCBA
  state1 = _mm_alignr_epi8(state1, tmp, 8);           // HGFE
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&state[0]), state0);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&state[4]), state1);
}

}  // namespace

bool Sha256::CpuHasShaExtensions() {
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    const bool ssse3 = c & (1u << 9), sse41 = c & (1u << 19);
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    return ssse3 && sse41 && (b & (1u << 29)) != 0;  // CPUID.7.0:EBX.SHA
  }();
  return has;
}

Sha256::Sha256(Impl impl)
    : h_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19},
      use_ni_(impl == Impl::kAuto && CpuHasShaExtensions()) {}

void Sha256::Blocks(const uint8_t* p, size_t n) {
  if (use_ni_) {
    BlocksNi(h_.data(), p, n);
    return;
  }
  for (; n > 0; --n, p += 64) Block(p);
}

void Sha256::Block(const uint8_t* p) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i) {
    w[i] = (uint32_t{p[4 * i]} << 24) | (uint32_t{p[4 * i + 1]} << 16) | (uint32_t{p[4 * i + 2]} << 8) |
           uint32_t{p[4 * i + 3]};
  }
  for (int i = 16; i < 64; ++i) {
    const uint32_t s0 = Rotr(w[i - 15], 7) ^ Rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    const uint32_t s1 = Rotr(w[i - 2], 17) ^ Rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
  for (int i = 0; i < 64; ++i) {
    const uint32_t t1 = h + (Rotr(e, 6) ^ Rotr(e, 11) ^ Rotr(e, 25)) + ((e & f) ^ (~e & g)) + kRound[i] + w[i];
    const uint32_t t2 = (Rotr(a, 2) ^ Rotr(a, 13) ^ Rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h_[0] += a;
  h_[1] += b;
  h_[2] += c;
  h_[3] += d;
  h_[4] += e;
  h_[5] += f;
  h_[6] += g;
  h_[7] += h;
}

void Sha256::Update(std::span<const uint8_t> data) {
  total_ += data.size();
  const uint8_t* p = data.data();
  size_t n = data.size();
  if (buf_len_ > 0) {
    const size_t take = std::min(n, buf_.size() - buf_len_);
    std::memcpy(buf_.data() + buf_len_, p, take);
    buf_len_ += take;
    p += take;
    n -= take;
    if (buf_len_ < buf_.size()) return;
    Blocks(buf_.data(), 1);
    buf_len_ = 0;
  }
  const size_t blocks = n / 64;
  Blocks(p, blocks);
  p += 64 * blocks;
  n -= 64 * blocks;
  if (n > 0) std::memcpy(buf_.data(), p, n);
  buf_len_ = n;
}

std::array<uint8_t, 32> Sha256::Finish() {
  const uint64_t bits = total_ * 8;
  // Padding: 0x80, zeros to 56 mod 64, then the message length in bits, big-endian.
  uint8_t pad[72] = {0x80};
  const size_t pad_len = (buf_len_ < 56 ? 56 - buf_len_ : 120 - buf_len_);
  for (int i = 0; i < 8; ++i) pad[pad_len + i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
  const uint64_t saved = total_;
  Update({pad, pad_len + 8});
  total_ = saved;
  std::array<uint8_t, 32> out;
  for (int i = 0; i < 8; ++i) {
    out[4 * i] = static_cast<uint8_t>(h_[i] >> 24);
    out[4 * i + 1] = static_cast<uint8_t>(h_[i] >> 16);
    out[4 * i + 2] = static_cast<uint8_t>(h_[i] >> 8);
    out[4 * i + 3] = static_cast<uint8_t>(h_[i]);
  }
  return out;
}

namespace {

std::string ToHex(const std::array<uint8_t, 32>& digest) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (uint8_t b : digest) {
    out += kHex[b >> 4];
    out += kHex[b & 0xf];
  }
  return out;
}

void UpdateLe64(Sha256& h, uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));
  h.Update({b, 8});
}

}  // namespace

std::string Sha256Hex(std::span<const uint8_t> data) {
  Sha256 h;
  h.Update(data);
  return ToHex(h.Finish());
}

std::string SparseContentSha256Hex(std::span<const uint8_t> data) {
  const std::pair<uint64_t, uint64_t> all{0, data.size()};
  return SparseContentSha256Hex(data, {&all, 1});
}

std::string SparseContentSha256Hex(std::span<const uint8_t> data,
                                   std::span<const std::pair<uint64_t, uint64_t>> written) {
  constexpr size_t kBlock = 4096;
  static const uint8_t kZeros[kBlock] = {};
  Sha256 h;
  static constexpr char kTag[] = "rvbpfd sparse content v1";
  h.Update({reinterpret_cast<const uint8_t*>(kTag), sizeof(kTag) - 1});
  UpdateLe64(h, data.size());
  // Blocks in increasing order, each once: the ones the ranges overlap (a block two ranges share is visited for the
  // first), clipped to the data.
  uint64_t next_block = 0;
  for (const auto& [begin, end] : written) {
    if (begin >= end || begin >= data.size()) continue;
    const uint64_t last = (std::min<uint64_t>(end, data.size()) - 1) / kBlock;
    for (uint64_t b = std::max<uint64_t>(begin / kBlock, next_block); b <= last; ++b) {
      const size_t off = static_cast<size_t>(b * kBlock);
      const size_t n = std::min(kBlock, data.size() - off);
      if (std::memcmp(data.data() + off, kZeros, n) == 0) continue;
      UpdateLe64(h, b);
      h.Update(data.subspan(off, n));
    }
    next_block = std::max(next_block, last + 1);
  }
  return ToHex(h.Finish());
}

}  // namespace rvbpfd
