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
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/cli_run.h"
#include "common/controlnet_model.h"
#include "common/gguf_builder.h"
#include "common/npy.h"
#include "io/model/model_folder.h"
#include "io/weights/safetensors.h"
#include "io/weights/weights.h"
#include "io/writers/random_controlnet.h"
#include "io/writers/random_model.h"
#include "pipeline/text_to_image.h"
#include "zimage/zimage.h"

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

// The tokenizer is parsed beside the weights now, but a broken one is still the first error,
// before a weight file that does not even open (which fails before the components load) and
// before one whose tensors are wrong, whatever the timing; a truncated weight file alone names
// its component.
TEST_F(InfoChecks, BrokenTokenizerIsReportedBeforeBrokenWeightFiles) {
  for (const char* part : {"vae", "text_encoder"}) {
    const fs::path model = copy_model(std::string("tok_and_") + part);
    fs::resize_file(model / "tokenizer" / "tokenizer.json", 1000);
    for (const auto& f : fs::directory_iterator(model / part))
      if (f.path().extension() == ".safetensors") fs::resize_file(f.path(), 100);
    expect_rejected(model, {"loading tokenizer"});
    const fs::path weights_only = copy_model(std::string("only_") + part);
    for (const auto& f : fs::directory_iterator(weights_only / part))
      if (f.path().extension() == ".safetensors") fs::resize_file(f.path(), 100);
    expect_rejected(weights_only, {std::string("loading ") + part});
  }
}

// Issue "security hardening", item 16: `info` on what is not a model folder runs the checks the
// loaders of `generate` make. Item 17: nothing from a file reaches the terminal unescaped.
class InfoOtherKinds : public InfoChecks {
 protected:
  static void write_bytes(const fs::path& p, const std::vector<uint8_t>& b) {
    std::ofstream(p, std::ios::binary)
        .write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  }
  // info's first message on stderr (exit 1 expected), with --json agreeing.
  std::string refused(const fs::path& path) {
    const ProgramRun r = zimage({"info", path.string()});
    EXPECT_EQ(r.exit_code, 1) << "info accepted " << path << ":\n" << r.out << r.err;
    const ProgramRun j = zimage({"info", "--json", path.string()});
    EXPECT_EQ(j.exit_code, 1) << j.out << j.err;
    const auto json = nlohmann::json::parse(j.out, nullptr, false);
    EXPECT_TRUE(!json.is_discarded() && json["valid"] == false) << j.out;
    const size_t at = r.err.find("zimage info: ");
    if (at == std::string::npos) return "";
    const size_t b = at + 13;
    return r.err.substr(b, r.err.find('\n', b) - b);
  }
  std::string png_file(const std::string& name) {
    Image img;
    img.width = img.height = 64;
    img.rgb.assign(64 * 64 * 3, 128);
    const std::string p = (root_ / name).string();
    auto bytes = png_encode(img);
    EXPECT_TRUE(bytes.ok());
    write_bytes(p, *bytes);
    return p;
  }
};

TEST_F(InfoOtherKinds, EmptyGgufIsRefused) {
  test::GgufBuilder g;
  g.header(0, 0);
  write_bytes(root_ / "empty.gguf", g.bytes);
  const std::string m = refused(root_ / "empty.gguf");
  EXPECT_NE(m.find("holds no"), std::string::npos) << m;
  // As `generate --dit` words it (TextToImage::check_file: the single-file loaders' check).
  EXPECT_EQ(TextToImage::check_file((root_ / "empty.gguf").string()).front().to_string(), m);
  fs::create_directories(root_ / "component");
  write_bytes(root_ / "component" / "model.gguf", g.bytes);
  EXPECT_NE(refused(root_ / "component").find("holds no tensors"), std::string::npos);
}

