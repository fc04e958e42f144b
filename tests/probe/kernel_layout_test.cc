// KernelLayout: task_struct offsets from synthetic BTF (typedefs, anonymous members, wrong types), the kernel build
// ID from ELF notes (hostile sizes included), the cache entry's checks, and LoadKernelLayout's cache round trip.
// No root needed.
#include "probe/kernel_layout.h"

#include <bpf/btf.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "elf/elf_fixtures.h"

namespace rvbpfd {
namespace {

// A BTF shaped like a kernel's: task_struct { long state; struct { pid_t pid; pid_t tgid; } (anonymous, at 16);
// struct thread_struct thread (at 2048) } with thread_struct { long sp; ... unsigned long fsbase (at 40) }.
struct FakeKernelBtf {
  bool pid_bitfield = false;  // pid declared `pid_t pid : 31`
  uint32_t pid_bits = 31;
  uint32_t fsbase_size = 8;
  bool with_thread = true;
  bool with_task = true;
  bool with_exit_code = false;  // task_struct.exit_code (int, at 1800)

  btf* Build() const {
    btf* b = btf__new_empty();
    const int i32 = btf__add_int(b, "int", 4, BTF_INT_SIGNED);
    const int u64 = btf__add_int(b, "long unsigned int", 8, 0);
    const int u32 = btf__add_int(b, "unsigned int", 4, 0);
    const int kpid = btf__add_typedef(b, "__kernel_pid_t", i32);
    const int pid_t_id = btf__add_typedef(b, "pid_t", kpid);
    const int cpid = btf__add_const(b, pid_t_id);
    const int anon = btf__add_struct(b, nullptr, 12);
    btf__add_field(b, "pad", u32, 0, 0);
    btf__add_field(b, "pid", pid_t_id, 32, pid_bitfield ? pid_bits : 0);
    btf__add_field(b, "tgid", cpid, 64, 0);
    const int thread = btf__add_struct(b, "thread_struct", 152);
    btf__add_field(b, "sp", u64, 0, 0);
    btf__add_field(b, "fsbase", fsbase_size == 8 ? u64 : u32, 40 * 8, 0);
    if (with_task) {
      btf__add_struct(b, "task_struct", 3264);
      btf__add_field(b, "state", u64, 0, 0);
      btf__add_field(b, nullptr, anon, 16 * 8, 0);
      if (with_exit_code) btf__add_field(b, "exit_code", i32, 1800 * 8, 0);
      if (with_thread) btf__add_field(b, "thread", thread, 2048 * 8, 0);
    }
    return b;
  }
};

TEST(KernelLayoutFromBtf, FindsFieldsThroughTypedefsModifiersAndAnonymousMembers) {
  btf* b = FakeKernelBtf{}.Build();
  Result<rv_kernel_layout> layout = KernelLayoutFromBtf(b);
  btf__free(b);
  ASSERT_TRUE(layout.ok()) << layout.error().message();
  EXPECT_EQ(layout->task_pid, 20u);
  EXPECT_EQ(layout->task_tgid, 24u);
  EXPECT_EQ(layout->task_fsbase, 2088u);
  EXPECT_EQ(layout->task_exit_code, 0u);  // optional: not in this BTF, so BPF does not read it
}

TEST(KernelLayoutFromBtf, FindsTheExitCodeWhenTheKernelHasIt) {
  FakeKernelBtf shape;
  shape.with_exit_code = true;
  btf* b = shape.Build();
  Result<rv_kernel_layout> layout = KernelLayoutFromBtf(b);
  btf__free(b);
  ASSERT_TRUE(layout.ok()) << layout.error().message();
  EXPECT_EQ(layout->task_exit_code, 1800u);
  EXPECT_EQ(layout->task_fsbase, 2088u);
}

TEST(KernelLayoutFromBtf, RefusesMistypedOrMissingFields) {
  struct Case {
    const char* what;
    FakeKernelBtf shape;
    const char* message;
  };
  FakeKernelBtf bitfield;
  bitfield.pid_bitfield = true;
  FakeKernelBtf narrow_fsbase;
  narrow_fsbase.fsbase_size = 4;
  FakeKernelBtf no_thread;
  no_thread.with_thread = false;
  FakeKernelBtf no_task;
  no_task.with_task = false;
  const Case cases[] = {
      {"pid bit field", bitfield, "task_struct.pid is a bit field"},
      {"4-byte fsbase", narrow_fsbase, "task_struct.thread.fsbase is not an integer of 8 bytes"},
      {"no thread", no_thread, "task_struct.thread is missing"},
      {"no task_struct", no_task, "no struct task_struct"},
  };
  for (const Case& c : cases) {
    btf* b = c.shape.Build();
    Result<rv_kernel_layout> layout = KernelLayoutFromBtf(b);
    btf__free(b);
    ASSERT_FALSE(layout.ok()) << c.what;
    EXPECT_EQ(layout.error().code(), ErrorCode::kBpf) << c.what;
    EXPECT_NE(layout.error().message().find(c.message), std::string::npos)
        << c.what << ": " << layout.error().message();
  }
}

// One ELF note: header, name padded to 4, descriptor padded to 4.
std::string Note(uint32_t type, std::string_view name, std::string_view desc, uint32_t namesz_override = 0,
                 uint32_t descsz_override = 0) {
  std::string out;
  auto put32 = [&](uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); };
  put32(namesz_override ? namesz_override : static_cast<uint32_t>(name.size()));
  put32(descsz_override ? descsz_override : static_cast<uint32_t>(desc.size()));
  put32(type);
  out.append(name);
  out.append((4 - name.size() % 4) % 4, '\0');
  out.append(desc);
  out.append((4 - desc.size() % 4) % 4, '\0');
  return out;
}

const std::string kGnu("GNU\0", 4);
const std::string kId("\x7d\xd4\xff\x07\x89\xe0\x5e\x14\x28\x53\x20\x12\x91\x49\xda\x25\x55\xca\x0b\xfc", 20);

TEST(KernelBuildIdFromNotes, FindsTheGnuBuildIdAmongOtherNotes) {
  const std::string notes = Note(6, std::string("Linux\0", 6), std::string("\x01\x01\0\0", 4)) +
                            Note(3, std::string("Xen\0", 4), "ab") + Note(3, kGnu, kId);
  EXPECT_EQ(KernelBuildIdFromNotes(notes), "7dd4ff0789e05e14285320129149da2555ca0bfc");
}

TEST(KernelBuildIdFromNotes, HostileOrMissingNotesGiveNone) {
  EXPECT_EQ(KernelBuildIdFromNotes(""), "");
  EXPECT_EQ(KernelBuildIdFromNotes("\x04\0\0"), "");                       // shorter than a header
  EXPECT_EQ(KernelBuildIdFromNotes(Note(1, kGnu, kId)), "");              // a GNU note of another type
  std::string truncated = Note(3, kGnu, kId);
  truncated.resize(truncated.size() - 4);
  EXPECT_EQ(KernelBuildIdFromNotes(truncated), "");                        // descriptor cut short
  EXPECT_EQ(KernelBuildIdFromNotes(Note(3, kGnu, kId, 0xfffffffdu)), "");  // name size that would wrap 32 bits
  EXPECT_EQ(KernelBuildIdFromNotes(Note(3, kGnu, kId, 0, 0xfffffffdu)), "");
  EXPECT_EQ(KernelBuildIdFromNotes(Note(3, kGnu, std::string(68, 'x'))), "");  // longer than any build ID
}

TEST(KernelLayoutCacheEntry, RoundTripsAndRefusesEntriesNotOfThisKernelOrOutOfRange) {
  const rv_kernel_layout layout{.task_pid = 1264, .task_tgid = 1268, .task_fsbase = 3088, .task_exit_code = 1800};
  const std::string entry = KernelLayoutCacheEntry(layout, "abc123");
  Result<rv_kernel_layout> back = ParseKernelLayoutCacheEntry(entry, "abc123");
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(back->task_pid, 1264u);
  EXPECT_EQ(back->task_tgid, 1268u);
  EXPECT_EQ(back->task_fsbase, 3088u);
  EXPECT_EQ(back->task_exit_code, 1800u);
  EXPECT_FALSE(ParseKernelLayoutCacheEntry(entry, "abc124").ok());
  const rv_kernel_layout without{.task_pid = 1264, .task_tgid = 1268, .task_fsbase = 3088, .task_exit_code = 0};
  Result<rv_kernel_layout> back0 = ParseKernelLayoutCacheEntry(KernelLayoutCacheEntry(without, "abc123"), "abc123");
  ASSERT_TRUE(back0.ok()) << back0.error().message();
  EXPECT_EQ(back0->task_exit_code, 0u);
#define RV_ENTRY(pid, tgid, fsbase, exit_code)                                                      \
  "{\"format\":2,\"build_id\":\"abc123\",\"task_pid\":" pid ",\"task_tgid\":" tgid ",\"task_fsbase\":" fsbase \
  ",\"task_exit_code\":" exit_code "}"
  const char* hostile[] = {
      "",
      "[]",
      "{\"format\":2,\"build_id\":\"abc123\",\"task_pid\":1264,\"task_tgid\":1268}",
      "{\"format\":2,\"build_id\":\"abc123\",\"task_pid\":1264,\"task_tgid\":1268,\"task_fsbase\":3088}",
      "{\"format\":1,\"build_id\":\"abc123\",\"task_pid\":1264,\"task_tgid\":1268,\"task_fsbase\":3088}",
      "{\"format\":2,\"build_id\":7,\"task_pid\":1264,\"task_tgid\":1268,\"task_fsbase\":3088,\"task_exit_code\":0}",
      RV_ENTRY("1266", "1268", "3088", "1800"),
      RV_ENTRY("1264", "1268", "3084", "1800"),
      RV_ENTRY("0", "1268", "3088", "1800"),
      RV_ENTRY("1264", "1268", "65536", "1800"),
      RV_ENTRY("-4", "1268", "3088", "1800"),
      RV_ENTRY("1264.0", "1268", "3088", "1800"),
      RV_ENTRY("4294967300", "1268", "3088", "1800"),
      RV_ENTRY("1264", "1268", "3088", "1801"),
      RV_ENTRY("1264", "1268", "3088", "65536"),
      RV_ENTRY("1264", "1268", "3088", "-4"),
  };
#undef RV_ENTRY
  for (const char* text : hostile) {
    Result<rv_kernel_layout> parsed = ParseKernelLayoutCacheEntry(text, "abc123");
    EXPECT_FALSE(parsed.ok()) << text;
    if (!parsed.ok()) {
      EXPECT_EQ(parsed.error().code(), ErrorCode::kIo) << text;
    }
  }
}

class LoadKernelLayoutTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(tmp_.path().empty());
    dir_ = tmp_.path();
    sources_.notes_path = dir_ + "/notes";
    sources_.btf_path = dir_ + "/vmlinux";
    cache_dir_ = dir_ + "/cache";
    Write(sources_.notes_path, Note(3, kGnu, kId));
    btf* b = FakeKernelBtf{}.Build();
    uint32_t size = 0;
    const void* raw = btf__raw_data(b, &size);
    Write(sources_.btf_path, std::string(static_cast<const char*>(raw), size));
    btf__free(b);
  }
  static void Write(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary) << bytes;
  }
  std::string CachePath() const { return cache_dir_ + "/kernel-7dd4ff0789e05e14285320129149da2555ca0bfc.json"; }

  testing::TempDir tmp_;
  std::string dir_;
  std::string cache_dir_;
  KernelLayoutSources sources_;
};

