// A fake target address space for unit tests: byte regions at chosen addresses; reads outside them fail.
#ifndef RVBPFD_TESTS_STACKS_FAKE_MEMORY_H_
#define RVBPFD_TESTS_STACKS_FAKE_MEMORY_H_

#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <vector>

#include "stacks/memory_reader.h"

namespace rvbpfd::testing {

class FakeMemory : public MemoryReader {
 public:
  // Adds (or replaces) a zero-filled region of `size` bytes at `addr`.
  void Map(uint64_t addr, size_t size) { regions_[addr] = std::vector<uint8_t>(size); }
  void Put64(uint64_t addr, uint64_t v) { Put(addr, &v, 8); }
  void Put32(uint64_t addr, uint32_t v) { Put(addr, &v, 4); }
  void Put(uint64_t addr, const void* src, size_t len) {
    uint8_t* p = Locate(addr, len);
    if (p == nullptr) abort();  // a test bug: writing outside the mapped regions
    std::memcpy(p, src, len);
  }
  bool Read(uint64_t addr, void* dst, size_t len) override {
    reads_++;
    if (len == 0 || len > kMaxReadBytes) return false;
    uint8_t* p = Locate(addr, len);
    if (p == nullptr) return false;
    std::memcpy(dst, p, len);
    return true;
  }
  size_t ReadMany(std::span<Request> requests) override {
    read_many_calls_++;
    return MemoryReader::ReadMany(requests);
  }
  uint64_t reads() const { return reads_; }
  // ReadMany batches asked for (each still counts its requests in reads()).
  uint64_t read_many_calls() const { return read_many_calls_; }

 private:
  uint8_t* Locate(uint64_t addr, size_t len) {
    auto it = regions_.upper_bound(addr);
    if (it == regions_.begin()) return nullptr;
    --it;
    if (addr - it->first > it->second.size() || len > it->second.size() - (addr - it->first)) return nullptr;
    return it->second.data() + (addr - it->first);
  }
  std::map<uint64_t, std::vector<uint8_t>> regions_;
  uint64_t reads_ = 0;
  uint64_t read_many_calls_ = 0;
};

}  // namespace rvbpfd::testing

#endif  // RVBPFD_TESTS_STACKS_FAKE_MEMORY_H_
