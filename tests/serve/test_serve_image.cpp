// The image-conditioned endpoints on a live in-process server with the tiny model: OpenAI's
// POST /v1/images/edits (multipart: image, mask, prompt, ...) and Automatic1111's POST
// /sdapi/v1/img2img (base64 init_images and mask). The images come back within 1/255 of the
// diffusers goldens made from the same files (tests/data/golden/image, the v_turbo cases) and
// equal to the engine's own run of the same request; the two mask conventions (OpenAI:
// transparent = edit; A1111: alpha > 128 = repaint, inpainting_mask_invert); every bad input is
// a 400 naming its field; image bodies may pass the JSON body limit, JSON bodies may not.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/cli_run.h"
#include "common/npy.h"
#include "serve/image_encode.h"
#include "serve/serve_test_util.h"

namespace zimage::serve::test {
namespace {

using nlohmann::json;

const char* kCat = "a cat sitting on a red sofa, photo";

std::string case_dir(const std::string& name) {
  return std::string(ZIMAGE_GOLDEN_DIR) + "/image/" + name;
}

std::string file_bytes(const std::string& path) {
  const std::string b = zimage::test::read_file_bytes(path);
  EXPECT_FALSE(b.empty()) << path;
  return b;
}

std::string b64(const std::string& bytes) {
  return base64_encode(std::vector<uint8_t>(bytes.begin(), bytes.end()));
}

httplib::MultipartFormData text(const std::string& name, const std::string& value) {
  return {name, value, "", ""};
}
httplib::MultipartFormData file(const std::string& name, const std::string& bytes,
                                const std::string& filename = "x.png") {
  return {name, bytes, filename, "image/png"};
}

// The decoded images of an OpenAI or A1111 response.
std::vector<Image> images_of(const Reply& r) {
  std::vector<Image> out;
  const json j = r.json();
  std::vector<std::string> list;
  if (j.contains("data"))
    for (const auto& d : j["data"]) list.push_back(d["b64_json"].get<std::string>());
  if (j.contains("images"))
    for (const auto& d : j["images"]) list.push_back(d.get<std::string>());
  for (const std::string& s : list) {
    auto img = png_decode(base64_decode(s), nullptr);
    EXPECT_TRUE(img.ok()) << img.status().to_string();
    if (img.ok()) out.push_back(*img);
  }
  return out;
}

uint8_t to_u8(float x) {
  const float v = std::nearbyint(x * 255.0f);
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

// Max |image - round(255 * diffusers)| over the case's images.
int diff_to_golden(const std::vector<Image>& got, const std::string& name) {
  auto ref = zimage::test::load_npy(case_dir(name) + "/image.npy");
  EXPECT_TRUE(ref.ok());
  if (!ref.ok() || static_cast<int64_t>(got.size()) != ref->dim(0)) return 999;
  int worst = 0;
  const size_t per = got.front().rgb.size();
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].rgb.size() != per || static_cast<int64_t>(per) != ref->numel() / ref->dim(0))
      return 999;
    for (size_t k = 0; k < per; ++k)
      worst = std::max(
          worst, std::abs(int{got[i].rgb[k]} - int{to_u8(ref->data_as<float>()[i * per + k])}));
  }
  return worst;
}

class ServeImage : public ::testing::Test {
 protected:
  void SetUp() override { server_ = std::make_unique<TestServer>(); }
  int port() const { return server_->port(); }
  std::unique_ptr<TestServer> server_;
};

