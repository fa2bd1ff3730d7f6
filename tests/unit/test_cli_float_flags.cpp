// Issue "security hardening", items 14 and 15, at the command line: every floating-point flag
// refuses NaN, infinities and values its type cannot hold (CLI11 converts them silently and
// CLI::Range lets NaN through) with a usage error naming the flag, and the fields' ranges are the
// library's, as the server and the worker apply them. `zimage submit --guidance nan` used to
// queue "guidance_scale": null (run with 0). `--seed -0` is 0, as "seed": -0 in JSON.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/cli_run.h"

namespace zimage {
namespace {

namespace fs = std::filesystem;

test::ProgramRun zimage(std::vector<std::string> args) {
  test::ProgramSpec s;
  s.exe = ZIMAGE_CLI_PATH;
  s.args = std::move(args);
  return test::run_program(s);
}

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    path =
        fs::temp_directory_path() / ("zimage_float_flags_" + tag + "_" + std::to_string(getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// Nothing listens on port 1: a job that got as far as the broker would fail with exit 1, not 2.
const char* kNoBroker = "redis://127.0.0.1:1";

TEST(CliFloatFlags, SubmitRefusesGuidanceItCannotQueue) {
  for (const char* g : {"nan", "NaN", "inf", "-inf", "1e39", "150", "-1", "-nan"}) {
    const auto r = zimage({"submit", "--broker", kNoBroker, "--prompt", "a", "--guidance", g});
    EXPECT_EQ(r.exit_code, 2) << g << ": " << r.err;
    EXPECT_NE(r.err.find("--guidance"), std::string::npos) << g << ": " << r.err;
    EXPECT_EQ(r.out, "") << g << ": a job id was printed";
  }
  const auto r = zimage({"submit", "--broker", kNoBroker, "--prompt", "a", "--guidance", "150"});
  EXPECT_NE(r.err.find("--guidance: 150 is outside 0..100"), std::string::npos) << r.err;
  // --timeout nan would wait forever (every comparison with NaN is false).
  for (const char* t : {"nan", "inf"}) {
    const auto w =
        zimage({"submit", "--broker", kNoBroker, "--prompt", "a", "--wait", "--timeout", t});
    EXPECT_EQ(w.exit_code, 2) << t << ": " << w.err;
    EXPECT_NE(w.err.find("--timeout"), std::string::npos) << w.err;
  }
}

TEST(CliFloatFlags, GenerateNamesTheFlag) {
  TempDir d("gen");
  const std::string out = (d.path / "x.png").string();
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"--guidance", "nan"},         {"--guidance", "inf"},          {"--guidance", "1e39"},
      {"--guidance", "150"},         {"--cfg-normalization", "nan"}, {"--cfg-truncation", "-inf"},
      {"--control-scale", "inf"},    {"--strength", "nan"},          {"--vram-budget", "nan"},
      {"--cfg-normalization", "-1"}, {"--host-memory", "nan"},       {"--host-memory", "-1"}};
  for (const auto& [flag, value] : bad) {
    const auto r = zimage(
        {"generate", "--prompt", "a", "--steps", "1", "--device", "cpu", flag, value, "-o", out});
    EXPECT_EQ(r.exit_code, 2) << flag << " " << value << ": " << r.err;
    EXPECT_NE(r.err.find(flag), std::string::npos) << flag << " " << value << ": " << r.err;
    EXPECT_FALSE(fs::exists(out)) << flag << " " << value;
  }
  const auto r = zimage({"generate", "--prompt", "a", "--steps", "1", "--device", "cpu",
                         "--guidance", "150", "-o", out});
  EXPECT_NE(r.err.find("--guidance: 150 is outside 0..100"), std::string::npos) << r.err;
}

TEST(CliFloatFlags, OtherCommandsRefuseNaN) {
  const std::vector<std::vector<std::string>> cmds = {
      {"worker", "--broker", kNoBroker, "--vram-budget", "nan"},
      {"serve", "--port", "0", "--vram-budget", "nan"},
      {"serve", "--port", "0", "--host-memory", "nan"},
      {"worker", "--broker", kNoBroker, "--host-memory", "nan"},
      {"bench", "--vram-budget", "nan"},
      {"bench", "--strength", "nan"},
      {"make-random-model", "--out", "/nonexistent/x", "--outlier-channels", "nan"}};
  for (const auto& c : cmds) {
    const auto r = zimage(c);
    EXPECT_EQ(r.exit_code, 2) << c[0] << ": " << r.err;
    EXPECT_NE(r.err.find("nan is not a finite number"), std::string::npos) << c[0] << ": " << r.err;
  }
}

// bench --fp8-quality measures batch 1 only: a --batch beside it is refused, naming both, rather
// than its rows silently left out.
TEST(CliBench, Fp8QualityRefusesBatch) {
  const auto r = zimage({"bench", "--device", "cpu", "--fp8-quality", "all", "--batch", "4"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--fp8-quality"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--batch"), std::string::npos) << r.err;
}

// bench --fp8-layers (the standard rows in FP8) and --fp8-quality (its own table) exclude each
// other; a bad layer list is an error naming the bad item.
TEST(CliBench, Fp8LayersExcludesQualityAndNamesABadLayer) {
  const auto both =
      zimage({"bench", "--device", "cpu", "--fp8-quality", "all", "--fp8-layers", "all,sdpa"});
  EXPECT_EQ(both.exit_code, 2) << both.err;
  EXPECT_NE(both.err.find("--fp8-layers"), std::string::npos) << both.err;
  // (Parsed before the precision is looked at: this CPU machine has no fp8.)
  const auto bad = zimage({"generate", "--device", "cpu", "--fp8-layers", "all,mlp", "--prompt",
                           "x", "--output", "/dev/null"});
  EXPECT_NE(bad.exit_code, 0) << bad.err;
  EXPECT_NE(bad.err.find("'mlp'"), std::string::npos) << bad.err;
}

TEST(CliSeeds, MinusZeroIsZero) {
  TempDir d("seed");
  const std::string a = (d.path / "a.png").string(), b = (d.path / "b.png").string();
  const auto r0 = zimage(
      {"generate", "--prompt", "a", "--steps", "1", "--device", "cpu", "--seed", "0", "-o", a});
  ASSERT_EQ(r0.exit_code, 0) << r0.err;
  const auto rm = zimage(
      {"generate", "--prompt", "a", "--steps", "1", "--device", "cpu", "--seed", "-0", "-o", b});
  ASSERT_EQ(rm.exit_code, 0) << rm.err;
  EXPECT_EQ(test::read_file_bytes(a), test::read_file_bytes(b));
}

}  // namespace
}  // namespace zimage
