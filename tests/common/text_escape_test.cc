#include "common/text_escape.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace rvbpfd {
namespace {

TEST(EscapeControlBytesTest, OrdinaryTextAndUtf8PassUnchanged) {
  EXPECT_EQ(EscapeControlBytes("pid 42 (ruby) at /usr/lib/libruby.so"), "pid 42 (ruby) at /usr/lib/libruby.so");
  const std::string utf8 = "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80";
  EXPECT_EQ(EscapeControlBytes(utf8), utf8);
}

TEST(EscapeControlBytesTest, TerminalSequencesBecomeVisible) {
  // ESC [ 2 J clears the screen; ESC ] 0 ; title BEL sets the window title.
  EXPECT_EQ(EscapeControlBytes("a\x1b[2Jb"), "a\\x1b[2Jb");
  EXPECT_EQ(EscapeControlBytes("\x1b]0;pwned\x07"), "\\x1b]0;pwned\\x07");
  EXPECT_EQ(EscapeControlBytes(std::string("nul\0byte", 8)), "nul\\x00byte");
  EXPECT_EQ(EscapeControlBytes("del\x7f"), "del\\x7f");
  EXPECT_EQ(EscapeControlBytes("l1\nl2\r\t"), "l1\\nl2\\r\\t");
}

TEST(EscapeControlBytesTest, C1ControlsAndInvalidUtf8AreEscapedBytewise) {
  EXPECT_EQ(EscapeControlBytes("\x9b" "31m"), "\\x9b31m");         // a raw 8-bit CSI
  EXPECT_EQ(EscapeControlBytes("\xc2\x9b" "31m"), "\\xc2\\x9b31m");  // U+009B, CSI as UTF-8
  EXPECT_EQ(EscapeControlBytes("\xc2\xa0"), "\xc2\xa0");             // U+00A0 is not a control
  EXPECT_EQ(EscapeControlBytes("bad\xffhost"), "bad\\xffhost");
  EXPECT_EQ(EscapeControlBytes("\xe2\x82"), "\\xe2\\x82");  // a cut sequence
  EXPECT_EQ(EscapeControlBytes("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a UTF-16 surrogate
}

TEST(EscapeControlBytesTest, KeepNewlinesForMultiLineReports) {
  EXPECT_EQ(EscapeControlBytes("a\x1b\nb\n", /*keep_newlines=*/true), "a\\x1b\nb\n");
}

TEST(EscapeControlBytesTest, ErrorMessagesAreEscapedWhenPrinted) {
  const Error e(ErrorCode::kNotRuby, "pid 7 (\x1b[31mevil\x1b[0m) maps no VM");
  EXPECT_EQ(e.ToString(), "rvbpfd: not-ruby: pid 7 (\\x1b[31mevil\\x1b[0m) maps no VM");
  EXPECT_EQ(e.message(), "pid 7 (\x1b[31mevil\x1b[0m) maps no VM");  // kept raw for structured (JSON) logs
}

}  // namespace
}  // namespace rvbpfd
