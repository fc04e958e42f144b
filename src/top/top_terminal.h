// The terminal of `rvbpfd top` when its output is one: the alternate screen, redrawn whole each interval with plain
// ANSI sequences, and stdin (when a terminal too) in non-canonical, no-echo mode so that a `q` is read at once.
// ISIG stays on: Ctrl-C and Ctrl-\ still stop rvbpfd through its signal handlers, which end the recording cleanly,
// and this object, destroyed on every return path, restores the terminal as it found it.
#ifndef RVBPFD_SRC_TOP_TOP_TERMINAL_H_
#define RVBPFD_SRC_TOP_TOP_TERMINAL_H_

#include <termios.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace rvbpfd {

class TopTerminal {
 public:
  // Takes over `out_fd` (a terminal) and, when it is a terminal too, `in_fd`.
  static std::unique_ptr<TopTerminal> Open(int in_fd, int out_fd);
  TopTerminal(const TopTerminal&) = delete;
  TopTerminal& operator=(const TopTerminal&) = delete;
  ~TopTerminal();

  // Reads the keys typed since the last call; true when one of them was q or Q.
  bool QuitPressed();
  // Columns and rows (80x24 when the terminal does not say).
  size_t width() const;
  size_t height() const;
  // Replaces the screen with `lines` (each at most width() columns, at most height() of them).
  void Draw(const std::vector<std::string>& lines);

 private:
  TopTerminal(int in_fd, int out_fd) : in_fd_(in_fd), out_fd_(out_fd) {}
  void Write(const std::string& s) const;

  int in_fd_;
  int out_fd_;
  bool raw_ = false;  // in_fd_'s mode was changed (saved_ restores it)
  termios saved_{};
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_TOP_TOP_TERMINAL_H_
