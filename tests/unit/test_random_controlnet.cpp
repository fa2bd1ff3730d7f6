// The random ControlNet folder (zimage make-random-model --controlnet; io/writers/random_controlnet.h),
// which stands in for the Fun-Controlnet-Union checkpoints in the full-size speed runs against
// diffusers: its tensor names, shapes and config.json must be what diffusers' save_pretrained
// writes for each published version (checked against the ControlNet goldens' folders, which
// diffusers wrote), zimage must load what it writes (sharded, every version, the version told
// apart from the tensors as for a single file), and `zimage bench --pipeline ...` must run every
// pipeline row end to end on the CPU with it (the GPU stage's logic, tiny sizes).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "common/cli_run.h"
#include "common/controlnet_model.h"
#include "common/npy.h"
#include "io/model/model_folder.h"
#include "io/writers/random_controlnet.h"
#include "io/weights/safetensors.h"
#include "io/weights/weights.h"
#include "model/adapters/zimage_controlnet.h"
#include "pipeline/text_to_image.h"

namespace zimage {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string cn_root() {
  return test::controlnet_golden_root();
}

json read_json(const fs::path& p) {
  std::ifstream f(p);
  return json::parse(f);
}

// The tiny 30-layer DiT of the ControlNet goldens.
TransformerConfig cn_dit() {
  const json j = read_json(fs::path(cn_root()) / "cn_model" / "transformer" / "config.json");
  TransformerConfig c;
  c.dim = j["dim"];
  c.n_layers = j["n_layers"];
  c.n_refiner_layers = j["n_refiner_layers"];
  c.n_heads = j["n_heads"];
  c.n_kv_heads = j["n_kv_heads"];
  c.cap_feat_dim = j["cap_feat_dim"];
  c.axes_dims = j["axes_dims"].get<std::vector<int>>();
  c.axes_lens = j["axes_lens"].get<std::vector<int>>();
  return c;
}

std::map<std::string, Shape> folder_tensors(const fs::path& dir) {
  std::map<std::string, Shape> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    auto f = SafetensorsFile::open(e.path().string());
    EXPECT_TRUE(f.ok()) << f.status().to_string();
    if (!f.ok()) continue;
    for (const auto& t : (*f)->tensors()) out[t.name] = t.shape;
  }
  return out;
}

// A scratch folder of this process, removed at exit.
struct Scratch {
  fs::path path;
  explicit Scratch(const std::string& name) {
    path = fs::temp_directory_path() / ("zimage_rcn_" + name + "_" + std::to_string(getpid()));
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

TEST(RandomControlNet, MatchesUpstreamFolders) {
  const TransformerConfig dit = cn_dit();
  int checked = 0;
  for (const auto& e : fs::directory_iterator(cn_root())) {
    if (!fs::exists(e.path() / "case.json")) continue;
    const std::string version = read_json(e.path() / "case.json")["version"];
    SCOPED_TRACE(e.path().filename().string() + " (" + version + ")");
    auto layout = controlnet_layout(version, dit);
    ASSERT_TRUE(layout.ok()) << layout.status().to_string();
    std::map<std::string, Shape> specs;
    for (const TensorSpec& s : controlnet_tensor_specs(dit, *layout)) specs[s.name] = s.shape;
    EXPECT_EQ(specs, folder_tensors(e.path() / "controlnet"));
    json ours = json::parse(controlnet_config_json(dit, *layout));
    json theirs = read_json(e.path() / "controlnet" / "config.json");
    ours.erase("_diffusers_version");
    theirs.erase("_diffusers_version");
    EXPECT_EQ(ours, theirs);
    ++checked;
  }
  EXPECT_EQ(checked, 4);  // 1.0, 2.0, 2.1, 2.1-lite
}

TEST(RandomControlNet, RefusesUnknownVersionAndUnevenDepth) {
  TransformerConfig dit = cn_dit();
  auto v = controlnet_layout("3.0", dit);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("--controlnet-version 3.0"), std::string::npos);
  dit.n_layers = 20;  // 15 control layers cannot spread over 20
  auto d = controlnet_layout("2.1", dit);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("20 layers"), std::string::npos) << d.status().message();
  EXPECT_TRUE(controlnet_layout("2.1-lite", TransformerConfig{}).ok());
  Scratch s("busy");
  fs::create_directories(s.path / "x");
  RandomModelOptions o;
  o.dit = cn_dit();
  EXPECT_FALSE(write_random_controlnet(s.path.string(), "2.1", o).ok());  // not empty
}

