// `rvbpfd dump --core FILE`: the same dump as of a live process (dump_command.h), from an ELF core file (gcore's or
// the kernel's). The VM binary is the libruby the core maps, else its executable (by NT_AUXV's entry point), read
// from this host at the path the core's NT_FILE note names, or from --libruby / --exe; when the core carries the
// mapping's first page, the file's build-id must equal the one in that page (else an error naming both). What only a
// live process has (/proc task states, /proc fd links) is derived from the core's NT_PRSTATUS registers or left out,
// and the dump's `notes` say so. docs/dump.md has the details.
#ifndef RVBPFD_SRC_DUMP_DUMP_CORE_H_
#define RVBPFD_SRC_DUMP_DUMP_CORE_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

#include "common/error.h"
#include "dump/dump_command.h"
#include "dump/dump_reader.h"
#include "stacks/memory_reader.h"

namespace rvbpfd {

// Errors (one line): kIo (the core cannot be read or is malformed; the VM file cannot be read), kNotRuby (the core
// maps no CRuby VM), kUnsupportedVersion, kNoSymbols (the VM file is not the one the core mapped: build-ids differ;
// or the memory does not match its layout), kUsage (--libruby for a core that maps no libruby).
Status RunDumpCore(const DumpOptions& options, std::ostream& out);

// The file of a core that holds the VM: the path the core recorded, the host file to read (an override or the same
// path), and the address the loader mapped it at (see ImageStartOf in dump_core.cc: not a whole-file mapping of it
// made later).
struct CoreVmFile {
  std::string recorded_path;
  std::string host_path;
  uint64_t load_start = 0;
  bool libruby = false;  // a libruby (else the executable)
};
// Chooses it from the core's notes: the mapped libruby (host file `libruby` when given), else the executable (the
// file whose mapping holds the AT_ENTRY address, else the lowest mapping's file; host file `exe` when given).
Result<CoreVmFile> ChooseCoreVmFile(const CoreNotes& notes, const std::string& exe, const std::string& libruby);

// Native tids, states and io descriptors from the core's threads (what /proc gives a live dump): a thread whose
// NT_PRSTATUS says it was inside a system call is off-CPU ('S'), one in user space on it ('R'); a thread waiting for
// IO gets the descriptor of its system call from its argument registers. Then DeriveStates, and `notes` say what a
// core cannot tell.
void AddCoreFacts(const CoreNotes& notes, MemoryReader& mem, DumpSnapshot* snap);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_DUMP_DUMP_CORE_H_
