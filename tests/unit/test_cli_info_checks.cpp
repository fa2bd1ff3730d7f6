// `zimage info` runs every load-time check `generate` runs (TextToImage::check_folder): on copies
// of the tiny golden folder with one defect each (a missing tensor, an extra tensor, a wrong shape,
// a non-float dtype, a truncated tokenizer.json, a text encoder of another width) `info` exits 1
// with the message naming the problem, --json says "valid": false with that message, and
// `generate` refuses the folder with the same message. The intact folder passes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/cli_run.h"
#include "common/npy.h"
#include "io/random_model.h"
#include "io/safetensors.h"
#include "io/weights.h"

namespace zimage {
namespace {

namespace fs = std::filesystem;
using test::ProgramRun;
using test::ProgramSpec;
using TensorList = std::vector<std::pair<std::string, Tensor>>;

class InfoChecks : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = fs::temp_directory_path() /
            ("zimage_info_checks_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  // A copy of the golden v_turbo model folder (with the real tokenizer).
  fs::path copy_model(const std::string& tag) {
    const fs::path dir = root_ / tag;
    fs::copy(test::golden_dir("v_turbo") + "/model", dir, fs::copy_options::recursive);
    return dir;
  }
  // Rewrites the single safetensors file of `component` with `edit` applied to its tensors.
  static void edit_weights(const fs::path& model, const std::string& component,
                           const std::function<void(TensorList&)>& edit) {
    std::string file;
    for (const auto& e : fs::directory_iterator(model / component))
      if (e.path().extension() == ".safetensors") file = e.path().string();
    ASSERT_FALSE(file.empty());
    auto ws = WeightStore::open(file);
    ASSERT_TRUE(ws.ok()) << ws.status().to_string();
    TensorList list;
    for (const std::string& n : ws->names()) list.emplace_back(n, ws->get(n).value());
    edit(list);
    const Status st = write_safetensors(file, list);
    ASSERT_TRUE(st.ok()) << st.to_string();
  }
  static Tensor& find(TensorList& list, const std::string& name) {
    for (auto& [n, t] : list)
      if (n == name) return t;
    ADD_FAILURE() << name << " not in the list";
    static Tensor none;
    return none;
  }

  static ProgramRun zimage(std::vector<std::string> args) {
    ProgramSpec s;
    s.exe = ZIMAGE_CLI_PATH;
    s.args = std::move(args);
    return test::run_program(s);
  }

  // `info` fails naming every piece of `expected`; --json agrees; `generate` fails with the same
  // message. Returns info's first message.
  std::string expect_rejected(const fs::path& model, const std::vector<std::string>& expected) {
    const ProgramRun info = zimage({"info", model.string()});
    EXPECT_EQ(info.exit_code, 1) << "info accepted a broken folder:\n" << info.out << info.err;
    const std::string prefix = "zimage info: ";
    const size_t at = info.err.find(prefix);
    if (at == std::string::npos) {
      ADD_FAILURE() << "no error from info: " << info.err;
      return "";
    }
    const size_t begin = at + prefix.size();
    const std::string message = info.err.substr(begin, info.err.find('\n', begin) - begin);
    for (const std::string& e : expected)
      EXPECT_NE(message.find(e), std::string::npos) << "'" << e << "' not in: " << message;

    const ProgramRun json = zimage({"info", "--json", model.string()});
    EXPECT_EQ(json.exit_code, 1);
    const auto j = nlohmann::json::parse(json.out, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << json.out;
    if (!j.is_discarded()) {
      EXPECT_EQ(j["valid"], false);
      EXPECT_TRUE(j["errors"].is_array() && !j["errors"].empty() && j["errors"][0] == message)
          << j["errors"];
    }

    const std::string png = (root_ / "out.png").string();
    const ProgramRun gen =
        zimage({"generate", "--model", model.string(), "--prompt", "a fox", "--width", "64",
                "--height", "64", "--steps", "1", "--device", "cpu", "--output", png});
    EXPECT_EQ(gen.exit_code, 1) << gen.err;
    EXPECT_NE(gen.err.find(message), std::string::npos)
        << "generate words it differently:\n  info:     " << message << "\n  generate: " << gen.err;
    EXPECT_FALSE(fs::exists(png));
    return message;
  }

  fs::path root_;
};

TEST_F(InfoChecks, IntactFolderPasses) {
  const fs::path model = copy_model("intact");
  const ProgramRun text = zimage({"info", model.string()});
  EXPECT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("check: ok"), std::string::npos) << text.out;
  const ProgramRun json = zimage({"info", "--json", model.string()});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const auto j = nlohmann::json::parse(json.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["valid"], true);
  EXPECT_TRUE(j["errors"].empty());
}

TEST_F(InfoChecks, MissingTensor) {
  const fs::path model = copy_model("missing");
  const std::string name = "layers.1.feed_forward.w3.weight";
  edit_weights(model, "transformer", [&](TensorList& l) {
    std::erase_if(l, [&](const auto& p) { return p.first == name; });
  });
  expect_rejected(model, {"loading transformer", name});
}

TEST_F(InfoChecks, ExtraTensor) {
  const fs::path model = copy_model("extra");
  const std::string name = "layers.0.self_attn.o_proj.bias";
  edit_weights(model, "text_encoder", [&](TensorList& l) {
    l.emplace_back(name, find(l, "layers.0.input_layernorm.weight"));
  });
  expect_rejected(model, {"loading text encoder", "unexpected tensor", name});
}

TEST_F(InfoChecks, WrongShapeAndNonFloatDtype) {
  const fs::path model = copy_model("shape");
  const std::string name = "noise_refiner.0.attention.to_k.weight";  // [64, 64]
  edit_weights(model, "transformer", [&](TensorList& l) {
    find(l, name) = find(l, name).view({32, 128});
  });
  expect_rejected(model, {"loading transformer", name, "[32, 128]", "[64, 64]"});

  const fs::path ints = copy_model("dtype");
  const std::string norm = "decoder.conv_in.bias";  // [64]
  edit_weights(ints, "vae",
               [&](TensorList& l) { find(l, norm) = Tensor::host(DType::kI32, {64}); });
  expect_rejected(ints, {"loading vae", norm, "non-float dtype"});
}

TEST_F(InfoChecks, TruncatedTokenizer) {
  const fs::path model = copy_model("tokenizer");
  const fs::path file = model / "tokenizer" / "tokenizer.json";
  fs::resize_file(file, fs::file_size(file) / 2);
  expect_rejected(model, {"loading tokenizer", "tokenizer.json"});
}

TEST_F(InfoChecks, TextEncoderOfAnotherWidth) {
  // Text encoder weights 16 wide while its config and the transformer's cap_feat_dim say 32.
  const fs::path model = copy_model("te_width");
  TextEncoderConfig te;
  te.hidden_size = 16;
  te.intermediate_size = 64;
  te.num_hidden_layers = 2;
  te.num_attention_heads = 4;
  te.num_key_value_heads = 2;
  te.head_dim = 8;
  te.vocab_size = 151936;
  TensorList list;
  for (const TensorSpec& s : qwen3_tensor_specs(te)) {
    Tensor t = Tensor::host(DType::kF32, s.shape);
    random_tensor_values(s, 1, 0, t.data_as<float>(), static_cast<size_t>(t.numel()));
    list.emplace_back(s.name, t);
  }
  ASSERT_TRUE(
      write_safetensors((model / "text_encoder" / "model.safetensors").string(), list).ok());
  expect_rejected(model,
                  {"loading text encoder", "embed_tokens.weight", "[151936, 16]", "[151936, 32]"});

  // The same encoder with its config saying so: the configs disagree before any weight is read.
  const fs::path cfg = model / "text_encoder" / "config.json";
  auto j = nlohmann::json::parse(test::read_file_bytes(cfg.string()));
  j["hidden_size"] = 16;
  std::ofstream(cfg) << j.dump(2);
  expect_rejected(model, {"cap_feat_dim", "hidden_size 16"});
}

TEST_F(InfoChecks, EveryProblemIsListedTheFirstAsGenerateReportsIt) {
  const fs::path model = copy_model("several");
  fs::resize_file(model / "tokenizer" / "tokenizer.json", 1000);
  edit_weights(model, "vae", [&](TensorList& l) {
    std::erase_if(l, [](const auto& p) { return p.first == "decoder.conv_out.bias"; });
  });
  const std::string first = expect_rejected(model, {"loading tokenizer"});
  const ProgramRun json = zimage({"info", "--json", model.string()});
  const auto j = nlohmann::json::parse(json.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << json.out;
  ASSERT_EQ(j["errors"].size(), 2u) << j["errors"];
  EXPECT_EQ(j["errors"][0], first);
  EXPECT_NE(j["errors"][1].get<std::string>().find("decoder.conv_out.bias"), std::string::npos);
}

}  // namespace
}  // namespace zimage
