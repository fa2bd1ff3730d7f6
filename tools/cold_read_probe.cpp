// Cold-read probe (not part of the build): how fast a file dropped from the page cache is read
// with several reads in flight, against one sequential stream (`dd`). A disk's speed for the
// load's read-ahead (src/io/fs/prefetch.h: 4 threads taking 8 MiB chunks in turn) depends on how
// many reads it serves at once, which `dd` does not show.
//
//   g++ -O2 -std=c++20 tools/cold_read_probe.cpp -o cold_read_probe -lpthread
//   cold_read_probe FILE interleaved|contiguous THREADS CHUNK_MIB
//
// "interleaved": every thread takes the next chunk of the file in turn (the read-ahead's way);
// "contiguous": each thread reads its own slice of the file front to back. Each thread opens the
// file itself. The file is dropped from the page cache (posix_fadvise DONTNEED) first, so it must
// not be mapped or open elsewhere; writes nothing.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s FILE interleaved|contiguous THREADS CHUNK_MIB\n", argv[0]);
    return 2;
  }
  const char* path = argv[1];
  const std::string mode = argv[2];
  const int threads = std::atoi(argv[3]);
  const size_t chunk = static_cast<size_t>(std::atoi(argv[4])) << 20;
  if ((mode != "interleaved" && mode != "contiguous") || threads < 1 || chunk == 0) return 2;
  const int fd0 = ::open(path, O_RDONLY);
  if (fd0 < 0) {
    std::perror(path);
    return 1;
  }
  const off_t size = ::lseek(fd0, 0, SEEK_END);
  ::fsync(fd0);
  ::posix_fadvise(fd0, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd0);
  const auto t0 = std::chrono::steady_clock::now();
  std::atomic<off_t> next{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::vector<char> buf(chunk);
      const int fd = ::open(path, O_RDONLY);
      if (mode == "interleaved") {
        for (off_t off = next.fetch_add(static_cast<off_t>(chunk)); off < size;
             off = next.fetch_add(static_cast<off_t>(chunk)))
          (void)::pread(fd, buf.data(), chunk, off);
      } else {
        const off_t a = size * t / threads, b = size * (t + 1) / threads;
        for (off_t off = a; off < b; off += static_cast<off_t>(chunk))
          (void)::pread(fd, buf.data(), static_cast<size_t>(std::min<off_t>(chunk, b - off)), off);
      }
      ::close(fd);
    });
  }
  for (std::thread& th : pool) th.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s, %d threads, %zu MiB: %.2f s, %.2f GB/s\n", mode.c_str(), threads, chunk >> 20, s,
              static_cast<double>(size) / s / 1e9);
  return 0;
}
