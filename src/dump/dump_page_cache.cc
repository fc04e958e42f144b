#include "dump/dump_page_cache.h"

#include <cstring>

namespace rvbpfd {

const PageCachedReader::Page* PageCachedReader::PageAt(uint64_t base) {
  auto it = pages_.find(base);
  if (it != pages_.end()) return it->second.get();
  if (pages_.size() >= kMaxPages) pages_.clear();
  auto page = std::make_unique<Page>();
  page_reads_++;
  if (!mem_.Read(base, page->data(), kPage)) page.reset();
  return pages_.emplace(base, std::move(page)).first->second.get();
}

bool PageCachedReader::Read(uint64_t addr, void* dst, size_t len) {
  if (len == 0 || len > kMaxReadBytes) return false;
  if (len > kMaxCachedRead || addr + len < addr) return mem_.Read(addr, dst, len);
  auto* out = static_cast<uint8_t*>(dst);
  uint64_t at = addr;
  size_t left = len;
  while (left > 0) {
    const uint64_t base = at & ~(kPage - 1);
    const Page* page = PageAt(base);
    if (page == nullptr) return mem_.Read(addr, dst, len);
    const size_t n = std::min<uint64_t>(left, base + kPage - at);
    std::memcpy(out, page->data() + (at - base), n);
    out += n;
    at += n;
    left -= n;
  }
  return true;
}

}  // namespace rvbpfd
