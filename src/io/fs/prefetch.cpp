#include "io/fs/prefetch.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>
#include <system_error>

namespace zimage {

std::unique_ptr<FilePrefetcher> FilePrefetcher::start(std::vector<std::string> files,
                                                      uint64_t max_bytes) {
  std::unique_ptr<FilePrefetcher> p(new (std::nothrow) FilePrefetcher());
  if (!p) return nullptr;
  p->files_ = std::move(files);
  p->max_bytes_ = max_bytes;
  try {
    p->thread_ = std::thread([raw = p.get()] { raw->run(); });
  } catch (const std::system_error&) {
    return nullptr;  // no thread: the loader reads the files itself
  }
  return p;
}

FilePrefetcher::~FilePrefetcher() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void FilePrefetcher::wait() {
  if (thread_.joinable()) thread_.join();
}

FilePrefetcher::Stats FilePrefetcher::stats() const {
  Stats s;
  s.chunks = chunks_.load();
  s.read_bytes = read_bytes_.load();
  s.cached_bytes = cached_bytes_.load();
  s.files = files_done_.load();
  return s;
}

uint64_t FilePrefetcher::default_limit() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  unsigned long long kib = 0;
  bool found = false;
  while (std::fgets(line, sizeof line, f)) {
    if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
      found = true;
      break;
    }
  }
  std::fclose(f);
  return found ? static_cast<uint64_t>(kib) * 1024 / 2 : 0;
}

void FilePrefetcher::run() {
  std::vector<unsigned char> buffer;
  try {
    buffer.resize(kChunkBytes);
  } catch (const std::bad_alloc&) {
    return;
  }
  for (const std::string& path : files_) {
    if (stop_.load()) break;
    if (max_bytes_ != 0 && read_bytes_.load() >= max_bytes_) break;
    prefetch_file(path, buffer);
    files_done_.fetch_add(1);
  }
}

void FilePrefetcher::prefetch_file(const std::string& path, std::vector<unsigned char>& buffer) {
  // O_NONBLOCK: a FIFO in a model folder must not hang the thread (the loader rejects it).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) {
    ::close(fd);
    return;
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  const long page_size = ::sysconf(_SC_PAGESIZE);
  const uint64_t page = page_size > 0 ? static_cast<uint64_t>(page_size) : 4096;
  std::vector<unsigned char> resident(kChunkBytes / page + 1);
  for (uint64_t off = 0; off < size && !stop_.load(); off += kChunkBytes) {
    if (max_bytes_ != 0 && read_bytes_.load() >= max_bytes_) break;
    const uint64_t n = std::min(kChunkBytes, size - off);
    chunks_.fetch_add(1);
    bool cached = false;
    if (map != MAP_FAILED &&
        ::mincore(static_cast<unsigned char*>(map) + off, n, resident.data()) == 0) {
      const uint64_t pages = (n + page - 1) / page;
      cached = std::all_of(resident.begin(), resident.begin() + static_cast<long>(pages),
                           [](unsigned char v) { return (v & 1) != 0; });
    }
    if (cached) {
      cached_bytes_.fetch_add(n);
      continue;
    }
    const ssize_t r = ::pread(fd, buffer.data(), n, static_cast<off_t>(off));
    if (r <= 0) break;  // the loader meets and reports the same error
    read_bytes_.fetch_add(static_cast<uint64_t>(r));
  }
  if (map != MAP_FAILED) ::munmap(map, size);
  ::close(fd);
}

}  // namespace zimage
