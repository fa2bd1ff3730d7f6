// Image-conditioned requests through the public API and the CLI: bad inputs are refused with a
// message naming the field (API) or the flag and the file (CLI, exit 2); the defaults (strength
// 0.6 / 1.0, the output size taken from the image) are diffusers'; an init image resized to an
// asked-for size equals the image resized first; a batch of image requests mixed with a text
// request (continuous batching) gives each the image it gets alone.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "zimage/request_check.h"
#include "common/cli_run.h"
#include "common/tiny_engine.h"
#include "io/image/image_read.h"
#include "io/image/image_resize.h"
#include "zimage/zimage.h"

namespace zimage {
namespace {

namespace fs = std::filesystem;

std::string image_case(const std::string& name) {
  return std::string(ZIMAGE_GOLDEN_DIR) + "/image/" + name;
}

Image solid(int w, int h, uint8_t v) {
  Image img;
  img.width = w;
  img.height = h;
  img.rgb.assign(static_cast<size_t>(w) * h * 3, v);
  return img;
}

class ImageRequests : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    engine_ = test::load_tiny_engine().release();
    ASSERT_NE(engine_, nullptr);
  }
  static void TearDownTestSuite() {
    delete engine_;
    engine_ = nullptr;
  }
  static GenerateRequest base() {
    GenerateRequest r;
    r.prompts = {"a cat sitting on a red sofa, photo"};
    r.width = 32;
    r.height = 32;
    r.steps = 2;
    r.seed = 3;
    return r;
  }
  // Expects validate() to fail with a message starting with `field` + ": ".
  static void expect_refused(const GenerateRequest& r, const std::string& field,
                             const std::string& what) {
    const Status st = engine_->validate(r);
    ASSERT_FALSE(st.ok()) << what << " was accepted";
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << what;
    EXPECT_EQ(st.message().rfind(field + ": ", 0), 0u) << what << ": " << st.message();
    std::printf("  %-30s -> %s\n", what.c_str(), st.message().c_str());
  }
  static Engine* engine_;
};
Engine* ImageRequests::engine_ = nullptr;

TEST_F(ImageRequests, BadFieldsAreNamed) {
  GenerateRequest r = base();
  r.strength = 0.5;
  expect_refused(r, "strength", "strength without an image");
  r = base();
  r.mask = solid(32, 32, 255);
  expect_refused(r, "mask", "mask without an image");
  r = base();
  r.init_image = solid(32, 32, 128);
  for (double s : {0.0, -0.5, 1.5, std::nan(""), std::numeric_limits<double>::infinity()}) {
    r.strength = s;
    expect_refused(r, "strength", "strength " + std::to_string(s));
  }
  r.strength = 1e-300;  // 2 - 2e-300 == 2 in double: no step left
  expect_refused(r, "strength", "strength 1e-300");
  r.strength = 0.01;  // int(2 - 0.02) = 1: one step, fine
  EXPECT_TRUE(engine_->validate(r).ok());
  r.strength.reset();
  r.init_image = solid(0, 32, 0);
  expect_refused(r, "init_image", "empty image");
  r.init_image = solid(32, 32, 0);
  r.init_image->rgb.pop_back();
  expect_refused(r, "init_image", "short pixel buffer");
  r.init_image = Image{9000, 9000, {}};  // the size is refused before the buffer is looked at
  expect_refused(r, "init_image", "81 MP image");
  r.init_image = solid(40, 30, 0);
  r.mask = solid(30, 40, 255);
  expect_refused(r, "mask", "mask of another size");
  r.mask = solid(40, 30, 255);
  r.mask->rgb.resize(10);
  expect_refused(r, "mask", "short mask buffer");
  r.mask = solid(40, 30, 255);
  EXPECT_TRUE(engine_->validate(r).ok());  // any image size: it is resized to width x height
  r.width = 30;
  expect_refused(r, "width", "width not a multiple");
}

TEST_F(ImageRequests, DefaultsAreDiffusers) {
  GenerateRequest r = base();
  r.steps = 8;
  r.init_image = solid(32, 32, 90);
  EXPECT_EQ(denoising_steps(r), 5);  // strength 0.6: t_start int(8 - 4.8) = 3
  r.mask = solid(32, 32, 255);
  EXPECT_EQ(denoising_steps(r), 8);  // strength 1.0
  r.strength = 0.25;
  EXPECT_EQ(denoising_steps(r), 2);
  r.init_image.reset();
  r.mask.reset();
  r.strength.reset();
  EXPECT_EQ(denoising_steps(r), 8);
}

TEST_F(ImageRequests, ResizedInputEqualsAPreResizedOne) {
  // An input of another size is resized (PIL Lanczos) to width x height: the same as handing
  // over the resized pixels.
  auto big = read_image(image_case("i2i_turbo") + "/inputs/init.png");  // 70x53
  ASSERT_TRUE(big.ok());
  GenerateRequest a = base();
  a.width = 48;
  a.height = 32;
  a.init_image = Image{big->width, big->height, big->pixels};
  auto small = resize_lanczos(*big, 48, 32);
  ASSERT_TRUE(small.ok());
  GenerateRequest b = a;
  b.init_image = Image{48, 32, small->pixels};
  auto ra = engine_->generate(a);
  auto rb = engine_->generate(b);
  ASSERT_TRUE(ra.ok() && rb.ok()) << ra.status().to_string() << rb.status().to_string();
  EXPECT_EQ(ra->images[0].rgb, rb->images[0].rgb);
}