// Every version written (sharded) loads in zimage against the tiny DiT with its config, and the
// tensors alone tell the version as the single-file loader tells it.
TEST(RandomControlNet, WrittenFoldersLoad) {
  auto be = create_cpu_backend(2);
  ASSERT_TRUE(be.ok()) << be.status().to_string();
  auto pipe = TextToImage::load(test::controlnet_model_dir(), **be);
  ASSERT_TRUE(pipe.ok()) << pipe.status().to_string();
  for (const std::string version : {"1.0", "2.0", "2.1", "2.1-lite"}) {
    SCOPED_TRACE(version);
    Scratch s("v" + version);
    RandomModelOptions o;
    o.dit = cn_dit();
    o.seed = 7;
    o.max_shard_bytes = 100'000;  // several shards + an index, as the full-size one has
    std::vector<std::string> written;
    ASSERT_TRUE(write_random_controlnet(s.path.string(), version, o, [&](const std::string& f) {
                  written.push_back(f);
                }).ok());
    EXPECT_GE(written.size(), 3u);  // config.json and at least two shards
    EXPECT_TRUE(fs::exists(s.path / "diffusion_pytorch_model.safetensors.index.json"));
    auto layout = controlnet_layout(version, o.dit);
    ASSERT_TRUE(layout.ok());
    const Status st = (*pipe)->load_controlnet(s.path.string());
    ASSERT_TRUE(st.ok()) << st.to_string();
    const ControlNetConfig& c = (*pipe)->controlnet()->config();
    EXPECT_EQ(c.control_layers_places, layout->control_layers_places);
    EXPECT_EQ(c.control_refiner_layers_places, layout->control_refiner_layers_places);
    EXPECT_EQ(c.control_in_dim, layout->control_in_dim);
    auto ws = WeightStore::open(s.path.string());
    ASSERT_TRUE(ws.ok()) << ws.status().to_string();
    auto inferred = infer_controlnet_config(*ws, o.dit.n_layers, nullptr);
    ASSERT_TRUE(inferred.ok()) << inferred.status().to_string();
    EXPECT_EQ(inferred->version, version);
    EXPECT_EQ(inferred->control_layers_places, layout->control_layers_places);
  }
}

// Issue "security hardening", item 19: a transformer with one noise refiner layer. The published
// refiner places [0, 1] name a layer it lacks; every version's writer must produce what the
// loader accepts ([0]), through `make-random-model --like DIR --controlnet`, and a transformer
// without refiner layers is refused up front.
TEST(RandomControlNet, OneRefinerLayerWritesWhatLoads) {
  Scratch s("one_refiner");
  auto folder = ModelFolder::open(test::controlnet_model_dir());
  ASSERT_TRUE(folder.ok()) << folder.status().to_string();
  RandomModelOptions o;
  o.dit = folder->transformer();
  o.dit.n_refiner_layers = 1;
  o.text_encoder = folder->text_encoder();
  o.vae = folder->vae();
  o.dtype = DType::kF32;
  o.tokenizer_dir = test::controlnet_model_dir() + "/tokenizer";
  const std::string model = (s.path / "model").string();
  ASSERT_TRUE(write_random_model(model, o).ok());
  auto be = create_cpu_backend(2);
  ASSERT_TRUE(be.ok()) << be.status().to_string();
  auto pipe = TextToImage::load(model, **be);
  ASSERT_TRUE(pipe.ok()) << pipe.status().to_string();
  for (const std::string version : {"1.0", "2.0", "2.1", "2.1-lite"}) {
    SCOPED_TRACE(version);
    const std::string cn = (s.path / ("cn" + version)).string();
    auto made = test::run_program({ZIMAGE_CLI_PATH,
                                   {"make-random-model", "--like", model, "--controlnet", cn,
                                    "--controlnet-version", version, "--dtype", "f32"}});
    ASSERT_EQ(made.exit_code, 0) << made.err;
    const Status st = (*pipe)->load_controlnet(cn);
    ASSERT_TRUE(st.ok()) << st.to_string();
    const ControlNetConfig& c = (*pipe)->controlnet()->config();
    if (version != "1.0") {
      EXPECT_EQ(c.control_refiner_layers_places, std::vector<int>{0});
    }
    EXPECT_EQ(c.n_refiner_layers, 1);
  }
  TransformerConfig none = o.dit;
  none.n_refiner_layers = 0;
  auto l = controlnet_layout("2.1-lite", none);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("no noise refiner layer"), std::string::npos)
      << l.status().message();
}

