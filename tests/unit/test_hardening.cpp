// What the adversarial run of the CLI and loaders found (issue "Hardening"), each pinned by a test
// that fails on the code before the fix:
// - a thread count the system refuses is an error, never a hang or an abort; a silly count is a
//   usage error naming the limit;
// - non-finite weights (NaN, Inf, values near the float maximum) fail the call with a message
//   naming the phase and the tensor, never a black image;
// - cancellation during the VAE decode is honoured;
// - a prompt longer than the DiT's position limit is refused by validate(), before anything runs;
// - seeds: -1 is random (printed, stored), anything outside 0..2^64-1 is a usage error;
// - exit codes and messages of the CLI for the smaller defects.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "common/npy.h"
#include "common/tiny_engine.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "io/weights/safetensors.h"
#include "zimage/zimage.h"

namespace zimage {
namespace {

namespace fs = std::filesystem;

std::string tiny_model() {
  return test::tiny_model_dir();
}

fs::path scratch(const std::string& tag) {
  const fs::path d =
      fs::temp_directory_path() / ("zimage_hardening_" + tag + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// ---- threads ---------------------------------------------------------------------------------

TEST(Hardening, ThreadCountIsCheckedAgainstTheMachine) {
  EXPECT_TRUE(check_cpu_threads(0).ok());
  EXPECT_TRUE(check_cpu_threads(max_cpu_threads()).ok());
  const Status st = check_cpu_threads(100000);
  ASSERT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("threads: 100000"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("at most " + std::to_string(max_cpu_threads())), std::string::npos)
      << st.to_string();
  EngineOptions o;
  o.model_dir = tiny_model();
  o.device = "cpu";
  o.threads = 100000;
  const auto t0 = std::chrono::steady_clock::now();
  auto e = Engine::load(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
// The system refuses threads (here: an address-space limit leaves room for a few 8 MiB stacks):
// the pool runs with the threads it got and says why; it neither aborts nor hangs. In a child
// process, since the limit cannot be raised again by an unprivileged process.
TEST(Hardening, RefusedThreadsAreAnErrorNotAHang) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(20);
    std::ifstream statm("/proc/self/statm");
    long pages = 0;
    statm >> pages;
    rlimit lim{};
    lim.rlim_cur = lim.rlim_max =
        static_cast<rlim_t>(pages) * static_cast<rlim_t>(sysconf(_SC_PAGESIZE)) + (48u << 20);
    if (setrlimit(RLIMIT_AS, &lim) != 0) _exit(3);
    ThreadPool pool(256);
    if (pool.start_status().ok()) _exit(4);  // all 256 started: the limit did not bite
    if (pool.start_status().message().find("cannot start thread") == std::string::npos) _exit(5);
    std::atomic<int64_t> sum{0};
    pool.parallel_for(1000, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) sum += i;
    });
    _exit(sum.load() == 499500 ? 0 : 6);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died (signal " << WTERMSIG(status)
                                 << "): an abort or a hang";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "exit code of the child (see the test body)";
}
#endif

// ---- non-finite weights ------------------------------------------------------------------------

using TensorList = std::vector<std::pair<std::string, Tensor>>;

// A copy of the tiny model whose `component` safetensors file is rewritten by `edit`.
std::string edited_model(const std::string& tag, const std::string& component,
                         const std::function<void(TensorList&)>& edit) {
  const fs::path dir = scratch(tag) / "model";
  fs::copy(tiny_model(), dir, fs::copy_options::recursive);
  fs::path file;
  for (const auto& e : fs::directory_iterator(dir / component))
    if (e.path().extension() == ".safetensors") file = e.path();
  TensorList tensors;
  {
    auto sf = SafetensorsFile::open(file.string());
    EXPECT_TRUE(sf.ok()) << sf.status().to_string();
    if (!sf.ok()) return dir.string();
    for (const auto& info : (*sf)->tensors()) {
      auto view = (*sf)->tensor(info.name);
      Tensor copy = Tensor::host(view->dtype(), view->shape());
      std::memcpy(copy.data(), view->data(), view->nbytes());
      tensors.emplace_back(info.name, std::move(copy));
    }
  }
  edit(tensors);
  EXPECT_TRUE(write_safetensors(file.string(), tensors).ok());
  return dir.string();
}

// ... whose `tensor` has value `v` at element `index`.
std::string poisoned_model(const std::string& tag, const std::string& component,
                           const std::string& tensor, float v, int64_t index = 0) {
  return edited_model(tag, component, [&](TensorList& list) {
    bool found = false;
    for (auto& [name, t] : list) {
      if (name != tensor) continue;
      if (t.dtype() == DType::kF32) {
        t.data_as<float>()[index] = v;
      } else {
        ASSERT_EQ(t.dtype(), DType::kBF16) << name;
        static_cast<uint16_t*>(t.data())[index] = f32_to_bf16(v);
      }
      found = true;
    }
    EXPECT_TRUE(found) << tensor << " not in " << component;
  });
}

Result<GenerateResult> generate_with(const std::string& model) {
  EngineOptions o;
  o.model_dir = model;
  o.device = "cpu";
  o.threads = 2;
  auto e = Engine::load(o);
  if (!e.ok()) return e.status();
  GenerateRequest r;
  r.prompts = {"a lighthouse"};
  r.width = r.height = 32;
  r.steps = 2;
  return (*e)->generate(r);
}

TEST(Hardening, NaNInADitWeightFailsNamingTheTensor) {
  const std::string name = "layers.0.feed_forward.w1.weight";
  auto r = generate_with(poisoned_model("nan_dit", "transformer", name, NAN));
  ASSERT_FALSE(r.ok()) << "a NaN weight gave an image";
  const std::string m = r.status().message();
  EXPECT_NE(m.find("denoising step 0"), std::string::npos) << m;
  EXPECT_NE(m.find("NaN/Inf"), std::string::npos) << m;
  EXPECT_NE(m.find(name), std::string::npos) << m;
  EXPECT_EQ(r.status().code(), ErrorCode::kFormat) << r.status().to_string();
}

TEST(Hardening, InfInAVaeBiasFailsNamingTheTensor) {
  const std::string name = "decoder.conv_in.bias";
  auto r =
      generate_with(poisoned_model("inf_vae", "vae", name, std::numeric_limits<float>::infinity()));
  ASSERT_FALSE(r.ok()) << "an Inf VAE bias gave an image";
  const std::string m = r.status().message();
  EXPECT_NE(m.find("vae decode"), std::string::npos) << m;
  EXPECT_NE(m.find(name), std::string::npos) << m;
}

TEST(Hardening, HugeWeightOverflowsAndIsNamed) {
  const std::string name = "decoder.conv_in.weight";
  auto r = generate_with(poisoned_model("huge_vae", "vae", name, 3.0e38f));
  ASSERT_FALSE(r.ok()) << "an overflowing weight gave an image";
  const std::string m = r.status().message();
  EXPECT_NE(m.find("NaN/Inf"), std::string::npos) << m;
  EXPECT_NE(m.find("largest magnitude"), std::string::npos) << m;
  EXPECT_NE(m.find(name), std::string::npos) << m;
}

TEST(Hardening, NaNInTheTextEncoderIsBlamedOnIt) {
  auto r = generate_with(
      poisoned_model("nan_te", "text_encoder", "layers.0.input_layernorm.weight", NAN));
  ASSERT_FALSE(r.ok());
  const std::string m = r.status().message();
  EXPECT_NE(m.find("text encoder"), std::string::npos) << m;
  EXPECT_NE(m.find("layers.0.input_layernorm.weight"), std::string::npos) << m;
}

// ---- the engine on the intact tiny model --------------------------------------------------------

class HardeningEngine : public ::testing::Test {
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
    r.prompts = {"a red fox"};
    r.width = r.height = 32;
    r.steps = 2;
    return r;
  }
  static Engine* engine_;
};
Engine* HardeningEngine::engine_ = nullptr;

TEST_F(HardeningEngine, CancelDuringTheVaeDecodeIsHonoured) {
  std::atomic<bool> cancel{false};
  GenerateHooks hooks;
  hooks.cancel = &cancel;
  hooks.on_progress = [&](const Progress& p) {
    if (p.phase == Phase::kVae) cancel.store(true);  // as a Ctrl-C during the decode
  };
  auto r = engine_->generate(small(), hooks);
  ASSERT_FALSE(r.ok()) << "the image was made although cancelled during the VAE decode";
  EXPECT_EQ(r.status().code(), ErrorCode::kCancelled) << r.status().to_string();
  EXPECT_NE(r.status().message().find("VAE"), std::string::npos) << r.status().to_string();
}

TEST_F(HardeningEngine, OverlongPromptIsRefusedUpFront) {
  // The tiny DiT's axes_lens[0] is 256: captions up to 224 tokens.
  GenerateRequest r = small();
  std::string prompt;
  for (int i = 0; i < 300; ++i) prompt += "fox ";
  r.prompts = {prompt};
  const Status st = engine_->validate(r);
  ASSERT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("prompts[0]"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("limit of 224"), std::string::npos) << st.message();
  r.max_sequence_length = 224;  // truncated to the limit: fine
  EXPECT_TRUE(engine_->validate(r).ok());
  r.max_sequence_length = 512;
  r.prompts = {"short"};
  r.guidance = 2.0f;
  r.negative_prompt = prompt;
  const Status neg = engine_->validate(r);
  ASSERT_EQ(neg.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(neg.message().find("negative_prompt"), std::string::npos) << neg.message();
}

TEST_F(HardeningEngine, TooManyPromptsBlameThePrompts) {
  GenerateRequest r = small();
  r.prompts.assign(40, "x");
  const Status st = engine_->validate(r);
  ASSERT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(st.message().rfind("prompts:", 0), 0u) << st.message();
  r.prompts.assign(4, "x");
  r.images_per_prompt = 5;
  const Status ipp = engine_->validate(r);
  EXPECT_EQ(ipp.message().rfind("images_per_prompt:", 0), 0u) << ipp.message();
}

TEST_F(HardeningEngine, DumpIntoAFileIsAnError) {
  const fs::path dir = scratch("dump");
  const std::string file = (dir / "a_file").string();
  std::ofstream(file) << "x";
  GenerateHooks hooks;
  hooks.dump_dir = file;
  auto r = engine_->generate(small(), hooks);
  ASSERT_FALSE(r.ok()) << "dumping into a file succeeded";
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("dump_dir"), std::string::npos) << r.status().to_string();
  fs::remove_all(dir);
}

// ---- the CLI -----------------------------------------------------------------------------------

// Runs `zimage` (no shell), stdout and stderr captured together; the exit code, -1 if it died.
int run_cli(const std::vector<std::string>& args, std::string* out) {
  const fs::path log = fs::temp_directory_path() / ("zimage_hard_cli_" + std::to_string(getpid()));
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
    alarm(120);
    execv(exe.c_str(), argv.data());
    _exit(127);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  std::ifstream f(log);
  out->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  fs::remove(log);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string png_text(const std::string& path, const std::string& key) {
  PngTextChunks text;
  if (!png_load(path, &text).ok()) return "<unreadable>";
  for (const auto& [k, v] : text)
    if (k == key) return v;
  return "<missing>";
}

TEST(HardeningCli, SeedsAreCheckedAndMinusOneIsRandom) {
  const fs::path dir = scratch("seed");
  const std::string out = (dir / "s.png").string();
  const std::string model = tiny_model();
  std::string log;
  for (const char* bad : {"18446744073709551616", "-2", "1e3", "abc", "99999999999999999999999"}) {
    EXPECT_EQ(run_cli({"generate", "-m", model, "-p", "x", "--seed", bad, "-o", out}, &log), 2)
        << bad << ": " << log;
    EXPECT_NE(log.find("--seed"), std::string::npos) << log;
  }
  EXPECT_FALSE(fs::exists(out));
  ASSERT_EQ(run_cli({"generate", "-m", model, "-p", "x", "-W", "32", "-H", "32", "-s", "1",
                     "--seed", "18446744073709551615", "-o", out},
                    &log),
            0)
      << log;
  EXPECT_EQ(png_text(out, "seed"), "18446744073709551615");
  ASSERT_EQ(run_cli({"generate", "-m", model, "-p", "x", "-W", "32", "-H", "32", "-s", "1",
                     "--seed", "-1", "-o", out},
                    &log),
            0)
      << log;
  const size_t at = log.find("seed ");
  ASSERT_NE(at, std::string::npos) << "the random seed is not printed: " << log;
  const std::string printed = log.substr(at + 5, log.find('\n', at) - at - 5);
  EXPECT_EQ(png_text(out, "seed"), printed) << "the PNG does not carry the printed seed";
  EXPECT_NE(printed, "18446744073709551615");
  fs::remove_all(dir);
}

// Ctrl-C (a real SIGINT) while generating: exit 130, nothing written, and the progress line ends
// with "cancelled" (it used to print "done" first).
TEST(HardeningCli, CtrlCStopsWritesNothingAndSaysCancelled) {
  const fs::path dir = scratch("sigint");
  const std::string out = (dir / "never.png").string();
  const fs::path log = dir / "log.txt";
  std::string exe = ZIMAGE_CLI_PATH;
  std::vector<std::string> args = {exe,  "generate", "-m",         tiny_model(), "-p",
                                   "x",  "-W",       "64",         "-H",         "64",
                                   "-s", "1000",     "--progress", "-o",         out};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    dup2(fd, 1);
    alarm(120);
    execv(exe.c_str(), argv.data());
    _exit(127);
  }
  // Wait until the denoising loop runs (the progress bar shows steps), then Ctrl-C.
  std::string text;
  for (int i = 0; i < 600 && text.find("denoising [") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::ifstream f(log);
    text.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  kill(pid, SIGINT);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  std::ifstream f(log);
  text.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  ASSERT_TRUE(WIFEXITED(status)) << text;
  EXPECT_EQ(WEXITSTATUS(status), 130) << text;
  EXPECT_NE(text.find("cancelled"), std::string::npos) << text;
  EXPECT_EQ(text.find("done"), std::string::npos) << text;
  EXPECT_FALSE(fs::exists(out));
  fs::remove_all(dir);
}

TEST(HardeningCli, ExitCodesOfTheSmallerDefects) {
  const fs::path dir = scratch("cli");
  const std::string out = (dir / "o.png").string();
  const std::string model = tiny_model();
  std::string log;
  // --threads far beyond the machine: a usage error at once, naming the limit.
  EXPECT_EQ(run_cli({"generate", "-m", model, "-p", "x", "--threads", "100000", "-o", out}, &log),
            2);
  EXPECT_NE(log.find("at most"), std::string::npos) << log;
  // --model: a file and a missing folder are the same kind of mistake.
  const std::string file = (dir / "f.txt").string();
  std::ofstream(file) << "x";
  EXPECT_EQ(run_cli({"generate", "-m", file, "-p", "x", "-o", out}, &log), 2) << log;
  EXPECT_NE(log.find("not a folder"), std::string::npos) << log;
  EXPECT_EQ(run_cli({"generate", "-m", (dir / "none").string(), "-p", "x", "-o", out}, &log), 2)
      << log;
  EXPECT_NE(log.find("does not exist"), std::string::npos) << log;
  // An output that cannot be written is found before generating.
  EXPECT_EQ(run_cli({"generate", "-m", model, "-p", "x", "-o", (dir / "no/x.png").string()}, &log),
            2);
  EXPECT_EQ(log.find("denois"), std::string::npos) << "it generated first: " << log;
  EXPECT_EQ(run_cli({"generate", "-m", model, "-p", "x", "-o", dir.string()}, &log), 2) << log;
  EXPECT_NE(log.find("is a directory"), std::string::npos) << log;
  // --dump into a file: an error, not a success after a warning per tensor.
  EXPECT_EQ(run_cli({"generate", "-m", model, "-p", "x", "-W", "32", "-H", "32", "-s", "1",
                     "--dump", file, "-o", out},
                    &log),
            2)
      << log;
  EXPECT_NE(log.find("dump_dir"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(out));
  // A full disk while writing: the real errno, exit 1.
  EXPECT_EQ(run_cli({"generate", "-m", model, "-p", "x", "-W", "32", "-H", "32", "-s", "1", "-o",
                     "/dev/full"},
                    &log),
            1);
  EXPECT_NE(log.find("No space left on device"), std::string::npos) << log;
  // zimage --version
  EXPECT_EQ(run_cli({"--version"}, &log), 0) << log;
  EXPECT_NE(log.find(std::string("zimage ") + kVersion), std::string::npos) << log;
  // A model load error names the component once ("loading transformer: loading transformer:").
  const std::string broken = edited_model("cli_missing", "transformer", [](TensorList& list) {
    list.erase(list.begin());  // a missing tensor
  });
  EXPECT_EQ(run_cli({"generate", "-m", broken, "-p", "x", "-o", out}, &log), 1);
  EXPECT_NE(log.find("loading transformer"), std::string::npos) << log;
  EXPECT_EQ(log.find("loading transformer: loading transformer"), std::string::npos) << log;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zimage
