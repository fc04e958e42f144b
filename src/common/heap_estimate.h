// Estimates of the heap bytes containers hold, for memory bounds that must not depend on the allocator's statistics
// (glibc malloc's chunk rounding; libstdc++'s node layout).
#ifndef RVBPFD_SRC_COMMON_HEAP_ESTIMATE_H_
#define RVBPFD_SRC_COMMON_HEAP_ESTIMATE_H_

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

namespace rvbpfd {

// Bytes glibc's malloc takes for a request of n bytes: n plus its 8-byte header, rounded up to 16, at least 32.
constexpr size_t HeapChunk(size_t n) {
  return n == 0 ? 0 : std::max<size_t>(32, (n + 8 + 15) & ~size_t{15});
}
inline size_t StringHeap(const std::string& s) {
  // libstdc++ keeps strings of up to 15 chars inside the object.
  return s.capacity() > 15 ? HeapChunk(s.capacity() + 1) : 0;
}
template <typename T>
size_t VectorHeap(const std::vector<T>& v) {
  return HeapChunk(v.capacity() * sizeof(T));
}
// Buckets plus one node per element (next pointer, the value, and the cached hash libstdc++ keeps for hashers that
// may throw).
template <typename Set>
size_t HashSetHeap(const Set& s, size_t value_bytes, bool cached_hash) {
  const size_t buckets = s.bucket_count() > 1 ? HeapChunk(s.bucket_count() * sizeof(void*)) : 0;
  const size_t node = HeapChunk(sizeof(void*) + ((value_bytes + 7) & ~size_t{7}) + (cached_hash ? sizeof(size_t) : 0));
  return buckets + s.size() * node;
}

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_COMMON_HEAP_ESTIMATE_H_
