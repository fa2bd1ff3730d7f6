// The image reader (io/image/image_read.h) and PIL's Lanczos resize (io/image/image_resize.h) against PIL
// itself: the image_io golden (tools/make_image_goldens.py) holds files in many PNG / JPEG / WebP
// variants with the arrays diffusers.utils.load_image gives for them (EXIF / XMP orientation
// applied, converted to RGB) and their convert("L"), and PIL resizes of RGB and gray images to
// many sizes. Everything is compared byte for byte; the tests print the largest difference.
// Bad files: each refused with a message naming the file.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/cli_run.h"
#include "common/npy.h"
#include "io/image/image_read.h"
#include "io/image/image_resize.h"
#include "zimage/zimage.h"

namespace zimage {
namespace {

namespace fs = std::filesystem;

std::string io_dir() {
  return std::string(ZIMAGE_GOLDEN_DIR) + "/image/image_io";
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

// Max |a - b| between an Image8 and a uint8 .npy of PIL's result; -1 for a shape mismatch.
int max_diff(const Image8& ours, const std::string& npy_path) {
  auto ref = test::load_npy(npy_path);
  EXPECT_TRUE(ref.ok()) << npy_path << ": " << ref.status().to_string();
  if (!ref.ok()) return -1;
  const Tensor& r = *ref;
  const int64_t ch = r.rank() == 3 ? r.dim(2) : 1;
  if (r.dim(0) != ours.height || r.dim(1) != ours.width || ch != ours.channels) {
    ADD_FAILURE() << npy_path << ": PIL " << r.describe() << ", ours " << ours.width << "x"
                  << ours.height << "x" << ours.channels;
    return -1;
  }
  int worst = 0;
  const uint8_t* p = r.data_as<uint8_t>();
  for (size_t i = 0; i < ours.pixels.size(); ++i)
    worst = std::max(worst, std::abs(int{ours.pixels[i]} - int{p[i]}));
  return worst;
}

TEST(ImageRead, EveryFileDecodesAsPil) {
  const nlohmann::json modes = read_json(io_dir() + "/decode/modes.json");
  ASSERT_GE(modes.size(), 30u);
  int files = 0, worst_rgb = 0, worst_gray = 0;
  for (const auto& [name, info] : modes.items()) {
    const std::string path = io_dir() + "/decode/" + name;
    const std::string mode = info.at("mode").get<std::string>();
    auto img = read_image(path);
    if (mode == "I;16" || mode == "CMYK" || name == "animated.webp") {
      // Refused: PIL's 16-bit gray clipping, PIL's CMYK formula, animations.
      ASSERT_FALSE(img.ok()) << name << " (" << mode << ") should be refused";
      EXPECT_EQ(img.status().code(), ErrorCode::kFormat) << img.status().to_string();
      EXPECT_NE(img.status().message().find(path), std::string::npos) << img.status().message();
      std::printf("  %-24s %-5s refused: %s\n", name.c_str(), mode.c_str(),
                  img.status().message().substr(path.size() + 2).c_str());
      continue;
    }
    ASSERT_TRUE(img.ok()) << name << ": " << img.status().to_string();
    const int d_rgb = max_diff(to_rgb(*img), path + ".npy");
    const int d_gray = max_diff(to_gray(*img), path + ".L.npy");
    std::printf("  %-24s %-5s %dx%d x%d  max|diff| RGB %d, L %d\n", name.c_str(), mode.c_str(),
                img->width, img->height, img->channels, d_rgb, d_gray);
    EXPECT_EQ(d_rgb, 0) << name;
    EXPECT_EQ(d_gray, 0) << name;
    worst_rgb = std::max(worst_rgb, d_rgb);
    worst_gray = std::max(worst_gray, d_gray);
    ++files;
  }
  std::printf("[ImageRead] %d files decoded as PIL: max|diff| RGB %d, L %d\n", files, worst_rgb,
              worst_gray);
}

TEST(ImageRead, ChannelsAsPilModes) {
  const nlohmann::json modes = read_json(io_dir() + "/decode/modes.json");
  const std::map<std::string, int> channels = {{"1", 1}, {"L", 1},   {"LA", 2},
                                               {"P", 3}, {"RGB", 3}, {"RGBA", 4}};
  for (const auto& [name, info] : modes.items()) {
    const std::string mode = info.at("mode").get<std::string>();
    if (channels.count(mode) == 0 || name == "animated.webp") continue;
    auto img = read_image(io_dir() + "/decode/" + name);
    ASSERT_TRUE(img.ok()) << name;
    if (name == "gray_alpha16.png") {
      EXPECT_EQ(img->channels, 2) << name;  // PIL: "RGBA" with R = G = B; same pixels
      continue;
    }
    EXPECT_EQ(img->channels, channels.at(mode)) << name << " (PIL " << mode << ")";
  }
}

TEST(ImageResize, LanczosMatchesPil) {
  const nlohmann::json sizes = read_json(io_dir() + "/resize/sizes.json");
  int cases = 0, worst = 0;
  for (const auto& [name, list] : sizes.items()) {
    auto src = read_image(io_dir() + "/resize/" + name + ".png");
    ASSERT_TRUE(src.ok()) << src.status().to_string();
    for (const auto& wh : list) {
      const int w = wh.at(0).get<int>(), h = wh.at(1).get<int>();
      auto out = resize_lanczos(*src, w, h);
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      const int d = max_diff(*out, io_dir() + "/resize/" + name + "_" + std::to_string(w) + "x" +
                                       std::to_string(h) + ".npy");
      EXPECT_EQ(d, 0) << name << " -> " << w << "x" << h;
      worst = std::max(worst, d);
      ++cases;
    }
  }
  std::printf("[ImageResize] %d PIL Lanczos resizes (up, down, odd ratios, 1x1): max|diff| %d\n",
              cases, worst);
  EXPECT_GE(cases, 30);
}

TEST(ImageResize, SameSizeIsACopyAndBadSizesFail) {
  Image8 img;
  img.width = 3;
  img.height = 2;
  img.channels = 3;
  img.pixels = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18};
  auto same = resize_lanczos(img, 3, 2);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->pixels, img.pixels);
  EXPECT_FALSE(resize_lanczos(img, 0, 2).ok());
  EXPECT_FALSE(resize_lanczos(img, 3, -1).ok());
  img.pixels.pop_back();
  EXPECT_FALSE(resize_lanczos(img, 6, 4).ok());
}

TEST(ImageRead, LumaMatchesPil) {
  auto src = read_image(io_dir() + "/resize/luma.png");
  ASSERT_TRUE(src.ok());
  const int d = max_diff(to_gray(*src), io_dir() + "/resize/luma.L.npy");
  std::printf("[ImageRead] RGB -> L over %d colours: max|diff| %d\n", src->width * src->height, d);
  EXPECT_EQ(d, 0);
}

TEST(ImageRead, OrientationParsers) {
  // TIFF blocks by hand: little and big endian, SHORT and LONG, prefix or not, malformed.
  const std::string le("II*\0\x08\0\0\0\x01\0\x12\x01\x03\0\x01\0\0\0\x06\0\0\0\0\0\0\0", 26);
  const std::string be("MM\0*\0\0\0\x08\0\x01\x01\x12\0\x03\0\0\0\x01\0\x03\0\0\0\0\0\0", 26);
  EXPECT_EQ(exif_orientation(le), 6);
  EXPECT_EQ(exif_orientation(std::string("Exif\0\0", 6) + le), 6);
  EXPECT_EQ(exif_orientation(be), 3);
  EXPECT_EQ(exif_orientation(le.substr(0, 20)), -1);  // entry cut off
  EXPECT_EQ(exif_orientation("garbage"), -1);
  EXPECT_EQ(exif_orientation(""), -1);
  EXPECT_EQ(xmp_orientation("<x tiff:Orientation=\"8\"/>"), 8);
  EXPECT_EQ(xmp_orientation("<tiff:Orientation>5</tiff:Orientation>"), 5);
  EXPECT_EQ(xmp_orientation("tiff:Orientation='6' tiff:Orientation=\"2\""), 2);  // first match
  EXPECT_EQ(xmp_orientation("tiff:Orientation=\"x\""), 0);
}

std::string bytes_of(const std::string& path) {
  return test::read_file_bytes(path);
}

Result<Image8> decode(const std::string& bytes, const std::string& name) {
  return decode_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), name);
}