TEST_F(ImageRequests, BatchedWithOthersAsAlone) {
  // Continuous batching: an inpainting request, an img2img request (starting later in the
  // schedule) and a text-to-image request of one size share DiT forwards.
  const std::string dir = image_case("inp_turbo");
  GenerateRequest inp = base();
  inp.width = 48;
  inp.height = 40;
  inp.steps = 3;
  inp.init_image = *image_load(dir + "/inputs/init.png");
  inp.mask = *mask_load(dir + "/inputs/mask.png");
  GenerateRequest i2i = inp;
  i2i.mask.reset();
  i2i.strength = 0.5;
  i2i.seed = 9;
  GenerateRequest t2i = inp;
  t2i.init_image.reset();
  t2i.mask.reset();
  t2i.seed = 4;
  std::vector<GenerateRequest> reqs = {inp, i2i, t2i};
  std::vector<std::vector<uint8_t>> alone;
  for (const auto& r : reqs) {
    auto g = engine_->generate(r);
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    alone.push_back(g->images[0].rgb);
  }
  std::map<uint64_t, size_t> ids;
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto id = engine_->batch_add(reqs[i]);
    ASSERT_TRUE(id.ok()) << id.status().to_string();
    ids[*id] = i;
  }
  int worst = 0, done = 0;
  for (int guard = 0; guard < 20 && done < 3; ++guard) {
    for (BatchOutcome& o : engine_->batch_step()) {
      ASSERT_TRUE(o.result.ok()) << o.result.status().to_string();
      const auto& want = alone[ids.at(o.id)];
      const auto& got = o.result->images[0].rgb;
      ASSERT_EQ(got.size(), want.size());
      for (size_t k = 0; k < got.size(); ++k)
        worst = std::max(worst, std::abs(int{got[k]} - int{want[k]}));
      ++done;
    }
  }
  EXPECT_EQ(done, 3);
  std::printf("[ImageRequests] batched (inpaint + img2img + text) vs alone: max|diff| %d\n", worst);
  EXPECT_LE(worst, 1);  // the DiT's GEMMs see more rows; float summation order only
}

test::ProgramRun cli(const std::vector<std::string>& args) {
  test::ProgramSpec p;
  p.exe = ZIMAGE_CLI_PATH;
  p.args = args;
  return test::run_program(p);
}

TEST(ImageCli, BadInputsNameTheFlagAndFile) {
  const fs::path dir = fs::temp_directory_path() / ("zimage_image_cli_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string model = test::tiny_model_dir();
  const std::string init = image_case("inp_turbo") + "/inputs/init.png";  // 48x40
  const std::string mask = image_case("inp_turbo") + "/inputs/mask.png";
  const std::string other = image_case("i2i_turbo") + "/inputs/init.png";  // 70x53
  const std::string rgba = image_case("image_io") + "/decode/rgba8.png";
  const std::string junk = (dir / "junk.png").string();
  {
    std::FILE* f = std::fopen(junk.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fputs("definitely not a PNG", f);
    std::fclose(f);
  }
  const std::string out = (dir / "out.png").string();
  const std::vector<std::string> common = {"generate", "--model", model, "--prompt", "a cat",
                                           "--steps",  "2",       "-o",  out};
  struct Bad {
    std::vector<std::string> extra;
    std::vector<std::string> expect;  // all in the message
  };
  const std::vector<Bad> bad = {
      {{"--init-image", (dir / "missing.png").string()}, {"--init-image", "missing.png"}},
      {{"--init-image", dir.string()}, {"--init-image", dir.string()}},
      {{"--init-image", junk}, {"--init-image", "junk.png", "not a PNG, JPEG or WebP"}},
      {{"--mask", mask}, {"--mask", "needs --init-image"}},
      {{"--strength", "0.5"}, {"--strength", "needs --init-image"}},
      {{"--init-image", init, "--strength", "0"}, {"--strength", "(0, 1]"}},
      {{"--init-image", init, "--strength", "1.5"}, {"--strength", "(0, 1]"}},
      {{"--init-image", init, "--strength", "abc"}, {"--strength"}},
      {{"--init-image", init, "--mask", other}, {"--mask", "init.png", "differs"}},
      {{"--init-image", init, "--mask", rgba}, {"--mask", "rgba8.png", "alpha"}},
      {{"--init-image", init, "--width", "30"}, {"width", "multiple"}},
  };
  for (const Bad& b : bad) {
    std::vector<std::string> args = common;
    args.insert(args.end(), b.extra.begin(), b.extra.end());
    const test::ProgramRun r = cli(args);
    std::string joined;
    for (const auto& a : b.extra) joined += a + " ";
    EXPECT_EQ(r.exit_code, 2) << joined << "\n" << r.err;
    for (const std::string& e : b.expect)
      EXPECT_NE(r.err.find(e), std::string::npos) << joined << "\n" << r.err;
    std::printf("  %-60s -> %s", joined.substr(0, 60).c_str(), r.err.c_str());
  }
  EXPECT_FALSE(fs::exists(out));

  // Success: the output takes the image's size (48x40) and records mode and strength.
  std::vector<std::string> ok = common;
  ok.insert(ok.end(), {"--init-image", init, "--mask", mask, "--strength", "0.75"});
  const test::ProgramRun r = cli(ok);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  PngTextChunks text;
  auto png = png_load(out, &text);
  ASSERT_TRUE(png.ok());
  EXPECT_EQ(png->width, 48);
  EXPECT_EQ(png->height, 40);
  std::map<std::string, std::string> t(text.begin(), text.end());
  EXPECT_EQ(t["mode"], "inpaint");
  EXPECT_EQ(t["strength"], "0.75");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zimage
