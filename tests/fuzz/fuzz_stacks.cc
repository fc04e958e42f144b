// libFuzzer harness: the host-side CRuby frame walker, the symbolizer and the EC route over hostile target memory.
// The input is a header saying which CRuby layout to assume and where the thread, the symbol table and the TLS
// pieces are, followed by the target's memory as address/bytes records (tests/fuzz/stacks_input.h). In "wrap" mode
// every address is readable, so pointers always lead somewhere and cycles are easy to build; otherwise a read
// outside the records fails, as an unmapped page does. Seeds are the memory real walks read from the coredump cases
// (make_seeds). Whatever the bytes say, walking, symbolizing and finding the EC must stay bounded and never read
// outside what the reader gives them.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "fuzz/stacks_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rvbpfd::fuzz;
  StacksHeader header;
  if (size < sizeof(header)) return 0;
  std::memcpy(&header, data, sizeof(header));
  FuzzMemory mem({data, size}, sizeof(header), (header.flags & kStacksWrap) != 0);
  (void)ExerciseStacks(mem, header);
  return 0;
}
