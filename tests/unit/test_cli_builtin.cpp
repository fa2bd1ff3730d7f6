// The built-in model travels inside the `zimage` binary: a copy of the program outside the build
// tree, with a fresh cache and HOME, generates the same image as the build-tree run on the golden
// folder; it unpacks the model into $XDG_CACHE_HOME (or ~/.cache) once, notices a damaged cached
// file and unpacks again, falls back to a temporary folder it removes when the cache cannot be
// written, and two first runs at once both succeed. `info` and `tokenize` default to it too.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/cli_run.h"
#include "common/npy.h"
#include "io/image/png.h"

namespace zimage {
namespace {

namespace fs = std::filesystem;
using test::ProgramRun;
using test::ProgramSpec;
using test::read_file_bytes;

// PNG bytes compared without printing them.
::testing::AssertionResult same_png(const std::string& got, const std::string& want) {
  if (!want.empty() && got == want) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "PNG of " << got.size() << " bytes differs from the "
                                       << want.size() << "-byte reference";
}

// A scratch folder outside the build tree with a copy of the program, a fresh cache, HOME and
// TMPDIR; removed at the end.
class CliBuiltin : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = fs::temp_directory_path() /
            ("zimage_builtin_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    for (const char* d : {"bin", "cache", "home", "tmp", "out"}) fs::create_directories(root_ / d);
    exe_ = (root_ / "bin" / "zimage").string();
    fs::copy_file(ZIMAGE_CLI_PATH, exe_);
    fs::permissions(exe_, fs::perms::owner_all);
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(root_ / "cache", fs::perms::owner_all, ec);
    fs::permissions(root_ / "home", fs::perms::owner_all, ec);
    fs::remove_all(root_, ec);
  }

  // The copied program with XDG_CACHE_HOME, HOME and TMPDIR inside root_.
  ProgramSpec spec(std::vector<std::string> args) const {
    ProgramSpec s;
    s.exe = exe_;
    s.args = std::move(args);
    s.env["XDG_CACHE_HOME"] = (root_ / "cache").string();
    s.env["HOME"] = (root_ / "home").string();
    s.env["TMPDIR"] = (root_ / "tmp").string();
    s.env["ZIMAGE_LOG"] = std::nullopt;
    return s;
  }
  static std::vector<std::string> generate_args(const std::string& output) {
    return {"generate", "--prompt", "a red fox in snow", "--steps", "2",       "--width",  "64",
            "--height", "64",       "--device",          "cpu",     "--quiet", "--output", output};
  }
  // Generates with the copied program; returns the PNG's bytes ("" on failure).
  std::string generate(ProgramSpec s, const std::string& name) {
    const std::string out = (root_ / "out" / name).string();
    s.args = generate_args(out);
    const ProgramRun r = test::run_program(s);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return read_file_bytes(out);
  }
  // The same image from the build-tree program on the golden v_turbo folder (what the old
  // build-folder built-in model was).
  std::string reference_png() {
    ProgramSpec s;
    s.exe = ZIMAGE_CLI_PATH;
    const std::string out = (root_ / "out" / "reference.png").string();
    s.args = generate_args(out);
    s.args.push_back("--model");
    s.args.push_back(test::golden_dir("v_turbo") + "/model");
    const ProgramRun r = test::run_program(s);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return read_file_bytes(out);
  }
  // The unpacked folders under <cache>/zimage ("builtin-*", and any temporary siblings).
  static std::vector<std::string> entries(const fs::path& dir) {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }
  fs::path cached_model() const {
    const auto names = entries(root_ / "cache" / "zimage");
    return names.size() == 1 ? root_ / "cache" / "zimage" / names[0] : fs::path();
  }

