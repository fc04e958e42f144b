#include "common/safe_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace rvbpfd {
namespace {

namespace fs = std::filesystem;

class SafeFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = fs::temp_directory_path() / "rvbpfd-safe-file-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    victim_ = dir_ + "/victim";
    WriteText(victim_, "precious\n");
  }
  void TearDown() override { fs::remove_all(dir_); }

  static void WriteText(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::binary) << text;
  }
  static std::string ReadText(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  static Status WriteHello(std::ostream& out) {
    out << "hello\n";
    return Status::Ok();
  }
  // Names in dir_ apart from the victim.
  std::vector<std::string> Entries() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) {
      if (e.path().filename() != "victim") out.push_back(e.path().filename().string());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  std::string dir_;
  std::string victim_;
};

TEST_F(SafeFileTest, CreatesMode0600WhateverTheUmask) {
  for (mode_t mask : {mode_t{0}, mode_t{077}, mode_t{0777}}) {
    const mode_t old = umask(mask);
    const std::string path = dir_ + "/out-" + std::to_string(mask);
    const Status st = WriteOutputFile(path, OutputFileOptions(), WriteHello);
    umask(old);
    ASSERT_TRUE(st.ok()) << st.error().ToString();
    struct stat s {};
    ASSERT_EQ(lstat(path.c_str(), &s), 0);
    EXPECT_TRUE(S_ISREG(s.st_mode));
    EXPECT_EQ(s.st_mode & 07777, 0600u) << "umask " << mask;
    EXPECT_EQ(ReadText(path), "hello\n");
  }
  EXPECT_EQ(Entries().size(), 3u);  // no temporary files left behind
}

TEST_F(SafeFileTest, SymlinkAtThePathIsRefusedAndNotFollowed) {
  const std::string path = dir_ + "/trace.rvtrace";
  ASSERT_EQ(symlink(victim_.c_str(), path.c_str()), 0);
  for (bool publish_now : {false, true}) {
    OutputFileOptions options;
    options.publish_at_create = publish_now;
    Result<OutputFile> f = OutputFile::Create(path, options);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.error().code(), ErrorCode::kOutputUnwritable);
    EXPECT_NE(f.error().message().find("symbolic link"), std::string::npos) << f.error().message();
  }
  EXPECT_EQ(ReadText(victim_), "precious\n");
  struct stat s {};
  ASSERT_EQ(lstat(path.c_str(), &s), 0);
  EXPECT_TRUE(S_ISLNK(s.st_mode));  // refused, not silently replaced either
  EXPECT_EQ(Entries(), std::vector<std::string>{"trace.rvtrace"});
}

TEST_F(SafeFileTest, SymlinksAtPredictableTempNamesAreNeverWrittenThrough) {
  // The old export wrote OUT.tmp; a planted link there (or at any name an attacker could guess) must stay untouched.
  const std::string path = dir_ + "/out.json";
  for (const std::string& guess : {path + ".tmp", dir_ + "/.out.json.tmp"}) {
    ASSERT_EQ(symlink(victim_.c_str(), guess.c_str()), 0);
  }
  ASSERT_TRUE(WriteOutputFile(path, OutputFileOptions(), WriteHello).ok());
  EXPECT_EQ(ReadText(path), "hello\n");
  EXPECT_EQ(ReadText(victim_), "precious\n");
  EXPECT_EQ(Entries(), (std::vector<std::string>{".out.json.tmp", "out.json", "out.json.tmp"}));
}

TEST_F(SafeFileTest, ExistingFileAndHardLinkAreReplacedNotWrittenThrough) {
  const std::string path = dir_ + "/out";
  ASSERT_EQ(link(victim_.c_str(), path.c_str()), 0);  // a hard link planted where protected_hardlinks is off
  ASSERT_TRUE(WriteOutputFile(path, OutputFileOptions(), WriteHello).ok());
  EXPECT_EQ(ReadText(path), "hello\n");
  EXPECT_EQ(ReadText(victim_), "precious\n");
}

