// `zimage generate --devices LIST --parallel sequence` (docs/PARALLEL.md) on the CPU with the tiny
// model: two and three CPU ranks write the PNG the one-device run writes (pixels within 1 level),
// and the flags that do not fit together are usage errors (exit 2) naming the flag.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/cli_run.h"
#include "common/tiny_engine.h"
#include "io/image/png.h"

namespace zimage {
namespace {

namespace fs = std::filesystem;

test::ProgramRun run_cli(std::vector<std::string> args) {
  test::ProgramSpec s;
  s.exe = ZIMAGE_CLI_PATH;
  s.args = std::move(args);
  return test::run_program(s);
}

std::vector<std::string> base_args(const std::string& out) {
  return {"generate",
          "--model",
          test::tiny_model_dir(),
          "--prompt",
          "a lighthouse at dusk",
          "--width",
          "64",
          "--height",
          "48",
          "--steps",
          "2",
          "--seed",
          "5",
          "--threads",
          "1",
          "--quiet",
          "--output",
          out};
}

}  // namespace

TEST(CliParallel, SequenceParallelWritesTheSameImage) {
  const fs::path dir = fs::temp_directory_path() / ("zimage_cli_par_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string ref_png = (dir / "ref.png").string();
  auto ref = run_cli(base_args(ref_png));
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  auto want = read_png(ref_png);
  ASSERT_TRUE(want.ok()) << want.status().to_string();
  for (const std::string devices : {"cpu,cpu", "cpu,cpu,cpu"}) {
    const std::string png = (dir / "par.png").string();
    auto args = base_args(png);
    args.insert(args.end(), {"--devices", devices, "--parallel", "sequence"});
    auto r = run_cli(args);
    ASSERT_EQ(r.exit_code, 0) << devices << ": " << r.err;
    auto got = read_png(png);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    ASSERT_EQ(got->rgb.size(), want->rgb.size());
    int diff = 0;
    for (size_t i = 0; i < got->rgb.size(); ++i)
      diff = std::max(diff, std::abs(int(got->rgb[i]) - int(want->rgb[i])));
    std::printf("[ parity ] CLI --devices %s: max pixel difference %d levels\n", devices.c_str(),
                diff);
    EXPECT_LE(diff, 1) << devices;
  }
  fs::remove_all(dir);
}

TEST(CliParallel, FlagsThatDoNotFitAreUsageErrors) {
  const std::string out = (fs::temp_directory_path() / "zimage_cli_par_never.png").string();
  struct Case {
    std::vector<std::string> extra;
    std::string message;
  };
  const std::vector<Case> cases{
      {{"--devices", "cpu,cpu", "--dump", "d"}, "--dump: not with --devices"},
      {{"--parallel", "sequence"}, "--parallel sequence: needs --devices"},
      {{"--parallel", "tensor", "--devices", "cpu,cpu"},
       "--parallel: 'tensor' is not one of: data, sequence"},
      {{"--parallel", "sequence", "--devices", "cpu,,cpu"}, "item 2 of 'cpu,,cpu' is empty"},
      {{"--parallel", "sequence", "--devices", "cuda:3-1"}, "is not a range cuda:A-B with A <= B"},
      {{"--parallel", "sequence", "--devices", "cpu,cpu", "--parallel-comm", "mpi"},
       "--parallel-comm: 'mpi'"},
      {{"--parallel", "sequence", "--devices", "cpu,cpu", "--device", "cpu"},
       "--device: not with --devices"},
      {{"--parallel", "sequence", "--devices", "cpu,gpu7"}, "gpu7"},
  };
  for (const Case& c : cases) {
    auto args = base_args(out);
    args.insert(args.end(), c.extra.begin(), c.extra.end());
    auto r = run_cli(args);
    EXPECT_EQ(r.exit_code, 2) << c.message << ": " << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
  }
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace zimage
