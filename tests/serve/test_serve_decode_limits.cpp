// Decoding cost of the server's image inputs (io/image/image_read.h): a JPEG is refused from its
// markers, before anything is decoded, past 500 scans or past the scan-cost budget (a scan bomb:
// thousands of progressive scans in a small file, each decoded over the whole image), and over
// HTTP every such refusal is a 400 naming the field the image came in.
#include <gtest/gtest.h>
#include <zlib.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/image/image_read.h"
#include "serve/image_encode.h"
#include "serve/serve_test_util.h"

namespace zimage::serve::test {
namespace {

using nlohmann::json;

// A valid progressive grayscale JPEG of w x h (flat gray) with `scans` scans: the DC scan, then
// each AC coefficient on its own with successive approximation (Al 10, then refinements down to
// 0), at most 1 + 63 x 11 = 694 scans as libjpeg's encoder could write them. Every scan codes
// zeros only (one-code Huffman tables), so the file is small whatever the size. `tricks`: what a
// hostile file may add to hide scans from a marker walker that libjpeg still decodes: a comment
// segment of length 0 (libjpeg skips nothing), a restart interval of one MCU, and after each scan's
// data an invalid marker 0xFF 0x05 with a "length" of 0xFFFF (libjpeg skips it while
// resynchronising).
std::string progressive_jpeg(int w, int h, int scans, bool tricks = false) {
  std::string j = "\xFF\xD8";
  if (tricks) j += std::string("\xFF\xFE\x00\x00\xFF\xDD\x00\x04\x00\x01", 10);
  auto u16 = [&j](int v) {
    j += static_cast<char>(v >> 8);
    j += static_cast<char>(v & 0xFF);
  };
  j += "\xFF\xDB";  // DQT: table 0, all ones
  u16(67);
  j += '\0';
  j += std::string(64, '\x01');
  j += "\xFF\xC2";  // SOF2: 8-bit, h x w, one component (id 1, 1x1, table 0)
  u16(11);
  j += '\x08';
  u16(h);
  u16(w);
  j += std::string("\x01\x01\x11\x00", 4);
  for (const char table : {'\x00', '\x10'}) {  // DHT DC 0 and AC 0: one 1-bit code, symbol 0
    j += "\xFF\xC4";
    u16(20);
    j += table;
    j += '\x01';
    j += std::string(15, '\0');
    j += '\0';
  }
  const int64_t blocks = int64_t{(w + 7) / 8} * ((h + 7) / 8);
  // One '0' bit a block (DC difference 0, EOB, no correction bits), padded with ones.
  std::string data(static_cast<size_t>(blocks / 8), '\0');
  if (blocks % 8 != 0) data += static_cast<char>(0xFF >> (blocks % 8));
  auto scan = [&](int ss, int se, int ah, int al) {
    j += "\xFF\xDA";
    u16(8);
    j += std::string("\x01\x01\x00", 3);
    j += static_cast<char>(ss);
    j += static_cast<char>(se);
    j += static_cast<char>(ah << 4 | al);
    j += data;
    if (tricks) j += "\xFF\x05\xFF\xFF";
  };
  scan(0, 0, 0, 0);
  for (int k = 1, n = 1; k <= 63 && n < scans; ++k)
    for (int al = 10; al >= 0 && n < scans; --al, ++n) scan(k, k, al == 10 ? 0 : al + 1, al);
  j += "\xFF\xD9";
  return j;
}

Result<Image8> decode(const std::string& bytes, const std::string& name) {
  return decode_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), name);
}

TEST(ServeDecodeLimits, JpegScanCountIsBounded) {
  // 500 scans: a valid file, decoded (flat mid-gray).
  const auto ok = decode(progressive_jpeg(16, 16, 500), "image");
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->width, 16);
  EXPECT_EQ(ok->channels, 1);
  EXPECT_EQ(ok->pixels[0], 128);
  // 694 scans: refused from the markers, naming the input.
  const auto t0 = std::chrono::steady_clock::now();
  const auto bad = decode(progressive_jpeg(16, 16, 694), "image");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message().rfind("image: progressive JPEG with more than 500 scans", 0), 0u)
      << bad.status().to_string();
  // At the pixel limit far fewer scans cost as much as the whole budget: 8192² with 250
  // one-coefficient scans (about 10 s of CPU) is refused before any decoding.
  const auto big = decode(progressive_jpeg(8192, 8192, 250), "mask");
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().message().rfind("mask: JPEG of 8192x8192 whose ", 0), 0u)
      << big.status().to_string();
  EXPECT_NE(big.status().message().find("decoding-cost limit"), std::string::npos);
  // The same through the tricks that hide scans from a careless marker walker.
  const auto hidden = decode(progressive_jpeg(16, 16, 694, true), "image");
  ASSERT_FALSE(hidden.ok());
  EXPECT_NE(hidden.status().message().find("more than 500 scans"), std::string::npos)
      << hidden.status().to_string();
  const auto hidden_big = decode(progressive_jpeg(8192, 8192, 250, true), "image");
  ASSERT_FALSE(hidden_big.ok());
  EXPECT_NE(hidden_big.status().message().find("decoding-cost limit"), std::string::npos)
      << hidden_big.status().to_string();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  // Fewer scans over fewer pixels stay within it: 2048² with 60 scans decodes.
  const auto mid = decode(progressive_jpeg(2048, 2048, 60), "image");
  EXPECT_TRUE(mid.ok()) << mid.status().to_string();
}

