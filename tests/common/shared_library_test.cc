// SharedLibrary: a library opened on first use resolves typed functions, and a missing library or symbol is an error
// that names the library, the symbol and the package to install.
#include "common/shared_library.h"

#include <gtest/gtest.h>
#include <unistd.h>

namespace rvbpfd {
namespace {

TEST(SharedLibrary, ResolvesTypedFunctions) {
  Result<SharedLibrary> libc = SharedLibrary::Open("libc.so.6", "libc6");
  ASSERT_TRUE(libc.ok()) << libc.error().message();
  decltype(&getpid) fn = nullptr;
  ASSERT_TRUE(libc->Resolve("getpid", &fn).ok());
  ASSERT_NE(fn, nullptr);
  EXPECT_EQ(fn(), getpid());
}

TEST(SharedLibrary, MissingLibraryNamesItsPackage) {
  Result<SharedLibrary> lib = SharedLibrary::Open("librvbpfd-does-not-exist.so.9", "librvbpfd-nothing9");
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.error().code(), ErrorCode::kIo);
  EXPECT_NE(lib.error().message().find("librvbpfd-does-not-exist.so.9"), std::string::npos) << lib.error().message();
  EXPECT_NE(lib.error().message().find("install the librvbpfd-nothing9 package"), std::string::npos)
      << lib.error().message();
}

TEST(SharedLibrary, MissingSymbolIsAnErrorNotANullFunction) {
  Result<SharedLibrary> libc = SharedLibrary::Open("libc.so.6", "libc6");
  ASSERT_TRUE(libc.ok());
  void (*fn)() = nullptr;
  Status st = libc->Resolve("rvbpfd_no_such_symbol", &fn);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(fn, nullptr);
  EXPECT_NE(st.error().message().find("libc.so.6 has no rvbpfd_no_such_symbol"), std::string::npos)
      << st.error().message();
}

}  // namespace
}  // namespace rvbpfd
