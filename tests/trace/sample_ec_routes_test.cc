// The summary's sample_ec_routes (how each on-CPU sample found its EC): written only when given, read back, shown by
// `rvbpfd stats`; absent for recordings that did not sample.
#include <gtest/gtest.h>

#include <sstream>

#include "trace/inspect.h"
#include "trace/reader.h"
#include "trace/writer.h"
#include "trace_test_util.h"

namespace rvbpfd {
namespace {

using ::rvbpfd::testing::ReadAll;
using ::rvbpfd::testing::ScratchDir;
using ::rvbpfd::testing::StatsFile;

std::string Write(const ScratchDir& dir, const std::string& name, std::optional<SampleEcRoutes> routes) {
  const std::string path = dir.File(name);
  TraceHeader header;
  header.pid = 7;
  header.ruby_version = "3.4.5";
  Result<TraceWriter> writer = TraceWriter::Create(path, header);
  EXPECT_TRUE(writer.ok());
  FinishInfo fin{.end_t_ns = 100};
  fin.sample_ec_routes = routes;
  EXPECT_TRUE(writer->Finish(fin).ok());
  return path;
}

TEST(SampleEcRoutes, WrittenReadBackAndShownByStats) {
  ScratchDir dir;
  const std::string path = Write(dir, "s.rvtrace", SampleEcRoutes{.tls = 314, .ractor = 2, .current_th = 1, .none = 5});
  EXPECT_NE(ReadAll(path).find("\"sample_ec_routes\":{\"tls\":314,\"ractor\":2,\"current_th\":1,\"none\":5}"),
            std::string::npos)
      << ReadAll(path);
  Result<TraceFile> t = TraceReader::ReadFile(path);
  ASSERT_TRUE(t.ok()) << t.error().ToString();
  ASSERT_TRUE(t->summary && t->summary->sample_ec_routes);
  EXPECT_EQ(t->summary->sample_ec_routes->tls, 314u);
  EXPECT_EQ(t->summary->sample_ec_routes->ractor, 2u);
  EXPECT_EQ(t->summary->sample_ec_routes->current_th, 1u);
  EXPECT_EQ(t->summary->sample_ec_routes->none, 5u);
  std::ostringstream out;
  ASSERT_TRUE(StatsFile(path, out).ok());
  EXPECT_NE(out.str().find("sample EC routes: tls 314, ractor 2, current_th 1, none (dropped) 5"), std::string::npos)
      << out.str();
}

TEST(SampleEcRoutes, AbsentWithoutSampling) {
  ScratchDir dir;
  const std::string path = Write(dir, "n.rvtrace", std::nullopt);
  EXPECT_EQ(ReadAll(path).find("sample_ec_routes"), std::string::npos);
  Result<TraceFile> t = TraceReader::ReadFile(path);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(t->summary.has_value());
  EXPECT_FALSE(t->summary->sample_ec_routes.has_value());
  std::ostringstream out;
  ASSERT_TRUE(StatsFile(path, out).ok());
  EXPECT_EQ(out.str().find("sample EC routes"), std::string::npos);
}

}  // namespace
}  // namespace rvbpfd