TEST_F(LoadKernelLayoutTest, ParsesTheBtfOnceThenReadsTheCacheOfThisBuildId) {
  Result<rv_kernel_layout> first = LoadKernelLayout(cache_dir_, sources_);
  ASSERT_TRUE(first.ok()) << first.error().message();
  EXPECT_EQ(first->task_fsbase, 2088u);
  ASSERT_TRUE(std::filesystem::exists(CachePath()));
  // The BTF gone: only the cache can answer now.
  std::filesystem::remove(sources_.btf_path);
  Result<rv_kernel_layout> second = LoadKernelLayout(cache_dir_, sources_);
  ASSERT_TRUE(second.ok()) << second.error().message();
  EXPECT_EQ(second->task_pid, 20u);
  EXPECT_EQ(second->task_tgid, 24u);
  EXPECT_EQ(second->task_fsbase, 2088u);
  // Another kernel (build ID) does not read this kernel's entry.
  Write(sources_.notes_path, Note(3, kGnu, std::string(20, '\x11')));
  Result<rv_kernel_layout> other = LoadKernelLayout(cache_dir_, sources_);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.error().code(), ErrorCode::kBpf);
  EXPECT_NE(other.error().message().find("CONFIG_DEBUG_INFO_BTF"), std::string::npos) << other.error().message();
  EXPECT_NE(other.error().message().find(sources_.btf_path), std::string::npos) << other.error().message();
}

