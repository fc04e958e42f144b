// Fakes for the fleet agent's unit tests: a /proc tree with fake Ruby processes, a probe backend that records what
// the agent asked of BPF and delivers injected records, a settable clock, a recording sink.
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

class FakeBackend : public ProbeBackend {
 public:
  struct Group {
    std::string path;
    std::vector<SiteSpec> sites;
    bool attached = true;
    int attaches = 1;
  };
  void SetHandlers(RecordHandler on_record, StackHandler on_stack) override {
    on_record_ = std::move(on_record);
    on_stack_ = std::move(on_stack);
  }
  Result<uint8_t> AddBinary(const rv_offsets&) override { return static_cast<uint8_t>(binaries++); }
  Status SetWalkConfig(uint8_t, const rv_walk_config&) override { return Status::Ok(); }
  Result<int> AttachGroup(const std::string& path, const std::vector<SiteSpec>& sites) override {
    groups.push_back(Group{path, sites});
    return static_cast<int>(groups.size() - 1);
  }
  void DetachGroup(int g) override {
    if (g >= 0) groups.at(static_cast<size_t>(g)).attached = false;
  }
  Status ReattachGroup(int g, const std::string& path) override {
    Group& grp = groups.at(static_cast<size_t>(g));
    if (!grp.attached) {
      grp.attached = true;
      grp.path = path;
      ++grp.attaches;
    }
    return Status::Ok();
  }
  bool GroupAttached(int g) const override { return g >= 0 && groups.at(static_cast<size_t>(g)).attached; }
  Status AddPid(uint32_t pid, const rv_pidns& ns, std::span<const std::pair<uint32_t, uint32_t>> threads) override {
    pids.insert(pid);
    pidns[pid] = ns;
    ns_threads[pid].assign(threads.begin(), threads.end());
    pid_traps[pid] = {};  // as BPF: the count starts over
    return Status::Ok();
  }
  Status RemovePid(uint32_t pid) override {
    pids.erase(pid);
    pid_traps.erase(pid);
    return Status::Ok();
  }
  Status StartSampling(int hz) override {
    sampling_hz = hz;
    return Status::Ok();
  }
  ProcessEcInstaller::State PollEc(ProcessEcInstaller&) override {
    ++ec_polls;
    return ProcessEcInstaller::State::kInstalled;
  }
  Status WatchProcesses() override {
    watching = true;
    return Status::Ok();
  }
  // Delivers everything queued (the first call with timeout > 0 as well: tests never wait).
  Result<int> Poll(int) override {
    int n = 0;
    std::vector<Queued> q;
    q.swap(queue_);
    for (Queued& r : q) {
      if (r.has_stack) {
        rv_stack_header h{};
        h.nframes = static_cast<uint32_t>(r.frames.size());
        on_stack_(r.rec, h, r.frames, r.gvl ? &*r.gvl : nullptr);
      } else {
        on_record_(r.rec);
      }
      ++n;
    }
    return n;
  }
  rv_counters ReadCounters() const override { return counters; }
  std::unordered_map<uint32_t, rv_pid_traps> ReadPidTraps() const override {
    std::unordered_map<uint32_t, rv_pid_traps> out;
    for (uint32_t pid : pids) {
      auto it = pid_traps.find(pid);
      out[pid] = it == pid_traps.end() ? rv_pid_traps{} : it->second;
    }
    return out;
  }
  // Hits of a process that became no record (BPF discarded them), e.g. rb_mutex_lock entered by IO#write.
  void DiscardedTraps(uint32_t pid, uint64_t n) {
    if (pids.count(pid)) pid_traps[pid].traps += n;
  }
  // Hits (already counted) that BPF found cold: no trap on their CPU for rv_config.cold_gap_ns before them.
  void ColdTraps(uint32_t pid, uint64_t n) {
    if (pids.count(pid)) pid_traps[pid].cold += n;
  }
  // Hits of a single-stepped site (counted as traps too).
  void SteppedTraps(uint32_t pid, uint64_t n) {
    if (pids.count(pid)) {
      pid_traps[pid].traps += n;
      pid_traps[pid].stepped += n;
    }
  }

  // Injection.
  // A scheduler event is one trap of a watched process (as BPF counts them); exec/exit/fork records are not.
  // tid: the host tid of the thread the record is about (0: unknown).
  void Record(uint64_t ts, uint32_t pid, uint16_t kind, uint64_t th = 0, uint32_t tid = 0) {
    if (kind < RV_EV_KIND_COUNT && pids.count(pid)) ++pid_traps[pid].traps;
    rv_record r{};
    r.ts_ns = ts;
    r.pid = pid;
    r.kind = kind;
    r.th = th;
    r.tid = tid;
    queue_.push_back(Queued{r, false, {}});
  }
  // A sample (or stacked event) whose frames are named "m<addr>" by FakeFrameSource.
  // `gvl`: the GVL reading the sample carries (RV_REC_HAS_GVL), none by default.
  void Stack(uint64_t ts, uint32_t pid, uint16_t kind, uint64_t th, std::vector<uint64_t> addrs,
             uint32_t flags = 0, uint32_t tid = 0, std::optional<rv_gvl_reading> gvl = std::nullopt) {
    if (kind < RV_EV_KIND_COUNT && pids.count(pid)) ++pid_traps[pid].traps;
    rv_record r{};
    r.ts_ns = ts;
    r.pid = pid;
    r.kind = kind;
    r.th = th;
    r.tid = tid;
    r.flags = flags | RV_REC_HAS_STACK | (gvl ? RV_REC_HAS_GVL : 0u);
    std::vector<rv_ruby_frame> frames;
    for (uint64_t a : addrs) {
      rv_ruby_frame f{};
      f.addr = a;
      frames.push_back(f);
    }
    queue_.push_back(Queued{r, true, frames, gvl});
  }
  size_t attached_groups() const {
    size_t n = 0;
    for (const Group& g : groups) n += g.attached ? 1 : 0;
    return n;
  }

  std::vector<Group> groups;
  std::set<uint32_t> pids;
  std::map<uint32_t, rv_pid_traps> pid_traps;  // uprobe hits per watched pid
  std::map<uint32_t, rv_pidns> pidns;                                            // AddPid's namespace, per pid
  std::map<uint32_t, std::vector<std::pair<uint32_t, uint32_t>>> ns_threads;  // AddPid's (ns tid, host tid)
  rv_counters counters{};
  int binaries = 0;
  int sampling_hz = 0;
  int ec_polls = 0;
  bool watching = false;

 private:
  struct Queued {
    rv_record rec;
    bool has_stack;
    std::vector<rv_ruby_frame> frames;
    std::optional<rv_gvl_reading> gvl;
  };
  RecordHandler on_record_;
  StackHandler on_stack_;
  std::vector<Queued> queue_;
};

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
};

// Two low sites (thread start, GC enter) and one high site (RESUMED), stacks on.
inline PreparedBinary FakePrepared(const std::string& version) {
  PreparedBinary p;
  p.sites.ruby_version = version;
  ProbeSite a;
  a.file_offset = 0x100;
  a.event = RV_EV_THREAD_STARTED;
  ProbeSite b;
  b.file_offset = 0x200;
  b.event = RV_EV_GC_ENTER;
  ProbeSite c;
  c.file_offset = 0x300;
  c.event = RV_EV_THREAD_RESUMED;
  p.sites.sites = {a, b, c};
  p.stacks = StackSetup{};
  return p;
}

}  // namespace rvbpfd::agent_testing

#endif  // RVBPFD_TESTS_AGENT_AGENT_FAKES_H_
