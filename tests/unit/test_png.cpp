// PNG writer/reader: pixel-exact round trips at odd sizes, UTF-8 (Chinese, emoji) metadata in
// uncompressed iTXt chunks, decoding of other colour types, and every error path returning a
// Status that names the file or the bad argument.
#include <gtest/gtest.h>
#include <png.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "io/image/png.h"

using namespace zimage;

namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("zimage_png_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

std::vector<uint8_t> random_rgb(int w, int h, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> px(static_cast<size_t>(w) * h * 3);
  for (auto& p : px) p = static_cast<uint8_t>(rng() & 0xFF);
  return px;
}

bool contains(const std::vector<uint8_t>& hay, const std::string& needle) {
  const std::vector<uint8_t> bytes(needle.begin(), needle.end());  // char may be signed
  return std::search(hay.begin(), hay.end(), bytes.begin(), bytes.end()) != hay.end();
}

}  // namespace

TEST(Png, RoundTripRandomPixelsOddSizes) {
  const int sizes[][2] = {{1, 1}, {3, 5}, {17, 9}, {64, 48}, {255, 1}, {1, 300}, {129, 77}};
  size_t total = 0;
  for (const auto& wh : sizes) {
    const int w = wh[0], h = wh[1];
    const auto px = random_rgb(w, h, static_cast<uint32_t>(w * 1000 + h));
    const std::string path = temp_path(std::to_string(w) + "x" + std::to_string(h) + ".png");
    ASSERT_TRUE(write_png(path, px.data(), w, h, {{"seed", "42"}}).ok());
    auto img = read_png(path);
    ASSERT_TRUE(img.ok()) << img.status().to_string();
    EXPECT_EQ(img->width, w);
    EXPECT_EQ(img->height, h);
    ASSERT_EQ(img->rgb.size(), px.size());
    size_t mismatches = 0;
    for (size_t i = 0; i < px.size(); ++i) mismatches += img->rgb[i] != px[i];
    EXPECT_EQ(mismatches, 0u) << w << "x" << h;
    ASSERT_EQ(img->text.size(), 1u);
    EXPECT_EQ(img->text[0].first, "seed");
    EXPECT_EQ(img->text[0].second, "42");
    total += px.size();
    std::remove(path.c_str());
  }
  std::printf("  %zu bytes round-tripped, 0 mismatches\n", total);
}

// Every zlib level writes the same pixels; a smooth image gets smaller as the level rises (0 is
// stored: larger than the raw pixels), and a level outside 0..9 is refused naming it.
TEST(Png, CompressionLevelsKeepThePixels) {
  const int w = 96, h = 64;
  std::vector<uint8_t> px(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c)
        px[(static_cast<size_t>(y) * w + x) * 3 + c] =
            static_cast<uint8_t>((x * 3 + y * 2 + c * 40) & 0xFF);
  std::vector<size_t> sizes;
  for (int level = 0; level <= 9; ++level) {
    auto png = encode_png(px.data(), w, h, {}, level);
    ASSERT_TRUE(png.ok()) << level << ": " << png.status().to_string();
    auto img = decode_png(png->data(), png->size());
    ASSERT_TRUE(img.ok()) << img.status().to_string();
    EXPECT_EQ(img->rgb, px) << "level " << level;
    sizes.push_back(png->size());
  }
  EXPECT_GT(sizes[0], px.size()) << "level 0 stores";
  EXPECT_LT(sizes[9], sizes[1]);
  EXPECT_LT(sizes[1], sizes[0]);
  auto fast = encode_png(px.data(), w, h, {});
  ASSERT_TRUE(fast.ok());
  EXPECT_EQ(fast->size(), sizes[kPngDefaultCompression]) << "the default is level 1";
  for (int bad : {-1, 10}) {
    auto r = encode_png(px.data(), w, h, {}, bad);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("compression level " + std::to_string(bad)),
              std::string::npos)
        << r.status().message();
  }
}

