// A shared library opened when a run first needs it instead of at program start. libcurl (the agent's push sink)
// and libdebuginfod (debug files by build-id) pull in TLS, Kerberos and LDAP libraries whose loading and
// initializers cost every run ~11 ms before main (an empty program linked with either takes ~8 ms to run instead of
// ~1 ms); most runs use neither.
//
// A library is opened once (RTLD_NOW | RTLD_LOCAL) and never closed: functions resolved from it stay valid for the
// process's life. Thread-safe.
#ifndef RVBPFD_SRC_COMMON_SHARED_LIBRARY_H_
#define RVBPFD_SRC_COMMON_SHARED_LIBRARY_H_

#include <string>
#include <string_view>

#include "common/error.h"

namespace rvbpfd {

class SharedLibrary {
 public:
  // Opens `soname` (e.g. "libcurl.so.4"). The error names the library, dlerror()'s reason and `package`, the Debian
  // package that provides it.
  static Result<SharedLibrary> Open(const char* soname, std::string_view package);

  // Resolves `name` into *fn (a function pointer of the symbol's type); the error names the library and symbol.
  template <typename F>
  Status Resolve(const char* name, F* fn) const {
    Result<void*> p = Symbol(name);
    if (!p) return p.error();
    *fn = reinterpret_cast<F>(*p);
    return Status::Ok();
  }

 private:
  SharedLibrary(void* handle, std::string soname, std::string package)
      : handle_(handle), soname_(std::move(soname)), package_(std::move(package)) {}
  Result<void*> Symbol(const char* name) const;

  void* handle_;  // never closed (see above)
  std::string soname_, package_;
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_COMMON_SHARED_LIBRARY_H_
