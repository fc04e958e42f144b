// The stack layout cache (src/stacks/offsets_cache.h): a hit returns what DWARF gave, a layout the table alone gives
// is never written, and an entry that is not exactly what the writer writes is ignored and rewritten.
#include "stacks/offsets_cache.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "common/sha256.h"
#include "elf/elf_fixtures.h"

namespace rvbpfd {
namespace {

using testing::CompileC;
using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;

// A VM-shaped library with DWARF for the frame structs OffsetsForBinary looks up in rb_profile_frames' CU, laid out
// unlike the 3.3 table (so a value that comes back from the cache is DWARF's, not the table's).
constexpr const char* kFixtureSource = R"(
struct rb_control_frame_struct { const void *pc; void *sp; const void *iseq; void *self; const void *ep;
                                 const void *block_code; void *jit_return; long pad; };
struct rb_execution_context_struct { long a, b, c; void *vm_stack; unsigned long vm_stack_size;
                                     struct rb_control_frame_struct *cfp; };
int rb_profile_frames(struct rb_execution_context_struct *ec, struct rb_control_frame_struct *cfp) {
  return (int)(ec->vm_stack_size + (unsigned long)cfp->pc);
}
)";

class OffsetsCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    lib_ = dir_.Join("libvmfx.so");
    ASSERT_TRUE(CompileC(kFixtureSource, lib_, "-shared -fPIC -O0 -g"));
    Result<ElfFile> elf = ElfFile::Open(lib_);
    ASSERT_TRUE(elf.ok()) << elf.error().ToString();
    elf_.emplace(std::move(elf.value()));
    sha_ = SparseContentSha256Hex(elf_->content());
    cache_ = dir_.Join("cache");
    entry_ = cache_ + "/" + sha_ + ".stacks.json";
  }
  RubyOffsets Fresh() {
    Result<RubyOffsets> o = OffsetsForBinary(*elf_, 3, 3, nullptr);
    EXPECT_TRUE(o.ok());
    return o.ok() ? *o : RubyOffsets{};
  }

  TempDir dir_;
  std::string lib_, sha_, cache_, entry_;
  std::optional<ElfFile> elf_;
};

TEST_F(OffsetsCacheTest, FirstCallWritesTheDwarfLayoutAndTheSecondIsServedFromIt) {
  const RubyOffsets fresh = Fresh();
  ASSERT_EQ(fresh.walk.ec_vm_stack, 24u) << "the fixture's DWARF was not read";
  Result<RubyOffsets> first = CachedOffsetsForBinary(*elf_, 3, 3, sha_, cache_);
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(*first == fresh);
  ASSERT_TRUE(testing::FileExists(entry_));
  struct stat st{};
  ASSERT_EQ(stat(entry_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);

  // Mark the entry: the second call must return the mark, so the cache (not DWARF) answered.
  nlohmann::json doc = nlohmann::json::parse(ReadFile(entry_));
  doc["offsets"]["iseq_body"] = 4242;
  WriteFile(entry_, doc.dump());
  Result<RubyOffsets> second = CachedOffsetsForBinary(*elf_, 3, 3, sha_, cache_);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->iseq_body, 4242u);
  RubyOffsets expected = fresh;
  expected.iseq_body = 4242;
  EXPECT_TRUE(*second == expected) << "a field other than the mark did not round-trip";

  // Another version of the same content is another layout: recomputed, never the marked entry.
  Result<RubyOffsets> other = CachedOffsetsForBinary(*elf_, 3, 4, sha_, cache_);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->iseq_body, 4242u);
  EXPECT_EQ(other->minor, 4);
}

TEST_F(OffsetsCacheTest, EveryFieldRoundTrips) {
  // Distinct values in every field, so a field the entry dropped or swapped with another shows.
  RubyOffsets o = Fresh();
  uint32_t* words = reinterpret_cast<uint32_t*>(&o.walk);
  for (size_t i = 0; i < sizeof(o.walk) / 4; ++i) words[i] = 100 + static_cast<uint32_t>(i);
  o.gvl = rv_gvl_offsets{RV_GVL_BASE_VM, 201, 202, 203, RV_GVL_NO_FIELD, 205};
  o.loc_first_lineno_is_fixnum = true;
  o.singleton_requires_t_class = true;
  o.fl_singleton = 0x123456789aULL;
  o.last_op_id = 777;
  o.shape_parent_id = 301;
  o.symbols_ids = 302;
  Result<RubyOffsets> back = ParseOffsetsCacheEntry(OffsetsCacheEntry(o, sha_), sha_, o.major, o.minor);
  ASSERT_TRUE(back.ok()) << back.error().ToString();
  EXPECT_TRUE(*back == o);
}

