// The one way a URL that may carry credentials is shown in messages and logs (--push-url may hold user:password@).
#ifndef RVBPFD_SRC_COMMON_URL_REDACT_H_
#define RVBPFD_SRC_COMMON_URL_REDACT_H_

#include <string>
#include <string_view>

namespace rvbpfd {

// `url` with the userinfo (user:password@) of its authority replaced by ***@, and the value of every query parameter
// whose name suggests a secret (token, key, password, secret, auth, signature, credential, session: case-insensitive
// substrings, e.g. access_token, api_key, X-Amz-Signature) replaced by ***. Everything else, including text that is
// not a URL at all, is returned unchanged.
std::string RedactUrl(std::string_view url);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_COMMON_URL_REDACT_H_