TEST_F(ServeImage, EditsInpaintingMatchesDiffusers) {
  // inp_turbo: 48x40, mask, 3 steps, seed 5, default strength (1.0 with a mask).
  const std::string dir = case_dir("inp_turbo");
  Reply r = post_form(port(), "/v1/images/edits",
                      {file("image", file_bytes(dir + "/inputs/init.png")),
                       file("mask", file_bytes(dir + "/inputs/mask.png")), text("prompt", kCat),
                       text("num_inference_steps", "3"), text("seed", "5")});
  ASSERT_EQ(r.status, 200) << r.body.substr(0, 400);
  const json j = r.json();
  EXPECT_EQ(j["parameters"]["mode"], "inpaint");
  EXPECT_EQ(j["parameters"]["strength"], 1.0);
  EXPECT_EQ(j["parameters"]["size"], "48x40");
  const std::vector<Image> got = images_of(r);
  ASSERT_EQ(got.size(), 1u);
  const int d = diff_to_golden(got, "inp_turbo");
  std::printf("[ServeImage] /v1/images/edits inpainting vs diffusers: max|diff| %d\n", d);
  EXPECT_LE(d, 1);

  // The same request through the engine: the same pixels.
  GenerateRequest req;
  req.prompts = {kCat};
  req.width = 48;
  req.height = 40;
  req.steps = 3;
  req.seed = 5;
  req.init_image = *image_load(dir + "/inputs/init.png");
  req.mask = *mask_load(dir + "/inputs/mask.png");
  auto direct = shared_engine()->generate(req);
  ASSERT_TRUE(direct.ok()) << direct.status().to_string();
  EXPECT_EQ(direct->images[0].rgb, got[0].rgb);
}

TEST_F(ServeImage, EditsImg2ImgMatchesDiffusers) {
  // i2i_turbo: a 70x53 PNG -> 68x52 (Lanczos), strength 0.6 by default, 4 steps (3 run).
  const std::string dir = case_dir("i2i_turbo");
  Reply r = post_form(port(), "/v1/images/edits",
                      {file("image[]", file_bytes(dir + "/inputs/init.png")), text("prompt", kCat),
                       text("num_inference_steps", "4"), text("seed", "7"),
                       text("model", "z-image-turbo"), text("response_format", "b64_json")});
  ASSERT_EQ(r.status, 200) << r.body.substr(0, 400);
  EXPECT_EQ(r.json()["parameters"]["denoising_steps"], 3);
  const int d = diff_to_golden(images_of(r), "i2i_turbo");
  std::printf("[ServeImage] /v1/images/edits img2img vs diffusers: max|diff| %d\n", d);
  EXPECT_LE(d, 1);
}

TEST_F(ServeImage, A1111Img2ImgMatchesDiffusers) {
  // i2i_edge_jpeg: a JPEG as a data: URL, denoising_strength 0.56 of 25 steps (15 run).
  std::string dir = case_dir("i2i_edge_jpeg");
  json body = {
      {"prompt", kCat},
      {"init_images", {"data:image/jpeg;base64," + b64(file_bytes(dir + "/inputs/init.jpg"))}},
      {"denoising_strength", 0.56},
      {"steps", 25},
      {"seed", 3},
      {"sampler_name", "Euler"},
      {"mask_blur", 4}};
  Reply r = post(port(), "/sdapi/v1/img2img", body.dump());
  ASSERT_EQ(r.status, 200) << r.body.substr(0, 400);
  EXPECT_EQ(r.json()["parameters"]["denoising_strength"], 0.56);
  int d = diff_to_golden(images_of(r), "i2i_edge_jpeg");
  std::printf("[ServeImage] /sdapi/v1/img2img img2img vs diffusers: max|diff| %d\n", d);
  EXPECT_LE(d, 1);

  // inp_turbo through A1111 (denoising_strength 1.0 = diffusers' inpainting default).
  dir = case_dir("inp_turbo");
  body = {{"prompt", kCat},
          {"init_images", {b64(file_bytes(dir + "/inputs/init.png"))}},
          {"mask", b64(file_bytes(dir + "/inputs/mask.png"))},
          {"denoising_strength", 1.0},
          {"steps", 3},
          {"seed", 5},
          {"width", 48},
          {"height", 40}};
  r = post(port(), "/sdapi/v1/img2img", body.dump());
  ASSERT_EQ(r.status, 200) << r.body.substr(0, 400);
  d = diff_to_golden(images_of(r), "inp_turbo");
  std::printf("[ServeImage] /sdapi/v1/img2img inpainting vs diffusers: max|diff| %d\n", d);
  EXPECT_LE(d, 1);
}

