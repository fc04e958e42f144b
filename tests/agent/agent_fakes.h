// Fakes for the fleet agent's unit tests: a /proc tree with fake Ruby processes, a probe backend that records what
// the agent asked of BPF and delivers injected records (probe/fake_probe_backend.h), a settable clock, a recording
// sink.
#ifndef RVBPFD_TESTS_AGENT_AGENT_FAKES_H_
#define RVBPFD_TESTS_AGENT_AGENT_FAKES_H_

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "agent/agent_env.h"
#include "elf/elf_fixtures.h"
#include "probe/fake_probe_backend.h"
#include "probe/probe_backend.h"
#include "session/vm_binary.h"
#include "sink/sink.h"

namespace rvbpfd::agent_testing {

using rvbpfd::testing::CompileC;
using rvbpfd::testing::TempDir;
using rvbpfd::testing::WriteFile;

// A /proc tree. Processes see a root file system (a directory under the temp dir): several processes sharing one root
// share their binaries (one inode), a process with its own root (a "container") has its own copies.
class FakeProc {
 public:
  std::string root() const { return dir_.Join("proc"); }
  std::string RootFs(const std::string& name) const { return dir_.Join("fs-" + name); }

  // A fake libruby.so (an ELF defining ruby_version) at <rootfs>/usr/lib/libruby.so.<version>.
  std::string AddLibruby(const std::string& rootfs, const std::string& version) {
    const std::string path = "/usr/lib/libruby.so." + version;
    const std::string host = RootFs(rootfs) + path;
    if (!std::filesystem::exists(host)) {
      CompileC("const char ruby_version[] = \"" + version + "\";\nint ruby_vm_event_flags;\n", host,
               "-shared -fPIC -O0");
    }
    return path;
  }
  // A non-Ruby executable at <rootfs>/bin/<name>.
  std::string AddExe(const std::string& rootfs, const std::string& name) {
    const std::string path = "/bin/" + name;
    const std::string host = RootFs(rootfs) + path;
    if (!std::filesystem::exists(host)) CompileC("int main(void) { return 0; }\n", host, "-O0");
    return path;
  }

  // A process running `exe` (in rootfs) with `mapped` files mapped (as the process sees them).
  void AddProcess(int pid, const std::string& comm, const std::string& rootfs, const std::string& exe,
                  const std::vector<std::string>& mapped, const std::string& environ = "",
                  const std::string& cgroup = "0::/user.slice/session-1.scope\n") {
    const std::string d = PidDir(pid);
    std::filesystem::create_directories(d);
    WriteFile(d + "/comm", comm + "\n");
    WriteFile(d + "/stat", std::to_string(pid) + " (" + comm + ") S 1 1 1 0 -1 0\n");
    WriteFile(d + "/cgroup", cgroup);
    WriteFile(d + "/environ", environ);
    std::error_code ec;
    std::filesystem::remove(d + "/root", ec);
    std::filesystem::remove(d + "/exe", ec);
    std::filesystem::create_directory_symlink(RootFs(rootfs), d + "/root");
    std::filesystem::create_symlink(RootFs(rootfs) + exe, d + "/exe");
    SetMaps(pid, exe, mapped);
    // The host's pid namespace: the same inode as the agent's own.
    std::filesystem::create_directories(d + "/ns");
    std::filesystem::create_directories(root() + "/self/ns");
    if (!std::filesystem::exists(root() + "/self/ns/pid")) WriteFile(root() + "/self/ns/pid", "");
    std::filesystem::remove(d + "/ns/pid", ec);
    std::filesystem::create_hard_link(root() + "/self/ns/pid", d + "/ns/pid");
  }
  // Moves the process into a pid namespace of its own (an inode of its own) with threads (host tid, namespace tid),
  // each with its task/TID/status NSpid line.
  void OwnPidNamespace(int pid, const std::vector<std::pair<int, int>>& threads) {
    const std::string d = PidDir(pid);
    std::filesystem::remove(d + "/ns/pid");
    WriteFile(d + "/ns/pid", "");
    for (const auto& [host, ns] : threads) {
      const std::string t = d + "/task/" + std::to_string(host);
      std::filesystem::create_directories(t);
      WriteFile(t + "/status", "Name:\truby\nTgid:\t" + std::to_string(pid) + "\nNSpid:\t" + std::to_string(host) +
                                   "\t" + std::to_string(ns) + "\nVmPeak:\t1 kB\n");
    }
  }
  void SetMaps(int pid, const std::string& exe, const std::vector<std::string>& mapped) {
    std::string text;
    uint64_t addr = 0x7f0000000000;
    char line[512];
    std::snprintf(line, sizeof(line), "%lx-%lx r-xp 00000000 08:01 1000 %s\n", 0x555500000000ul, 0x555500001000ul,
                  exe.c_str());
    text += line;
    for (const std::string& p : mapped) {
      std::snprintf(line, sizeof(line), "%lx-%lx r-xp 00000000 08:01 1234 %s\n", addr, addr + 0x1000, p.c_str());
      text += line;
      addr += 0x10000;
    }
    WriteFile(PidDir(pid) + "/maps", text);
  }
  void Zombie(int pid, const std::string& comm) {
    WriteFile(PidDir(pid) + "/stat", std::to_string(pid) + " (" + comm + ") Z 1 1 1 0 -1 0\n");
  }
  void Remove(int pid) { std::filesystem::remove_all(PidDir(pid)); }
  std::string PidDir(int pid) const { return root() + "/" + std::to_string(pid); }

