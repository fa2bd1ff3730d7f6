// The public Engine API (include/zimage/zimage.h) on the tiny golden model: request validation
// names the field at fault, cancellation stops a run with kCancelled, the progress callback sees
// every step, one seed gives one image, a bad model folder fails with a clear error. Also the
// model-free pieces: the UTF-8 checker and the range checks with explicit limits.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/npy.h"
#include "common/tiny_engine.h"
#include "zimage/request_check.h"
#include "zimage/zimage.h"

namespace zimage {
namespace {

std::string tiny_model() {
  return test::tiny_model_dir();
}

// One engine for the whole suite: loading the tokenizer dominates a tiny model's load time.
class Api : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    engine_ = test::load_tiny_engine().release();
    ASSERT_NE(engine_, nullptr);
  }
  static void TearDownTestSuite() {
    delete engine_;
    engine_ = nullptr;
  }
  static GenerateRequest small() {
    GenerateRequest r;
    r.prompts = {"a cat sitting on a red sofa, photo"};
    r.width = 32;
    r.height = 32;
    r.steps = 2;
    return r;
  }
  // The request's validation error message, "" when valid.
  static std::string error_of(const GenerateRequest& r) {
    const Status st = engine_->validate(r);
    if (!st.ok()) {
      EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.to_string();
    }
    return st.ok() ? "" : st.message();
  }
  static Engine* engine_;
};
Engine* Api::engine_ = nullptr;

void expect_field(const std::string& message, const std::string& field) {
  EXPECT_EQ(message.rfind(field + ":", 0), 0u)
      << "message does not start with '" << field << ":': " << message;
}

TEST_F(Api, ValidRequestPasses) {
  EXPECT_EQ(error_of(small()), "");
}

TEST_F(Api, ValidationNamesTheField) {
  auto r = small();
  r.prompts.clear();
  expect_field(error_of(r), "prompts");
  r = small();
  r.width = 30;  // the tiny model needs multiples of 4
  expect_field(error_of(r), "width");
  r = small();
  r.width = -32;
  expect_field(error_of(r), "width");
  r = small();
  r.height = 0;
  expect_field(error_of(r), "height");
  r = small();
  r.height = 1 << 20;
  expect_field(error_of(r), "height");
  r = small();
  r.steps = 0;
  expect_field(error_of(r), "steps");
  r = small();
  r.steps = 1001;
  expect_field(error_of(r), "steps");
  r = small();
  r.guidance = std::numeric_limits<float>::quiet_NaN();
  expect_field(error_of(r), "guidance");
  r = small();
  r.guidance = -1.0f;
  expect_field(error_of(r), "guidance");
  r = small();
  r.guidance = std::numeric_limits<float>::infinity();
  expect_field(error_of(r), "guidance");
  r = small();
  r.images_per_prompt = 0;
  expect_field(error_of(r), "images_per_prompt");
  r = small();
  r.images_per_prompt = 1000;
  expect_field(error_of(r), "images_per_prompt");
  r = small();
  r.max_sequence_length = 0;
  expect_field(error_of(r), "max_sequence_length");
  r = small();
  r.cfg_normalization = -0.5f;
  expect_field(error_of(r), "cfg_normalization");
  r = small();
  r.cfg_truncation = std::numeric_limits<float>::infinity();
  expect_field(error_of(r), "cfg_truncation");
  r = small();
  r.prompts = {"ok", std::string("bad\0byte", 8)};
  const std::string nul = error_of(r);
  expect_field(nul, "prompts[1]");
  EXPECT_NE(nul.find("NUL"), std::string::npos) << nul;
  r = small();
  r.prompts = {"\xC3\x28"};  // a broken two-byte sequence
  const std::string utf = error_of(r);
  expect_field(utf, "prompts[0]");
  EXPECT_NE(utf.find("UTF-8"), std::string::npos) << utf;
  r = small();
  r.negative_prompt = "\xED\xA0\x80";  // an encoded surrogate
  expect_field(error_of(r), "negative_prompt");
  r = small();
  r.prompts = {std::string(20000, 'a')};
  const std::string big = error_of(r);
  expect_field(big, "prompts[0]");
  EXPECT_NE(big.find("byte"), std::string::npos) << big;
  // generate() refuses the same request before running anything.
  r = small();
  r.steps = 0;
  auto res = engine_->generate(r);
  ASSERT_FALSE(res.ok());
  EXPECT_EQ(res.status().code(), ErrorCode::kInvalidArgument);
  expect_field(res.status().message(), "steps");
}

