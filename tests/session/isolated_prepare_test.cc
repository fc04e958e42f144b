#include "session/isolated_prepare.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "common/threads.h"
#include "elf/elf_fixtures.h"

namespace rvbpfd {
namespace {

using testing::CompileC;
using testing::TempDir;
using testing::WriteFile;
using State = PrepareChildOutcome::State;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A stand-in for rvbpfd as the child: a shell script with `body`; $OUT is a file it may write to.
class IsolatedPrepareTest : public ::testing::Test {
 protected:
  std::string Script(const std::string& body) {
    const std::string path = dir_.Join("child-" + std::to_string(++scripts_) + ".sh");
    WriteFile(path, "#!/bin/sh\nOUT='" + out_ + "'\n" + body + "\n");
    chmod(path.c_str(), 0700);
    return path;
  }
  PrepareChildRequest Request(const std::string& exe) {
    PrepareChildRequest r;
    r.exe = exe;
    r.path = "/proc/4242/root/usr/lib/libruby.so.3.4";
    r.ruby_version = "3.4.5";
    r.cache_dir = dir_.Join("cache");
    r.timeout = std::chrono::milliseconds(20'000);
    return r;
  }

  TempDir dir_;
  std::string out_ = dir_.Join("out");
  int scripts_ = 0;
};

TEST_F(IsolatedPrepareTest, AnOkAnswerMeansWarmedAndTheChildGetsItsArgumentsAndTheBinarysDescriptor) {
  const std::string binary = dir_.Join("libruby.so");
  WriteFile(binary, "not really ELF");
  const int raw = open(binary.c_str(), O_PATH | O_CLOEXEC);
  ASSERT_GE(raw, 0);
  FileFd handle(raw);
  PrepareChildRequest r = Request(Script(
      "printf '%s\\n' \"$@\" > \"$OUT\"; readlink /proc/$$/fd/4 >> \"$OUT\"; printf 'ok\\n' >&3"));
  r.handle = &handle;
  r.origin_path = "/usr/lib/libruby.so.3.4";
  r.want_stacks = false;
  const PrepareChildOutcome o = WarmBinaryCaches(r);
  EXPECT_EQ(o.state, State::kWarmed) << o.error.message();
  EXPECT_EQ(ReadAll(out_), std::string(kPrepareChildCommand) + "\n1\n" + r.path + "\n" + r.origin_path + "\n3.4.5\n" +
                               r.cache_dir + "\n0\n" + binary + "\n");
}

TEST_F(IsolatedPrepareTest, WithoutADescriptorTheChildOpensThePathAndHasNoFd4) {
  PrepareChildRequest r = Request(Script(
      "printf '%s,' \"$2\" > \"$OUT\"; if [ -e /proc/$$/fd/4 ]; then echo fd4 >> \"$OUT\"; fi; printf 'ok\\n' >&3"));
  EXPECT_EQ(WarmBinaryCaches(r).state, State::kWarmed);
  EXPECT_EQ(ReadAll(out_), "0,");
}

TEST_F(IsolatedPrepareTest, TheChildsErrorComesBackWithItsCodeAndMessage) {
  const std::string message = "no .symtab in /x: install the matching debug symbols";
  PrepareChildRequest r =
      Request(Script("printf 'error 6 " + std::to_string(message.size()) + "\\n" + message + "' >&3"));
  const PrepareChildOutcome o = WarmBinaryCaches(r);
  EXPECT_EQ(o.state, State::kFailed);
  EXPECT_EQ(o.error.code(), ErrorCode::kNoSymbols);
  EXPECT_EQ(o.error.message(), message);
}

TEST_F(IsolatedPrepareTest, ACrashedChildIsAnErrorNamingTheSignalAndTheBinary) {
  const PrepareChildOutcome o = WarmBinaryCaches(Request(Script("kill -SEGV $$")));
  EXPECT_EQ(o.state, State::kFailed);
  EXPECT_EQ(o.error.code(), ErrorCode::kInternal);
  EXPECT_NE(o.error.message().find("killed by signal 11"), std::string::npos) << o.error.message();
  EXPECT_NE(o.error.message().find("/proc/4242/root/usr/lib/libruby.so.3.4"), std::string::npos);
}

TEST_F(IsolatedPrepareTest, AChildThatExitsWithoutAnAnswerIsAnError) {
  const PrepareChildOutcome o = WarmBinaryCaches(Request(Script("exit 3")));
  EXPECT_EQ(o.state, State::kFailed);
  EXPECT_NE(o.error.message().find("exited with status 3 without an answer"), std::string::npos)
      << o.error.message();
}

TEST_F(IsolatedPrepareTest, AChildPastTheDeadlineIsKilledAndReaped) {
  PrepareChildRequest r = Request(Script("echo $$ > \"$OUT\"; exec sleep 60"));
  r.timeout = std::chrono::milliseconds(300);
  const PrepareChildOutcome o = WarmBinaryCaches(r);
  EXPECT_EQ(o.state, State::kFailed);
  EXPECT_EQ(o.error.code(), ErrorCode::kIo);
  EXPECT_NE(o.error.message().find("took more than 300 ms"), std::string::npos) << o.error.message();
  const pid_t pid = static_cast<pid_t>(std::stol(ReadAll(out_)));
  EXPECT_NE(kill(pid, 0), 0) << "the child still exists (not killed, or not reaped: a zombie)";
  EXPECT_EQ(errno, ESRCH);
}

TEST_F(IsolatedPrepareTest, AChildThatAnswersButDoesNotExitIsKilled) {
  PrepareChildRequest r = Request(Script("echo $$ > \"$OUT\"; printf 'ok\\n' >&3; exec 3>&-; exec sleep 60"));
  r.timeout = std::chrono::milliseconds(300);
  const PrepareChildOutcome o = WarmBinaryCaches(r);
  EXPECT_EQ(o.state, State::kFailed);
  EXPECT_NE(o.error.message().find("did not exit"), std::string::npos) << o.error.message();
  EXPECT_NE(kill(static_cast<pid_t>(std::stol(ReadAll(out_))), 0), 0);
}

TEST_F(IsolatedPrepareTest, AFloodOfOutputIsRefusedAndTheChildKilled) {
  PrepareChildRequest r = Request(Script("echo $$ > \"$OUT\"; exec yes ok >&3"));
  const PrepareChildOutcome o = WarmBinaryCaches(r);
  EXPECT_EQ(o.state, State::kFailed);
  EXPECT_NE(o.error.message().find("malformed"), std::string::npos) << o.error.message();
  EXPECT_NE(kill(static_cast<pid_t>(std::stol(ReadAll(out_))), 0), 0);
}

TEST_F(IsolatedPrepareTest, NoChildCanStartWithoutAnExecutableOrACacheDir) {
  PrepareChildRequest r = Request(dir_.Join("no-such-program"));
  PrepareChildOutcome o = WarmBinaryCaches(r);
  EXPECT_EQ(o.state, State::kNotStarted);
  EXPECT_NE(o.error.message().find("posix_spawn"), std::string::npos) << o.error.message();
  r = Request(Script("printf 'ok\\n' >&3"));
  r.cache_dir = "";
  o = WarmBinaryCaches(r);
  EXPECT_EQ(o.state, State::kNotStarted);
}

// The agent prepares binaries on helper threads that block the daemon's signals, and it ignores SIGPIPE: the child
// must start with neither (a blocked SIGTERM would outlive a kill request; an ignored SIGPIPE hides a broken pipe).
TEST_F(IsolatedPrepareTest, TheChildStartsWithNoBlockedOrIgnoredSignals) {
  // Read with shell builtins only: a command the shell forks (e.g. grep) would read the shell's status while dash
  // has every signal blocked around its vfork, until it is scheduled again after the exec (seen on a loaded machine).
  const std::string exe = Script(
      "while IFS= read -r line; do case \"$line\" in SigBlk:*|SigIgn:*) printf '%s\\n' \"$line\";; esac; "
      "done < /proc/$$/status > \"$OUT\"; printf 'ok\\n' >&3");
  void (*old_pipe)(int) = signal(SIGPIPE, SIG_IGN);
  PrepareChildOutcome o;
  std::thread t = StartHelperThread([&] { o = WarmBinaryCaches(Request(exe)); });
  t.join();
  signal(SIGPIPE, old_pipe);
  EXPECT_EQ(o.state, State::kWarmed);
  // Signals 1-31 (glibc reserves 32 and 33 for itself: posix_spawn leaves them as this process has them).
  const std::string status = ReadAll(out_);
  const size_t blk = status.find("SigBlk:\t"), ign = status.find("SigIgn:\t");
  ASSERT_NE(blk, std::string::npos) << status;
  ASSERT_NE(ign, std::string::npos) << status;
  EXPECT_EQ(std::stoull(status.substr(blk + 8, 16), nullptr, 16) & 0x7fffffffu, 0u) << status;
  EXPECT_EQ(std::stoull(status.substr(ign + 8, 16), nullptr, 16) & 0x7fffffffu, 0u) << status;
}

TEST(PrepareAnswerTest, RoundTrips) {
  EXPECT_TRUE(DecodePrepareAnswer(EncodePrepareAnswer(Status::Ok()), "/b"));
  const Error e(ErrorCode::kUnsupportedVersion, "CRuby 3.1 has no\nscheduler events \x01");
  const Status back = DecodePrepareAnswer(EncodePrepareAnswer(e), "/b");
  ASSERT_FALSE(back);
  EXPECT_EQ(back.error().code(), e.code());
  EXPECT_EQ(back.error().message(), e.message());
}

TEST(PrepareAnswerTest, MalformedAnswersAreInternalErrorsNamingTheBinary) {
  for (const std::string& bad : {std::string(""), std::string("ok"), std::string("ok\nmore"), std::string("okay\n"),
                                std::string("error 6\nx"), std::string("error x 1\nx"), std::string("error 6 x\nx"),
                                std::string("error 99 1\nx"), std::string("error 0 1\nx"), std::string("error 6 2\nx"),
                                std::string("error 6 0\nx"), std::string("error -6 1\nx"),
                                std::string("error 6 99999999999\nx"), std::string("error 6 5000\n") + std::string(5000, 'x'),
                                std::string("warn 6 1\nx")}) {
    const Status st = DecodePrepareAnswer(bad, "/some/binary");
    ASSERT_FALSE(st) << bad;
    EXPECT_EQ(st.error().code(), ErrorCode::kInternal) << bad;
    EXPECT_NE(st.error().message().find("/some/binary"), std::string::npos) << bad;
  }
}

// The child's own side, run in this process with fd 3 (and 4) pointed at pipes and files as the parent sets them up.
class PrepareChildSideTest : public ::testing::Test {
 protected:
  // Runs RunPrepareChild(args) with fd 3 a pipe (and fd 4 `fd4` when >= 0), returns what it wrote there.
  std::string Run(std::vector<std::string> args, int fd4 = -1) {
    const int saved3 = fcntl(3, F_DUPFD_CLOEXEC, 10), saved4 = fcntl(4, F_DUPFD_CLOEXEC, 10);  // -1: not open
    int raw[2];
    EXPECT_EQ(pipe(raw), 0);
    // Above 10, so neither end is fd 3 or 4 itself (a free fd 3 is where pipe() puts the read end).
    const int p[2] = {fcntl(raw[0], F_DUPFD_CLOEXEC, 10), fcntl(raw[1], F_DUPFD_CLOEXEC, 10)};
    close(raw[0]);
    close(raw[1]);
    dup2(p[1], 3);
    close(p[1]);
    if (fd4 >= 0) dup2(fd4, 4);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    status_ = RunPrepareChild(argv);
    close(3);  // RunPrepareChild leaves fd 3 to the process's exit; the reader needs its EOF
    if (fd4 >= 0 && fcntl(4, F_GETFD) >= 0) close(4);
    std::string got;
    char buf[512];
    for (ssize_t n; (n = read(p[0], buf, sizeof(buf))) > 0;) got.append(buf, static_cast<size_t>(n));
    close(p[0]);
    if (saved3 >= 0) {
      dup2(saved3, 3);
      close(saved3);
    }
    if (saved4 >= 0) {
      dup2(saved4, 4);
      close(saved4);
    }
    return got;
  }
  TempDir dir_;
  int status_ = -1;
};

TEST_F(PrepareChildSideTest, WrongArgumentsAreAUsageAnswer) {
  Status st = DecodePrepareAnswer(Run({"1", "2"}), "/b");
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code(), ErrorCode::kUsage);
  EXPECT_EQ(status_, 0);
  st = DecodePrepareAnswer(Run({"2", "/b", "", "3.4.5", dir_.path(), "1"}), "/b");
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code(), ErrorCode::kUsage);
}

TEST_F(PrepareChildSideTest, AFileThatIsNotAVmBinaryIsTheAnalysissOwnError) {
  const std::string not_elf = dir_.Join("libruby.so.3.4");
  WriteFile(not_elf, "#!/bin/sh\n");
  Status st = DecodePrepareAnswer(Run({"0", not_elf, "", "3.4.5", dir_.Join("cache"), "1"}), not_elf);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().code(), ErrorCode::kInternal) << st.error().message();
  EXPECT_NE(st.error().message().find(not_elf), std::string::npos) << st.error().message();

  // An ELF file without the VM: the site finder's refusal, through the descriptor in fd 4.
  const std::string lib = dir_.Join("libnotruby.so");
  ASSERT_TRUE(CompileC("int not_ruby(void) { return 1; }\n", lib, "-shared -fPIC -O0"));
  const int handle = open(lib.c_str(), O_PATH | O_CLOEXEC);
  ASSERT_GE(handle, 0);
  st = DecodePrepareAnswer(Run({"1", lib, "", "3.4.5", dir_.Join("cache"), "0"}, handle), lib);
  close(handle);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().code(), ErrorCode::kInternal) << st.error().message();
  EXPECT_NE(st.error().message().find(lib), std::string::npos) << st.error().message();
}

}  // namespace
}  // namespace rvbpfd
