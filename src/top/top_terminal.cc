#include "top/top_terminal.h"

#include <poll.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>

namespace rvbpfd {
namespace {

constexpr const char* kEnter = "\033[?1049h\033[?25l\033[H\033[2J";  // alternate screen, cursor hidden, cleared
constexpr const char* kLeave = "\033[?25h\033[?1049l";              // cursor shown, main screen back

winsize Size(int fd) {
  winsize ws{};
  if (ioctl(fd, TIOCGWINSZ, &ws) != 0 || ws.ws_col == 0 || ws.ws_row == 0) {
    ws.ws_col = 80;
    ws.ws_row = 24;
  }
  return ws;
}

}  // namespace

std::unique_ptr<TopTerminal> TopTerminal::Open(int in_fd, int out_fd) {
  std::unique_ptr<TopTerminal> t(new TopTerminal(in_fd, out_fd));
  if (isatty(in_fd) && tcgetattr(in_fd, &t->saved_) == 0) {
    termios raw = t->saved_;
    raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    t->raw_ = tcsetattr(in_fd, TCSANOW, &raw) == 0;
  }
  t->Write(kEnter);
  return t;
}

TopTerminal::~TopTerminal() {
  Write(kLeave);
  if (raw_) tcsetattr(in_fd_, TCSANOW, &saved_);
}

void TopTerminal::Write(const std::string& s) const {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = write(out_fd_, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the terminal went away: nothing more to show
    off += static_cast<size_t>(n);
  }
}

bool TopTerminal::QuitPressed() {
  if (!raw_) return false;
  bool quit = false;
  char buf[64];
  for (int i = 0; i < 16; ++i) {  // bounded: a paste cannot hold the recording's loop
    pollfd p{in_fd_, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0 || !(p.revents & POLLIN)) break;
    const ssize_t n = read(in_fd_, buf, sizeof(buf));
    if (n <= 0) break;
    for (ssize_t k = 0; k < n; ++k) quit = quit || buf[k] == 'q' || buf[k] == 'Q';
  }
  return quit;
}

size_t TopTerminal::width() const { return Size(out_fd_).ws_col; }
size_t TopTerminal::height() const { return Size(out_fd_).ws_row; }

void TopTerminal::Draw(const std::vector<std::string>& lines) {
  std::string screen = "\033[H";
  for (size_t i = 0; i < lines.size(); ++i) {
    screen += lines[i];
    screen += "\033[K";
    if (i + 1 < lines.size()) screen += "\r\n";
  }
  screen += "\033[J";
  Write(screen);
}

}  // namespace rvbpfd