TEST_F(Api, InfoDescribesTheModel) {
  const EngineInfo i = engine_->info();
  EXPECT_EQ(i.vae_factor, 2);  // the tiny golden VAE has two blocks
  EXPECT_EQ(i.size_multiple, 4);
  EXPECT_EQ(i.latent_channels, 16);
  EXPECT_EQ(i.precision, "f32");
  EXPECT_NE(i.device.find("cpu"), std::string::npos) << i.device;
}

TEST_F(Api, ProgressOncePerStepAndSameSeedSameImage) {
  auto r = small();
  r.steps = 3;
  r.seed = 7;
  std::vector<int> steps_seen;
  std::vector<Phase> phases;
  double last_elapsed = -1;
  bool monotonic = true;
  GenerateHooks hooks;
  hooks.on_progress = [&](const Progress& p) {
    phases.push_back(p.phase);
    if (p.phase == Phase::kDenoise && p.step > 0) {
      steps_seen.push_back(p.step);
      EXPECT_EQ(p.total, 3);
    }
    monotonic = monotonic && p.elapsed_s >= last_elapsed;
    last_elapsed = p.elapsed_s;
  };
  auto a = engine_->generate(r, hooks);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(steps_seen, (std::vector<int>{1, 2, 3}));
  EXPECT_TRUE(monotonic);
  ASSERT_FALSE(phases.empty());
  EXPECT_EQ(phases.front(), Phase::kTokenize);
  EXPECT_EQ(phases.back(), Phase::kVae);
  ASSERT_EQ(a->images.size(), 1u);
  EXPECT_EQ(a->images[0].width, 32);
  EXPECT_EQ(a->images[0].rgb.size(), 32u * 32u * 3u);
  EXPECT_EQ(a->timings.dit_s.size(), 3u);
  EXPECT_GT(a->timings.total_s, 0.0);
  EXPECT_EQ(a->seed, 7u);

  auto b = engine_->generate(r);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(a->images[0].rgb, b->images[0].rgb) << "same seed, different image";

  r.seed = 8;
  auto c = engine_->generate(r);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  size_t differing = 0;
  for (size_t k = 0; k < c->images[0].rgb.size(); ++k)
    differing += c->images[0].rgb[k] != a->images[0].rgb[k];
  EXPECT_GT(differing, c->images[0].rgb.size() / 4) << "another seed should change the image";
}

TEST_F(Api, BatchGivesImagesInPromptOrder) {
  auto r = small();
  r.prompts = {"snow", "a lighthouse"};
  r.images_per_prompt = 2;
  auto res = engine_->generate(r);
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  ASSERT_EQ(res->images.size(), 4u);
  // Four different noise draws: no two images are equal.
  for (size_t i = 0; i < 4; ++i)
    for (size_t j = i + 1; j < 4; ++j) EXPECT_NE(res->images[i].rgb, res->images[j].rgb);
}

TEST_F(Api, CancellationReturnsCancelled) {
  auto r = small();
  r.steps = 6;
  std::atomic<bool> cancel{false};
  int steps_done = 0;
  GenerateHooks hooks;
  hooks.cancel = &cancel;
  hooks.on_progress = [&](const Progress& p) {
    if (p.phase == Phase::kDenoise && p.step == 2) cancel.store(true);
    if (p.phase == Phase::kDenoise && p.step > 0) steps_done = p.step;
  };
  auto res = engine_->generate(r, hooks);
  ASSERT_FALSE(res.ok());
  EXPECT_EQ(res.status().code(), ErrorCode::kCancelled) << res.status().to_string();
  EXPECT_EQ(steps_done, 2) << "the run must stop at the next step check";
  // Set before the call: nothing runs.
  int calls = 0;
  hooks.on_progress = [&](const Progress&) { ++calls; };
  auto early = engine_->generate(r, hooks);
  ASSERT_FALSE(early.ok());
  EXPECT_EQ(early.status().code(), ErrorCode::kCancelled);
  EXPECT_EQ(calls, 0);
  // The engine is still usable afterwards.
  cancel.store(false);
  EXPECT_TRUE(engine_->generate(r, hooks).ok());
}

