#include "io/fs/prefetch.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>
#include <system_error>

#include "core/read_gate.h"
#include "io/fs/mapped_files.h"

namespace zimage {

// Which chunks of which files have been read (or found cached), shared with the copies waiting
// in wait_readable(): it outlives the prefetcher while one of them is inside.
class FilePrefetcher::Gate final : public ReadGate {
 public:
  struct FileState {
    uint64_t device = 0, inode = 0, chunks = 0;
    std::vector<unsigned char> done;
    bool failed = false;
  };

  explicit Gate(std::vector<FileState> files) : files_(std::move(files)) {}

  void chunk_done(size_t file, uint64_t chunk) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      files_[file].done[chunk] = 1;
    }
    cv_.notify_all();
  }
  void file_failed(size_t file) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      files_[file].failed = true;
    }
    cv_.notify_all();
  }
  // The read-ahead reads nothing more (stopped, at its limit, or every chunk taken).
  void end() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ended_ = true;
    }
    cv_.notify_all();
  }

  void wait_readable(const void* p, size_t n) noexcept override {
    const std::optional<MappedFileSpot> spot = find_mapped_file(p);
    if (!spot || n == 0) return;
    std::unique_lock<std::mutex> lock(mu_);
    const FileState* f = nullptr;
    for (const FileState& x : files_)
      if (x.device == spot->device && x.inode == spot->inode && x.chunks > 0) f = &x;
    if (f == nullptr) return;  // not a file this read-ahead reads
    const uint64_t len = std::min<uint64_t>(n, spot->left);
    const uint64_t first = spot->offset / kChunkBytes;
    if (first >= f->chunks) return;
    const uint64_t last = std::min(f->chunks - 1, (spot->offset + len - 1) / kChunkBytes);
    auto ready = [&] {
      if (ended_ || f->failed) return true;
      for (uint64_t c = first; c <= last; ++c)
        if (!f->done[c]) return false;
      return true;
    };
    if (ready()) return;
    lock.unlock();
    if (cached(p, len)) return;  // read by someone else already: nothing to wait for
    const auto t0 = std::chrono::steady_clock::now();
    lock.lock();
    // Bounded: a read-ahead stuck on a broken disk must not hold the load longer than the
    // load's own reads would be held.
    cv_.wait_for(lock, std::chrono::seconds(60), ready);
    ++waits_;
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  void add_stats(Stats& s) {
    std::lock_guard<std::mutex> lock(mu_);
    s.gate_waits = waits_;
    s.gate_wait_seconds = wait_seconds_;
  }

 private:
  // Whether every page of [p, p + n) is in the page cache (mincore), in steps of a fixed buffer.
  static bool cached(const void* p, size_t n) noexcept {
    const long ps = ::sysconf(_SC_PAGESIZE);
    const uintptr_t page = ps > 0 ? static_cast<uintptr_t>(ps) : 4096;
    uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
    const uintptr_t end = reinterpret_cast<uintptr_t>(p) + n;
    unsigned char v[1024];
    while (a < end) {
      const size_t pages = std::min<uintptr_t>(sizeof v, (end - a + page - 1) / page);
      if (::mincore(reinterpret_cast<void*>(a), pages * page, v) != 0) return false;
      for (size_t i = 0; i < pages; ++i)
        if ((v[i] & 1) == 0) return false;
      a += pages * page;
    }
    return true;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<FileState> files_;  // parallel to the prefetcher's files_, never resized
  bool ended_ = false;
  uint64_t waits_ = 0;
  double wait_seconds_ = 0;
};

std::unique_ptr<FilePrefetcher> FilePrefetcher::start(std::vector<std::string> files,
                                                      Options options) {
  std::unique_ptr<FilePrefetcher> p(new (std::nothrow) FilePrefetcher());
  if (!p) return nullptr;
  p->paths_ = std::move(files);
  p->max_bytes_ = options.max_bytes;
  p->before_chunk_ = std::move(options.before_chunk);
  try {
    p->open_files();
    std::vector<Gate::FileState> states;
    for (const auto& f : p->files_) {
      Gate::FileState st;
      st.device = f->device;
      st.inode = f->inode;
      st.chunks = f->chunks;
      st.done.assign(f->chunks, 0);
      states.push_back(std::move(st));
    }
    p->gate_ = std::make_shared<Gate>(std::move(states));
  } catch (const std::bad_alloc&) {  // no read-ahead: the loader reads anyway
    return nullptr;
  }
  // Counted before any thread runs, so that the last one out (which ends the gate) is the last.
  const int want = std::max(1, options.threads);
  if (options.slices)
    p->slices_per_file_ = options.slices_per_file > 0 ? options.slices_per_file : want;
  p->running_.store(want);
  int started = 0;
  try {
    for (; started < want; ++started) p->threads_.emplace_back([raw = p.get()] { raw->run(); });
  } catch (const std::system_error&) {  // fewer threads, or none
  } catch (const std::bad_alloc&) {
  }
  if (started < want && p->running_.fetch_sub(want - started) == want - started) p->gate_->end();
  if (p->threads_.empty()) return nullptr;
  if (options.gate) p->gate_registered_ = add_read_gate(p->gate_);
  return p;
}

FilePrefetcher::~FilePrefetcher() {
  stop_.store(true);
  if (gate_) {
    gate_->end();  // copies waiting in it go on (they read the disk themselves)
    if (gate_registered_) remove_read_gate(gate_.get());
  }
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
  if (gate_) gate_->add_stats(s);
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
  uint64_t chunks_before = 0;
  for (const std::string& path : paths_) {
    files_.push_back(std::make_unique<File>());
    first_chunk_.push_back(chunks_before);
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
    f.device = static_cast<uint64_t>(st.st_dev);
    f.inode = static_cast<uint64_t>(st.st_ino);
    f.chunks = (f.size + kChunkBytes - 1) / kChunkBytes;
    chunks_before += f.chunks;
    void* map = ::mmap(nullptr, f.size, PROT_READ, MAP_SHARED, fd, 0);
    if (map != MAP_FAILED) f.map = static_cast<const unsigned char*>(map);
  }
}

void FilePrefetcher::run() {
  // The last thread out tells the gate that nothing more will be read.
  struct Leave {
    FilePrefetcher* p;
    ~Leave() {
      if (p->running_.fetch_sub(1) == 1 && p->gate_) p->gate_->end();
    }
  } leave{this};
  // Not zeroed: with a warm page cache nothing is read, and its pages are never touched.
  std::unique_ptr<unsigned char[]> buffer(new (std::nothrow) unsigned char[kChunkBytes]);
  std::vector<unsigned char> resident;
  try {
    resident.resize(kChunkBytes / 4096 + 1);
  } catch (const std::bad_alloc&) {
    return;
  }
  if (!buffer) return;
  auto more = [&] { return !stop_.load() && (max_bytes_ == 0 || read_bytes_.load() < max_bytes_); };
  if (slices_per_file_ > 0) {
    // Each file in `slices_per_file_` contiguous slices, taken in order (the first file's slices,
    // then the next file's) and each read front to back by the thread that took it: as many
    // sequential streams as threads. Taken rather than assigned, so threads that could not start
    // (or stopped early) leave no slice unread.
    const auto per_file = static_cast<uint64_t>(slices_per_file_);
    for (;;) {
      if (!more()) return;
      const uint64_t item = next_.fetch_add(1);
      const uint64_t k = item / per_file, j = item % per_file;
      if (k >= files_.size()) return;
      const uint64_t n = files_[k]->chunks, per = (n + per_file - 1) / per_file;
      const uint64_t first = std::min(n, per * j), last = std::min(n, first + per);
      for (uint64_t i = first; i < last; ++i) {
        if (!more()) return;
        take_chunk(k, i, first_chunk_[k] + i, buffer.get(), resident);
      }
    }
  }
  for (;;) {
    if (!more()) return;
    // The next chunk in file order: threads take chunks one at a time, so they read the files
    // front to back together, each keeping one request in flight.
    const uint64_t index = next_.fetch_add(1);
    uint64_t i = index;
    size_t k = 0;
    for (; k < files_.size() && i >= files_[k]->chunks; ++k) i -= files_[k]->chunks;
    if (k == files_.size()) return;  // past the last chunk
    take_chunk(k, i, index, buffer.get(), resident);
  }
}

void FilePrefetcher::take_chunk(size_t k, uint64_t i, uint64_t index, unsigned char* buffer,
                                std::vector<unsigned char>& resident) {
  File& f = *files_[k];
  if (before_chunk_) before_chunk_(index);
  if (!f.failed.load()) {
    if (prefetch_chunk(f, i, buffer, resident)) {
      gate_->chunk_done(k, i);
    } else {
      f.failed.store(true);
      gate_->file_failed(k);
    }
  }
  if (f.chunks_done.fetch_add(1) + 1 == f.chunks) files_done_.fetch_add(1);
}

bool FilePrefetcher::prefetch_chunk(File& f, uint64_t c, unsigned char* buffer,
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
  const ssize_t r = ::pread(f.fd, buffer, n, static_cast<off_t>(off));
  if (r <= 0) return false;  // the loader meets and reports the same error
  read_bytes_.fetch_add(static_cast<uint64_t>(r));
  return true;
}

}  // namespace zimage
