#include "common/url_redact.h"

#include <algorithm>
#include <array>
#include <cctype>

namespace rvbpfd {
namespace {

bool IsSecretParameter(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  static constexpr std::array<std::string_view, 9> kSecretWords = {
      "token", "key", "password", "passwd", "secret", "auth", "signature", "credential", "session"};
  return std::any_of(kSecretWords.begin(), kSecretWords.end(),
                     [&](std::string_view w) { return lower.find(w) != std::string::npos; });
}

// Appends the query `q` (without '?') with the values of secret parameters replaced.
void AppendRedactedQuery(std::string* out, std::string_view q) {
  for (size_t start = 0; start <= q.size();) {
    const size_t amp = std::min(q.find('&', start), q.size());
    const std::string_view param = q.substr(start, amp - start);
    const size_t eq = param.find('=');
    if (eq != std::string_view::npos && IsSecretParameter(param.substr(0, eq))) {
      out->append(param.substr(0, eq + 1)).append("***");
    } else {
      out->append(param);
    }
    if (amp == q.size()) break;
    out->push_back('&');
    start = amp + 1;
  }
}

}  // namespace

std::string RedactUrl(std::string_view url) {
  const size_t scheme_end = url.find("://");
  if (scheme_end == std::string_view::npos) return std::string(url);
  const size_t authority_start = scheme_end + 3;
  const size_t authority_end = std::min(url.find_first_of("/?#", authority_start), url.size());
  const std::string_view authority = url.substr(authority_start, authority_end - authority_start);
  std::string out(url.substr(0, authority_start));
  if (const size_t at = authority.rfind('@'); at != std::string_view::npos) {
    out += "***";
    out += authority.substr(at);
  } else {
    out += authority;
  }
  const std::string_view rest = url.substr(authority_end);
  const size_t query = rest.find('?');
  if (query == std::string_view::npos) {
    out += rest;
    return out;
  }
  const size_t fragment = std::min(rest.find('#', query), rest.size());
  out += rest.substr(0, query + 1);
  AppendRedactedQuery(&out, rest.substr(query + 1, fragment - query - 1));
  out += rest.substr(fragment);
  return out;
}

}  // namespace rvbpfd
