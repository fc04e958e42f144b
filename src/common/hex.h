// "0x" followed by the lower-case hex digits of a value: how messages and `rvbpfd sites` print addresses.
#ifndef RVBPFD_SRC_COMMON_HEX_H_
#define RVBPFD_SRC_COMMON_HEX_H_

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>

namespace rvbpfd {

inline std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%" PRIx64, v);
  return buf;
}

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_COMMON_HEX_H_
