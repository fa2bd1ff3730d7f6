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
                                                      uint64_t max_bytes, int threads) {
  std::unique_ptr<FilePrefetcher> p(new (std::nothrow) FilePrefetcher());
  if (!p) return nullptr;
  p->paths_ = std::move(files);
  p->max_bytes_ = max_bytes;
  try {
    p->open_files();
    for (int i = 0; i < std::max(1, threads); ++i)
      p->threads_.emplace_back([raw = p.get()] { raw->run(); });
  } catch (const std::system_error&) {  // fewer threads, or none: the loader reads anyway
  } catch (const std::bad_alloc&) {
  }
  if (p->threads_.empty()) return nullptr;
  return p;
}

FilePrefetcher::~FilePrefetcher() {
  stop_.store(true);
  wait();
  for (const auto& f : files_) {
    if (f->map) ::munmap(const_cast<unsigned char*>(f->map), f->size);
    if (f->fd >= 0) ::close(f->fd);
  }
}

void FilePrefetcher::wait() {
  for (std::thread& t : threads_)
    if (t.joinable()) t.join();
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

void FilePrefetcher::open_files() {
  for (const std::string& path : paths_) {
    files_.push_back(std::make_unique<File>());
    File& f = *files_.back();
    // O_NONBLOCK: a FIFO in a model folder must not hang the thread (the loader rejects it).
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) {
      if (fd >= 0) ::close(fd);
      files_done_.fetch_add(1);  // nothing to read: gone through
      continue;
    }
    f.fd = fd;
    f.size = static_cast<uint64_t>(st.st_size);
    f.chunks = (f.size + kChunkBytes - 1) / kChunkBytes;
    void* map = ::mmap(nullptr, f.size, PROT_READ, MAP_SHARED, fd, 0);
    if (map != MAP_FAILED) f.map = static_cast<const unsigned char*>(map);
  }
}

void FilePrefetcher::run() {
  std::vector<unsigned char> buffer, resident;
  try {
    buffer.resize(kChunkBytes);
    resident.resize(kChunkBytes / 4096 + 1);
  } catch (const std::bad_alloc&) {
    return;
  }
  for (;;) {
    if (stop_.load()) return;
    if (max_bytes_ != 0 && read_bytes_.load() >= max_bytes_) return;
    // The next chunk in file order: threads take chunks one at a time, so they read the files
    // front to back together, each keeping one request in flight.
    uint64_t i = next_.fetch_add(1);
    File* f = nullptr;
    for (const auto& file : files_) {
      if (i < file->chunks) {
        f = file.get();
        break;
      }
      i -= file->chunks;
    }
    if (f == nullptr) return;  // past the last chunk
    if (!f->failed.load() && !prefetch_chunk(*f, i, buffer, resident)) f->failed.store(true);
    if (f->chunks_done.fetch_add(1) + 1 == f->chunks) files_done_.fetch_add(1);
  }
}

bool FilePrefetcher::prefetch_chunk(File& f, uint64_t c, std::vector<unsigned char>& buffer,
                                    std::vector<unsigned char>& resident) {
  const uint64_t off = c * kChunkBytes;
  const uint64_t n = std::min(kChunkBytes, f.size - off);
  chunks_.fetch_add(1);
  if (f.map != nullptr) {
    const long page_size = ::sysconf(_SC_PAGESIZE);
    const uint64_t page = page_size > 0 ? static_cast<uint64_t>(page_size) : 4096;
    const uint64_t pages = (n + page - 1) / page;
    if (pages <= resident.size() &&
        ::mincore(const_cast<unsigned char*>(f.map) + off, n, resident.data()) == 0 &&
        std::all_of(resident.begin(), resident.begin() + static_cast<long>(pages),
                    [](unsigned char v) { return (v & 1) != 0; })) {
      cached_bytes_.fetch_add(n);
      return true;
    }
  }
  const ssize_t r = ::pread(f.fd, buffer.data(), n, static_cast<off_t>(off));
  if (r <= 0) return false;  // the loader meets and reports the same error
  read_bytes_.fetch_add(static_cast<uint64_t>(r));
  return true;
}

}  // namespace zimage
