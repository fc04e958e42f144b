// libFuzzer harness: the ELF core reader over hostile core files (what `rvbpfd dump --core` and the coredump tests
// read): program headers, the notes (NT_FILE, NT_PRSTATUS, NT_PRPSINFO, NT_AUXV), memory reads, and the build-id of
// a mapping read from the core's bytes. An input that starts with 'W' is a whole core after that byte; any other input
// is a little-endian 16-bit length, that many bytes of a note segment, and a page of memory (its first 4 bytes made
// the ELF magic), wrapped in a well-formed core with the memory at 0x400000: so the fuzzer reaches the note parsers
// and CoreBuildIdAt's ELF header parse without first having to find a valid core layout. Whatever the bytes say,
// parsing and reading must stay bounded and never crash.
#include <elf.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "stacks/core_builder.h"
#include "stacks/memory_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rvbpfd;
  if (size < 2) return 0;
  std::vector<uint8_t> bytes;
  if (data[0] == 'W') {
    bytes.assign(data + 1, data + size);
  } else {
    // Two bytes: the note segment's length; the rest (at most a page) is the memory.
    const size_t notes = std::min<size_t>(size - 2, size_t{data[0]} | size_t{data[1]} << 8);
    const size_t page = std::min<size_t>(size - 2 - notes, 4096);
    std::vector<uint8_t> memory(data + 2 + notes, data + 2 + notes + page);
    if (page > 0) std::memcpy(memory.data(), ELFMAG, std::min<size_t>(page, SELFMAG));
    bytes = rvbpfd::testing::BuildCoreFile({{0x400000, 0x2000, std::move(memory)}},
                                           std::vector<uint8_t>(data + 2, data + 2 + notes));
  }
  CoreFileReader::Options options;
  options.use_original_files = false;  // never open the host files a fuzzed NT_FILE names
  auto core = CoreFileReader::FromBytes(std::move(bytes), options);
  if (!core.ok()) return 0;
  CoreFileReader& r = **core;
  uint8_t buf[64];
  (void)r.Read(0x400000, buf, sizeof(buf));
  (void)r.ReadCarried(0x400ff0, buf, 32);  // runs from carried bytes into declared ones
  (void)CoreBuildIdAt(r, 0x400000);
  for (const CoreFileMapping& m : r.file_mappings()) {
    (void)r.Read(m.start, buf, 8);
    (void)CoreBuildIdAt(r, m.start);
  }
  for (const CoreThread& t : r.notes().threads) (void)r.Read(t.rsp, buf, 8);
  return 0;
}
