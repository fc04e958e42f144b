#include "common/label_bound.h"

#include <gtest/gtest.h>

#include <string>

#include "common/utf8.h"

namespace rvbpfd {
namespace {

// Bytes `s` takes as the trace writer writes it: an invalid byte becomes U+FFFD (3 bytes).
size_t WrittenBytes(const std::string& s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size();) {
    const size_t len = Utf8SequenceLength(s, i);
    n += len == 0 ? 3 : len;
    i += len == 0 ? 1 : len;
  }
  return n;
}

TEST(BoundLabelTest, TextWithinTheBoundIsKept) {
  for (const std::string& s : {std::string(), std::string("Foo#bar"), std::string(kMaxLabelBytes, 'a'),
                               std::string(kMaxLabelBytes / 3, '\xff')}) {
    std::string t = s;
    EXPECT_FALSE(BoundLabel(&t));
    EXPECT_EQ(t, s);
  }
}

TEST(BoundLabelTest, LongTextIsCutToTheBoundAndMarked) {
  std::string s(kMaxLabelBytes + 1, 'a');
  EXPECT_TRUE(BoundLabel(&s));
  EXPECT_EQ(s, std::string(kMaxLabelBytes - kTruncatedMark.size(), 'a') + std::string(kTruncatedMark));
  EXPECT_EQ(s.size(), kMaxLabelBytes);
  // Cutting again changes nothing: the reader applies the same bound to what the symbolizer already cut.
  const std::string once = s;
  EXPECT_FALSE(BoundLabel(&s));
  EXPECT_EQ(s, once);
}

TEST(BoundLabelTest, NeverSplitsAUtf8SequenceAndCountsInvalidBytesAsWritten) {
  // 4-byte sequences: the cut falls on a whole sequence, and the result stays valid UTF-8.
  std::string emoji;
  for (int i = 0; i < 1000; ++i) emoji += "\xf0\x9f\x98\x80";
  EXPECT_TRUE(BoundLabel(&emoji));
  EXPECT_LE(emoji.size(), kMaxLabelBytes);
  for (size_t i = 0; i < emoji.size();) {
    const size_t len = Utf8SequenceLength(emoji, i);
    ASSERT_NE(len, 0u) << "invalid UTF-8 at " << i;
    i += len;
  }
  // 400 invalid bytes are 400 bytes here but 1200 as written: cut.
  std::string invalid(400, '\xff');
  EXPECT_TRUE(BoundLabel(&invalid));
  EXPECT_LE(WrittenBytes(invalid), kMaxLabelBytes);
  EXPECT_TRUE(invalid.ends_with(kTruncatedMark));
  EXPECT_EQ(invalid.size(), (kMaxLabelBytes - kTruncatedMark.size()) / 3 + kTruncatedMark.size());
}

}  // namespace
}  // namespace rvbpfd
