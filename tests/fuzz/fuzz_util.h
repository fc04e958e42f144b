// Shared pieces of the libFuzzer harnesses: an output stream that discards what it is given (the harnesses check
// what they need of an exporter's output themselves), and a check that aborts with a message, so libFuzzer records
// the input as a crash when a property of the output does not hold.
#ifndef RVBPFD_TESTS_FUZZ_FUZZ_UTIL_H_
#define RVBPFD_TESTS_FUZZ_FUZZ_UTIL_H_

#include <cstdio>
#include <cstdlib>
#include <ostream>
#include <streambuf>

namespace rvbpfd::fuzz {

class NullBuf : public std::streambuf {
 protected:
  int_type overflow(int_type c) override { return traits_type::not_eof(c); }
  std::streamsize xsputn(const char*, std::streamsize n) override { return n; }
};

class NullStream : public std::ostream {
 public:
  NullStream() : std::ostream(&buf_) {}

 private:
  NullBuf buf_;
};

[[noreturn]] inline void Fail(const char* what) {
  std::fprintf(stderr, "fuzz check failed: %s\n", what);
  std::abort();
}

}  // namespace rvbpfd::fuzz

#define FUZZ_CHECK(cond)                                  \
  do {                                                    \
    if (!(cond)) ::rvbpfd::fuzz::Fail(#cond);             \
  } while (0)

#endif  // RVBPFD_TESTS_FUZZ_FUZZ_UTIL_H_