// `zimage make-random-model --controlnet` then `zimage bench --pipeline ...` on the CPU: every
// row runs (the denoising steps as each pipeline computes them), the inputs are written for the
// diffusers script, and a ControlNet row without --controlnet is refused.
TEST(BenchPipelinesCli, CpuRowsRun) {
  Scratch s("bench");
  const std::string cn = (s.path / "controlnet").string();
  auto made = test::run_program({ZIMAGE_CLI_PATH,
                                 {"make-random-model", "--like", test::controlnet_model_dir(),
                                  "--controlnet", cn, "--controlnet-version", "2.1"}});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  EXPECT_TRUE(fs::exists(fs::path(cn) / "config.json"));
  const std::string js = (s.path / "rows.json").string(), inputs = (s.path / "inputs").string();
  auto run = test::run_program({ZIMAGE_CLI_PATH,
                                {"bench",
                                 "--device",
                                 "cpu",
                                 "--threads",
                                 "2",
                                 "--model",
                                 test::controlnet_model_dir(),
                                 "--controlnet",
                                 cn,
                                 "--pipeline",
                                 "controlnet-inpaint,t2i,img2img,inpaint,controlnet",
                                 "--sizes",
                                 "32",
                                 "--steps",
                                 "3",
                                 "--iters",
                                 "1",
                                 "--strength",
                                 "0.5",
                                 "--inputs-dir",
                                 inputs,
                                 "--json",
                                 js}});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("| controlnet-inpaint | 3 |"), std::string::npos) << run.out;
  const json r = read_json(js);
  ASSERT_EQ(r["pipelines"].size(), 5u);
  const std::pair<const char*, int> want[] = {
      {"t2i", 3}, {"img2img", 2}, {"inpaint", 2}, {"controlnet", 3}, {"controlnet-inpaint", 3}};
  for (size_t i = 0; i < 5; ++i) {
    const json& row = r["pipelines"][i];
    EXPECT_EQ(row["pipeline"], want[i].first);
    EXPECT_EQ(row["denoising_steps"], want[i].second) << want[i].first;  // 3 - int(3 - 3 · 0.5) = 2
    EXPECT_GT(row["image_s"].get<double>(), 0.0);
    EXPECT_GE(row["image_s_max"].get<double>(), row["image_s_min"].get<double>());
  }
  EXPECT_GT(r["pipelines"][1]["vae_encode_s"].get<double>(), 0.0);
  EXPECT_EQ(r["controlnet_version"], "folder");
  for (const char* f : {"init.png", "mask.png", "control.png"}) {
    auto img = image_load(inputs + "/" + f);
    ASSERT_TRUE(img.ok()) << f;
    EXPECT_EQ(img->width, 32);
    EXPECT_EQ(img->height, 32);
  }
  auto refused =
      test::run_program({ZIMAGE_CLI_PATH,
                         {"bench", "--device", "cpu", "--model", test::controlnet_model_dir(),
                          "--pipeline", "controlnet", "--sizes", "32"}});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.err.find("--controlnet"), std::string::npos) << refused.err;
}

}  // namespace
}  // namespace zimage