 private:
  TempDir dir_;
};

// The probe backend fake is shared with the recorder's tests.
using FakeBackend = rvbpfd::testing::FakeProbeBackend;

class FakeClock : public AgentClock {
 public:
  uint64_t MonotonicNs() const override { return mono; }
  int64_t RealtimeNs() const override { return 1'700'000'000'000'000'000ll + static_cast<int64_t>(mono); }
  uint64_t mono = 1'000'000'000'000;  // 1000 s after boot
};

// Names frame addr A "m<A>"; addr 0 stays unresolved.
class FakeFrameSource : public FrameSource {
 public:
  explicit FakeFrameSource(std::vector<uint64_t>* epochs = nullptr) : epochs_(epochs) {}
  void Resolve(std::span<const rv_ruby_frame> frames, uint64_t gc_epoch, std::vector<FrameInfo>* out) override {
    if (epochs_) epochs_->push_back(gc_epoch);
    out->clear();
    for (const rv_ruby_frame& f : frames) {
      if (f.addr == 0) {
        out->push_back(FrameInfo{"<unresolved>", "", 0, FrameKind::kUnresolved});
      } else {
        out->push_back(FrameInfo{"m" + std::to_string(f.addr), "/app/x.rb", 1, FrameKind::kRuby});
      }
    }
  }

 private:
  std::vector<uint64_t>* epochs_;  // the GC epoch of every Resolve, when the test wants them
};

class RecordingSink : public ProfileSink {
 public:
  void Submit(ProfileUpload upload) override {
    std::lock_guard<std::mutex> l(mu);
    uploads.push_back(std::move(upload));
  }
  void SubmitAll(std::vector<ProfileUpload> all) override {
    std::lock_guard<std::mutex> l(mu);
    ++submit_alls;
    for (ProfileUpload& u : all) uploads.push_back(std::move(u));
  }
  bool Flush(std::chrono::milliseconds) override {
    ++flushes;
    return true;
  }
  SinkStats stats() const override {
    SinkStats s;
    s.delivered = uploads.size();
    return s;
  }
  std::mutex mu;
  std::vector<ProfileUpload> uploads;
  int flushes = 0;
  int submit_alls = 0;  // hand-overs through SubmitAll
};

// A prepared binary with stacks on and three sites: a thread start (low group), a GC enter and a RESUMED (high); with
// `entry_probes` also a Kernel#sleep and a Mutex#lock entry site.
inline PreparedBinary FakePrepared(const std::string& version, bool entry_probes = false) {
  PreparedBinary p;
  p.sites.ruby_version = version;
  auto add = [&p](uint64_t offset, uint8_t event) {
    ProbeSite s;
    s.file_offset = offset;
    s.event = event;
    p.sites.sites.push_back(s);
  };
  add(0x100, RV_EV_THREAD_STARTED);
  add(0x200, RV_EV_GC_ENTER);
  add(0x300, RV_EV_THREAD_RESUMED);
  if (entry_probes) {
    add(0x400, RV_EV_SLEEP_ENTER);
    add(0x500, RV_EV_MUTEX_LOCK_ENTER);
  }
  p.stacks = StackSetup{};
  return p;
}

}  // namespace rvbpfd::agent_testing

#endif  // RVBPFD_TESTS_AGENT_AGENT_FAKES_H_
