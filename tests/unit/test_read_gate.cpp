// The process-wide read gates (core/read_gate.h) and the registry of file mappings the weight
// readers hold (io/fs/mapped_files.h), which the read-ahead's gate finds files by.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/read_gate.h"
#include "io/fs/mapped_files.h"
#include "io/weights/safetensors.h"

namespace zimage {
namespace {

namespace fs = std::filesystem;

// Counts the calls it gets and the last range.
class CountingGate final : public ReadGate {
 public:
  void wait_readable(const void* p, size_t n) noexcept override {
    ++calls;
    last = p;
    last_n = n;
  }
  std::atomic<int> calls{0};
  const void* last = nullptr;
  size_t last_n = 0;
};

TEST(ReadGate, EveryRegisteredGateIsAskedUntilRemoved) {
  char buffer[64] = {};
  wait_readable(buffer, sizeof buffer);  // none registered: returns
  auto a = std::make_shared<CountingGate>(), b = std::make_shared<CountingGate>();
  ASSERT_TRUE(add_read_gate(a));
  ASSERT_TRUE(add_read_gate(b));
  wait_readable(buffer + 8, 16);
  EXPECT_EQ(a->calls.load(), 1);
  EXPECT_EQ(b->calls.load(), 1);
  EXPECT_EQ(a->last, buffer + 8);
  EXPECT_EQ(a->last_n, 16u);
  wait_readable(buffer, 0);  // nothing to read: no gate is asked
  EXPECT_EQ(a->calls.load(), 1);
  remove_read_gate(a.get());
  wait_readable(buffer, 4);
  EXPECT_EQ(a->calls.load(), 1) << "a removed gate is not asked";
  EXPECT_EQ(b->calls.load(), 2);
  remove_read_gate(b.get());
  wait_readable(buffer, 4);
  EXPECT_EQ(b->calls.load(), 2);
  EXPECT_FALSE(add_read_gate(nullptr));
}

TEST(ReadGate, TheTableHasAFixedSize) {
  std::vector<std::shared_ptr<CountingGate>> gates;
  for (int i = 0; i < kMaxReadGates; ++i) {
    gates.push_back(std::make_shared<CountingGate>());
    ASSERT_TRUE(add_read_gate(gates.back())) << i;
  }
  auto extra = std::make_shared<CountingGate>();
  EXPECT_FALSE(add_read_gate(extra)) << "one more than the table holds is refused";
  char c = 0;
  wait_readable(&c, 1);
  EXPECT_EQ(extra->calls.load(), 0);
  for (const auto& g : gates) {
    EXPECT_EQ(g->calls.load(), 1);
    remove_read_gate(g.get());
  }
  EXPECT_TRUE(add_read_gate(extra)) << "room again once removed";
  remove_read_gate(extra.get());
}

class MappedFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("zimage_mapped_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(MappedFiles, AnAddressFindsItsFileAndOffsetWhileRegistered) {
  const std::string path = (dir_ / "a.bin").string();
  {
    std::vector<char> data(3 * 4096 + 5, 'x');
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(data.data(), 1, data.size(), f);
    std::fclose(f);
  }
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  struct stat st {};
  ASSERT_EQ(::fstat(fd, &st), 0);
  const size_t size = static_cast<size_t>(st.st_size);
  void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ASSERT_NE(m, MAP_FAILED);
  const auto* base = static_cast<const char*>(m);
  {
    MappedFileRegistration reg(m, size, fd);
    ASSERT_TRUE(reg.registered());
    auto spot = find_mapped_file(base + 4100);
    ASSERT_TRUE(spot.has_value());
    EXPECT_EQ(spot->device, static_cast<uint64_t>(st.st_dev));
    EXPECT_EQ(spot->inode, static_cast<uint64_t>(st.st_ino));
    EXPECT_EQ(spot->offset, 4100u);
    EXPECT_EQ(spot->left, size - 4100);
    EXPECT_FALSE(find_mapped_file(base + size).has_value()) << "one past the end";
    char local = 0;
    EXPECT_FALSE(find_mapped_file(&local).has_value());
    // Moved: still registered once, by the new owner.
    MappedFileRegistration moved(std::move(reg));
    EXPECT_FALSE(reg.registered());
    EXPECT_TRUE(find_mapped_file(base).has_value());
    MappedFileRegistration assigned;
    assigned = std::move(moved);
    EXPECT_TRUE(find_mapped_file(base).has_value());
  }
  EXPECT_FALSE(find_mapped_file(base).has_value()) << "gone with its registration";
  MappedFileRegistration bad(m, size, -1);  // fstat fails: nothing registered
  EXPECT_FALSE(bad.registered());
  EXPECT_FALSE(find_mapped_file(base).has_value());
  ::munmap(m, size);
  ::close(fd);
}

TEST_F(MappedFiles, ASafetensorsFileRegistersItsMappingUntilClosed) {
  const std::string path = (dir_ / "w.safetensors").string();
  Tensor t = Tensor::host(DType::kF32, {64, 64});
  ASSERT_TRUE(write_safetensors(path, {{"w", t}}).ok());
  const void* base = nullptr;
  {
    auto file = SafetensorsFile::open(path);
    ASSERT_TRUE(file.ok()) << file.status().to_string();
    base = (*file)->mapping();
    auto spot = find_mapped_file(static_cast<const char*>(base) + 16);
    ASSERT_TRUE(spot.has_value());
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(spot->inode, static_cast<uint64_t>(st.st_ino));
    EXPECT_EQ(spot->offset, 16u);
  }
  EXPECT_FALSE(find_mapped_file(base).has_value());
}

}  // namespace
}  // namespace zimage