TEST_F(Api, DumpsNamedIntermediates) {
  auto r = small();
  r.guidance = 2.0f;  // CFG: the DiT runs 2 rows, the negative prompt is dumped too
  const auto dir =
      std::filesystem::temp_directory_path() / ("zimage_api_dump_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  GenerateHooks hooks;
  hooks.dump_dir = dir.string();
  auto res = engine_->generate(r, hooks);
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  const std::pair<const char*, Shape> expected[] = {
      {"tokens.0", {17}},  // the golden v_turbo prompt: 17 ids with the chat template
      {"tokens.negative", {8}},
      {"prompt_embeds.0", {17, 32}},
      {"negative_embeds", {8, 32}},
      {"init_noise", {1, 16, 16, 16}},
      {"dit_out.step0", {2, 16, 16, 16}},
      {"latents.step1", {1, 16, 16, 16}},
  };
  for (const auto& [name, shape] : expected) {
    auto t = test::load_npy((dir / (std::string(name) + ".npy")).string());
    ASSERT_TRUE(t.ok()) << name << ": " << t.status().to_string();
    EXPECT_EQ(t->shape(), shape) << name;
  }
  // A filter keeps only matching names.
  std::filesystem::remove_all(dir);
  hooks.dump_filter = "latents.";
  ASSERT_TRUE(engine_->generate(r, hooks).ok());
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    EXPECT_EQ(e.path().filename().string().rfind("latents.", 0), 0u) << e.path();
    ++files;
  }
  EXPECT_EQ(files, 2u);  // latents.step0, latents.step1
  std::filesystem::remove_all(dir);
}

TEST_F(Api, ConcurrentCallsAreSerialisedAndAgree) {
  auto r = small();
  r.seed = 3;
  Result<GenerateResult> a = Status(ErrorCode::kInternal, "not run");
  Result<GenerateResult> b = Status(ErrorCode::kInternal, "not run");
  std::thread t1([&] { a = engine_->generate(r); });
  std::thread t2([&] { b = engine_->generate(r); });
  t1.join();
  t2.join();
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(a->images[0].rgb, b->images[0].rgb);
}

TEST(ApiLoad, BadModelFolderIsAClearError) {
  EngineOptions o;
  o.device = "cpu";
  o.model_dir = "/nonexistent/zimage-model";
  auto e = Engine::load(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("/nonexistent/zimage-model"), std::string::npos)
      << e.status().to_string();

  // A folder that exists but is not a model.
  const auto dir = std::filesystem::temp_directory_path() / "zimage_api_not_a_model";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "model_index.json") << "{ not json";
  o.model_dir = dir.string();
  e = Engine::load(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("model_index.json"), std::string::npos)
      << e.status().to_string();
  std::filesystem::remove_all(dir);

  o.model_dir = "";
  e = Engine::load(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), ErrorCode::kInvalidArgument);
}

TEST(ApiLoad, BadOptionsNameTheOption) {
  EngineOptions o;
  o.model_dir = tiny_model();
  o.device = "tpu";
  auto e = Engine::load(o);
  ASSERT_FALSE(e.ok());
  expect_field(e.status().message(), "device");
  o.device = "cpu";
  o.precision = "f8";
  e = Engine::load(o);
  ASSERT_FALSE(e.ok());
  expect_field(e.status().message(), "precision");
  o.precision = "bf16";  // the CPU backend computes in f32 only
  e = Engine::load(o);
  ASSERT_FALSE(e.ok());
  expect_field(e.status().message(), "precision");
  o.precision = "fp8";  // CUDA only
  e = Engine::load(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), ErrorCode::kInvalidArgument);
  expect_field(e.status().message(), "precision");
  EXPECT_NE(e.status().message().find("fp8 needs the CUDA backend"), std::string::npos);
  o.precision = "auto";
  o.threads = -1;
  e = Engine::load(o);
  ASSERT_FALSE(e.ok());
  expect_field(e.status().message(), "threads");
  o.threads = 0;
  for (double bad : {-1.0, std::nan(""), 2e6}) {
    o.host_memory_gib = bad;
    e = Engine::load(o);
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_EQ(e.status().code(), ErrorCode::kInvalidArgument);
    expect_field(e.status().message(), "host_memory_gib");
  }
  o.host_memory_gib = 0.5;  // no budget on the CPU: nothing streams, the limit is moot
  for (const char* bad : {"", "file", "pinned", "COPY"}) {
    o.streamed_weights = bad;
    e = Engine::load(o);
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_EQ(e.status().code(), ErrorCode::kInvalidArgument);
    expect_field(e.status().message(), "streamed_weights");
  }
  o.streamed_weights = "files";
  e = Engine::load(o);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
}