TEST(Png, Utf8MetadataInUncompressedItxt) {
  const std::string prompt =
      "冰雪女王，坐在冰冻的王座上，精致细节 🐱❄️ «café» naïve";
  const PngText text = {{"prompt", prompt},
                        {"negative_prompt", ""},
                        {"parameters", "steps: 8, cfg: 0.0, seed: 18446744073709551615"},
                        {"Software", "zimage"}};
  const auto px = random_rgb(16, 16, 7);
  auto encoded = encode_png(px.data(), 16, 16, text);
  ASSERT_TRUE(encoded.ok()) << encoded.status().to_string();
  // The UTF-8 bytes appear verbatim (uncompressed) in an iTXt chunk.
  EXPECT_TRUE(contains(*encoded, "iTXt"));
  EXPECT_TRUE(contains(*encoded, prompt));
  EXPECT_FALSE(contains(*encoded, "zTXt"));
  auto img = decode_png(encoded->data(), encoded->size(), "mem");
  ASSERT_TRUE(img.ok()) << img.status().to_string();
  ASSERT_EQ(img->text.size(), text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    EXPECT_EQ(img->text[i].first, text[i].first);
    EXPECT_EQ(img->text[i].second, text[i].second);
  }
  // write_png writes exactly encode_png's bytes.
  const std::string path = temp_path("utf8.png");
  ASSERT_TRUE(write_png(path, px.data(), 16, 16, text).ok());
  std::FILE* f = std::fopen(path.c_str(), "rb");
  ASSERT_NE(f, nullptr);
  std::vector<uint8_t> file_bytes(encoded->size() + 16);
  file_bytes.resize(std::fread(file_bytes.data(), 1, file_bytes.size(), f));
  std::fclose(f);
  EXPECT_EQ(file_bytes, *encoded);
  std::remove(path.c_str());
}

TEST(Png, UnwritablePathNamesThePath) {
  const auto px = random_rgb(4, 4, 1);
  const std::string path = "/nonexistent_zimage_dir/sub/out.png";
  const Status st = write_png(path, px.data(), 4, 4, {});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ErrorCode::kIo);
  EXPECT_NE(st.message().find(path), std::string::npos) << st.message();
  // A directory is not writable as a file either.
  const std::string dir = std::filesystem::temp_directory_path().string();
  EXPECT_EQ(write_png(dir, px.data(), 4, 4, {}).code(), ErrorCode::kIo);
}

TEST(Png, BadDimensionsAreErrors) {
  const auto px = random_rgb(4, 4, 2);
  const int bad[][2] = {{0, 4},          {4, 0},         {-1, 4},
                        {4, -7},         {0, 0},         {1000001, 1},
                        {1, 2000000000}, {65536, 65536}, {-2147483647 - 1, 1}};
  for (const auto& wh : bad) {
    auto r = encode_png(px.data(), wh[0], wh[1], {});
    ASSERT_FALSE(r.ok()) << wh[0] << "x" << wh[1];
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
    const std::string dims = std::to_string(wh[0]) + "x" + std::to_string(wh[1]);
    EXPECT_NE(r.status().message().find(dims), std::string::npos) << r.status().message();
    const std::string path = temp_path("bad.png");
    const Status st = write_png(path, px.data(), wh[0], wh[1], {});
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(st.message().find(path), std::string::npos) << st.message();
    EXPECT_FALSE(std::filesystem::exists(path));
  }
  EXPECT_EQ(encode_png(nullptr, 4, 4, {}).status().code(), ErrorCode::kInvalidArgument);
}

