// libFuzzer harness: the site cache's reader (SiteSetFromJson), which reads files in a cache directory other
// processes' analyses wrote. Any input is refused with an error or read into sites that print, and whatever it
// accepts serialises to a form it reads back to the same sites.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_util.h"
#include "sites/sites.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rvbpfd;
  Result<SiteSet> set = SiteSetFromJson(std::string(reinterpret_cast<const char*>(data), size));
  if (!set.ok()) return 0;
  (void)FormatSites(*set);
  const std::string json = SiteSetToJson(*set);
  Result<SiteSet> back = SiteSetFromJson(json);
  FUZZ_CHECK(back.ok());
  FUZZ_CHECK(SiteSetToJson(*back) == json);
  return 0;
}
