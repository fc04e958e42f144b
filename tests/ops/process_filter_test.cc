#include "ops/process_filter.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace rvbpfd {
namespace {

using ::testing::HasSubstr;

const std::string kId = "3f2a9c1b7d8e4f5061728394a5b6c7d8e9f00112233445566778899aabbccdde";

ProcessLabels Proc(const std::string& comm, const std::string& cgroup = "/", const std::string& container = "",
                   const std::string& service = "") {
  ProcessLabels p;
  p.pid = 1;
  p.comm = comm;
  p.cgroup = cgroup;
  p.container_id = container;
  p.service_name = service.empty() ? comm : service;
  return p;
}

ProcessFilter MustCreate(const std::vector<std::string>& include, const std::vector<std::string>& exclude) {
  Result<ProcessFilter> f = ProcessFilter::Create(include, exclude);
  EXPECT_TRUE(f.ok()) << f.error().message();
  return f.ok() ? *f : ProcessFilter();
}

TEST(GlobMatchTest, StarAndQuestionMark) {
  EXPECT_TRUE(GlobMatch("ruby", "ruby"));
  EXPECT_FALSE(GlobMatch("ruby", "ruby2"));
  EXPECT_FALSE(GlobMatch("ruby", "rub"));
  EXPECT_TRUE(GlobMatch("puma*", "puma"));
  EXPECT_TRUE(GlobMatch("puma*", "puma: cluster w"));
  EXPECT_TRUE(GlobMatch("*worker*", "sidekiq worker 3"));
  EXPECT_FALSE(GlobMatch("*worker*", "sidekiq"));
  EXPECT_TRUE(GlobMatch("r?by", "ruby"));
  EXPECT_FALSE(GlobMatch("r?by", "rby"));
  EXPECT_TRUE(GlobMatch("*", ""));
  EXPECT_TRUE(GlobMatch("", ""));
  EXPECT_FALSE(GlobMatch("", "x"));
  EXPECT_TRUE(GlobMatch("a*b*c", "aXXbYYbc"));  // needs backtracking past the first 'b'
  EXPECT_FALSE(GlobMatch("a*b*c", "aXXbYYb"));
  EXPECT_TRUE(GlobMatch("**a", "a"));
  // Pathological input stays fast and correct (no exponential backtracking).
  EXPECT_FALSE(GlobMatch("*a*a*a*a*a*a*a*a*b", std::string(4096, 'a')));
}

TEST(ProcessFilterTest, NoRulesMatchEverything) {
  ProcessFilter f = MustCreate({}, {});
  EXPECT_TRUE(f.empty());
  EXPECT_TRUE(f.Matches(Proc("ruby")));
  EXPECT_TRUE(f.Matches(Proc("bash")));
  EXPECT_TRUE(ProcessFilter().Matches(Proc("x")));
}

TEST(ProcessFilterTest, CommRules) {
  ProcessFilter f = MustCreate({"comm:ruby", "comm:puma*"}, {});
  EXPECT_TRUE(f.Matches(Proc("ruby")));
  EXPECT_TRUE(f.Matches(Proc("puma 6.4.2 (tc")));
  EXPECT_FALSE(f.Matches(Proc("bundle")));
  EXPECT_FALSE(f.Matches(Proc("rubyx")));
}

TEST(ProcessFilterTest, CgroupRulesArePathPrefixes) {
  ProcessFilter f = MustCreate({"cgroup:/system.slice/docker-"}, {});
  EXPECT_TRUE(f.Matches(Proc("ruby", "/system.slice/docker-" + kId + ".scope")));
  EXPECT_FALSE(f.Matches(Proc("ruby", "/system.slice/puma.service")));
  EXPECT_FALSE(f.Matches(Proc("ruby", "/user.slice/system.slice/docker-x")));  // prefix, not substring
  EXPECT_FALSE(f.Matches(Proc("ruby", "")));
}

TEST(ProcessFilterTest, LabelRules) {
  ProcessFilter service = MustCreate({"label:service=shop-*"}, {});
  EXPECT_TRUE(service.Matches(Proc("ruby", "/", "", "shop-web")));
  EXPECT_FALSE(service.Matches(Proc("ruby", "/", "", "billing")));

  ProcessFilter container = MustCreate({"label:container=3f2a*"}, {});
  EXPECT_TRUE(container.Matches(Proc("ruby", "/", kId)));
  EXPECT_FALSE(container.Matches(Proc("ruby", "/", "")));

  ProcessFilter host_only = MustCreate({"label:container="}, {});  // processes outside containers
  EXPECT_TRUE(host_only.Matches(Proc("ruby", "/", "")));
  EXPECT_FALSE(host_only.Matches(Proc("ruby", "/", kId)));

  // The value may contain '=' (everything after the first '=' is the pattern).
  ProcessFilter eq = MustCreate({"label:service=a=b"}, {});
  EXPECT_TRUE(eq.Matches(Proc("ruby", "/", "", "a=b")));
}

TEST(ProcessFilterTest, ExcludeWinsOverInclude) {
  ProcessFilter f = MustCreate({"comm:ruby*"}, {"label:service=batch", "cgroup:/system.slice/cron"});
  EXPECT_TRUE(f.Matches(Proc("ruby", "/system.slice/web.service", "", "web")));
  EXPECT_FALSE(f.Matches(Proc("ruby", "/system.slice/web.service", "", "batch")));
  EXPECT_FALSE(f.Matches(Proc("ruby", "/system.slice/cron.service", "", "web")));
  EXPECT_FALSE(f.Matches(Proc("bash", "/system.slice/web.service", "", "web")));  // not included

  ProcessFilter exclude_only = MustCreate({}, {"comm:irb"});
  EXPECT_TRUE(exclude_only.Matches(Proc("ruby")));
  EXPECT_FALSE(exclude_only.Matches(Proc("irb")));
}

TEST(ProcessFilterTest, BadRulesNameTheFlagTheRuleAndTheAcceptedForms) {
  struct Case {
    std::vector<std::string> include, exclude;
    const char* expect;
  };
  const Case cases[] = {
      {{"ruby"}, {}, "--include rule \"ruby\": unknown rule kind"},
      {{}, {"comm:"}, "--exclude rule \"comm:\": empty command name"},
      {{"comm:a-very-long-process-name"}, {}, "at most 15 bytes"},
      {{"cgroup:system.slice"}, {}, "must start with '/'"},
      {{"cgroup:"}, {}, "must start with '/'"},
      {{"label:service"}, {}, "missing '='"},
      {{"label:pod=web"}, {}, "unknown label key \"pod\""},
      {{"label:service="}, {}, "empty service name"},
      {{"comm:ok"}, {"COMM:ruby"}, "--exclude rule \"COMM:ruby\""},
  };
  for (const Case& c : cases) {
    Result<ProcessFilter> f = ProcessFilter::Create(c.include, c.exclude);
    ASSERT_FALSE(f.ok()) << c.expect;
    EXPECT_EQ(f.error().code(), ErrorCode::kUsage);
    EXPECT_THAT(f.error().message(), HasSubstr(c.expect));
    EXPECT_THAT(f.error().message(),
                HasSubstr("expected comm:NAME (glob * ?), cgroup:/PREFIX or label:KEY=VALUE (KEY service or "
                          "container)"));
  }
  // Long patterns are fine when wildcards stand for the rest.
  EXPECT_TRUE(ProcessFilter::Create({"comm:sidekiq*"}, {}).ok());
}

}  // namespace
}  // namespace rvbpfd
