// Reads weight files into the page cache ahead of the loader, on background threads, in the
// order the loader will read them. Why: a new process spends its first few hundred milliseconds
// starting CUDA and its libraries, and from a cold page cache the loader's reads fault the mapped
// files in piece by piece; a sequential reader started at once overlaps the disk with that
// start-up and keeps large requests in flight while the uploader copies.
//
// What it does, per 16 MiB chunk of each file: asks the kernel which pages are cached (mincore on a
// read-only mapping) and reads the chunk with pread only when some are not, so a warm page cache
// costs one system call per chunk and no copying. It stops after `max_bytes` read (the caller
// passes what the machine can cache without evicting what it just read), at the end of the list,
// or when destroyed (the destructor waits for the chunks being read). Errors (a file that cannot
// be opened or read) end the prefetch of that file silently: the loader reads it anyway and
// reports its own error. Never throws; threads that cannot be started leave their share to the
// others (none started: no prefetch).
//
// Measured on this project's development machine (virtio disk; the 8 GB text encoder dropped from
// the page cache; a 0.4 s start-up simulated first, then the files read the uploader's way, 64 MiB
// pieces copied by 2 threads from the mapping): 6.6-6.9 s alone, 4.5-4.9 s with 1 or 2 prefetch
// threads, 3.7 s with 4, against 2.6 s for `dd` of the same files (+ the 0.4 s); with the files
// cached, 4 threads go through them in 0.08 s.
//
// How the threads share a file: each reads its own contiguous slice of it front to back (by
// default), rather than all of them taking the next chunk in turn. Measured with
// tools/cold_read_probe.cpp on a 5 GB file dropped from the page cache (docs/BENCHMARKS.md,
// "Session 21"): on an H100 host's disk, one stream of 16 MiB reads 2.46 GB/s, 4 or 16 threads
// taking 8 MiB chunks in turn 1.74-1.88, 8 threads on contiguous slices 2.45; on the
// development machine's virtio disk (2 GB file) 0.48-1.16, 1.56-1.85 and 2.13-2.74. Interleaved
// requests broke the host's sequential read-ahead; slices keep it and still keep several reads
// in flight. Hence 8 threads on slices, 16 MiB a read.
//
// The gate (core/read_gate.h; Options::gate, off by default): while it runs, a copy out of a
// registered mapping of one of its files (io/fs/mapped_files.h; the safetensors and GGUF readers
// register theirs) waits in wait_readable() until the chunks it covers have been read, unless
// their pages are already cached, so the loader's copy threads never fault ahead of the
// read-ahead. The wait ends too when the read-ahead stops (destroyed, its byte limit reached, the
// file unreadable). Measured on an H100 host (docs/BENCHMARKS.md, "Session 20"), it made a cold
// load slower: the read-ahead alone read 20.5 GB at 1.12 GB/s (18.2 s), while without the gate the
// loader's faults and the read-ahead together read at 1.49 GB/s (13.75 s), as fast as `dd`
// (1.46 GB/s). So the loader's faults add useful parallelism there; the gate stays an opt-in.
// (Session 21's host, with the chunks still taken in turn: 13.06 s with it, 13.69 s without; it
// has not been measured with slices.)
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
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
    uint64_t gate_waits = 0;    // copies the gate held back until their chunks were read
    double gate_wait_seconds = 0;
  };

  static constexpr uint64_t kChunkBytes = uint64_t{16} << 20;

  struct Options {
    uint64_t max_bytes = 0;  // 0: read them all
    int threads = 8;         // reads in flight
    // Each thread reads its own contiguous slice of each file (true), or every thread takes the
    // next chunk in file order (false: the whole list read front to back together).
    bool slices = true;
    // Slices a file is cut into; 0: one per thread. (Tests: more slices than threads, as when
    // some threads could not be started.)
    int slices_per_file = 0;
    bool gate = false;  // registers the gate described above while running (opt-in)
    // Tests only: called on a prefetch thread before chunk `index` (counted over all files in
    // order) is looked at, so a test can hold the read-ahead back.
    std::function<void(uint64_t index)> before_chunk;
  };

  // Starts reading `files` in order; nullptr when no thread could be started.
  static std::unique_ptr<FilePrefetcher> start(std::vector<std::string> files, Options options);
  static std::unique_ptr<FilePrefetcher> start(std::vector<std::string> files,
                                               uint64_t max_bytes = 0, int threads = 8) {
    Options o;
    o.max_bytes = max_bytes;
    o.threads = threads;
    return start(std::move(files), std::move(o));
  }
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
  struct File {
    int fd = -1;
    const unsigned char* map = nullptr;  // read-only shared mapping, for mincore; may be null
    uint64_t size = 0;
    uint64_t chunks = 0;
    uint64_t device = 0, inode = 0;  // what the gate matches a registered mapping against
    std::atomic<uint64_t> chunks_done{0};
    std::atomic<bool> failed{false};  // a read failed: its other chunks are skipped
  };
  class Gate;  // which chunks are read; waits for them (prefetch.cpp)

  FilePrefetcher() = default;
  void open_files();
  void run();
  // Looks at chunk `i` of file `k` (`index` counted over all files in order).
  void take_chunk(size_t k, uint64_t i, uint64_t index, unsigned char* buffer,
                  std::vector<unsigned char>& resident);
  // Reads (or finds cached) chunk `c` of file `f`; false when the file cannot be read further.
  bool prefetch_chunk(File& f, uint64_t c, unsigned char* buffer,
                      std::vector<unsigned char>& resident);

  std::vector<std::string> paths_;
  std::vector<std::unique_ptr<File>> files_;
  std::vector<uint64_t> first_chunk_;  // chunks in the files before each one
  uint64_t max_bytes_ = 0;
  int slices_per_file_ = 0;  // 0: every thread takes the next chunk in turn
  std::function<void(uint64_t)> before_chunk_;
  std::shared_ptr<Gate> gate_;   // outlives this object while a copy waits in it
  std::atomic<int> running_{0};  // threads still in run()
  bool gate_registered_ = false;
  std::atomic<bool> stop_{false};
  // The next chunk to take, counted over all files in order (or, with slices, the next slice:
  // file by file, slice by slice).
  std::atomic<uint64_t> next_{0};
  std::atomic<uint64_t> chunks_{0}, read_bytes_{0}, cached_bytes_{0};
  std::atomic<int> files_done_{0};
  std::vector<std::thread> threads_;
};

}  // namespace zimage