// A 48x40 RGBA PNG whose alpha is `inside` in a rectangle and `outside` elsewhere.
std::string alpha_mask_png(uint8_t inside, uint8_t outside) {
  std::vector<uint8_t> rgba(48 * 40 * 4, 255);
  for (int y = 0; y < 40; ++y)
    for (int x = 0; x < 48; ++x)
      rgba[(y * 48 + x) * 4 + 3] = (x >= 8 && x < 32 && y >= 4 && y < 28) ? inside : outside;
  // A tiny RGBA writer: the engine's PNG encoder writes RGB only.
  std::string png;
  auto crc = [](const std::string& s) {
    uint32_t c = 0xFFFFFFFFu;
    for (unsigned char ch : s) {
      c ^= ch;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return c ^ 0xFFFFFFFFu;
  };
  auto be32 = [](uint32_t v) {
    return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                       static_cast<char>(v >> 8), static_cast<char>(v)};
  };
  auto chunk = [&](const std::string& tag, const std::string& data) {
    return be32(static_cast<uint32_t>(data.size())) + tag + data + be32(crc(tag + data));
  };
  // Stored (uncompressed) deflate blocks inside a zlib stream.
  std::string raw;
  for (int y = 0; y < 40; ++y) {
    raw.push_back(0);
    raw.append(reinterpret_cast<const char*>(&rgba[y * 48 * 4]), 48 * 4);
  }
  std::string z = "\x78\x01";
  for (size_t pos = 0; pos < raw.size(); pos += 65535) {
    const size_t n = std::min<size_t>(65535, raw.size() - pos);
    z.push_back(pos + n == raw.size() ? 1 : 0);
    z.push_back(static_cast<char>(n & 0xFF));
    z.push_back(static_cast<char>(n >> 8));
    z.push_back(static_cast<char>(~n & 0xFF));
    z.push_back(static_cast<char>((~n >> 8) & 0xFF));
    z.append(raw, pos, n);
  }
  uint32_t a = 1, b = 0;
  for (unsigned char ch : raw) a = (a + ch) % 65521, b = (b + a) % 65521;
  z += be32((b << 16) | a);
  const std::string ihdr = be32(48) + be32(40) + std::string("\x08\x06\x00\x00\x00", 5);
  png = std::string("\x89PNG\r\n\x1a\n", 8) + chunk("IHDR", ihdr) + chunk("IDAT", z) +
        chunk("IEND", "");
  return png;
}

// The engine's mask for the rectangle: white (repaint) inside when `inside_white`.
Image rect_mask(bool inside_white) {
  Image m;
  m.width = 48;
  m.height = 40;
  m.rgb.assign(48 * 40 * 3, 0);
  for (int y = 0; y < 40; ++y)
    for (int x = 0; x < 48; ++x) {
      const bool inside = x >= 8 && x < 32 && y >= 4 && y < 28;
      const uint8_t v = inside == inside_white ? 255 : 0;
      for (int c = 0; c < 3; ++c) m.rgb[(y * 48 + x) * 3 + c] = v;
    }
  return m;
}

