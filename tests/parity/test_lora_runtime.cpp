// Runtime LoRAs (model/adapters/lora_runtime.h, ZImageDiT::set_loras, GenerateRequest::loras) on
// the CPU backend, against two independent references: the same LoRAs merged at load (lora_merge.h,
// the float32 host merge the CLI uses) and diffusers' images (tools/make_lora_cases.py). Both
// methods (merge into the weights, low-rank side GEMM) for every LoRA case on one loaded model,
// switched in a row; taking a set off restores the base weights bit for bit; the engine's
// per-request LoRAs through generate() and through the continuous batch (different sets never share
// a step).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "common/cli_run.h"
#include "common/lora_case.h"
#include "common/npy.h"
#include "common/tiny_engine.h"
#include "io/lora/lora.h"
#include "io/weights/safetensors.h"
#include "model/adapters/lora_runtime.h"
#include "pipeline/text_to_image.h"

namespace zimage {
namespace {

namespace fs = std::filesystem;
using test::turbo_request;

// Runtime vs load-time merge, both float32 on the CPU: the merge adds up·down computed by a
// float32 GEMM instead of the host merge's, the side GEMM computes x·W + (x·downᵀ)·upᵀ instead of
// x·(W + up·down): rounding only. Measured over the 13 cases: step-0 DiT output <= 1.8e-6
// (merge), <= 1.9e-6 (side); image <= 6e-7 (both); LoHa / LoKr (merged in both) bit-identical.
// The bounds leave a margin of ~50x.
constexpr double kTolDitVsLoadMerge = 1e-4;
constexpr double kTolImageVsLoadMerge = 1e-4;
constexpr double kTolImageVsDiffusers = 1.0 / 255.0;  // as the load-time parity test

std::string lora_file(const std::string& name) {
  return std::string(ZIMAGE_LORA_DIR) + "/" + name;
}

struct Case {
  std::string name;
  std::vector<LoraSpec> loras;
};

std::vector<Case> cases() {
  std::ifstream f(lora_file("cases.json"));
  std::vector<Case> out;
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded()) return out;
  for (const auto& c : j.at("cases")) {
    Case lc{c.at("name").get<std::string>(), {}};
    for (const auto& l : c.at("loras"))
      lc.loras.push_back({lora_file(l.at("file").get<std::string>()), l.at("scale").get<float>()});
    out.push_back(lc);
  }
  return out;
}

struct RunOut {
  Tensor image, dit0;
};

Result<RunOut> run(TextToImage& pipe) {
  test::CaptureSink sink = test::step0_sink();
  TextToImageHooks hooks;
  hooks.debug = &sink;
  ZI_ASSIGN_OR_RETURN(TextToImageOutput out, pipe.run(turbo_request(), hooks));
  return RunOut{out.image, sink.get(test::kDitStep0)};
}

Result<std::vector<RuntimeLora>> read_set(const std::vector<LoraSpec>& specs) {
  std::vector<RuntimeLora> out;
  for (const LoraSpec& s : specs) {
    ZI_ASSIGN_OR_RETURN(LoraFile f, read_lora(s.path, 1.0f));
    out.push_back({std::make_shared<const LoraFile>(std::move(f)), s.scale});
  }
  return out;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

Tensor npy(const std::string& path) {
  auto t = test::load_npy(path);
  EXPECT_TRUE(t.ok()) << path << ": " << t.status().to_string();
  return t.ok() ? *t : Tensor();
}

// The load-time merged model's output for `loras` (the reference the runtime paths must give).
Result<RunOut> load_merged(const std::vector<LoraSpec>& loras) {
  std::unique_ptr<Backend> be = make_cpu_backend(2);
  PipelineLoadOptions opts;
  opts.loras = loras;
  ZI_ASSIGN_OR_RETURN(auto pipe, TextToImage::load(test::tiny_model_dir(), *be, opts));
  return run(*pipe);
}

// Every case in a row on ONE loaded model, per method: each matches the load-time merge and
// diffusers' image; the base model comes back bit for bit at the end.
TEST(LoraRuntime, EveryCaseBothMethodsMatchLoadTimeMergeInARow) {
  std::unique_ptr<Backend> be = make_cpu_backend(2);
  auto pipe = TextToImage::load(test::tiny_model_dir(), *be);
  ASSERT_TRUE(pipe.ok()) << pipe.status().to_string();
  auto base = run(**pipe);
  ASSERT_TRUE(base.ok()) << base.status().to_string();
  const std::vector<Case> all = cases();
  ASSERT_GE(all.size(), 13u);
  std::map<std::string, RunOut> refs;
  for (const Case& c : all) {
    auto r = load_merged(c.loras);
    ASSERT_TRUE(r.ok()) << c.name << ": " << r.status().to_string();
    refs[c.name] = *r;
  }
  ZImageDiT& dit = (*pipe)->transformer();
  for (LoraMethod m : {LoraMethod::kMerge, LoraMethod::kSide, LoraMethod::kAuto}) {
    double worst_dit = 0, worst_img = 0, worst_diffusers = 0;
    int side_weights = 0;
    for (const Case& c : all) {
      auto set = read_set(c.loras);
      ASSERT_TRUE(set.ok()) << set.status().to_string();
      ASSERT_TRUE(dit.set_loras(*set, m, false).ok()) << c.name;
      side_weights += dit.applied_loras().side_weights;
      if (m != LoraMethod::kSide) {
        EXPECT_EQ(dit.applied_loras().side_weights, 0) << c.name;  // CPU: everything resident
      }
      auto out = run(**pipe);
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      const double d = test::max_abs_diff(out->dit0, refs[c.name].dit0);
      const double i = test::max_abs_diff(out->image, refs[c.name].image);
      const double g = test::max_abs_diff(out->image, npy(lora_file(c.name + ".image.npy")));
      std::printf("  %-6s %-13s dit0 vs load-merge %.3g, image %.3g; vs diffusers %.3g\n",
                  lora_method_name(m), c.name.c_str(), d, i, g);
      EXPECT_LE(d, kTolDitVsLoadMerge) << c.name;
      EXPECT_LE(i, kTolImageVsLoadMerge) << c.name;
      EXPECT_LE(g, kTolImageVsDiffusers) << c.name;
      worst_dit = std::max(worst_dit, d), worst_img = std::max(worst_img, i);
      worst_diffusers = std::max(worst_diffusers, g);
    }
    std::printf("  %s: worst dit0 %.3g, image %.3g vs load-time merge; %.3g vs diffusers\n",
                lora_method_name(m), worst_dit, worst_img, worst_diffusers);
    // The side method really ran side GEMMs (LoHa / LoKr and non-linear targets merge).
    if (m == LoraMethod::kSide) {
      EXPECT_GT(side_weights, 0);
    }
  }
  ASSERT_TRUE(dit.set_loras({}, LoraMethod::kAuto, false).ok());
  auto again = run(**pipe);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(same_bits(again->image, base->image));
  EXPECT_TRUE(same_bits(again->dit0, base->dit0));
}

// Merging then taking the set off gives back every touched weight's bytes exactly, also for a
// stack of LoRAs that hit the same rows and for the fused q|k|v.
TEST(LoraRuntime, TakingAMergedSetOffRestoresTheWeightsBitForBit) {
  std::unique_ptr<Backend> be = make_cpu_backend(2);
  auto pipe = TextToImage::load(test::tiny_model_dir(), *be);
  ASSERT_TRUE(pipe.ok()) << pipe.status().to_string();
  ZImageDiT& dit = (*pipe)->transformer();
  auto set = read_set({{lora_file("peft.safetensors"), 0.7f},
                       {lora_file("kohya.safetensors"), -0.5f},
                       {lora_file("kohya_qkv.safetensors"), 1.3f},
                       {lora_file("lokr.safetensors"), 1.0f}});
  ASSERT_TRUE(set.ok()) << set.status().to_string();
  // The bytes of every stored weight the set touches, before.
  std::map<Tensor*, std::vector<char>> before;
  for (const RuntimeLora& l : *set)
    for (const LoraPatch& p : l.file->patches) {
      auto slot = dit.lora_slot(p.target);
      ASSERT_TRUE(slot.ok()) << p.target;
      const Tensor& t = *slot->tensor;
      const char* b = static_cast<const char*>(t.data());
      before.try_emplace(slot->tensor, b, b + t.nbytes());
    }
  ASSERT_GT(before.size(), 4u);
  ASSERT_TRUE(dit.set_loras(*set, LoraMethod::kMerge, false).ok());
  EXPECT_GT(dit.applied_loras().merged_weights, 0);
  int changed = 0;
  for (auto& [t, bytes] : before)
    changed += std::memcmp(t->data(), bytes.data(), bytes.size()) != 0;
  EXPECT_EQ(changed, static_cast<int>(before.size())) << "every touched weight changes";
  ASSERT_TRUE(dit.set_loras({}, LoraMethod::kMerge, false).ok());
  for (auto& [t, bytes] : before)
    EXPECT_EQ(std::memcmp(t->data(), bytes.data(), bytes.size()), 0) << t->describe();
}

// Feed-forward weights in row blocks (the layout the GPU's fused SwiGLU GEMM takes; here the
// oracle runs the GEMM + swiglu over the blocks): the same base model, and runtime LoRAs on w1
// and w3 (merged and as side GEMMs) still match the load-time merge, because a patched weight
// goes back to gate rows first; with the LoRAs off the weights are in blocks again and the base
// model comes back bit for bit.
TEST(LoraRuntime, FeedForwardsInRowBlocks) {
  auto plain = make_cpu_backend(2);
  auto blocked = std::make_unique<cpu::CpuBackend>(2);
  blocked->set_swiglu_block(17);  // F = 170 in the tiny model
  auto ref_pipe = TextToImage::load(test::tiny_model_dir(), *plain);
  auto pipe = TextToImage::load(test::tiny_model_dir(), *blocked);
  ASSERT_TRUE(ref_pipe.ok() && pipe.ok());
  auto ref = run(**ref_pipe);
  auto base = run(**pipe);
  ASSERT_TRUE(ref.ok() && base.ok());
  const double d0 = test::max_abs_diff(base->dit0, ref->dit0);
  std::printf("  blocks of 17 vs gate rows first: dit0 %.3g, image %.3g\n", d0,
              test::max_abs_diff(base->image, ref->image));
  EXPECT_LE(d0, 1e-5);
  const std::vector<LoraSpec> specs = {{lora_file("peft.safetensors"), 0.8f},
                                       {lora_file("lokr.safetensors"), 1.0f}};
  auto merged = load_merged(specs);
  ASSERT_TRUE(merged.ok()) << merged.status().to_string();
  auto set = read_set(specs);
  ASSERT_TRUE(set.ok()) << set.status().to_string();
  ZImageDiT& dit = (*pipe)->transformer();
  for (LoraMethod m : {LoraMethod::kMerge, LoraMethod::kSide}) {
    ASSERT_TRUE(dit.set_loras(*set, m, false).ok()) << lora_method_name(m);
    auto out = run(**pipe);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    const double d = test::max_abs_diff(out->dit0, merged->dit0);
    std::printf("  %s on blocked weights: dit0 vs load-time merge %.3g\n", lora_method_name(m), d);
    EXPECT_LE(d, kTolDitVsLoadMerge) << lora_method_name(m);
    ASSERT_TRUE(dit.set_loras({}, LoraMethod::kAuto, false).ok());
    auto again = run(**pipe);
    ASSERT_TRUE(again.ok());
    EXPECT_TRUE(same_bits(again->dit0, base->dit0)) << lora_method_name(m);
    EXPECT_TRUE(same_bits(again->image, base->image)) << lora_method_name(m);
  }
}

// The same with the W8A8 linears (--precision fp8): w1|w3 as FP8 rows in blocks with their
// scales (the layout of the GPU's fused FP8 SwiGLU GEMM; here the oracle composes
// matmul_fp8_swiglu): the base model as with gate rows first, the side GEMMs of a runtime LoRA
// on w1 and w3 on weights put back in the files' order, and the base model again bit for bit
// once the LoRA is off and the blocks are back.
TEST(LoraRuntime, Fp8FeedForwardsInRowBlocks) {
  auto plain = make_cpu_backend(2);
  auto blocked = std::make_unique<cpu::CpuBackend>(2);
  blocked->set_fp8_swiglu_block(17);  // F = 170 in the tiny model
  PipelineLoadOptions opts;
  opts.dit_fp8_compute = kFp8Default;
  auto ref_pipe = TextToImage::load(test::tiny_model_dir(), *plain, opts);
  auto pipe = TextToImage::load(test::tiny_model_dir(), *blocked, opts);
  ASSERT_TRUE(ref_pipe.ok() && pipe.ok());
  auto ref = run(**ref_pipe);
  auto base = run(**pipe);
  ASSERT_TRUE(ref.ok() && base.ok());
  const double d0 = test::max_abs_diff(base->dit0, ref->dit0);
  std::printf("  W8A8, blocks of 17 vs gate rows first: dit0 %.3g, image %.3g\n", d0,
              test::max_abs_diff(base->image, ref->image));
  EXPECT_LE(d0, 1e-5);
  auto set = read_set({{lora_file("peft.safetensors"), 1.0f}});
  ASSERT_TRUE(set.ok()) << set.status().to_string();
  ZImageDiT& dit = (*pipe)->transformer();
  ZImageDiT& ref_dit = (*ref_pipe)->transformer();
  auto block_of = [&](ZImageDiT& d) -> int64_t {  // layer 0's w1|w3: W8A8, and in which blocks
    auto slot = d.lora_slot("layers.0.feed_forward.w1.weight");
    EXPECT_TRUE(slot.ok() && slot->linear != nullptr && slot->linear->fp8_compute);
    return slot.ok() && slot->linear != nullptr ? slot->linear->swiglu_block : -1;
  };
  EXPECT_EQ(block_of(dit), 17);
  EXPECT_EQ(block_of(ref_dit), 0);
  ASSERT_TRUE(dit.set_loras(*set, LoraMethod::kAuto, false).ok());
  EXPECT_EQ(block_of(dit), 0) << "a LoRA on w1 puts the weight back in the files' order";
  ASSERT_TRUE(ref_dit.set_loras(*set, LoraMethod::kAuto, false).ok());
  EXPECT_GT(dit.applied_loras().side_weights, 0);
  auto with = run(**pipe);
  auto ref_with = run(**ref_pipe);
  ASSERT_TRUE(with.ok() && ref_with.ok());
  const double d1 = test::max_abs_diff(with->dit0, ref_with->dit0);
  std::printf("  W8A8 + runtime peft, blocked vs gate rows first: dit0 %.3g\n", d1);
  EXPECT_LE(d1, 1e-5);
  ASSERT_TRUE(dit.set_loras({}, LoraMethod::kAuto, false).ok());
  EXPECT_EQ(block_of(dit), 17);
  auto again = run(**pipe);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(same_bits(again->dit0, base->dit0));
  EXPECT_TRUE(same_bits(again->image, base->image));
}

// A bad set (a key that matches nothing, a shape that does not fit) fails naming the key and
// leaves the base model in place, whatever was applied before.
TEST(LoraRuntime, ErrorsNameTheKeyAndLeaveTheBaseModel) {
  std::unique_ptr<Backend> be = make_cpu_backend(2);
  auto pipe = TextToImage::load(test::tiny_model_dir(), *be);
  ASSERT_TRUE(pipe.ok()) << pipe.status().to_string();
  auto base = run(**pipe);
  ASSERT_TRUE(base.ok());
  ZImageDiT& dit = (*pipe)->transformer();
  auto good = read_set({{lora_file("peft.safetensors"), 1.0f}});
  ASSERT_TRUE(good.ok());
  ASSERT_TRUE(dit.set_loras(*good, LoraMethod::kMerge, false).ok());
  // peft first (applies), then the unknown key: the whole set fails and is undone.
  auto bad = read_set(
      {{lora_file("peft.safetensors"), 1.0f}, {lora_file("unknown_key.safetensors"), 1.0f}});
  ASSERT_TRUE(bad.ok());
  for (LoraMethod m : {LoraMethod::kMerge, LoraMethod::kSide}) {
    Status st = dit.set_loras(*bad, m, false);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("'transformer.layers.0.attention.to_x.lora_A.weight'"),
              std::string::npos)
        << st.message();
    EXPECT_NE(st.message().find("unknown_key.safetensors"), std::string::npos) << st.message();
    EXPECT_TRUE(dit.applied_loras().empty());
    auto out = run(**pipe);
    ASSERT_TRUE(out.ok());
    EXPECT_TRUE(same_bits(out->image, base->image)) << lora_method_name(m);
  }
  // Lenient: the unknown key is skipped and the rest applies.
  ASSERT_TRUE(dit.set_loras(*bad, LoraMethod::kSide, true).ok());
  EXPECT_GT(dit.applied_loras().patches, 0);

  const std::string dir =
      fs::temp_directory_path() / ("zimage_lora_rt_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = dir + "/wide.safetensors";
  Tensor a = Tensor::host(DType::kF32, {2, 48}), b = Tensor::host(DType::kF32, {64, 2});
  ASSERT_TRUE(write_safetensors(path, {{"transformer.layers.1.attention.to_v.lora_A.weight", a},
                                       {"transformer.layers.1.attention.to_v.lora_B.weight", b}})
                  .ok());
  auto wide = read_set({{path, 1.0f}});
  ASSERT_TRUE(wide.ok());
  Status st = dit.set_loras(*wide, LoraMethod::kAuto, true);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("transformer.layers.1.attention.to_v.lora_A.weight"),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("[64, 48] does not fit"), std::string::npos) << st.message();
  EXPECT_TRUE(dit.applied_loras().empty());
  fs::remove_all(dir);
}

// FP8-row weights (--weights fp8) and the W8A8 FP8 linears (--precision fp8) cannot be merged
// without loss: side GEMMs carry the LoRA there, and the image lands near diffusers' LoRA image
// (the base weights in FP8 are the only difference; without the LoRA it is ~0.5 away).
TEST(LoraRuntime, Fp8WeightsGetSideGemms) {
  for (int mode = 0; mode < 2; ++mode) {
    std::unique_ptr<Backend> be = make_cpu_backend(2);
    PipelineLoadOptions opts;
    opts.fp8_weights = mode == 0;
    if (mode == 1) opts.dit_fp8_compute = kFp8Default;
    auto pipe = TextToImage::load(test::tiny_model_dir(), *be, opts);
    ASSERT_TRUE(pipe.ok()) << pipe.status().to_string();
    auto set = read_set({{lora_file("peft.safetensors"), 1.0f}});
    ASSERT_TRUE(set.ok());
    ZImageDiT& dit = (*pipe)->transformer();
    ASSERT_TRUE(dit.set_loras(*set, LoraMethod::kAuto, false).ok());
    EXPECT_GT(dit.applied_loras().side_weights, 0);
    auto out = run(**pipe);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    const double to_lora = test::max_abs_diff(out->image, npy(lora_file("peft.image.npy")));
    const double to_base = test::max_abs_diff(out->image, npy(lora_file("base.image.npy")));
    std::printf("  %s + runtime peft: to diffusers' LoRA image %.3g, to the base %.3g\n",
                mode == 0 ? "fp8 weights" : "fp8 W8A8", to_lora, to_base);
    EXPECT_LT(to_lora, 0.25 * to_base);
  }
}

// The engine API: per-request LoRAs through generate() (two requests in a row, different sets,
// then none), and through the continuous batch with three requests of three sets at once: each
// request's image is its own set's, never its neighbours'.
TEST(LoraRuntime, EnginePerRequestLorasInARowAndInTheBatch) {
  auto engine = test::load_tiny_engine();
  ASSERT_TRUE(engine);
  const std::vector<std::pair<std::string, std::vector<LoraSpec>>> sets = {
      {"peft", {{lora_file("peft.safetensors"), 1.0f}}},
      {"kohya", {{lora_file("kohya.safetensors"), 1.0f}}},
      {"base", {}},
      {"stack", {{lora_file("peft.safetensors"), 0.7f}, {lora_file("kohya.safetensors"), -0.5f}}},
  };
  auto check = [&](const std::string& name, const Image& img) {
    const Tensor ref = npy(lora_file(name + ".image.npy"));  // [1, H, W, 3] f32
    ASSERT_EQ(static_cast<int64_t>(img.rgb.size()), ref.numel());
    double worst = 0;
    for (size_t i = 0; i < img.rgb.size(); ++i)
      worst = std::max(worst, std::abs(img.rgb[i] / 255.0 - ref.data_as<float>()[i]));
    std::printf("  engine %-6s RGB8 vs diffusers' image: max|diff| %.3g\n", name.c_str(), worst);
    EXPECT_LE(worst, 1.0 / 255.0 + 0.5 / 255.0) << name;  // RGB8 rounding on top of 1/255
  };
  for (const auto& [name, loras] : sets) {
    GenerateRequest req = turbo_request();
    req.loras = loras;
    auto r = engine->generate(req);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    check(name, r->images[0]);
  }
  std::map<uint64_t, std::string> ids;
  for (const auto& [name, loras] : sets) {
    GenerateRequest req = turbo_request();
    req.loras = loras;
    auto id = engine->batch_add(req);
    ASSERT_TRUE(id.ok()) << id.status().to_string();
    ids[*id] = name;
  }
  int done = 0;
  for (int guard = 0; guard < 100 && engine->batch_active() > 0; ++guard)
    for (BatchOutcome& o : engine->batch_step()) {
      ASSERT_TRUE(o.result.ok()) << o.result.status().to_string();
      check(ids.at(o.id), o.result->images[0]);
      ++done;
    }
  EXPECT_EQ(done, static_cast<int>(sets.size()));
  // A missing file fails the request up front, naming it.
  GenerateRequest req = turbo_request();
  req.loras = {{lora_file("no_such.safetensors"), 1.0f}};
  auto r = engine->batch_add(req);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no_such.safetensors"), std::string::npos);
}

// `zimage make-random-lora` writes a LoRA the loader maps completely (every attention and
// feed-forward weight of every block), and `zimage bench --lora` runs both methods on it.
TEST(LoraRuntime, RandomLoraAndBenchModeRun) {
  const std::string dir =
      fs::temp_directory_path() / ("zimage_lora_bench_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string file = dir + "/r4.safetensors";
  test::ProgramSpec make;
  make.exe = ZIMAGE_CLI_PATH;
  make.args = {"make-random-lora", "--like", test::tiny_model_dir(), "--rank", "4", "--out", file};
  test::ProgramRun m = test::run_program(make);
  ASSERT_EQ(m.exit_code, 0) << m.err;
  auto lora = read_lora(file, 1.0f);
  ASSERT_TRUE(lora.ok()) << lora.status().to_string();
  EXPECT_TRUE(lora->unmatched.empty());
  // v_turbo: 2 noise + 2 context refiners + 2 layers (config) x 7 weights.
  std::unique_ptr<Backend> be = make_cpu_backend(1);
  auto pipe = TextToImage::load(test::tiny_model_dir(), *be);
  ASSERT_TRUE(pipe.ok());
  const int blocks = (*pipe)->transformer().num_blocks();
  EXPECT_EQ(static_cast<int>(lora->patches.size()), 7 * blocks);
  for (const LoraPatch& p : lora->patches) EXPECT_EQ(p.rank, 4);

  test::ProgramSpec bench;
  bench.exe = ZIMAGE_CLI_PATH;
  bench.args = {"bench",
                "--device",
                "cpu",
                "--threads",
                "2",
                "--model",
                test::tiny_model_dir(),
                "--lora",
                file,
                "--sizes",
                "32",
                "--steps",
                "1",
                "--iters",
                "1",
                "--json",
                dir + "/bench.json"};
  test::ProgramRun b = test::run_program(bench);
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_NE(b.out.find("| merge |"), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("| side |"), std::string::npos) << b.out;
  const nlohmann::json j = nlohmann::json::parse(test::read_file_bytes(dir + "/bench.json"));
  EXPECT_EQ(j["methods"]["merge"]["merged_weights"].get<int>(), 4 * blocks);
  EXPECT_EQ(j["methods"]["merge"]["side_weights"].get<int>(), 0);
  EXPECT_EQ(j["methods"]["side"]["side_weights"].get<int>(), 4 * blocks);  // qkv, out, w13, w2
  EXPECT_GT(j["methods"]["side"]["image_s"].get<double>(), 0.0);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zimage
