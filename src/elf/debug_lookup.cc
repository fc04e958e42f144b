#include "elf/debug_lookup.h"

#include <elfutils/debuginfod.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

#include "common/shared_library.h"
#include "common/target_file.h"

namespace rvbpfd {
namespace {

std::mutex g_config_mu;
DebugLookupConfig* g_config = nullptr;  // set on first use or by ConfigureDebugLookup; never freed

DebugLookupConfig FromEnvironment() {
  DebugLookupConfig c;
  if (const char* d = std::getenv("RVBPFD_DEBUG_DIR"); d != nullptr && *d == '/') c.debug_dir = d;
  return c;
}

bool IsHex(const std::string& s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

bool NeedsDebugInfo(const ElfFile& elf) {
  return !elf.has_symtab() || !elf.dwarf_file().FindSection(".debug_info").has_value();
}

// The libdebuginfod functions this file calls, resolved from libdebuginfod.so.1 at the first query (the library is
// not linked: common/shared_library.h says why).
struct DebuginfodApi {
  decltype(&debuginfod_begin) begin;
  decltype(&debuginfod_end) end;
  decltype(&debuginfod_set_user_data) set_user_data;
  decltype(&debuginfod_get_user_data) get_user_data;
  decltype(&debuginfod_set_progressfn) set_progressfn;
  decltype(&debuginfod_find_debuginfo) find_debuginfo;
  decltype(&debuginfod_get_url) get_url;
};

Result<DebuginfodApi> OpenDebuginfod() {
  Result<SharedLibrary> lib = SharedLibrary::Open("libdebuginfod.so.1", "libdebuginfod1");
  if (!lib) return lib.error();
  DebuginfodApi api{};
  for (Status st : {lib->Resolve("debuginfod_begin", &api.begin), lib->Resolve("debuginfod_end", &api.end),
                    lib->Resolve("debuginfod_set_user_data", &api.set_user_data),
                    lib->Resolve("debuginfod_get_user_data", &api.get_user_data),
                    lib->Resolve("debuginfod_set_progressfn", &api.set_progressfn),
                    lib->Resolve("debuginfod_find_debuginfo", &api.find_debuginfo),
                    lib->Resolve("debuginfod_get_url", &api.get_url)}) {
    if (!st) return st.error();
  }
  return api;
}

// libdebuginfod, opened once per process (thread-safe), or why it could not be.
const Result<DebuginfodApi>& Debuginfod() {
  static const Result<DebuginfodApi> api = OpenDebuginfod();
  return api;
}

// The deadline of one debuginfod query: libdebuginfod calls the progress function while it waits for the servers;
// a nonzero return aborts the transfer.
struct Deadline {
  std::chrono::steady_clock::time_point at;
};
int AbortAfterDeadline(debuginfod_client* client, long /*done*/, long /*total*/) {
  const auto* d = static_cast<const Deadline*>(Debuginfod()->get_user_data(client));
  return d != nullptr && std::chrono::steady_clock::now() >= d->at ? 1 : 0;
}

struct ClientCloser {
  void operator()(debuginfod_client* c) const { Debuginfod()->end(c); }
};

}  // namespace

const DebugLookupConfig& DebugLookupSettings() {
  std::lock_guard<std::mutex> lock(g_config_mu);
  if (g_config == nullptr) g_config = new DebugLookupConfig(FromEnvironment());
  return *g_config;
}

void ConfigureDebugLookup(const DebugLookupConfig& config) {
  std::lock_guard<std::mutex> lock(g_config_mu);
  if (g_config == nullptr) {
    g_config = new DebugLookupConfig(config);
  } else {
    *g_config = config;
  }
}

Result<FetchedDebugFile> FetchFromDebuginfod(const std::string& build_id, int timeout_s) {
  const char* urls = std::getenv(DEBUGINFOD_URLS_ENV_VAR);
  if (urls == nullptr || *urls == '\0') {
    return Error(ErrorCode::kIo, "debuginfod: " DEBUGINFOD_URLS_ENV_VAR " is not set (ENOSYS)");
  }
  const Result<DebuginfodApi>& api = Debuginfod();
  if (!api) return api.error().Wrap("debuginfod");
  std::unique_ptr<debuginfod_client, ClientCloser> client(api->begin());
  if (client == nullptr) return Error(ErrorCode::kIo, ErrnoMessage("debuginfod: debuginfod_begin", errno));
  Deadline deadline{std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s)};
  api->set_user_data(client.get(), &deadline);
  api->set_progressfn(client.get(), AbortAfterDeadline);
  char* path = nullptr;
  const int fd = api->find_debuginfo(client.get(), reinterpret_cast<const unsigned char*>(build_id.c_str()), 0,
                                           &path);
  std::unique_ptr<char, decltype(&std::free)> path_owner(path, &std::free);
  if (fd < 0) {
    if (std::chrono::steady_clock::now() >= deadline.at) {
      return Error(ErrorCode::kIo, "debuginfod: no answer for build-id " + build_id + " from " + urls + " within " +
                                       std::to_string(timeout_s) + " s (--debuginfod-timeout)");
    }
    return Error(ErrorCode::kIo,
                 ErrnoMessage("debuginfod: build-id " + build_id + " from " + std::string(urls), -fd));
  }
  close(fd);
  if (path == nullptr) return Error(ErrorCode::kIo, "debuginfod: no cache path for build-id " + build_id);
  const char* url = api->get_url(client.get());
  return FetchedDebugFile{path, url != nullptr ? url : urls};
}

std::string FileSystemRootOf(const std::string& path) {
  constexpr std::string_view kProc = "/proc/";
  if (path.rfind(kProc, 0) != 0) return "";
  const size_t slash = path.find('/', kProc.size());
  if (slash == std::string::npos || slash == kProc.size()) return "";
  const std::string pid = path.substr(kProc.size(), slash - kProc.size());
  for (char c : pid) {
    if (c < '0' || c > '9') return "";
  }
  const std::string rest = path.substr(slash);
  if (rest.rfind("/root/", 0) == 0 || rest.rfind("/map_files/", 0) == 0) return path.substr(0, slash) + "/root";
  return "";
}

std::string BuildIdDebugPath(const std::string& root, const std::string& debug_dir, const std::string& build_id) {
  if (build_id.size() < 3 || !IsHex(build_id)) return "";
  return root + debug_dir + "/.build-id/" + build_id.substr(0, 2) + "/" + build_id.substr(2) + ".debug";
}

std::string DebugLookupResult::Summary() const {
  std::string out;
  for (const std::string& t : tried) {
    if (!out.empty()) out += "; ";
    out += t;
  }
  return out;
}

DebugLookupResult AttachDebugInfo(ElfFile* elf, const DebugLookupConfig& config, const DebugFetcher& fetch) {
  DebugLookupResult r;
  if (!NeedsDebugInfo(*elf)) return r;
  const std::string& build_id = elf->build_id();
  if (build_id.empty()) {
    r.tried.push_back(elf->path() + " has no build-id: its debug file cannot be looked up");
    return r;
  }
  // Attaches the file at `path` if it is this binary's; records why not otherwise.
  auto try_file = [&](const std::string& path, const std::string& source) {
    Result<ElfFile> debug = ElfFile::Open(path);
    if (!debug.ok()) {
      r.tried.push_back(debug.error().message());
      return false;
    }
    Status st = elf->AttachDebugFile(std::move(debug.value()), source);
    if (!st.ok()) {
      r.tried.push_back(st.error().message());
      return false;
    }
    r.attached = true;
    return true;
  };
  std::vector<std::string> roots;
  if (std::string target_root = FileSystemRootOf(elf->origin_path()); !target_root.empty()) roots.push_back(target_root);
  roots.push_back("");
  for (const std::string& root : roots) {
    const std::string path = BuildIdDebugPath(root, config.debug_dir, build_id);
    if (path.empty()) break;
    if (access(path.c_str(), F_OK) != 0) {
      r.tried.push_back(ErrnoMessage(path, errno));
      continue;
    }
    if (try_file(path, "build-id directory " + path)) return r;
  }
  if (fetch == nullptr && config.debuginfod_timeout_s <= 0) {
    r.tried.push_back("debuginfod: disabled (--debuginfod-timeout 0)");
    return r;
  }
  Result<FetchedDebugFile> fetched =
      fetch != nullptr ? fetch(build_id) : FetchFromDebuginfod(build_id, config.debuginfod_timeout_s);
  if (!fetched.ok()) {
    r.tried.push_back(fetched.error().message());
    return r;
  }
  try_file(fetched->path, "debuginfod " + fetched->origin + " (cached at " + fetched->path + ")");
  return r;
}

DebugLookupResult AttachDebugInfo(ElfFile* elf) { return AttachDebugInfo(elf, DebugLookupSettings()); }

std::string DebugFileIdentity(const std::string& path, const std::string& build_id, const DebugLookupConfig& config) {
  const std::string target_root = FileSystemRootOf(path);
  for (const std::string& root : {target_root, std::string()}) {
    if (!target_root.empty() || root.empty()) {
      const std::string candidate = BuildIdDebugPath(root, config.debug_dir, build_id);
      if (candidate.empty()) return "none";
      struct stat st;
      if (StatInRoot(candidate, &st) != 0) {
        if (root.empty()) break;
        continue;
      }
      return std::string(root.empty() ? "host:" : "target:") + std::to_string(st.st_dev) + ":" +
             std::to_string(st.st_ino) + ":" + std::to_string(st.st_size) + ":" +
             std::to_string(st.st_mtim.tv_sec * 1'000'000'000LL + st.st_mtim.tv_nsec) + ":" +
             std::to_string(st.st_ctim.tv_sec * 1'000'000'000LL + st.st_ctim.tv_nsec);
    }
  }
  return "none";
}

Result<ElfFile> OpenWithDebugInfo(const std::string& path, DebugLookupResult* lookup) {
  Result<ElfFile> elf = ElfFile::Open(path);
  if (!elf.ok()) return elf;
  DebugLookupResult r = AttachDebugInfo(&elf.value());
  if (lookup != nullptr) *lookup = std::move(r);
  return elf;
}

}  // namespace rvbpfd