TEST_F(InfoOtherKinds, ControlNetWithBrokenConfigIsRefusedAsGenerateRefusesIt) {
  const TransformerConfig dit = ModelFolder::open(test::controlnet_model_dir())->transformer();
  RandomModelOptions o;
  o.dit = dit;
  const fs::path cn = root_ / "cn";
  ASSERT_TRUE(write_random_controlnet(cn.string(), "2.1", o).ok());
  const ProgramRun ok = zimage({"info", cn.string()});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  std::ofstream(cn / "config.json") << "{\"control_in_dim\": 33, ";
  const std::string m = refused(cn);
  EXPECT_NE(m.find("config.json"), std::string::npos) << m;
  const std::string out = (root_ / "out.png").string();
  const ProgramRun gen =
      zimage({"generate", "--model", test::controlnet_model_dir(), "--prompt", "a", "--width", "64",
              "--height", "64", "--steps", "1", "--device", "cpu", "--controlnet", cn.string(),
              "--control-image", png_file("control.png"), "--output", out});
  EXPECT_NE(gen.exit_code, 0);
  EXPECT_NE(gen.err.find(m), std::string::npos) << "info: " << m << "\ngenerate: " << gen.err;
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(InfoOtherKinds, LoraHoldingNaNIsRefusedAsGenerateRefusesIt) {
  const fs::path lora = root_ / "nan_lora.safetensors";
  Tensor down = Tensor::host(DType::kF32, {2, 64});
  Tensor up = Tensor::host(DType::kF32, {64, 2});
  for (int64_t i = 0; i < 128; ++i) {
    down.data_as<float>()[i] = 0.01f;
    up.data_as<float>()[i] = 0.01f;
  }
  up.data_as<float>()[5] = std::numeric_limits<float>::quiet_NaN();
  ASSERT_TRUE(write_safetensors(lora.string(), {{"layers.0.attention.to_q.lora_A.weight", down},
                                                {"layers.0.attention.to_q.lora_B.weight", up}})
                  .ok());
  const std::string m = refused(lora);
  EXPECT_NE(m.find("holds NaN or Inf"), std::string::npos) << m;
  const std::string out = (root_ / "out.png").string();
  const ProgramRun gen = zimage({"generate", "--prompt", "a", "--steps", "1", "--device", "cpu",
                                 "--lora", lora.string(), "--output", out});
  EXPECT_NE(gen.exit_code, 0);
  EXPECT_NE(gen.err.find("holds NaN or Inf"), std::string::npos) << gen.err;
  EXPECT_FALSE(fs::exists(out));
}

// Tensor names with a terminal escape (ESC [ 3 1 m), a C1 CSI (U+009B) and a BEL: printed as \xNN
// by `info --tensors`, and --json is pure ASCII.
TEST_F(InfoOtherKinds, TensorNamesAreEscaped) {
  const std::string evil =
      "evil\x1b[31mred\xc2\x9b"
      "2J\x07";
  const fs::path st = root_ / "evil.safetensors";
  ASSERT_TRUE(write_safetensors(st.string(), {{evil, Tensor::host(DType::kF32, {2})}}).ok());
  test::GgufBuilder g;
  g.header(1, 2).kv_str("general.architecture", "zimage-test").kv_u32("general.alignment", 32);
  g.tensor_info(evil, {4}, 0, 0).pad_to(32).f32s({1, 2, 3, 4});
  write_bytes(root_ / "evil.gguf", g.bytes);
  for (const fs::path& f : {st, root_ / "evil.gguf"}) {
    SCOPED_TRACE(f.string());
    for (bool as_json : {false, true}) {
      std::vector<std::string> args = {"info", "--tensors", f.string()};
      if (as_json) args.insert(args.begin() + 1, "--json");
      const ProgramRun r = zimage(args);
      EXPECT_EQ(r.exit_code, 0) << r.err;
      for (const std::string* text : {&r.out, &r.err})
        for (unsigned char c : *text) {
          EXPECT_FALSE(c == 0x1b || c == 0x07 || (as_json && c >= 0x80))
              << "unescaped byte " << int(c) << " in:\n"
              << *text;
          if (c == 0x1b || c == 0x07) break;
        }
      EXPECT_EQ(r.out.find("\xc2\x9b"), std::string::npos) << r.out;
      if (!as_json) {
        EXPECT_NE(r.out.find("evil\\x1b[31mred\\xc2\\x9b2J\\x07"), std::string::npos) << r.out;
      } else {
        const auto j = nlohmann::json::parse(r.out, nullptr, false);
        ASSERT_FALSE(j.is_discarded()) << r.out;
        EXPECT_EQ(j["weights"]["tensor_list"][0]["name"], evil);  // the exact name, JSON-escaped
      }
    }
  }
}

}  // namespace
}  // namespace zimage