TEST_F(LoadKernelLayoutTest, ACorruptEntryIsRecomputedAndReplaced) {
  std::filesystem::create_directories(cache_dir_);
  Write(CachePath(), "{\"format\":1,\"build_id\":\"7dd4ff0789e05e14285320129149da2555ca0bfc\",\"task_pid\":8,"
                     "\"task_tgid\":12,\"task_fsbase\":7}");
  Result<rv_kernel_layout> layout = LoadKernelLayout(cache_dir_, sources_);
  ASSERT_TRUE(layout.ok()) << layout.error().message();
  EXPECT_EQ(layout->task_fsbase, 2088u);
  std::ifstream in(CachePath());
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Result<rv_kernel_layout> rewritten =
      ParseKernelLayoutCacheEntry(text, "7dd4ff0789e05e14285320129149da2555ca0bfc");
  ASSERT_TRUE(rewritten.ok()) << text;
  EXPECT_EQ(rewritten->task_fsbase, 2088u);
}

TEST_F(LoadKernelLayoutTest, WithoutABuildIdNothingIsCached) {
  Write(sources_.notes_path, "");
  Result<rv_kernel_layout> layout = LoadKernelLayout(cache_dir_, sources_);
  ASSERT_TRUE(layout.ok()) << layout.error().message();
  EXPECT_FALSE(std::filesystem::exists(cache_dir_));
}

TEST(LoadKernelLayout, TheRunningKernelsLayoutIsFound) {
  if (access("/sys/kernel/btf/vmlinux", R_OK) != 0) GTEST_SKIP() << "the kernel has no BTF (/sys/kernel/btf/vmlinux)";
  Result<rv_kernel_layout> layout = LoadKernelLayout("");
  ASSERT_TRUE(layout.ok()) << layout.error().message();
  // pid and tgid are adjacent pid_t members in every kernel since 2.6; fsbase lies in the thread struct at the end.
  EXPECT_EQ(layout->task_tgid, layout->task_pid + 4);
  EXPECT_GT(layout->task_fsbase, layout->task_tgid);
}

}  // namespace
}  // namespace rvbpfd
