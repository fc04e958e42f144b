#include "common/shared_library.h"

#include <dlfcn.h>

#include <utility>

namespace rvbpfd {

Result<SharedLibrary> SharedLibrary::Open(const char* soname, std::string_view package) {
  void* handle = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return Error(ErrorCode::kIo, std::string("loading ") + soname + " failed (" +
                                           (why != nullptr ? why : "dlopen") + "): install the " +
                                           std::string(package) + " package");
  }
  return SharedLibrary(handle, soname, std::string(package));
}

Result<void*> SharedLibrary::Symbol(const char* name) const {
  dlerror();  // clear a stale error, so a null symbol is told from a failed lookup
  void* p = dlsym(handle_, name);
  if (p == nullptr) {
    const char* why = dlerror();
    return Error(ErrorCode::kIo, soname_ + " has no " + name + " (" + (why != nullptr ? why : "null symbol") +
                                           "): the " + package_ + " package is too old or broken");
  }
  return p;
}

}  // namespace rvbpfd