// Runs `zimage` (no shell) with stderr captured; returns the exit code (-1 if it crashed).
int run_cli(const std::vector<std::string>& args, std::string* err) {
  const auto log = std::filesystem::temp_directory_path() /
                   ("zimage_api_cli_" + std::to_string(getpid()) + ".txt");
  std::string exe = ZIMAGE_CLI_PATH;
  std::vector<std::string> copy = args;
  std::vector<char*> argv{exe.data()};
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 2);
      dup2(fd, 1);
    }
    execv(exe.c_str(), argv.data());
    _exit(127);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  std::ifstream f(log);
  err->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  std::filesystem::remove(log);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

#if defined(ZIMAGE_WITH_CUDA)
// ZIMAGE_ATTENTION is read before the GPU is looked for: a bad value is an error naming it, also
// with device auto on a machine without a GPU, never a silent fall back to the CPU.
TEST(ApiLoad, BadAttentionSettingIsAnErrorNotACpuFallback) {
  EngineOptions o;
  o.model_dir = tiny_model();
  o.device = "auto";
  ::setenv("ZIMAGE_ATTENTION", "fastest", 1);
  auto e = Engine::load(o);
  ::setenv("ZIMAGE_ATTENTION", "cudnn", 1);
  auto good = Engine::load(o);
  ::unsetenv("ZIMAGE_ATTENTION");
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), ErrorCode::kInvalidArgument) << e.status().to_string();
  EXPECT_NE(e.status().message().find(
                "ZIMAGE_ATTENTION: 'fastest' is not one of auto, flashinfer, cudnn"),
            std::string::npos)
      << e.status().to_string();
  EXPECT_TRUE(good.ok()) << good.status().to_string();
}
#endif

