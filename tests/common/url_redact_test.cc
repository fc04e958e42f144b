#include "common/url_redact.h"

#include <gtest/gtest.h>

namespace rvbpfd {
namespace {

TEST(RedactUrlTest, UserinfoIsHidden) {
  EXPECT_EQ(RedactUrl("https://alice:s3cret@pyro.example:4040/base"), "https://***@pyro.example:4040/base");
  EXPECT_EQ(RedactUrl("http://tokenonly@pyro:4040"), "http://***@pyro:4040");
  // The last '@' of the authority ends the userinfo (a password may hold '@').
  EXPECT_EQ(RedactUrl("http://u:p@ss@host/x"), "http://***@host/x");
}

TEST(RedactUrlTest, SecretQueryParametersAreHidden) {
  EXPECT_EQ(RedactUrl("https://h/ingest?name=app&access_token=abc&from=1"),
            "https://h/ingest?name=app&access_token=***&from=1");
  EXPECT_EQ(RedactUrl("https://h/?API_KEY=k1&X-Amz-Signature=zz#frag"),
            "https://h/?API_KEY=***&X-Amz-Signature=***#frag");
  EXPECT_EQ(RedactUrl("https://h/?password=p"), "https://h/?password=***");
}

TEST(RedactUrlTest, UrlsWithoutSecretsAndNonUrlsAreUnchanged) {
  EXPECT_EQ(RedactUrl("http://pyroscope:4040"), "http://pyroscope:4040");
  EXPECT_EQ(RedactUrl("http://h/p?name=app&from=1"), "http://h/p?name=app&from=1");
  EXPECT_EQ(RedactUrl("not a url at all"), "not a url at all");
  EXPECT_EQ(RedactUrl("http://h/a@b"), "http://h/a@b");  // '@' in the path is not userinfo
  EXPECT_EQ(RedactUrl(""), "");
}

}  // namespace
}  // namespace rvbpfd
