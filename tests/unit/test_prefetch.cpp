// FilePrefetcher (io/fs/prefetch.h): reads what is not cached, skips what is, honours its byte
// limit, and goes past files it cannot read without hanging; its gate holds a copy out of a
// registered mapping until the read-ahead has read it, and lets it go when the read-ahead stops.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "core/read_gate.h"
#include "io/fs/mapped_files.h"
#include "io/fs/prefetch.h"

namespace zimage {
namespace {

namespace fs = std::filesystem;

class Prefetch : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("zimage_prefetch_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write_file(const std::string& name, size_t bytes) {
    const std::string path = (dir_ / name).string();
    std::vector<char> data(bytes);
    for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<char>(i * 131 + 7);
    std::ofstream(path, std::ios::binary).write(data.data(), static_cast<std::streamsize>(bytes));
    return path;
  }

  // Written back and dropped from the page cache; false where the file system keeps it anyway
  // (tmpfs), so the tests below assert what such a machine can show.
  static bool drop(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) return false;
    ::fsync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
    return resident_fraction(path) < 0.5;
  }

  static double resident_fraction(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    struct stat st {};
    ::fstat(fd, &st);
    const size_t size = static_cast<size_t>(st.st_size);
    void* m = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    std::vector<unsigned char> v((size + page - 1) / page);
    size_t in = 0;
    if (::mincore(m, size, v.data()) == 0)
      for (unsigned char b : v) in += b & 1;
    ::munmap(m, size);
    return v.empty() ? 1.0 : static_cast<double>(in) / static_cast<double>(v.size());
  }

  fs::path dir_;
};

constexpr size_t kSize = FilePrefetcher::kChunkBytes * 5 / 2;  // 2.5 chunks

TEST_F(Prefetch, ReadsWhatIsNotCachedAndSkipsWhatIs) {
  const std::string f = write_file("a.bin", kSize);
  const bool dropped = drop(f);
  auto p = FilePrefetcher::start({f});
  ASSERT_NE(p, nullptr);
  p->wait();
  FilePrefetcher::Stats s = p->stats();
  EXPECT_EQ(s.files, 1);
  EXPECT_EQ(s.chunks, 3u);
  EXPECT_EQ(s.read_bytes + s.cached_bytes, kSize);
  if (dropped) {
    EXPECT_GE(s.read_bytes, kSize / 2) << "a dropped file must be read";
  }
  EXPECT_GT(resident_fraction(f), 0.99) << "the file is in the page cache afterwards";

  // Now cached: nothing is read again. The kernel may still take a page of a chunk back between
  // the reads (seen in a fresh-clone CI run and once in five runs right after it, not in 72 runs
  // later: every chunk read again though the file read fully resident just before), so a read is
  // allowed twice; a prefetcher that never skips what is cached reads all three times.
  bool skipped = false;
  for (int attempt = 0; attempt < 3 && !skipped; ++attempt) {
    auto again = FilePrefetcher::start({f});
    ASSERT_NE(again, nullptr);
    again->wait();
    s = again->stats();
    EXPECT_EQ(s.read_bytes + s.cached_bytes, kSize);
    skipped = s.read_bytes == 0 && s.cached_bytes == kSize;
  }
  EXPECT_TRUE(skipped) << "a cached file was read again three times";
}

TEST_F(Prefetch, StopsAtItsByteLimit) {
  const std::string a = write_file("a.bin", kSize), b = write_file("b.bin", kSize);
  if (!drop(a) || !drop(b)) GTEST_SKIP() << "this file system keeps files cached (tmpfs?)";
  const uint64_t limit = FilePrefetcher::kChunkBytes;
  auto p = FilePrefetcher::start({a, b}, limit, /*threads=*/1);
  ASSERT_NE(p, nullptr);
  p->wait();
  const FilePrefetcher::Stats s = p->stats();
  EXPECT_GE(s.read_bytes, limit);
  EXPECT_LE(s.read_bytes, limit + FilePrefetcher::kChunkBytes);
  EXPECT_LT(resident_fraction(b), 0.5) << "the second file was not read past the limit";
  // Several threads overshoot by at most one chunk each.
  ASSERT_TRUE(drop(a) && drop(b));
  auto q = FilePrefetcher::start({a, b}, limit, /*threads=*/4);
  ASSERT_NE(q, nullptr);
  q->wait();
  EXPECT_GE(q->stats().read_bytes, limit);
  EXPECT_LE(q->stats().read_bytes, limit + 4 * FilePrefetcher::kChunkBytes);
}