TEST_F(ServeImage, MaskConventions) {
  const std::string dir = case_dir("inp_turbo");
  const std::string init = file_bytes(dir + "/inputs/init.png");
  GenerateRequest req;
  req.prompts = {kCat};
  req.width = 48;
  req.height = 40;
  req.steps = 2;
  req.seed = 11;
  req.init_image = *image_load(dir + "/inputs/init.png");

  // OpenAI: transparent pixels (alpha 0) are edited.
  Reply r = post_form(port(), "/v1/images/edits",
                      {file("image", init), file("mask", alpha_mask_png(0, 255)),
                       text("prompt", kCat), text("num_inference_steps", "2"), text("seed", "11")});
  ASSERT_EQ(r.status, 200) << r.body.substr(0, 400);
  req.mask = rect_mask(true);
  auto want = shared_engine()->generate(req);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(images_of(r).at(0).rgb, want->images[0].rgb) << "OpenAI: alpha 0 = edit";

  // A1111: alpha > 128 is repainted; inpainting_mask_invert swaps.
  json body = {{"prompt", kCat},
               {"init_images", {b64(init)}},
               {"mask", b64(alpha_mask_png(255, 0))},
               {"denoising_strength", 1.0},
               {"steps", 2},
               {"seed", 11}};
  r = post(port(), "/sdapi/v1/img2img", body.dump());
  ASSERT_EQ(r.status, 200) << r.body.substr(0, 400);
  EXPECT_EQ(images_of(r).at(0).rgb, want->images[0].rgb) << "A1111: alpha > 128 = repaint";
  body["mask"] = b64(alpha_mask_png(0, 255));
  body["inpainting_mask_invert"] = 1;
  r = post(port(), "/sdapi/v1/img2img", body.dump());
  ASSERT_EQ(r.status, 200) << r.body.substr(0, 400);
  EXPECT_EQ(images_of(r).at(0).rgb, want->images[0].rgb) << "A1111: inverted";
}

