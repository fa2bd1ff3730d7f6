// The server with a ControlNet loaded (the cn_v21_inpaint golden: diffusers'
// ZImageControlNetInpaintPipeline with a tiny 2.1 ControlNet): A1111's img2img with init_images,
// mask and a ControlNet unit is ControlNet inpainting, which takes no denoising_strength; the
// parser must not invent A1111's default (0.75) for it, and an explicit value is still checked.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/cli_run.h"
#include "common/controlnet_model.h"
#include "common/npy.h"
#include "serve/image_encode.h"
#include "serve/serve_test_util.h"

namespace zimage::serve::test {
namespace {

using nlohmann::json;

std::string file_b64(const std::string& path) {
  const std::string b = zimage::test::read_file_bytes(path);
  EXPECT_FALSE(b.empty()) << path;
  return base64_encode(std::vector<uint8_t>(b.begin(), b.end()));
}

uint8_t to_u8(float x) {
  const float v = std::nearbyint(x * 255.0f);
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

// The cn_v21_inpaint golden (diffusers' ZImageControlNetInpaintPipeline, a tiny 2.1 ControlNet)
// through /sdapi/v1/img2img: without denoising_strength the image comes back, within 1/255 of
// diffusers'; with one the request is refused naming it (ControlNet inpainting has no strength),
// and a value out of range is refused as before.
TEST(ServeA1111ControlNet, InpaintingWithoutDenoisingStrengthGivesTheImage) {
  const std::string dir = zimage::test::controlnet_golden_root() + "/cn_v21_inpaint";
  EngineOptions o;
  o.model_dir = zimage::test::controlnet_model_dir();
  o.controlnet = dir + "/controlnet";
  o.device = "cpu";
  o.threads = 2;
  auto engine = Engine::load(o);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  Server server(TestServer::defaults());
  ASSERT_TRUE(server.start().ok());
  ASSERT_TRUE(server.attach(engine->get(), nullptr, /*warm_up=*/false).ok());

  json body = {
      {"prompt", "a cat sitting on a red sofa, photo"},
      {"init_images", {file_b64(dir + "/inputs/init.png")}},
      {"mask", file_b64(dir + "/inputs/mask.png")},
      {"width", 32},
      {"height", 32},
      {"steps", 2},
      {"cfg_scale", 0},
      {"seed", 5},
      {"alwayson_scripts",
       {{"controlnet",
         {{"args", {{{"image", file_b64(dir + "/inputs/control.png")}, {"weight", 1.0}}}}}}}}};
  const Reply r = post(server.port(), "/sdapi/v1/img2img", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.json();
  ASSERT_EQ(j["images"].size(), 1u) << r.body;
  EXPECT_EQ(j["parameters"]["inpaint"], true) << r.body;
  EXPECT_FALSE(j["parameters"].contains("denoising_strength")) << r.body;  // none applied
  auto img = png_decode(base64_decode(j["images"][0].get<std::string>()), nullptr);
  ASSERT_TRUE(img.ok()) << img.status().to_string();
  auto ref = zimage::test::load_npy(dir + "/image.npy");
  ASSERT_TRUE(ref.ok());
  ASSERT_EQ(static_cast<int64_t>(img->rgb.size()), ref->numel());
  int worst = 0;
  for (size_t k = 0; k < img->rgb.size(); ++k)
    worst = std::max(worst, std::abs(int{img->rgb[k]} - int{to_u8(ref->data_as<float>()[k])}));
  EXPECT_LE(worst, 1);

  body["denoising_strength"] = 0.75;
  Reply sent = post(server.port(), "/sdapi/v1/img2img", body.dump());
  EXPECT_EQ(sent.status, 400) << sent.body;
  EXPECT_EQ(sent.json()["error"].value("param", ""), "denoising_strength") << sent.body;
  EXPECT_NE(sent.body.find("does not apply"), std::string::npos) << sent.body;
  body["denoising_strength"] = 1.5;
  sent = post(server.port(), "/sdapi/v1/img2img", body.dump());
  EXPECT_EQ(sent.status, 400) << sent.body;
  EXPECT_NE(sent.body.find("denoising_strength: must be in (0, 1]"), std::string::npos)
      << sent.body;
  // img2img without a ControlNet unit still gets A1111's default strength (0.75).
  body.erase("denoising_strength");
  body.erase("alwayson_scripts");
  body.erase("mask");
  const Reply plain = post(server.port(), "/sdapi/v1/img2img", body.dump());
  ASSERT_EQ(plain.status, 200) << plain.body;
  EXPECT_EQ(plain.json()["parameters"]["denoising_strength"], 0.75);
  server.shutdown();
}
}  // namespace
}  // namespace zimage::serve::test