TEST(ImageRead, BadFilesNameTheFile) {
  const std::string png = bytes_of(io_dir() + "/decode/rgb8.png");
  const std::string jpg = bytes_of(io_dir() + "/decode/q90_420.jpg");
  const std::string webp = bytes_of(io_dir() + "/decode/lossy.webp");
  ASSERT_FALSE(png.empty() || jpg.empty() || webp.empty());
  struct Bad {
    std::string what, bytes;
  };
  std::string huge = png;  // IHDR claiming 100000 x 100000: refused before libpng runs
  huge[16] = 0, huge[17] = 1, huge[18] = static_cast<char>(0x86),
  huge[19] = static_cast<char>(0xA0);
  huge[20] = 0, huge[21] = 1, huge[22] = static_cast<char>(0x86),
  huge[23] = static_cast<char>(0xA0);
  const std::vector<Bad> bad = {
      {"empty", ""},
      {"text", "hello, this is not an image"},
      {"gif", "GIF89a\x01\0\x01\0"},
      {"truncated png", png.substr(0, png.size() / 2)},
      {"png header only", png.substr(0, 40)},
      {"truncated jpeg", jpg.substr(0, jpg.size() / 2)},
      {"jpeg header only", jpg.substr(0, 20)},
      {"truncated webp", webp.substr(0, webp.size() / 2)},
      {"huge png", huge},
  };
  for (const Bad& b : bad) {
    auto r = decode(b.bytes, "input-" + b.what);
    ASSERT_FALSE(r.ok()) << b.what << " was accepted";
    EXPECT_NE(r.status().message().find("input-" + b.what), std::string::npos)
        << r.status().message();
    std::printf("  %-18s -> %s\n", b.what.c_str(), r.status().to_string().c_str());
  }
}

