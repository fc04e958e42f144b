#include "export/pprof_builder.h"

#include <gtest/gtest.h>

#include <set>

#include "pprof_test_util.h"

namespace rvbpfd {
namespace {

using testing::DecodedProfile;
using testing::DecodedSample;
using testing::DecodeMessage;
using testing::DecodeProfile;
using testing::Submessages;
using testing::Varint;
using testing::WireField;

FrameInfo Ruby(std::string label, std::string path, int32_t line) {
  return FrameInfo{std::move(label), std::move(path), line, FrameKind::kRuby};
}

// The ids of a repeated message field's `id` (field 1), in file order.
std::vector<uint64_t> Ids(const std::string& profile, uint32_t field) {
  std::vector<uint64_t> ids;
  auto top = DecodeMessage(profile);
  EXPECT_TRUE(top.has_value());
  for (const std::string& m : Submessages(top.value_or(std::vector<WireField>{}), field)) {
    ids.push_back(Varint(DecodeMessage(m).value_or(std::vector<WireField>{}), 1));
  }
  return ids;
}

std::vector<uint64_t> OneTo(size_t n) {
  std::vector<uint64_t> v;
  for (size_t i = 1; i <= n; ++i) v.push_back(i);
  return v;
}

TEST(PprofBuilder, EmptyProfileHasTheEmptyStringFirstAndOneMapping) {
  PprofBuilder b;
  const std::string bytes = b.Build();
  const DecodedProfile p = DecodeProfile(bytes);
  ASSERT_TRUE(p.errors.empty()) << p.errors.front();
  ASSERT_FALSE(p.strings.empty());
  EXPECT_EQ(p.strings[0], "");
  EXPECT_TRUE(p.samples.empty());
  EXPECT_TRUE(p.sample_types.empty());
  EXPECT_EQ(Ids(bytes, 3), std::vector<uint64_t>{1});  // the mapping
  EXPECT_EQ(p.period, 0);
  EXPECT_EQ(p.default_sample_type, "");
}

TEST(PprofBuilder, HeaderFieldsRoundTrip) {
  PprofBuilder b;
  b.AddSampleType("samples", "count");
  b.AddSampleType("cpu", "nanoseconds");
  b.SetPeriod("cpu", "nanoseconds", 52'631'578);
  b.SetDefaultSampleType("cpu");
  b.SetTimeNanos(1'738'324'800'250'000'000);
  b.SetDurationNanos(15'000'000'000);
  b.SetMapping("ruby 3.4.5", "abcdef");
  b.AddComment("first");
  b.AddComment("second");
  EXPECT_EQ(b.sample_type_count(), 2u);
  const std::string bytes = b.Build();
  const DecodedProfile p = DecodeProfile(bytes);
  ASSERT_TRUE(p.errors.empty()) << p.errors.front();
  ASSERT_EQ(p.sample_types.size(), 2u);
  EXPECT_EQ(p.sample_types[0], std::make_pair(std::string("samples"), std::string("count")));
  EXPECT_EQ(p.sample_types[1], std::make_pair(std::string("cpu"), std::string("nanoseconds")));
  EXPECT_EQ(p.period_type, std::make_pair(std::string("cpu"), std::string("nanoseconds")));
  EXPECT_EQ(p.period, 52'631'578);
  EXPECT_EQ(p.default_sample_type, "cpu");
  EXPECT_EQ(p.time_nanos, 1'738'324'800'250'000'000);
  EXPECT_EQ(p.duration_nanos, 15'000'000'000);
  EXPECT_EQ(p.comments, (std::vector<std::string>{"first", "second"}));
  // The mapping names the VM and its build id, and says symbols are present.
  auto top = DecodeMessage(bytes);
  ASSERT_TRUE(top);
  auto mappings = Submessages(*top, 3);
  ASSERT_EQ(mappings.size(), 1u);
  auto m = DecodeMessage(mappings[0]);
  ASSERT_TRUE(m);
  EXPECT_EQ(p.strings.at(Varint(*m, 5)), "ruby 3.4.5");
  EXPECT_EQ(p.strings.at(Varint(*m, 6)), "abcdef");
  EXPECT_EQ(Varint(*m, 7), 1u);
  EXPECT_EQ(Varint(*m, 8), 1u);
  EXPECT_EQ(Varint(*m, 9), 1u);
}

TEST(PprofBuilder, FramesInternIntoDenseFunctionAndLocationIds) {
  PprofBuilder b;
  b.AddSampleType("samples", "count");
  const FrameInfo leaf = Ruby("Foo#bar", "/app/foo.rb", 12);
  const FrameInfo leaf_other_line = Ruby("Foo#bar", "/app/foo.rb", 14);      // same function, other location
  const FrameInfo same_name_other_file = Ruby("Foo#bar", "/app/other.rb", 12);  // other function
  const FrameInfo root = Ruby("<main>", "/app/main.rb", 1);
  const FrameInfo cfunc{"Integer#times", "<cfunc>", 0, FrameKind::kCfunc};
  const FrameInfo negative_line = Ruby("Weird#line", "/app/w.rb", -5);
  const int64_t one[] = {1};
  ASSERT_TRUE(b.AddSample(std::vector<FrameInfo>{leaf, cfunc, root}, one).ok());
  ASSERT_TRUE(b.AddSample(std::vector<FrameInfo>{leaf_other_line, cfunc, root}, one).ok());
  ASSERT_TRUE(b.AddSample(std::vector<FrameInfo>{same_name_other_file, root}, one).ok());
  ASSERT_TRUE(b.AddSample(std::vector<FrameInfo>{leaf, cfunc, root}, one).ok());  // all known
  ASSERT_TRUE(b.AddSample(std::vector<FrameInfo>{negative_line}, one).ok());
  EXPECT_EQ(b.location_count(), 6u);
  EXPECT_EQ(b.function_count(), 5u);
  EXPECT_EQ(b.Location(leaf), 1u);  // interned: the same id again
  EXPECT_EQ(b.sample_count(), 5u);

  const std::string bytes = b.Build();
  const DecodedProfile p = DecodeProfile(bytes);
  ASSERT_TRUE(p.errors.empty()) << p.errors.front();
  EXPECT_EQ(Ids(bytes, 4), OneTo(6));  // locations 1..6, in order
  EXPECT_EQ(Ids(bytes, 5), OneTo(5));  // functions 1..5
  ASSERT_EQ(p.samples.size(), 5u);
  EXPECT_EQ(p.samples[0].frames, (std::vector<std::string>{"Foo#bar", "Integer#times", "<main>"}));
  EXPECT_EQ(p.samples[2].frames, (std::vector<std::string>{"Foo#bar", "<main>"}));
  // Lines live on locations, files on functions; a negative line is written as 0.
  std::multiset<int64_t> lines;
  for (const auto& [id, loc] : p.locations) lines.insert(loc.second);
  EXPECT_EQ(lines, (std::multiset<int64_t>{12, 14, 12, 0, 1, 0}));
  std::set<std::pair<std::string, std::string>> functions;
  for (const auto& [id, fn] : p.functions) functions.insert(fn);
  EXPECT_TRUE(functions.contains({"Foo#bar", "/app/other.rb"}));
  EXPECT_TRUE(functions.contains({"Integer#times", "<cfunc>"}));
  // Every string is stored once.
  EXPECT_EQ(std::set<std::string>(p.strings.begin(), p.strings.end()).size(), p.strings.size());
}

TEST(PprofBuilder, AFrameIsItsLabelPathLineAndKind) {
  // Frames that share a function and a line but differ in kind, or whose lines differ only below 0 (both written as
  // 0), are distinct locations, each found again by its own value.
  PprofBuilder b;
  const FrameInfo ruby = Ruby("Foo#bar", "/app/foo.rb", 0);
  const FrameInfo cfunc{"Foo#bar", "/app/foo.rb", 0, FrameKind::kCfunc};
  const FrameInfo gc{"Foo#bar", "/app/foo.rb", 0, FrameKind::kGc};
  const FrameInfo minus_one = Ruby("Foo#bar", "/app/foo.rb", -1);
  const FrameInfo minus_two = Ruby("Foo#bar", "/app/foo.rb", -2);
  const uint64_t ids[] = {b.Location(ruby), b.Location(cfunc), b.Location(gc), b.Location(minus_one),
                          b.Location(minus_two)};
  EXPECT_EQ(std::set<uint64_t>(std::begin(ids), std::end(ids)).size(), 5u);
  EXPECT_EQ(b.function_count(), 1u);
  EXPECT_EQ(b.Location(gc), ids[2]);
  EXPECT_EQ(b.Location(cfunc), ids[1]);
  EXPECT_EQ(b.Location(ruby), ids[0]);
  EXPECT_EQ(b.Location(minus_two), ids[4]);
  EXPECT_EQ(b.Location(minus_one), ids[3]);
  EXPECT_EQ(b.location_count(), 5u);
  const DecodedProfile p = DecodeProfile(b.Build());
  ASSERT_TRUE(p.errors.empty()) << p.errors.front();
  for (const auto& [id, loc] : p.locations) EXPECT_EQ(loc.second, 0) << id;
}

TEST(PprofBuilder, LabelsStringAndNumericIncludingZero) {
  PprofBuilder b;
  b.AddSampleType("wait", "nanoseconds");
  const int64_t v[] = {7};
  const PprofLabel labels[] = {{.key = "thread", .str = "worker"},
                               {.key = "serial", .num = 0},
                               {.key = "bytes", .num = 4096, .num_unit = "bytes"}};
  ASSERT_TRUE(b.AddSample(std::vector<FrameInfo>{Ruby("a", "/a.rb", 1)}, v, labels).ok());
  const std::string bytes = b.Build();
  const DecodedProfile p = DecodeProfile(bytes);
  ASSERT_TRUE(p.errors.empty()) << p.errors.front();
  ASSERT_EQ(p.samples.size(), 1u);
  EXPECT_EQ(p.samples[0].str_labels, (std::map<std::string, std::string>{{"thread", "worker"}}));
  EXPECT_EQ(p.samples[0].num_labels, (std::map<std::string, int64_t>{{"serial", 0}, {"bytes", 4096}}));
  // num_unit (Label field 4) is set on the labelled number only.
  auto top = DecodeMessage(bytes);
  ASSERT_TRUE(top);
  auto sample = DecodeMessage(Submessages(*top, 2).at(0));
  ASSERT_TRUE(sample);
  auto label_msgs = Submessages(*sample, 3);
  ASSERT_EQ(label_msgs.size(), 3u);
  EXPECT_EQ(Varint(*DecodeMessage(label_msgs[1]), 4), 0u);
  EXPECT_EQ(p.strings.at(Varint(*DecodeMessage(label_msgs[2]), 4)), "bytes");
}

TEST(PprofBuilder, LargeAndNegativeValuesRoundTrip) {
  PprofBuilder b;
  b.AddSampleType("a", "count");
  b.AddSampleType("b", "nanoseconds");
  b.AddSampleType("c", "nanoseconds");
  const int64_t values[] = {0, int64_t{5} << 40, -3};
  ASSERT_TRUE(b.AddSample(std::vector<FrameInfo>{Ruby("x", "/x.rb", 300)}, values).ok());
  const DecodedProfile p = DecodeProfile(b.Build());
  ASSERT_TRUE(p.errors.empty()) << p.errors.front();
  ASSERT_EQ(p.samples.size(), 1u);
  EXPECT_EQ(p.samples[0].values, (std::vector<int64_t>{0, int64_t{5} << 40, -3}));
}

TEST(PprofBuilder, RejectsWrongValueCountsAndUnknownLocations) {
  PprofBuilder b;
  b.AddSampleType("samples", "count");
  b.AddSampleType("cpu", "nanoseconds");
  const int64_t one[] = {1};
  Status st = b.AddSample(std::vector<FrameInfo>{Ruby("x", "/x.rb", 1)}, one);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kInternal);
  const int64_t two[] = {1, 2};
  const uint64_t unknown[] = {42};
  EXPECT_FALSE(b.AddSample(std::span<const uint64_t>(unknown), two).ok());
  const uint64_t zero[] = {0};
  EXPECT_FALSE(b.AddSample(std::span<const uint64_t>(zero), two).ok());
  EXPECT_EQ(b.sample_count(), 0u);
  const DecodedProfile p = DecodeProfile(b.Build());
  ASSERT_TRUE(p.errors.empty()) << p.errors.front();
  EXPECT_TRUE(p.samples.empty());
}

TEST(PprofBuilder, DeterministicBytes) {
  auto make = [] {
    PprofBuilder b;
    b.AddSampleType("samples", "count");
    b.SetPeriod("cpu", "nanoseconds", 10);
    const int64_t v[] = {3};
    const PprofLabel l[] = {{.key = "k", .str = "v"}};
    for (int i = 0; i < 200; ++i) {
      EXPECT_TRUE(
          b.AddSample(std::vector<FrameInfo>{Ruby("m" + std::to_string(i % 37), "/f.rb", i), Ruby("<main>", "/f.rb", 1)},
                      v, l)
              .ok());
    }
    return b;
  };
  PprofBuilder a = make();
  PprofBuilder c = make();
  const std::string first = a.Build();
  EXPECT_EQ(first, c.Build());
  EXPECT_EQ(first, a.Build());  // Build does not change the builder's output
  const DecodedProfile p = DecodeProfile(first);
  ASSERT_TRUE(p.errors.empty()) << p.errors.front();
  EXPECT_EQ(p.samples.size(), 200u);
  EXPECT_EQ(p.functions.size(), 38u);  // m0..m36 and <main>
  EXPECT_EQ(p.locations.size(), 201u);  // 200 (label, line) pairs and <main>
}

}  // namespace
}  // namespace rvbpfd