TEST(Png, BadMetadataIsRejected) {
  const auto px = random_rgb(2, 2, 3);
  const std::vector<std::string> bad_keys = {
      "", std::string(80, 'k'), " lead", "trail ", "dou  ble", "ключ", std::string("a\nb")};
  for (const auto& k : bad_keys) {
    auto r = encode_png(px.data(), 2, 2, {{k, "v"}});
    ASSERT_FALSE(r.ok()) << "key '" << k << "'";
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("keyword"), std::string::npos);
  }
  EXPECT_TRUE(encode_png(px.data(), 2, 2, {{std::string(79, 'k'), "v"}}).ok());
  const std::vector<std::string> bad_values = {"\xff\xfe", "abc\xc3", std::string("a\0b", 3),
                                               "\xed\xa0\x80", "\xc0\xaf"};
  for (const auto& v : bad_values) {
    auto r = encode_png(px.data(), 2, 2, {{"prompt", v}});
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("prompt"), std::string::npos) << r.status().message();
  }
}

TEST(Png, ReadErrorsNameTheFile) {
  const std::string missing = temp_path("missing.png");
  auto r = read_png(missing);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(r.status().message().find(missing), std::string::npos);

  const std::string junk = temp_path("junk.png");
  std::FILE* f = std::fopen(junk.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fputs("this is not a png file at all", f);
  std::fclose(f);
  r = read_png(junk);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kFormat);
  EXPECT_NE(r.status().message().find(junk), std::string::npos);
  std::remove(junk.c_str());

  // Truncated and corrupted valid files: errors, never crashes.
  const auto px = random_rgb(33, 21, 4);
  auto enc = encode_png(px.data(), 33, 21, {{"k", "v"}});
  ASSERT_TRUE(enc.ok());
  for (size_t cut : {size_t{8}, size_t{20}, size_t{40}, enc->size() / 2, enc->size() - 13}) {
    auto d = decode_png(enc->data(), cut, "cut" + std::to_string(cut));
    ASSERT_FALSE(d.ok()) << cut;
    EXPECT_EQ(d.status().code(), ErrorCode::kFormat);
    EXPECT_NE(d.status().message().find("cut" + std::to_string(cut)), std::string::npos);
  }
  std::vector<uint8_t> bad = *enc;
  bad[16] = 0xFF;  // width's high byte: IHDR CRC mismatch
  EXPECT_EQ(decode_png(bad.data(), bad.size(), "crc").status().code(), ErrorCode::kFormat);
  EXPECT_FALSE(decode_png(nullptr, 0, "null").ok());
}

TEST(Png, DecodesGrayAlphaAndRgba) {
  // Encoded with libpng's simplified API (independent of our writer).
  const int w = 5, h = 3;
  std::vector<uint8_t> ga(static_cast<size_t>(w) * h * 2), rgba(static_cast<size_t>(w) * h * 4);
  for (size_t i = 0; i < ga.size(); ++i) ga[i] = static_cast<uint8_t>(i * 17);
  for (size_t i = 0; i < rgba.size(); ++i) rgba[i] = static_cast<uint8_t>(i * 7 + 1);
  for (int fmt = 0; fmt < 2; ++fmt) {
    png_image im{};
    im.version = PNG_IMAGE_VERSION;
    im.width = w;
    im.height = h;
    im.format = fmt == 0 ? PNG_FORMAT_GA : PNG_FORMAT_RGBA;
    const void* src = fmt == 0 ? static_cast<const void*>(ga.data()) : rgba.data();
    png_alloc_size_t size = 0;
    ASSERT_TRUE(png_image_write_to_memory(&im, nullptr, &size, 0, src, 0, nullptr));
    std::vector<uint8_t> mem(size);
    ASSERT_TRUE(png_image_write_to_memory(&im, mem.data(), &size, 0, src, 0, nullptr));
    auto d = decode_png(mem.data(), size, "simplified");
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    ASSERT_EQ(d->rgb.size(), static_cast<size_t>(w) * h * 3);
    for (int p = 0; p < w * h; ++p) {
      for (int c = 0; c < 3; ++c) {
        const uint8_t want =
            fmt == 0 ? ga[static_cast<size_t>(p) * 2] : rgba[static_cast<size_t>(p) * 4 + c];
        EXPECT_EQ(d->rgb[static_cast<size_t>(p) * 3 + c], want) << fmt << " " << p << " " << c;
      }
    }
  }
}
