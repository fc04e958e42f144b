// The one way rvbpfd reads a number out of a parsed nlohmann::json value that a file or a user wrote (traces, the
// site cache, agent configuration). nlohmann's get<T>() converts without checking: a float out of T's range is
// undefined behaviour, a wider integer wraps, a negative becomes a huge unsigned. Here only an integer that T holds
// exactly is accepted.
#ifndef RVBPFD_SRC_COMMON_JSON_READ_H_
#define RVBPFD_SRC_COMMON_JSON_READ_H_

#include <concepts>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

namespace rvbpfd {

// `v` as T when it is a JSON integer (not a float, string or bool) within T's range; nullopt otherwise.
template <std::integral T, typename Json>
  requires(!std::same_as<T, bool>)
std::optional<T> JsonInteger(const Json& v) {
  if (v.is_number_unsigned()) {
    const auto u = v.template get<uint64_t>();
    if (std::in_range<T>(u)) return static_cast<T>(u);
    return std::nullopt;
  }
  if (v.is_number_integer()) {
    const auto s = v.template get<int64_t>();
    if (std::in_range<T>(s)) return static_cast<T>(s);
  }
  return std::nullopt;
}

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_COMMON_JSON_READ_H_
