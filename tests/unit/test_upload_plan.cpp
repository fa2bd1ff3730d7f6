// The host half of the CUDA backend's staged uploads (backend/cuda/runtime/upload_plan.h): how uploads are
// cut into pieces over a ring of staging buffers (coverage, order, bounds, when the host must wait
// for a buffer), and the multithreaded copy, also from a memory-mapped file. Pure host code, so it
// runs in every build.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "backend/cuda/runtime/upload_plan.h"
#include "core/thread_pool.h"

using zimage::ThreadPool;
using zimage::cuda::parallel_copy;
using zimage::cuda::StagePiece;
using zimage::cuda::StageRing;

namespace {

constexpr size_t kBuf = 64 * 1024;  // small buffers: many wraps of the ring in a short test

// Checks the pieces of one upload of `bytes`: they cover [0, bytes) in order, each inside its
// buffer, starting aligned.
void expect_covers(const std::vector<StagePiece>& pieces, size_t bytes, const StageRing& ring) {
  size_t next = 0;
  for (const StagePiece& p : pieces) {
    EXPECT_EQ(p.src_offset, next);
    EXPECT_GT(p.bytes, 0u);
    EXPECT_GE(p.buffer, 0);
    EXPECT_LT(p.buffer, ring.buffers());
    EXPECT_EQ(p.buffer_offset % StageRing::kAlign, 0u);
    EXPECT_LE(p.buffer_offset + p.bytes, ring.buffer_bytes());
    next += p.bytes;
  }
  EXPECT_EQ(next, bytes);
}

TEST(UploadPlan, SizesAroundTheBufferSize) {
  for (size_t bytes : {size_t{0}, size_t{1}, kBuf - 1, kBuf, kBuf + 1, kBuf * 7 / 2, kBuf * 10}) {
    StageRing ring(kBuf, 4);
    std::vector<StagePiece> pieces;
    ring.plan(bytes, &pieces);
    SCOPED_TRACE(bytes);
    expect_covers(pieces, bytes, ring);
    EXPECT_EQ(pieces.size(), (bytes + kBuf - 1) / kBuf);
    for (size_t i = 0; i < pieces.size(); ++i) {
      // A fresh ring starts at buffer 0 and moves on one buffer per piece.
      EXPECT_EQ(pieces[i].buffer, static_cast<int>(i % 4));
      EXPECT_EQ(pieces[i].buffer_offset, 0u);
      EXPECT_TRUE(pieces[i].wait);
    }
  }
}

TEST(UploadPlan, SmallUploadsShareABuffer) {
  StageRing ring(kBuf, 3);
  std::vector<StagePiece> a, b, c;
  ring.plan(100, &a);
  ring.plan(5000, &b);
  ring.plan(kBuf, &c);  // does not fit in what is left: split over two buffers
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].buffer, 0);
  EXPECT_TRUE(a[0].wait);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].buffer, 0);
  EXPECT_EQ(b[0].buffer_offset, StageRing::kAlign);  // after a's 100 bytes, rounded up
  EXPECT_FALSE(b[0].wait) << "same buffer: its earlier DMA reads other bytes";
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].buffer, 0);
  EXPECT_EQ(c[0].buffer_offset, 3 * StageRing::kAlign);  // 4096 + 5000 rounded up
  EXPECT_EQ(c[0].bytes, kBuf - 3 * StageRing::kAlign);
  EXPECT_FALSE(c[0].wait);
  EXPECT_EQ(c[1].buffer, 1);
  EXPECT_EQ(c[1].buffer_offset, 0u);
  EXPECT_TRUE(c[1].wait);
  expect_covers(c, kBuf, ring);
}

