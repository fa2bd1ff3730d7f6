// `zimage info` end to end: the real binary on a golden folder (text and --json), on a single
// weight file, and on a missing folder (a clear message and a non-zero exit, no crash).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace {

struct CliRun {
  int exit_code = -1;
  std::string output;  // stdout, plus stderr when merged
};

CliRun run_cli(const std::string& args, bool merge_stderr) {
  CliRun r;
  const std::string cmd =
      std::string("'") + ZIMAGE_CLI_PATH + "' " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string golden_model(const std::string& name) {
  return std::string(ZIMAGE_GOLDEN_DIR) + "/" + name + "/model";
}

}  // namespace

TEST(CliInfo, JsonDescribesShardedGoldenFolder) {
  const CliRun r = run_cli("info --json '" + golden_model("v_batch") + "'", false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.output;
  EXPECT_EQ(j["kind"], "model_folder");
  const auto& c = j["components"];
  EXPECT_EQ(c["transformer"]["config"]["dim"], 64);
  EXPECT_EQ(c["transformer"]["config"]["head_dim"], 16);
  EXPECT_EQ(c["transformer"]["weights"]["tensors"], 73);
  EXPECT_EQ(c["transformer"]["weights"]["files"].size(), 2u);
  EXPECT_EQ(c["text_encoder"]["weights"]["parameters"], 4880576);    // index total_parameters
  EXPECT_EQ(c["text_encoder"]["weights"]["tensor_bytes"], 9761152);  // index total_size
  EXPECT_EQ(c["vae"]["weights"]["dtypes"]["bf16"], c["vae"]["weights"]["tensors"]);
  EXPECT_EQ(c["vae"]["config"]["scaling_factor"], 0.3611);
  EXPECT_EQ(c["scheduler"]["config"]["shift"], 3.0);
  const int64_t total = c["transformer"]["weights"]["parameters"].get<int64_t>() +
                        c["text_encoder"]["weights"]["parameters"].get<int64_t>() +
                        c["vae"]["weights"]["parameters"].get<int64_t>();
  EXPECT_EQ(j["total"]["parameters"], total);
  EXPECT_GT(j["total"]["file_bytes"].get<int64_t>(), 0);
}

TEST(CliInfo, TextOutputAndSingleFile) {
  const CliRun r = run_cli("info '" + golden_model("v_turbo") + "'", false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("transformer"), std::string::npos);
  EXPECT_NE(r.output.find("73 tensors"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("4,880,576 parameters"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bf16"), std::string::npos);

  const CliRun f = run_cli("info --json --tensors '" + golden_model("v_turbo") +
                               "/vae/diffusion_pytorch_model.safetensors'",
                           false);
  ASSERT_EQ(f.exit_code, 0) << f.output;
  const auto j = nlohmann::json::parse(f.output, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["kind"], "weights");
  EXPECT_EQ(j["weights"]["tensor_list"].size(), j["weights"]["tensors"].get<size_t>());
  EXPECT_EQ(j["weights"]["tensor_list"][0]["dtype"], "bf16");
}

TEST(CliInfo, MissingFolderFailsClearly) {
  const CliRun r = run_cli("info /nonexistent/zimage-model-dir", true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("/nonexistent/zimage-model-dir"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("no such file or folder"), std::string::npos) << r.output;
  const CliRun usage = run_cli("info --no-such-flag", true);  // a usage error
  EXPECT_EQ(usage.exit_code, 2) << usage.output;
}