  fs::path root_;
  std::string exe_;
};

TEST_F(CliBuiltin, CopiedProgramUnpacksIntoTheCacheAndMatchesTheBuildTreeImage) {
  const std::string reference = reference_png();
  ASSERT_FALSE(reference.empty());
  const std::string first = generate(spec({}), "first.png");
  EXPECT_TRUE(same_png(first, reference)) << "the built-in model gives another image";
  // Unpacked once into $XDG_CACHE_HOME/zimage/builtin-<version>-<crc32>/.
  const auto names = entries(root_ / "cache" / "zimage");
  ASSERT_EQ(names.size(), 1u) << "expected one unpacked folder in the cache";
  EXPECT_EQ(names[0].rfind("builtin-0.1.0-", 0), 0u) << names[0];
  EXPECT_TRUE(fs::is_regular_file(cached_model() / "model_index.json"));
  EXPECT_TRUE(fs::is_regular_file(cached_model() / "tokenizer" / "tokenizer.json"));
  const auto mtime = fs::last_write_time(cached_model() / "model_index.json");
  // The second run uses the cache: not unpacked again.
  EXPECT_TRUE(same_png(generate(spec({}), "second.png"), reference));
  EXPECT_EQ(fs::last_write_time(cached_model() / "model_index.json"), mtime);
  EXPECT_TRUE(entries(root_ / "tmp").empty());

  // Without XDG_CACHE_HOME: $HOME/.cache.
  ProgramSpec home = spec({});
  home.env["XDG_CACHE_HOME"] = std::nullopt;
  EXPECT_TRUE(same_png(generate(home, "home.png"), reference));
  EXPECT_EQ(entries(root_ / "home" / ".cache" / "zimage").size(), 1u);
}

TEST_F(CliBuiltin, DamagedCachedFilesAreUnpackedAgain) {
  const std::string reference = generate(spec({}), "first.png");
  ASSERT_FALSE(reference.empty());
  const fs::path model = cached_model();
  ASSERT_FALSE(model.empty());
  const fs::path weights = model / "transformer" / "diffusion_pytorch_model.safetensors";
  const fs::path tokenizer = model / "tokenizer" / "tokenizer.json";
  const std::string weights_bytes = read_file_bytes(weights),
                    tokenizer_bytes = read_file_bytes(tokenizer);
  {  // same size, changed weight bytes near the end
    std::fstream f(weights, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(weights_bytes.size() - 64));
    f.write("damaged!damaged!damaged!", 24);
  }
  EXPECT_TRUE(same_png(generate(spec({}), "after_damage.png"), reference));
  EXPECT_EQ(read_file_bytes(weights), weights_bytes);

  fs::resize_file(tokenizer, tokenizer_bytes.size() / 2);  // truncated
  fs::remove(model / "vae" / "config.json");               // missing
  EXPECT_TRUE(same_png(generate(spec({}), "after_truncation.png"), reference));
  EXPECT_EQ(read_file_bytes(tokenizer), tokenizer_bytes);
  EXPECT_TRUE(fs::is_regular_file(model / "vae" / "config.json"));
  EXPECT_EQ(entries(root_ / "cache" / "zimage").size(), 1u) << "temporary siblings left behind";
}

TEST_F(CliBuiltin, UnwritableCacheFallsBackToATemporaryFolderRemovedAtExit) {
  const std::string reference = reference_png();
  // <cache>/zimage is a file: no folder can be made there, whoever runs the test (even root).
  std::ofstream(root_ / "cache" / "zimage") << "not a folder";
  ProgramSpec s = spec({});
  const std::string out = (root_ / "out" / "blocked.png").string();
  s.args = generate_args(out);
  s.args.erase(std::find(s.args.begin(), s.args.end(), "--quiet"));
  const ProgramRun r = test::run_program(s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(same_png(read_file_bytes(out), reference));
  EXPECT_NE(r.err.find("temporary copy"), std::string::npos) << r.err;
  EXPECT_TRUE(entries(root_ / "tmp").empty()) << "the temporary copy was not removed";

  // A read-only cache folder (and HOME): the same, when the permission bits bind (not root).
  fs::remove(root_ / "cache" / "zimage");
  fs::permissions(root_ / "cache", fs::perms::owner_read | fs::perms::owner_exec);
  fs::permissions(root_ / "home", fs::perms::owner_read | fs::perms::owner_exec);
  EXPECT_TRUE(same_png(generate(spec({}), "read_only.png"), reference));
  EXPECT_TRUE(entries(root_ / "tmp").empty()) << "the temporary copy was not removed";
  if (::geteuid() != 0) {
    EXPECT_TRUE(entries(root_ / "cache").empty());
  }
  fs::permissions(root_ / "home", fs::perms::owner_all);

  // No cache folder at all: neither XDG_CACHE_HOME nor HOME.
  ProgramSpec none = spec({});
  none.env["XDG_CACHE_HOME"] = std::nullopt;
  none.env["HOME"] = std::nullopt;
  EXPECT_TRUE(same_png(generate(none, "no_home.png"), reference));
  EXPECT_TRUE(entries(root_ / "tmp").empty());
}

TEST_F(CliBuiltin, TwoFirstRunsAtOnceBothSucceed) {
  const std::string reference = reference_png();
  std::vector<test::RunningProgram> running;
  for (int i = 0; i < 3; ++i) {
    ProgramSpec s = spec({});
    s.args = generate_args((root_ / "out" / ("run" + std::to_string(i) + ".png")).string());
    running.push_back(test::start_program(s));
  }
  for (int i = 0; i < 3; ++i) {
    const ProgramRun r = test::wait_program(running[i]);
    EXPECT_EQ(r.exit_code, 0) << "run " << i << ": " << r.err;
    EXPECT_TRUE(
        same_png(read_file_bytes((root_ / "out" / ("run" + std::to_string(i) + ".png")).string()),
                 reference))
        << "run " << i;
  }
  const auto names = entries(root_ / "cache" / "zimage");
  ASSERT_EQ(names.size(), 1u) << "leftovers: " << ::testing::PrintToString(names);
  EXPECT_EQ(names[0].rfind("builtin-", 0), 0u);
}

// --verbose raises the engine's messages to info without lowering what ZIMAGE_LOG asks for
// (the debug lines the start-up measurements read), --quiet shows errors only, and with neither
// flag ZIMAGE_LOG decides. --verbose used to set info, dropping ZIMAGE_LOG=debug's lines. A bad
// ZIMAGE_LOG is named on stderr.
TEST_F(CliBuiltin, LogLevelComesFromTheFlagsAndTheEnvironment) {
  auto stderr_of = [&](const std::string& flag, std::optional<std::string> env) {
    std::vector<std::string> args = generate_args((root_ / "out" / "log.png").string());
    args.erase(std::find(args.begin(), args.end(), "--quiet"));
    if (!flag.empty()) args.push_back(flag);
    ProgramSpec s = spec(std::move(args));
    s.env["ZIMAGE_LOG"] = std::move(env);
    const ProgramRun r = test::run_program(s);
    EXPECT_EQ(r.exit_code, 0) << flag << ": " << r.err;
    return r.err;
  };
  auto has = [](const std::string& err, const char* what) {
    return err.find(what) != std::string::npos;
  };
  const std::string verbose_debug = stderr_of("--verbose", "debug");
  EXPECT_TRUE(has(verbose_debug, "[zimage debug ")) << verbose_debug;
  EXPECT_TRUE(has(verbose_debug, "[zimage info ")) << verbose_debug;
  const std::string verbose = stderr_of("--verbose", std::nullopt);
  EXPECT_TRUE(has(verbose, "[zimage info ")) << verbose;
  EXPECT_FALSE(has(verbose, "[zimage debug ")) << verbose;
  const std::string env_debug = stderr_of("", "debug");
  EXPECT_TRUE(has(env_debug, "[zimage debug ")) << env_debug;
  const std::string plain = stderr_of("", std::nullopt);
  EXPECT_FALSE(has(plain, "[zimage info ")) << plain;
  const std::string quiet = stderr_of("--quiet", "debug");
  EXPECT_FALSE(has(quiet, "[zimage debug ") || has(quiet, "[zimage info ")) << quiet;
  // A level it does not take is named once, and the default (warnings) kept.
  const std::string bad = stderr_of("", "verbose");
  EXPECT_TRUE(has(bad, "ZIMAGE_LOG='verbose' is not one of error, warn, info, debug")) << bad;
  EXPECT_FALSE(has(bad, "[zimage info ")) << bad;
  EXPECT_FALSE(has(stderr_of("", "warn"), "ZIMAGE_LOG=")) << "warn is a level";
}

// --png-compression picks zlib's level: the same image at every level (the pixels decode
// equal), stored at 0, smaller at 9; outside 0..9 a usage error naming the flag.
TEST_F(CliBuiltin, PngCompressionKeepsThePixels) {
  auto run = [&](const std::string& level, const std::string& name) {
    std::vector<std::string> args = generate_args((root_ / "out" / name).string());
    args.push_back("--png-compression");
    args.push_back(level);
    return test::run_program(spec(std::move(args)));
  };
  ASSERT_EQ(run("0", "stored.png").exit_code, 0);
  ASSERT_EQ(run("9", "small.png").exit_code, 0);
  const std::string stored = read_file_bytes((root_ / "out" / "stored.png").string());
  const std::string small = read_file_bytes((root_ / "out" / "small.png").string());
  EXPECT_GT(stored.size(), small.size());
  auto a = decode_png(reinterpret_cast<const uint8_t*>(stored.data()), stored.size());
  auto b = decode_png(reinterpret_cast<const uint8_t*>(small.data()), small.size());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->rgb, b->rgb);
  EXPECT_EQ(a->text, b->text);
  const ProgramRun bad = run("10", "bad.png");
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("--png-compression"), std::string::npos) << bad.err;
}

TEST_F(CliBuiltin, InfoAndTokenizeDefaultToTheBuiltinModel) {
  const ProgramRun info = test::run_program(spec({"info", "--json"}));
  ASSERT_EQ(info.exit_code, 0) << info.err;
  const auto j = nlohmann::json::parse(info.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << info.out;
  EXPECT_EQ(j["valid"], true);
  EXPECT_EQ(j["components"]["transformer"]["weights"]["tensors"], 73);
  EXPECT_EQ(j["path"].get<std::string>().rfind((root_ / "cache" / "zimage").string(), 0), 0u)
      << j["path"];

  ProgramSpec tok = spec({"tokenize"});
  tok.stdin_text = "\"Hello world\"\n";
  const ProgramRun t = test::run_program(tok);
  EXPECT_EQ(t.exit_code, 0) << t.err;
  EXPECT_EQ(t.out, "[9707,1879]\n");
}

}  // namespace
}  // namespace zimage
