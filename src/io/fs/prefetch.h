// Reads weight files into the page cache ahead of the loader, on one background thread, in the
// order the loader will read them. Why: a new process spends its first few hundred milliseconds
// starting CUDA and its libraries, and from a cold page cache the loader's reads fault the mapped
// files in piece by piece; a sequential reader started at once overlaps the disk with that
// start-up and keeps large requests in flight while the uploader copies.
//
// What it does, per 8 MiB chunk of each file: asks the kernel which pages are cached (mincore on a
// read-only mapping) and reads the chunk with pread only when some are not, so a warm page cache
// costs one system call per chunk and no copying. It stops after `max_bytes` read (the caller
// passes what the machine can cache without evicting what it just read), at the end of the list,
// or when destroyed (the destructor waits for the chunk being read). Errors (a file that cannot be
// opened or read) end the prefetch of that file silently: the loader reads it anyway and reports
// its own error. Never throws; a thread that cannot be started means no prefetch.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace zimage {

class FilePrefetcher {
 public:
  struct Stats {
    uint64_t chunks = 0;        // chunks looked at
    uint64_t read_bytes = 0;    // bytes read from files (not already cached)
    uint64_t cached_bytes = 0;  // bytes found cached and skipped
    int files = 0;              // files finished (or ended by an error)
  };

  static constexpr uint64_t kChunkBytes = uint64_t{8} << 20;

  // Starts reading `files` in order; `max_bytes` == 0 reads them all.
  static std::unique_ptr<FilePrefetcher> start(std::vector<std::string> files,
                                               uint64_t max_bytes = 0);
  ~FilePrefetcher();
  FilePrefetcher(const FilePrefetcher&) = delete;
  FilePrefetcher& operator=(const FilePrefetcher&) = delete;

  // Waits until every file has been gone through (tests and benchmarks).
  void wait();
  // Consistent once wait() has returned; a snapshot while running.
  Stats stats() const;

  // The bytes a prefetch may read on this machine: half of MemAvailable (/proc/meminfo), 0 when
  // unknown (no limit).
  static uint64_t default_limit();

 private:
  FilePrefetcher() = default;
  void run();
  void prefetch_file(const std::string& path, std::vector<unsigned char>& buffer);

  std::vector<std::string> files_;
  uint64_t max_bytes_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> chunks_{0}, read_bytes_{0}, cached_bytes_{0};
  std::atomic<int> files_done_{0};
  std::thread thread_;
};

}  // namespace zimage