TEST(ApiCli, ExitCodesAndMessages) {
  const std::string model = tiny_model();
  const auto dir =
      std::filesystem::temp_directory_path() / ("zimage_api_cli_out_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string out = (dir / "img.png").string();
  std::string err;
  // Usage errors: 2, with the field or flag named.
  EXPECT_EQ(
      run_cli({"generate", "--model", model, "--prompt", "a", "--width", "30", "-o", out}, &err),
      2);
  EXPECT_NE(err.find("width: 30 is not a multiple of 4"), std::string::npos) << err;
  EXPECT_EQ(run_cli({"generate", "--model", model, "--prompt", "a", "-W", "64", "-H", "64",
                     "--steps", "0", "-o", out},
                    &err),
            2);
  EXPECT_NE(err.find("steps"), std::string::npos) << err;
  // The default 1024 is beyond the tiny model's own limit (256): named up front.
  EXPECT_EQ(run_cli({"generate", "--model", model, "--prompt", "a", "-o", out}, &err), 2);
  EXPECT_NE(err.find("width: 1024 exceeds the limit 256"), std::string::npos) << err;
  EXPECT_EQ(run_cli({"generate", "--model", model, "-o", out}, &err), 2);
  EXPECT_NE(err.find("--prompt"), std::string::npos) << err;
  EXPECT_EQ(run_cli({"generate", "--prompt", "a", "--no-such-flag"}, &err), 2);
  EXPECT_EQ(run_cli({"generate", "--prompt", "a", "--guidance", "abc"}, &err), 2);
  EXPECT_EQ(run_cli({"generate", "--prompt", "a", "--guidance", "-1", "-o", out}, &err), 2);
  EXPECT_NE(err.find("guidance"), std::string::npos) << err;
  // Paths that do not exist are usage errors too (2), named in the message.
  EXPECT_EQ(run_cli({"generate", "--model", "/nonexistent/m", "--prompt", "a", "-o", out}, &err),
            2);
  EXPECT_NE(err.find("/nonexistent/m"), std::string::npos) << err;
  EXPECT_EQ(run_cli({"generate", "--model", model, "--prompt", "a", "-o",
                     (dir / "missing" / "x.png").string()},
                    &err),
            2);
  EXPECT_NE(err.find("does not exist"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(out));
  // Success: the built-in model at its default 64x64, two prompts -> img_0.png, img_1.png.
  ASSERT_EQ(run_cli({"generate", "--prompt", "a red fox in snow", "--prompt", "a \"quoted\" one",
                     "--steps", "2", "-o", out},
                    &err),
            0)
      << err;
  for (const char* name : {"img_0.png", "img_1.png"}) {
    auto png = png_load((dir / name).string());
    ASSERT_TRUE(png.ok()) << png.status().to_string();
    EXPECT_EQ(png->width, 64);
    EXPECT_EQ(png->height, 64);
  }
  PngTextChunks text;
  ASSERT_TRUE(png_load((dir / "img_1.png").string(), &text).ok());
  bool found = false;
  for (const auto& [k, v] : text) found = found || (k == "prompt" && v == "a \"quoted\" one");
  EXPECT_TRUE(found) << "the second image carries the second prompt";
  std::filesystem::remove_all(dir);
}

TEST(RequestCheck, Utf8Checker) {
  EXPECT_EQ(text_problem("plain ascii"), "");
  EXPECT_EQ(text_problem("冰雪女王 ✓ 🦊"), "");
  EXPECT_NE(text_problem("\xC0\xAF"), "");          // overlong '/'
  EXPECT_NE(text_problem("\xE0\x80\xAF"), "");      // overlong, 3 bytes
  EXPECT_NE(text_problem("\xF4\x90\x80\x80"), "");  // past U+10FFFF
  EXPECT_NE(text_problem("\xE6\x97"), "");          // truncated
  EXPECT_NE(text_problem("\x80"), "");              // lone continuation byte
  EXPECT_NE(text_problem(std::string("a\0b", 3)).find("offset 1"), std::string::npos);
}

// The field is on the Status too (Status::field()), across the public API: the server and the
// CLI name it in their own words without reading the message.
TEST_F(Api, ValidationErrorsCarryTheirField) {
  const std::pair<void (*)(GenerateRequest&), const char*> cases[] = {
      {[](GenerateRequest& r) { r.prompts.clear(); }, "prompts"},
      {[](GenerateRequest& r) { r.width = 30; }, "width"},
      {[](GenerateRequest& r) { r.steps = 0; }, "steps"},
      {[](GenerateRequest& r) { r.guidance = std::nanf(""); }, "guidance"},
      {[](GenerateRequest& r) { r.strength = 0.5; }, "strength"},
      {[](GenerateRequest& r) {
         r.prompts = {"ok", std::string("bad\0", 4)};
       },
       "prompts[1]"}};
  for (const auto& [change, field] : cases) {
    GenerateRequest r = small();
    change(r);
    const Status st = engine_->validate(r);
    EXPECT_EQ(st.field(), field) << st.to_string();
    EXPECT_TRUE(st.field_detail().has_value()) << st.message();
  }
}

TEST(RequestCheck, LimitsAreHonoured) {
  GenerateRequest r;
  r.prompts = {"x"};
  RequestLimits lim;
  lim.size_multiple = 16;
  lim.max_side = 2048;
  lim.max_batch = 4;
  lim.max_pixels = int64_t{1024} * 1024 * 2;
  EXPECT_TRUE(check_request(r, lim).ok());  // 1024x1024, 8 steps: the defaults
  r.width = 1000;
  const Status st = check_request(r, lim);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("multiple of 16"), std::string::npos) << st.message();
  r.width = 1024;
  r.images_per_prompt = 3;  // 3 x 1 MP exceeds 2 MP
  ASSERT_FALSE(check_request(r, lim).ok());
  r.images_per_prompt = 5;  // batch 5 > 4
  expect_field(check_request(r, lim).message(), "images_per_prompt");
}

}  // namespace
}  // namespace zimage