TEST_F(ServeImage, BadInputsAre400sNamingTheField) {
  const std::string dir = case_dir("inp_turbo");
  const std::string init = file_bytes(dir + "/inputs/init.png");
  const std::string other = file_bytes(case_dir("i2i_turbo") + "/inputs/init.png");  // 70x53
  struct FormCase {
    std::string what, param;
    httplib::MultipartFormDataItems items;
  };
  const std::vector<FormCase> forms = {
      {"no image", "image", {text("prompt", kCat)}},
      {"garbage image", "image", {file("image", "not an image at all"), text("prompt", kCat)}},
      {"truncated image",
       "image",
       {file("image", init.substr(0, init.size() / 2)), text("prompt", kCat)}},
      {"two images", "image", {file("image", init), file("image", init), text("prompt", kCat)}},
      {"mask of another size",
       "mask",
       {file("image", init), file("mask", other), text("prompt", kCat)}},
      {"garbage mask", "mask", {file("image", init), file("mask", "GIF89a"), text("prompt", kCat)}},
      {"strength text",
       "strength",
       {file("image", init), text("prompt", kCat), text("strength", "abc")}},
      {"strength 0",
       "strength",
       {file("image", init), text("prompt", kCat), text("strength", "0")}},
      {"strength 1.5",
       "strength",
       {file("image", init), text("prompt", kCat), text("strength", "1.5")}},
      {"tiny strength",
       "strength",
       {file("image", init), text("prompt", kCat), text("strength", "1e-300")}},
      {"n text", "n", {file("image", init), text("prompt", kCat), text("n", "two")}},
      {"no prompt", "prompt", {file("image", init)}},
      {"bad size", "size", {file("image", init), text("prompt", kCat), text("size", "48x41")}},
      {"unknown field", "steps", {file("image", init), text("prompt", kCat), text("steps", "2")}},
  };
  for (const FormCase& c : forms) {
    Reply r = post_form(port(), "/v1/images/edits", c.items);
    EXPECT_EQ(r.status, 400) << c.what << ": " << r.body.substr(0, 300);
    const json e = r.json()["error"];
    EXPECT_EQ(e["param"], c.param) << c.what << ": " << e.dump();
    std::printf("  edits %-22s -> %s\n", c.what.c_str(), e["message"].get<std::string>().c_str());
  }
  Reply r = post(port(), "/v1/images/edits", R"({"prompt": "x"})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.json()["error"]["param"], "body");

  struct JsonCase {
    std::string what, param;
    json body;
  };
  const std::string img = b64(init);
  const std::vector<JsonCase> bodies = {
      {"no init_images", "init_images", {{"prompt", kCat}}},
      {"init_images not an array", "init_images", {{"prompt", kCat}, {"init_images", img}}},
      {"two init_images", "init_images", {{"prompt", kCat}, {"init_images", {img, img}}}},
      {"not base64", "init_images", {{"prompt", kCat}, {"init_images", {"***"}}}},
      {"not an image", "init_images", {{"prompt", kCat}, {"init_images", {b64("hello")}}}},
      {"denoising_strength 0",
       "denoising_strength",
       {{"prompt", kCat}, {"init_images", {img}}, {"denoising_strength", 0}}},
      {"denoising_strength text",
       "denoising_strength",
       {{"prompt", kCat}, {"init_images", {img}}, {"denoising_strength", "high"}}},
      {"resize_mode 1",
       "resize_mode",
       {{"prompt", kCat}, {"init_images", {img}}, {"resize_mode", 1}}},
      {"mask of another size",
       "mask",
       {{"prompt", kCat}, {"init_images", {img}}, {"mask", b64(other)}}},
      {"mask not a string", "mask", {{"prompt", kCat}, {"init_images", {img}}, {"mask", 3}}},
      {"invert 2",
       "inpainting_mask_invert",
       {{"prompt", kCat}, {"init_images", {img}}, {"inpainting_mask_invert", 2}}},
      {"width not a multiple", "width", {{"prompt", kCat}, {"init_images", {img}}, {"width", 50}}},
  };
  for (const JsonCase& c : bodies) {
    Reply j = post(port(), "/sdapi/v1/img2img", c.body.dump());
    EXPECT_EQ(j.status, 400) << c.what << ": " << j.body.substr(0, 300);
    const json e = j.json()["error"];
    EXPECT_EQ(e["param"], c.param) << c.what << ": " << e.dump();
    std::printf("  img2img %-22s -> %s\n", c.what.c_str(), e["message"].get<std::string>().c_str());
  }
  EXPECT_EQ(server_->server().context().metrics.jobs_succeeded.load(), 0u);
}

TEST(ServeImageLimits, ImageBodiesPassTheJsonLimitJsonBodiesDoNot) {
  ServeOptions o = TestServer::defaults();
  o.max_body_bytes = 64 << 10;
  o.max_image_body_bytes = 4 << 20;
  TestServer server(o);
  // A 256x256 noise image: a PNG of about 200 KB, over the JSON limit.
  Image noise;
  noise.width = noise.height = 256;
  noise.rgb.resize(256 * 256 * 3);
  uint32_t s = 12345;
  for (uint8_t& v : noise.rgb) v = static_cast<uint8_t>((s = s * 1664525u + 1013904223u) >> 24);
  auto png = png_encode(noise);
  ASSERT_TRUE(png.ok());
  ASSERT_GT(png->size(), size_t{150} << 10);
  const std::string bytes(png->begin(), png->end());
  Reply r = post_form(server.port(), "/v1/images/edits",
                      {file("image", bytes), text("prompt", kCat), text("size", "64x64"),
                       text("num_inference_steps", "2")});
  EXPECT_EQ(r.status, 200) << r.body.substr(0, 300);
  json body = {
      {"prompt", kCat}, {"init_images", {b64(bytes)}}, {"width", 64}, {"height", 64}, {"steps", 2}};
  r = post(server.port(), "/sdapi/v1/img2img", body.dump());
  EXPECT_EQ(r.status, 200) << r.body.substr(0, 300);
  // The same size of JSON to a text-to-image route: 413.
  r = post(server.port(), "/v1/images/generations",
           json{{"prompt", std::string(200 << 10, 'x')}}.dump());
  EXPECT_EQ(r.status, 413);
  EXPECT_EQ(r.json()["error"]["param"], "body");
}

}  // namespace
}  // namespace zimage::serve::test