TEST_F(SafeFileTest, StickyWorldWritableDirectoryWithAnotherUsersLink) {
  const std::string sticky = dir_ + "/tmp";
  ASSERT_EQ(mkdir(sticky.c_str(), 0777), 0);
  ASSERT_EQ(chmod(sticky.c_str(), 01777), 0);
  const std::string path = sticky + "/x.rvtrace";
  ASSERT_EQ(symlink(victim_.c_str(), path.c_str()), 0);
  if (geteuid() == 0) {
    ASSERT_EQ(lchown(path.c_str(), 65534, 65534), 0);  // "nobody" planted it
  }
  OutputFileOptions options;
  options.publish_at_create = true;
  EXPECT_FALSE(OutputFile::Create(path, options).ok());
  EXPECT_EQ(ReadText(victim_), "precious\n");
  // A fresh name in the same directory works.
  Result<OutputFile> ok = OutputFile::Create(sticky + "/y.rvtrace", options);
  ASSERT_TRUE(ok.ok()) << ok.error().ToString();
  EXPECT_TRUE(ok->Commit().ok());
}

TEST_F(SafeFileTest, OwnerIsTheInjectedInvoker) {
  // As root, a real other user; otherwise our own ids (fchown to oneself is allowed), which still runs the call.
  const UserIds owner = geteuid() == 0 ? UserIds{65534, 65533} : UserIds{getuid(), getgid()};
  OutputFileOptions options;
  options.owner = owner;
  const std::string path = dir_ + "/owned";
  ASSERT_TRUE(WriteOutputFile(path, options, WriteHello).ok());
  struct stat s {};
  ASSERT_EQ(stat(path.c_str(), &s), 0);
  EXPECT_EQ(s.st_uid, owner.uid);
  EXPECT_EQ(s.st_gid, owner.gid);
  EXPECT_EQ(s.st_mode & 07777, 0600u);
}

TEST_F(SafeFileTest, PublishAtCreateShowsTheFileAtOnceAndAbandonRemovesIt) {
  const std::string path = dir_ + "/live.rvtrace";
  WriteText(path, "old recording\n");
  OutputFileOptions options;
  options.publish_at_create = true;
  {
    Result<OutputFile> f = OutputFile::Create(path, options);
    ASSERT_TRUE(f.ok()) << f.error().ToString();
    ASSERT_EQ(write(f->fd(), "head\n", 5), 5);
    EXPECT_EQ(ReadText(path), "head\n");  // readable while being written (a crash keeps this prefix)
    f->Abandon();
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(Entries().empty());
}

TEST_F(SafeFileTest, AbandonLeavesAFileThatReplacedOursAlone) {
  const std::string path = dir_ + "/live.rvtrace";
  OutputFileOptions options;
  options.publish_at_create = true;
  Result<OutputFile> f = OutputFile::Create(path, options);
  ASSERT_TRUE(f.ok());
  ASSERT_EQ(unlink(path.c_str()), 0);
  WriteText(path, "someone else's\n");
  f->Abandon();
  EXPECT_EQ(ReadText(path), "someone else's\n");
}

TEST_F(SafeFileTest, FailedWriteLeavesNothing) {
  const std::string path = dir_ + "/export.pb.gz";
  const Status st = WriteOutputFile(path, OutputFileOptions(), [](std::ostream& out) {
    out << "partial";
    return Status(Error(ErrorCode::kBadTrace, "trace is cut"));
  });
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(Entries().empty());
}

TEST_F(SafeFileTest, OutputPastItsCapIsRemovedWithOutputTooLarge) {
  const std::string path = dir_ + "/export.json";
  OutputFileOptions options;
  options.max_bytes = 100 * 1024;
  // Exactly the cap: written.
  auto write = [](size_t n) {
    return [n](std::ostream& out) {
      const std::string chunk(1000, 'x');
      for (size_t left = n; left > 0 && out; left -= std::min(left, chunk.size())) {
        out.write(chunk.data(), static_cast<std::streamsize>(std::min(left, chunk.size())));
      }
      return Status::Ok();
    };
  };
  ASSERT_TRUE(WriteOutputFile(path, options, write(100 * 1024)).ok());
  EXPECT_EQ(fs::file_size(path), 100u * 1024);
  fs::remove(path);
  // One byte more: the stream fails once the cap would be passed, the file is removed, and the error is its own.
  const Status st = WriteOutputFile(path, options, write(100 * 1024 + 1));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kOutputTooLarge);
  EXPECT_NE(st.error().message().find("--max-output-bytes (102400 bytes)"), std::string::npos) << st.error().message();
  EXPECT_TRUE(Entries().empty());
  // The writer's own error does not hide the cap's (an exporter reports a failed stream as kIo).
  const Status io = WriteOutputFile(path, options, [&](std::ostream& out) {
    (void)write(200 * 1024)(out);
    return Status(Error(ErrorCode::kIo, "writing the export failed"));
  });
  EXPECT_EQ(io.error().code(), ErrorCode::kOutputTooLarge);
  EXPECT_TRUE(Entries().empty());
}