// Four threads over three files take every chunk exactly once, each on its own slice of every
// file (the default) or all taking the next chunk in turn; as many threads as a file has chunks,
// or more (a file of one chunk: one thread has work).
TEST_F(Prefetch, ThreadsShareTheChunksOfSeveralFiles) {
  std::vector<std::string> files;
  for (size_t size : {kSize, size_t{3} << 20, kSize + 5})
    files.push_back(write_file("f" + std::to_string(files.size()), size));
  for (bool slices : {true, false}) {
    for (int threads : {4, 3, 1}) {
      for (const std::string& f : files) drop(f);
      FilePrefetcher::Options o;
      o.threads = threads;
      o.slices = slices;
      auto p = FilePrefetcher::start(files, o);
      ASSERT_NE(p, nullptr);
      p->wait();
      const FilePrefetcher::Stats s = p->stats();
      const std::string tag =
          std::string(slices ? "slices, " : "interleaved, ") + std::to_string(threads) + " threads";
      EXPECT_EQ(s.files, 3) << tag;
      EXPECT_EQ(s.chunks, 3u + 1u + 3u) << tag;
      EXPECT_EQ(s.read_bytes + s.cached_bytes, kSize + (size_t{3} << 20) + kSize + 5) << tag;
      for (const std::string& f : files) EXPECT_GT(resident_fraction(f), 0.99) << f << ", " << tag;
    }
  }
}

// More slices than threads (as when some threads could not be started): the threads take the
// slices no one took, so every chunk is still read exactly once.
TEST_F(Prefetch, SlicesOutnumberingTheThreadsAreAllRead) {
  std::vector<std::string> files;
  for (size_t size : {kSize * 3, size_t{5} << 20, kSize})
    files.push_back(write_file("s" + std::to_string(files.size()), size));
  for (const std::string& f : files) drop(f);
  FilePrefetcher::Options o;
  o.threads = 2;
  o.slices_per_file = 5;
  auto p = FilePrefetcher::start(files, o);
  ASSERT_NE(p, nullptr);
  p->wait();
  const FilePrefetcher::Stats s = p->stats();
  EXPECT_EQ(s.files, 3);
  EXPECT_EQ(s.chunks, 8u + 1u + 3u);
  EXPECT_EQ(s.read_bytes + s.cached_bytes, kSize * 3 + (size_t{5} << 20) + kSize);
  for (const std::string& f : files) EXPECT_GT(resident_fraction(f), 0.99) << f;
}

TEST_F(Prefetch, GoesPastFilesItCannotReadWithoutHanging) {
  const std::string good = write_file("good.bin", 1u << 20);
  const std::string empty = write_file("empty.bin", 0);
  const std::string fifo = (dir_ / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto p =
      FilePrefetcher::start({(dir_ / "missing.bin").string(), fifo, empty, dir_.string(), good});
  ASSERT_NE(p, nullptr);
  p->wait();  // a FIFO opened for reading would block here
  const FilePrefetcher::Stats s = p->stats();
  EXPECT_EQ(s.files, 5);
  EXPECT_EQ(s.read_bytes + s.cached_bytes, 1u << 20) << "only the regular file is read";
}

// A file mapped read-only and registered as the weight readers register theirs.
struct Mapped {
  explicit Mapped(const std::string& path) {
    fd = ::open(path.c_str(), O_RDONLY);
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0) return;
    size = static_cast<size_t>(st.st_size);
    void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) return;
    base = static_cast<const char*>(m);
    reg = MappedFileRegistration(m, size, fd);
  }
  ~Mapped() {
    reg = MappedFileRegistration();
    if (base) ::munmap(const_cast<char*>(base), size);
    if (fd >= 0) ::close(fd);
  }
  int fd = -1;
  size_t size = 0;
  const char* base = nullptr;
  MappedFileRegistration reg;
};

// Holds the read-ahead's one thread before chunk `at` until released.
struct Hold {
  explicit Hold(uint64_t index) : at(index), released(release.get_future().share()) {}
  void operator()(uint64_t index) const {
    if (index == at) released.wait();
  }
  uint64_t at;
  std::promise<void> release;
  std::shared_future<void> released;
};

constexpr uint64_t kChunk = FilePrefetcher::kChunkBytes;

// A gated read-ahead of `files` on one thread, held before chunk `at` until `hold` is released.
std::unique_ptr<FilePrefetcher> start_held(const std::vector<std::string>& files,
                                           const std::shared_ptr<Hold>& hold, bool gate = true) {
  FilePrefetcher::Options o;
  o.threads = 1;
  o.gate = gate;
  o.before_chunk = [hold](uint64_t i) { (*hold)(i); };
  return FilePrefetcher::start(files, o);
}