TEST_F(OffsetsCacheTest, ALayoutWithoutDwarfIsNotCached) {
  // The same library without its DWARF: the table answers, and nothing is written.
  const std::string stripped = dir_.Join("libvmfx-nodebug.so");
  ASSERT_TRUE(CompileC(kFixtureSource, stripped, "-shared -fPIC -O0 -g0"));
  Result<ElfFile> elf = ElfFile::Open(stripped);
  ASSERT_TRUE(elf.ok());
  const std::string sha = SparseContentSha256Hex(elf->content());
  Result<RubyOffsets> o = CachedOffsetsForBinary(*elf, 3, 3, sha, cache_);
  ASSERT_TRUE(o.ok());
  Result<RubyOffsets> table = RubyOffsets::ForVersion(3, 3);
  ASSERT_TRUE(table.ok());
  EXPECT_TRUE(*o == *table);
  EXPECT_FALSE(std::filesystem::exists(cache_ + "/" + sha + ".stacks.json"));
}

TEST_F(OffsetsCacheTest, AnEntryThatIsNotTheWritersIsIgnoredAndRewritten) {
  const RubyOffsets fresh = Fresh();
  const std::string good = OffsetsCacheEntry(fresh, sha_);
  auto with = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json doc = nlohmann::json::parse(good);
    edit(doc);
    return doc.dump();
  };
  const std::vector<std::pair<std::string, std::string>> hostile = {
      {"empty", ""},
      {"not JSON", "{\"format\": 1,"},
      {"an array", "[1, 2]"},
      {"other format", with([](nlohmann::json& d) { d["format"] = 0; })},
      {"other content", with([](nlohmann::json& d) { d["content_sha256"] = std::string(64, '0'); })},
      {"other version", with([](nlohmann::json& d) { d["minor"] = 4; })},
      {"a missing field", with([](nlohmann::json& d) { d["offsets"].erase("walk.ec_cfp"); })},
      {"offsets not an object", with([](nlohmann::json& d) { d["offsets"] = 5; })},
      {"an offset out of range", with([](nlohmann::json& d) { d["offsets"]["walk.ec_cfp"] = 1 << 20; })},
      {"a negative offset", with([](nlohmann::json& d) { d["offsets"]["iseq_body"] = -8; })},
      {"a float", with([](nlohmann::json& d) { d["offsets"]["iseq_body"] = 16.5; })},
      {"a string", with([](nlohmann::json& d) { d["offsets"]["iseq_body"] = "16"; })},
      {"a number for a flag", with([](nlohmann::json& d) { d["offsets"]["loc_first_lineno_is_fixnum"] = 1; })},
      {"NO_FIELD outside the GVL reading", with([](nlohmann::json& d) { d["offsets"]["cme_def"] = 0xffffffffu; })},
      {"a mask wider than its field", with([](nlohmann::json& d) { d["offsets"]["walk.flags"] = 1ULL << 40; })},
  };
  for (const auto& [what, text] : hostile) {
    EXPECT_FALSE(ParseOffsetsCacheEntry(text, sha_, 3, 3).ok()) << what << " was accepted";
    WriteFile(entry_, text);
    Result<RubyOffsets> o = CachedOffsetsForBinary(*elf_, 3, 3, sha_, cache_);
    ASSERT_TRUE(o.ok()) << what;
    EXPECT_TRUE(*o == fresh) << what << ": the result is not DWARF's";
    EXPECT_EQ(ReadFile(entry_), good) << what << ": the entry was not rewritten";
  }
  // GVL fields the VM does not have are RV_GVL_NO_FIELD, which is valid there.
  EXPECT_TRUE(ParseOffsetsCacheEntry(with([](nlohmann::json& d) { d["offsets"]["gvl.queue_count"] = 0xffffffffu; }),
                                     sha_, 3, 3)
                  .ok());
}

TEST_F(OffsetsCacheTest, NoCacheDirOrKeyMeansNoCache) {
  Result<RubyOffsets> a = CachedOffsetsForBinary(*elf_, 3, 3, sha_, "");
  Result<RubyOffsets> b = CachedOffsetsForBinary(*elf_, 3, 3, "", cache_);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(*a == Fresh() && *b == Fresh());
  EXPECT_FALSE(std::filesystem::exists(cache_));
}

}  // namespace
}  // namespace rvbpfd
