#include "common/cache_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "common/target_file.h"

namespace rvbpfd {

std::optional<std::string> ReadCacheFile(const std::string& path, uint64_t max_bytes) {
  Result<MappedFile> m = MappedFile::Map(path, "cache file", max_bytes);
  if (!m) return std::nullopt;
  return std::string(reinterpret_cast<const char*>(m->data()), m->size());
}

void WriteCacheFile(const std::string& cache_dir, const std::string& path, const std::string& text) {
  mkdir(cache_dir.c_str(), 0755);
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return;
  size_t done = 0;
  bool ok = true;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ok = false;
      break;
    }
    done += static_cast<size_t>(n);
  }
  ok = close(fd) == 0 && ok;
  if (!ok || rename(tmp.c_str(), path.c_str()) != 0) unlink(tmp.c_str());
}

}  // namespace rvbpfd