TEST_F(Prefetch, GateHoldsACopyUntilTheReadAheadHasReadIt) {
  const std::string f = write_file("a.bin", kSize);  // chunks 0, 1, 2
  if (!drop(f)) GTEST_SKIP() << "this file system keeps files cached (tmpfs?)";
  Mapped m(f);
  ASSERT_NE(m.base, nullptr);
  ASSERT_TRUE(m.reg.registered());
  auto hold = std::make_shared<Hold>(1);
  auto p = start_held({f}, hold);
  ASSERT_NE(p, nullptr);
  // Chunk 0 is read (or being read): a copy from it waits at most for that read.
  auto first = std::async(std::launch::async, [&] { wait_readable(m.base + 100, 4096); });
  EXPECT_EQ(first.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  // The last page of chunk 2: not read while the read-ahead is held before chunk 1.
  const char* late = m.base + kSize - 4096;
  std::atomic<bool> done{false};
  auto waiter = std::async(std::launch::async, [&] {
    wait_readable(late, 4096);
    done = true;
  });
  EXPECT_EQ(waiter.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout)
      << "the copy went on before its chunk was read";
  EXPECT_FALSE(done.load());
  hold->release.set_value();
  EXPECT_EQ(waiter.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  EXPECT_TRUE(done.load());
  p->wait();
  const FilePrefetcher::Stats s = p->stats();
  EXPECT_GE(s.gate_waits, 1u);
  EXPECT_GT(s.gate_wait_seconds, 0.2);
  EXPECT_GT(resident_fraction(f), 0.99);
}

TEST_F(Prefetch, GateLetsCopiesGoWhenTheReadAheadStops) {
  const std::string f = write_file("a.bin", kSize);
  if (!drop(f)) GTEST_SKIP() << "this file system keeps files cached (tmpfs?)";
  Mapped m(f);
  ASSERT_NE(m.base, nullptr);
  auto hold = std::make_shared<Hold>(1);
  auto p = start_held({f}, hold);
  ASSERT_NE(p, nullptr);
  const char* late = m.base + kSize - 4096;
  auto waiter = std::async(std::launch::async, [&] { wait_readable(late, 4096); });
  EXPECT_EQ(waiter.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  // Destroyed while its thread is still held: the copy goes on (and reads the disk itself)
  // before the destructor can finish.
  auto destroy = std::async(std::launch::async, [&] { p.reset(); });
  EXPECT_EQ(waiter.wait_for(std::chrono::seconds(20)), std::future_status::ready)
      << "a stopped read-ahead still held the copy";
  hold->release.set_value();
  EXPECT_EQ(destroy.wait_for(std::chrono::seconds(20)), std::future_status::ready);
}

TEST_F(Prefetch, GateLetsCopiesGoPastItsByteLimit) {
  const std::string f = write_file("a.bin", kSize);
  if (!drop(f)) GTEST_SKIP() << "this file system keeps files cached (tmpfs?)";
  Mapped m(f);
  ASSERT_NE(m.base, nullptr);
  FilePrefetcher::Options o;
  o.max_bytes = kChunk;
  o.threads = 1;
  o.gate = true;
  auto p = FilePrefetcher::start({f}, o);
  ASSERT_NE(p, nullptr);
  p->wait();  // one chunk read, then the limit
  ASSERT_LT(p->stats().read_bytes, kSize);
  auto waiter = std::async(std::launch::async, [&] { wait_readable(m.base + kSize - 4096, 4096); });
  EXPECT_EQ(waiter.wait_for(std::chrono::seconds(20)), std::future_status::ready)
      << "a read-ahead at its limit still held a copy it will never read";
  EXPECT_EQ(p->stats().gate_waits, 0u);
}

TEST_F(Prefetch, GateIgnoresWhatItDoesNotRead) {
  const std::string f = write_file("a.bin", kSize), other = write_file("b.bin", kSize);
  if (!drop(f) || !drop(other)) GTEST_SKIP() << "this file system keeps files cached (tmpfs?)";
  Mapped m(f), o(other);
  ASSERT_NE(m.base, nullptr);
  ASSERT_NE(o.base, nullptr);
  auto hold = std::make_shared<Hold>(0);  // nothing is read until released
  auto p = start_held({f}, hold);
  ASSERT_NE(p, nullptr);
  std::vector<char> anonymous(1 << 20, 1);
  auto quick = [&](const void* q, size_t n) {
    auto w = std::async(std::launch::async, [=] { wait_readable(q, n); });
    return w.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  };
  EXPECT_TRUE(quick(o.base + kSize - 4096, 4096)) << "another file's mapping";
  EXPECT_TRUE(quick(anonymous.data(), anonymous.size())) << "memory that is no mapping";
  // Without the gate, its own file is not held either.
  auto hold2 = std::make_shared<Hold>(0);
  hold->release.set_value();
  p.reset();
  auto q = start_held({f}, hold2, /*gate=*/false);
  ASSERT_NE(q, nullptr);
  EXPECT_TRUE(quick(m.base + kSize - 4096, 4096)) << "a read-ahead started without its gate";
  hold2->release.set_value();
}

TEST(PrefetchLimit, IsHalfOfAvailableMemoryWhenKnown) {
  const uint64_t limit = FilePrefetcher::default_limit();
  if (!fs::exists("/proc/meminfo")) {
    EXPECT_EQ(limit, 0u);
    return;
  }
  EXPECT_GT(limit, uint64_t{1} << 20);
  EXPECT_LT(limit, uint64_t{1} << 50);
}

}  // namespace
}  // namespace zimage
