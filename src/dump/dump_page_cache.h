// A page cache over a MemoryReader for one thread's stack in a dump: the walker and the symbolizer read a thread's
// ~100 control frames, their environments and the same method entries and iseqs word by word (five
// process_vm_readv calls per frame, ~50,000 for 100 threads of 100 frames); read a 4 KiB page at a time, the same
// stack costs a few dozen. The target keeps running, so the cache is emptied before every stack reading (Clear):
// nothing read for one thread, or for an earlier reading of the same thread, is served to the next. The reads that
// detect a thread moving (dump/dump_reader.h) go to the process directly.
#ifndef RVBPFD_SRC_DUMP_DUMP_PAGE_CACHE_H_
#define RVBPFD_SRC_DUMP_DUMP_PAGE_CACHE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <unordered_map>

#include "stacks/memory_reader.h"

namespace rvbpfd {

class PageCachedReader : public MemoryReader {
 public:
  static constexpr uint64_t kPage = 4096;
  // Pages held at most (16 MiB); when full it starts over.
  static constexpr size_t kMaxPages = 4096;
  // Reads longer than this go to the underlying reader whole.
  static constexpr size_t kMaxCachedRead = 2 * kPage;

  explicit PageCachedReader(MemoryReader& mem) : mem_(mem) {}
  // A read through the pages it spans, each read whole once. A page that cannot be read whole (at the end of a
  // file mapping, say) is not cached and the read goes to the underlying reader as asked.
  bool Read(uint64_t addr, void* dst, size_t len) override;
  void Clear() { pages_.clear(); }
  // Pages read so far (tests).
  uint64_t page_reads() const { return page_reads_; }

 private:
  using Page = std::array<uint8_t, kPage>;
  const Page* PageAt(uint64_t base);

  MemoryReader& mem_;
  std::unordered_map<uint64_t, std::unique_ptr<Page>> pages_;  // base address -> bytes; null: not readable whole
  uint64_t page_reads_ = 0;
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_DUMP_DUMP_PAGE_CACHE_H_
