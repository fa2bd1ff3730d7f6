// The PNG image data compressed on several threads (io/image/png_deflate.h): the zlib stream
// inflates (header and Adler-32 checked by zlib) to rows that unfilter to the pixels, whatever the
// thread count (the same bytes), across piece boundaries; and against libpng's own encoder on the
// calling thread: the same pixels back, sizes and times printed.
#include <gtest/gtest.h>
#include <png.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "io/image/png.h"
#include "io/image/png_deflate.h"

using namespace zimage;

namespace {

// A smooth picture with a little noise (what generated images look like to zlib), or noise.
std::vector<uint8_t> picture(int w, int h, bool noise_only, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> px(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) {
        const double v = 128 + 90 * std::sin(0.013 * x * (c + 1) + 0.021 * y) *
                                   std::cos(0.017 * y - 0.011 * x * c);
        const int n = static_cast<int>(rng() % 5) - 2;
        px[(static_cast<size_t>(y) * w + x) * 3 + c] =
            static_cast<uint8_t>(noise_only ? static_cast<int>(rng() & 0xFF)
                                            : std::clamp(static_cast<int>(v) + n, 0, 255));
      }
  return px;
}

int paeth(int a, int b, int c) {
  const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
  return pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
}

// Inflates a zlib stream of filtered rows and undoes the filters (PNG spec, section 9).
std::vector<uint8_t> inflate_and_unfilter(const std::vector<uint8_t>& z, int w, int h) {
  const size_t row = static_cast<size_t>(w) * 3, stride = row + 1;
  std::vector<uint8_t> raw(stride * h);
  uLongf n = static_cast<uLongf>(raw.size());
  EXPECT_EQ(uncompress(raw.data(), &n, z.data(), static_cast<uLong>(z.size())), Z_OK);
  EXPECT_EQ(n, raw.size());
  std::vector<uint8_t> px(row * h);
  for (int y = 0; y < h; ++y) {
    const uint8_t f = raw[y * stride];
    EXPECT_LE(f, 4) << "row " << y;
    const uint8_t* in = raw.data() + y * stride + 1;
    uint8_t* out = px.data() + y * row;
    const uint8_t* up = y > 0 ? out - row : nullptr;
    for (size_t i = 0; i < row; ++i) {
      const int a = i >= 3 ? out[i - 3] : 0, b = up ? up[i] : 0, c = up && i >= 3 ? up[i - 3] : 0;
      const int pred = f == 1 ? a : f == 2 ? b : f == 3 ? (a + b) / 2 : f == 4 ? paeth(a, b, c) : 0;
      out[i] = static_cast<uint8_t>(in[i] + pred);
    }
  }
  return px;
}

struct LibpngOut {
  std::vector<uint8_t> bytes;
};

void libpng_write(png_structp png, png_bytep data, size_t size) {
  auto* o = static_cast<LibpngOut*>(png_get_io_ptr(png));
  o->bytes.insert(o->bytes.end(), data, data + size);
}

// libpng's own encoder on the calling thread (what encode_png did before): adaptive filters,
// zlib at `level`.
std::vector<uint8_t> libpng_encode(const std::vector<uint8_t>& px, int w, int h, int level) {
  LibpngOut o;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    return {};
  }
  png_set_write_fn(png, &o, libpng_write, nullptr);
  png_set_compression_level(png, level);
  png_set_IHDR(png, info, w, h, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (int y = 0; y < h; ++y) png_write_row(png, px.data() + static_cast<size_t>(y) * w * 3);
  png_write_end(png, info);
  png_destroy_write_struct(&png, &info);
  return o.bytes;
}

}  // namespace

TEST(PngDeflate, PiecesAndThreadsGiveOneStreamOfTheRows) {
  // 700 x 500: 1.05 MB of filtered rows, four pieces; 1 x 1 and a single long row: one piece.
  const int sizes[][2] = {{700, 500}, {1, 1}, {5000, 1}, {3, 20000}};
  for (const auto& wh : sizes) {
    const int w = wh[0], h = wh[1];
    for (bool noise : {false, true}) {
      const auto px = picture(w, h, noise, static_cast<uint32_t>(w + h));
      for (int level : {0, 1, 6, 9}) {
        auto one = png_deflate_rows(px.data(), w, h, level, 1);
        auto many = png_deflate_rows(px.data(), w, h, level, 3);
        auto shared = png_deflate_rows(px.data(), w, h, level);
        ASSERT_TRUE(one.ok() && many.ok() && shared.ok()) << one.status().to_string();
        EXPECT_EQ(*one, *many) << w << "x" << h << " level " << level;
        EXPECT_EQ(*one, *shared) << w << "x" << h << " level " << level;
        EXPECT_EQ(inflate_and_unfilter(*one, w, h), px) << w << "x" << h << " level " << level;
      }
    }
  }
  EXPECT_FALSE(png_deflate_rows(nullptr, 1, 1, 1).ok());
  const uint8_t p[3] = {1, 2, 3};
  EXPECT_FALSE(png_deflate_rows(p, 0, 1, 1).ok());
  EXPECT_EQ(png_deflate_rows(p, 1, 1, 10).status().code(), ErrorCode::kInvalidArgument);
}

TEST(PngDeflate, AgainstLibpngsOwnEncoder) {
  for (bool noise : {false, true}) {
    const int w = 1024, h = 1024;
    const auto px = picture(w, h, noise, 7);
    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    const std::vector<uint8_t> theirs = libpng_encode(px, w, h, 1);
    const auto t1 = Clock::now();
    auto ours = encode_png(px.data(), w, h, {{"prompt", "a snow fairy"}});
    const auto t2 = Clock::now();
    ASSERT_TRUE(ours.ok()) << ours.status().to_string();
    ASSERT_FALSE(theirs.empty());
    auto a = decode_png(ours->data(), ours->size());
    auto b = decode_png(theirs.data(), theirs.size());
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->rgb, px);
    EXPECT_EQ(b->rgb, px);
    ASSERT_EQ(a->text.size(), 1u);
    EXPECT_EQ(a->text[0].second, "a snow fairy");
    const double ms_theirs = std::chrono::duration<double, std::milli>(t1 - t0).count();
    const double ms_ours = std::chrono::duration<double, std::milli>(t2 - t1).count();
    std::printf(
        "  1024x1024 %s, level 1: libpng on one thread %.1f ms, %zu bytes; encode_png "
        "%.1f ms, %zu bytes (%+.2f %%)\n",
        noise ? "noise" : "smooth", ms_theirs, theirs.size(), ms_ours, ours->size(),
        100.0 * (static_cast<double>(ours->size()) / theirs.size() - 1.0));
    // The pieces' seams cost little: within 2 % of libpng's size.
    EXPECT_LT(static_cast<double>(ours->size()), 1.02 * static_cast<double>(theirs.size()));
  }
}