TEST_F(SafeFileTest, DirectoryAtThePathIsAnError) {
  ASSERT_EQ(mkdir((dir_ + "/d").c_str(), 0700), 0);
  Result<OutputFile> f = OutputFile::Create(dir_ + "/d", OutputFileOptions());
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.error().code(), ErrorCode::kOutputUnwritable);
  EXPECT_FALSE(OutputFile::Create(dir_ + "/", OutputFileOptions()).ok());
  EXPECT_FALSE(OutputFile::Create(dir_ + "/missing/x", OutputFileOptions()).ok());
}

TEST_F(SafeFileTest, FifoIsWrittenInPlaceOnlyWhenAllowedAndNeverBlocks) {
  const std::string fifo = dir_ + "/pipe";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  OutputFileOptions options;
  Result<OutputFile> refused = OutputFile::Create(fifo, options);
  EXPECT_FALSE(refused.ok());
  options.allow_fifo_or_device = true;
  const auto t0 = std::chrono::steady_clock::now();
  Result<OutputFile> no_reader = OutputFile::Create(fifo, options);  // no reader: ENXIO at once, not a hang
  ASSERT_FALSE(no_reader.ok());
  EXPECT_NE(no_reader.error().message().find("no reader"), std::string::npos) << no_reader.error().message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  const int reader = open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  Result<OutputFile> w = OutputFile::Create(fifo, options);
  ASSERT_TRUE(w.ok()) << w.error().ToString();
  EXPECT_FALSE(w->created());
  ASSERT_EQ(write(w->fd(), "x", 1), 1);
  EXPECT_TRUE(w->Commit().ok());
  char c = 0;
  EXPECT_EQ(read(reader, &c, 1), 1);
  close(reader);
  EXPECT_TRUE(fs::is_fifo(fifo));  // never removed or replaced
}

TEST_F(SafeFileTest, DevNullAndInheritedDescriptors) {
  OutputFileOptions options;
  options.allow_fifo_or_device = true;
  ASSERT_TRUE(WriteOutputFile("/dev/null", options, WriteHello).ok());
  Result<OutputFile> err = OutputFile::Create("/dev/stderr", options);  // a symlink into /proc, but our own fd
  ASSERT_TRUE(err.ok()) << err.error().ToString();
  EXPECT_TRUE(err->Commit().ok());
  EXPECT_GE(fcntl(STDERR_FILENO, F_GETFD), 0);  // the duplicate was closed, not fd 2
}

TEST_F(SafeFileTest, CreateAtRejectsPathsAsNames) {
  const int d = open(dir_.c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(d, 0);
  EXPECT_FALSE(OutputFile::CreateAt(d, dir_, "../escape", OutputFileOptions()).ok());
  EXPECT_FALSE(OutputFile::CreateAt(d, dir_, "..", OutputFileOptions()).ok());
  Result<OutputFile> f = OutputFile::CreateAt(d, dir_, "ok", OutputFileOptions());
  close(d);  // CreateAt keeps its own descriptor
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->path(), dir_ + "/ok");
  EXPECT_TRUE(f->Commit().ok());
  EXPECT_TRUE(fs::exists(dir_ + "/ok"));
}

}  // namespace
}  // namespace rvbpfd