// Replays many uploads of mixed sizes and checks the rule that makes reuse safe: between two
// waits on a buffer, the byte ranges written to it never overlap (so no write hits bytes a queued
// DMA still reads), and a buffer is written again only after a wait.
TEST(UploadPlan, RingNeverOverwritesBytesWithoutAWait) {
  StageRing ring(kBuf, 4);
  std::vector<std::vector<std::pair<size_t, size_t>>> since_wait(4);
  uint32_t x = 12345;
  for (int i = 0; i < 2000; ++i) {
    x = x * 1664525u + 1013904223u;
    const size_t bytes = (i % 7 == 0) ? (x % (5 * kBuf)) : (x % 9000);
    std::vector<StagePiece> pieces;
    ring.plan(bytes, &pieces);
    expect_covers(pieces, bytes, ring);
    for (const StagePiece& p : pieces) {
      auto& ranges = since_wait[static_cast<size_t>(p.buffer)];
      if (p.wait) ranges.clear();
      for (const auto& [b, e] : ranges)
        ASSERT_TRUE(p.buffer_offset >= e || p.buffer_offset + p.bytes <= b)
            << "upload " << i << " overwrites bytes of buffer " << p.buffer << " without a wait";
      ranges.emplace_back(p.buffer_offset, p.buffer_offset + p.bytes);
    }
  }
}

TEST(UploadPlan, ResetStartsOverAtBufferZero) {
  StageRing ring(kBuf, 4);
  std::vector<StagePiece> pieces;
  ring.plan(kBuf * 2 + 10, &pieces);
  ring.reset();
  pieces.clear();
  ring.plan(10, &pieces);
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_EQ(pieces[0].buffer, 0);
  EXPECT_EQ(pieces[0].buffer_offset, 0u);
  EXPECT_TRUE(pieces[0].wait);
}

TEST(UploadPlan, BufferSizeIsRoundedToTheAlignment) {
  StageRing ring(kBuf + 100, 0);
  EXPECT_EQ(ring.buffer_bytes(), kBuf);
  EXPECT_EQ(ring.buffers(), 1);
  StageRing tiny(1, 2);
  EXPECT_EQ(tiny.buffer_bytes(), StageRing::kAlign);
}

TEST(UploadPlan, ParallelCopyIsExact) {
  ThreadPool pool(4);
  std::vector<uint8_t> src(3 * 1000 * 1000 + 17);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + (i >> 9));
  for (size_t bytes :
       {size_t{0}, size_t{1}, size_t{4095}, size_t{65536}, size_t{1000003}, src.size() - 5}) {
    for (size_t grain : {size_t{1}, size_t{4096}, size_t{1} << 20}) {
      std::vector<uint8_t> dst(bytes + 16, 0xAB);
      parallel_copy(pool, dst.data() + 3, src.data() + 5, bytes, grain);  // unaligned both sides
      for (size_t i = 0; i < 3; ++i) ASSERT_EQ(dst[i], 0xAB) << "wrote before the destination";
      for (size_t i = 0; i < bytes; ++i)
        ASSERT_EQ(dst[3 + i], src[5 + i]) << "byte " << i << " of " << bytes << ", grain " << grain;
      for (size_t i = bytes + 3; i < dst.size(); ++i)
        ASSERT_EQ(dst[i], 0xAB) << "wrote past the destination";
    }
  }
}

// The loader's real source: a read-only private mapping of a file (pages faulted in by the copy
// threads).
TEST(UploadPlan, ParallelCopyFromAMappedFile) {
  std::string path = (std::filesystem::temp_directory_path() / "zimage_upload_XXXXXX").string();
  const int fd = ::mkstemp(path.data());
  ASSERT_GE(fd, 0);
  std::vector<uint32_t> words(2'500'000);  // 10 MB
  std::iota(words.begin(), words.end(), 7u);
  const size_t bytes = words.size() * sizeof(uint32_t);
  ASSERT_EQ(::write(fd, words.data(), bytes), static_cast<ssize_t>(bytes));
  void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  ::unlink(path.c_str());
  ASSERT_NE(map, MAP_FAILED);
  ThreadPool pool(3);
  std::vector<uint32_t> got(words.size() - 1);
  parallel_copy(pool, got.data(), static_cast<const uint8_t*>(map) + 4, bytes - 4, 64 * 1024);
  ::munmap(map, bytes);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], words[i + 1]) << i;
}

}  // namespace