// `png` with chunks inserted before its IEND (the last 12 bytes).
std::string with_chunks(const std::string& png, const std::vector<std::string>& chunks) {
  std::string out = png.substr(0, png.size() - 12);
  for (const std::string& c : chunks) out += c;
  return out + png.substr(png.size() - 12);
}

std::string png_chunk(const std::string& type, const std::string& data) {
  std::string c;
  for (int s = 24; s >= 0; s -= 8) c += static_cast<char>((data.size() >> s) & 0xFF);
  c += type + data;
  const uint32_t crc = static_cast<uint32_t>(
      crc32(crc32(0, reinterpret_cast<const Bytef*>(type.data()), 4),
            reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(data.size())));
  for (int s = 24; s >= 0; s -= 8) c += static_cast<char>((crc >> s) & 0xFF);
  return c;
}

// A zTXt chunk whose text is `n` zero bytes (a few KiB compressed).
std::string ztxt(size_t n) {
  const std::string text(n, '\0');
  uLongf size = compressBound(static_cast<uLong>(n));
  std::string z(size, '\0');
  EXPECT_EQ(compress2(reinterpret_cast<Bytef*>(z.data()), &size,
                      reinterpret_cast<const Bytef*>(text.data()), static_cast<uLong>(n), 9),
            Z_OK);
  z.resize(size);
  return png_chunk("zTXt", std::string("Comment\0\0", 9) + z);
}

// PNG text follows PIL's limits (1 MiB a compressed text, 64 MiB in all), checked before libpng
// inflates anything: a small file can no longer make the decoder inflate gigabytes.
TEST(ServeDecodeLimits, PngTextIsBounded) {
  const std::string png = png_bytes(pattern_image(8, 8, 1));
  const auto ok =
      decode(with_chunks(png, {ztxt(kMaxPngTextChunk), png_chunk("tEXt", "a\0b")}), "image");
  EXPECT_TRUE(ok.ok()) << ok.status().to_string();
  const auto one = decode(with_chunks(png, {ztxt(kMaxPngTextChunk + 1)}), "image");
  ASSERT_FALSE(one.ok());
  EXPECT_EQ(
      one.status().message().rfind("image: a PNG zTXt text chunk inflates to more than 1 MiB", 0),
      0u)
      << one.status().to_string();
  const std::vector<std::string> many(65, ztxt(kMaxPngTextChunk));  // 65 MiB of text, 65 KiB
  const auto all = decode(with_chunks(png, many), "mask");
  ASSERT_FALSE(all.ok());
  EXPECT_EQ(all.status().message().rfind("mask: the PNG's text chunks hold more than 64 MiB", 0),
            0u)
      << all.status().to_string();
}

// Over HTTP each JPEG field is a 400 naming it: edits' image and mask, A1111's init_images and
// mask, the ControlNet unit's image.
TEST(ServeDecodeLimits, ScanBombsAre400sNamingTheField) {
  TestServer server;
  const std::string bomb = progressive_jpeg(16, 16, 694);
  const std::string png = png_bytes(pattern_image(32, 32, 1));
  auto expect_refused = [](const Reply& r, const std::string& param) {
    EXPECT_EQ(r.status, 400) << r.body;
    const json e = r.json()["error"];
    EXPECT_EQ(e.value("param", ""), param) << r.body;
    EXPECT_NE(e.value("message", "").find("more than 500 scans"), std::string::npos) << r.body;
  };
  expect_refused(post_form(server.port(), "/v1/images/edits",
                           {{"image", bomb, "in.jpg", "image/jpeg"}, {"prompt", "a cat", "", ""}}),
                 "image");
  expect_refused(post_form(server.port(), "/v1/images/edits",
                           {{"image", png, "in.png", "image/png"},
                            {"mask", bomb, "mask.jpg", "image/jpeg"},
                            {"prompt", "a cat", "", ""}}),
                 "mask");
  const Reply text = post_form(server.port(), "/v1/images/edits",
                               {{"image", with_chunks(png, {ztxt(2 << 20)}), "in.png", "image/png"},
                                {"prompt", "a cat", "", ""}});
  EXPECT_EQ(text.status, 400) << text.body;
  EXPECT_EQ(text.json()["error"].value("param", ""), "image") << text.body;
  const std::string b64_bomb = base64_encode(std::vector<uint8_t>(bomb.begin(), bomb.end()));
  const std::string b64_png = base64_encode(std::vector<uint8_t>(png.begin(), png.end()));
  json a = {{"prompt", "a cat"}, {"init_images", {b64_bomb}}, {"steps", 2}};
  expect_refused(post(server.port(), "/sdapi/v1/img2img", a.dump()), "init_images");
  a["init_images"] = {b64_png};
  a["mask"] = b64_bomb;
  expect_refused(post(server.port(), "/sdapi/v1/img2img", a.dump()), "mask");
  json t = {{"prompt", "a cat"},
            {"alwayson_scripts", {{"controlnet", {{"args", {{{"image", b64_bomb}}}}}}}}};
  expect_refused(post(server.port(), "/sdapi/v1/txt2img", t.dump()), "control_image");
}
}  // namespace
}  // namespace zimage::serve::test
