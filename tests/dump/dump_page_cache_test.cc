// PageCachedReader: reads served from whole pages read once, across page boundaries; a page that cannot be read
// whole falls back to the exact read; Clear serves fresh bytes; the MemoryReader contract (length 0, too long) kept.
#include "dump/dump_page_cache.h"

#include <gtest/gtest.h>

#include <cstring>

#include "stacks/fake_memory.h"

namespace rvbpfd {
namespace {

constexpr uint64_t kPage = PageCachedReader::kPage;

TEST(PageCachedReaderTest, ReadsComeFromPagesReadOnce) {
  testing::FakeMemory mem;
  mem.Map(0x10000, 2 * kPage);
  mem.Put64(0x10000 + kPage - 4, 0x1122334455667788);  // spans the two pages
  mem.Put64(0x10010, 42);
  PageCachedReader pages(mem);
  uint64_t v = 0;
  ASSERT_TRUE(pages.ReadValue(0x10010, &v));
  EXPECT_EQ(v, 42u);
  ASSERT_TRUE(pages.ReadValue(0x10018, &v));
  EXPECT_EQ(pages.page_reads(), 1u);
  ASSERT_TRUE(pages.ReadValue(0x10000 + kPage - 4, &v));
  EXPECT_EQ(v, 0x1122334455667788u);
  EXPECT_EQ(pages.page_reads(), 2u);
  // Stale until cleared, fresh after.
  mem.Put64(0x10010, 43);
  ASSERT_TRUE(pages.ReadValue(0x10010, &v));
  EXPECT_EQ(v, 42u);
  pages.Clear();
  ASSERT_TRUE(pages.ReadValue(0x10010, &v));
  EXPECT_EQ(v, 43u);
}

TEST(PageCachedReaderTest, APageNotReadableWholeFallsBackToTheExactRead) {
  testing::FakeMemory mem;
  mem.Map(0x20100, 16);  // 16 readable bytes in an otherwise unreadable page
  mem.Put64(0x20100, 7);
  PageCachedReader pages(mem);
  uint64_t v = 0;
  ASSERT_TRUE(pages.ReadValue(0x20100, &v));
  EXPECT_EQ(v, 7u);
  EXPECT_FALSE(pages.ReadValue(0x20110, &v));
  EXPECT_FALSE(pages.ReadValue(0x30000, &v));
  char big[PageCachedReader::kMaxCachedRead + 1];
  EXPECT_FALSE(pages.Read(0x20100, big, sizeof(big)));
  EXPECT_FALSE(pages.Read(0x20100, big, 0));
  EXPECT_FALSE(pages.Read(~uint64_t{0} - 3, big, 8));
}

}  // namespace
}  // namespace rvbpfd