TEST(ImageRead, FilesThatAreNotImages) {
  const fs::path dir = fs::temp_directory_path() / ("zimage_image_io_" + std::to_string(getpid()));
  fs::create_directories(dir);
  auto missing = read_image((dir / "nope.png").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope.png"), std::string::npos);
  auto folder = read_image(dir.string());
  ASSERT_FALSE(folder.ok());
  EXPECT_NE(folder.status().message().find(dir.string()), std::string::npos);
  const std::string fifo = (dir / "fifo").string();
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  auto f = read_image(fifo);  // must not block
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("fifo"), std::string::npos) << f.status().message();
  fs::remove_all(dir);
}

TEST(ImageRead, PublicLoaders) {
  auto rgba = image_load(io_dir() + "/decode/rgba8.png");
  ASSERT_TRUE(rgba.ok()) << rgba.status().to_string();
  EXPECT_EQ(rgba->rgb.size(), static_cast<size_t>(rgba->width) * rgba->height * 3);
  auto gray = mask_load(io_dir() + "/decode/gray8.png");
  ASSERT_TRUE(gray.ok()) << gray.status().to_string();
  for (size_t i = 0; i < gray->rgb.size(); i += 3) {
    ASSERT_EQ(gray->rgb[i], gray->rgb[i + 1]);
    ASSERT_EQ(gray->rgb[i], gray->rgb[i + 2]);
  }
  for (const char* with_alpha : {"rgba8.png", "gray_alpha8.png", "alpha.webp"}) {
    auto m = mask_load(io_dir() + "/decode/" + with_alpha);
    ASSERT_FALSE(m.ok()) << with_alpha;
    EXPECT_NE(m.status().message().find("alpha"), std::string::npos) << m.status().message();
    EXPECT_NE(m.status().message().find(with_alpha), std::string::npos) << m.status().message();
  }
}

}  // namespace
}  // namespace zimage
