// The one way rvbpfd serializes an nlohmann::json value. Strings in it may come from users (--host, config values)
// or targets (symbol names, paths) and need not be valid UTF-8; nlohmann's default dump throws type_error.316 on
// such bytes, which would abort the daemon. Here they become U+FFFD instead.
#ifndef RVBPFD_SRC_COMMON_JSON_DUMP_H_
#define RVBPFD_SRC_COMMON_JSON_DUMP_H_

#include <nlohmann/json.hpp>
#include <string>

namespace rvbpfd {

// `indent` as in basic_json::dump: -1 compact, >= 0 pretty-printed with that many spaces. Never throws on string
// content (invalid UTF-8 is replaced by U+FFFD).
template <typename Json>
std::string DumpJson(const Json& value, int indent = -1) {
  return value.dump(indent, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::replace);
}

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_COMMON_JSON_DUMP_H_
