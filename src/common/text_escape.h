// Escaping of text that reaches a terminal or a text log: target processes control their comm, paths, argv and
// thread names, and a raw ESC, CSI or other control byte in a message would drive the reader's terminal.
#ifndef RVBPFD_SRC_COMMON_TEXT_ESCAPE_H_
#define RVBPFD_SRC_COMMON_TEXT_ESCAPE_H_

#include <string>
#include <string_view>

namespace rvbpfd {

// `s` with every C0 control byte, DEL, C1 control (U+0080..U+009F) and byte that is not valid UTF-8 written as a
// visible escape: \n, \r, \t for those three, \xNN (the byte, or each byte of a C1 character's encoding) for the
// rest. Printable ASCII and valid non-control UTF-8 pass unchanged, so ordinary messages read as before.
// With `keep_newlines`, '\n' passes unchanged (multi-line reports such as `rvbpfd inspect`, escaped line by line).
std::string EscapeControlBytes(std::string_view s, bool keep_newlines = false);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_COMMON_TEXT_ESCAPE_H_
