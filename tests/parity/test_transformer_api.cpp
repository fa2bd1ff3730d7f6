// The drop-in transformer's C++ API (include/zimage/transformer.h) on the CPU: its forward on the
// caller's host memory against the DiT outputs diffusers recorded for the golden cases (the
// tolerance of GoldenModels.DiT*), against the DiT output the engine's own pipeline computes
// (equal), the half-precision views, several latent sizes in one call, outputs aliasing inputs,
// two threads, the model layouts it loads, and every bad argument named.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "common/golden_harness.h"
#include "common/npy.h"
#include "core/dtype.h"
#include "golden_models_util.h"
#include "pipeline/text_to_image.h"
#include "zimage/transformer.h"

namespace zimage {
namespace {

using golden::npy;
using golden::report;
using golden::t_model_at;
using test::golden_dir;
using test::max_abs_diff;

constexpr double kDitTol = 1.5e-5;  // GoldenModels.DiT* (CPU fp32 against diffusers)

std::unique_ptr<Transformer> load_cpu(const std::string& path) {
  TransformerOptions o;
  o.path = path;
  o.device = "cpu";
  o.threads = 2;
  auto t = Transformer::load(o);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? std::move(t).value() : nullptr;
}

// A host tensor's bytes as a view of `shape` (contiguous, on the CPU).
TensorView view(const Tensor& t, std::vector<int64_t> shape, size_t byte_offset = 0) {
  TensorView v;
  v.data = static_cast<char*>(t.data()) + byte_offset;
  v.dtype = t.dtype() == DType::kBF16  ? ElementType::kBF16
            : t.dtype() == DType::kF16 ? ElementType::kF16
                                       : ElementType::kF32;
  v.shape = std::move(shape);
  return v;
}

// A host copy of `t` (f32) in `to` (bf16 / f16 / f32).
Tensor as_dtype(const Tensor& t, DType to) {
  Tensor r = Tensor::host(to, t.shape());
  EXPECT_TRUE(convert_from_f32(to, t.data_as<float>(), r.data(), static_cast<size_t>(t.numel())));
  return r;
}

// A host f32 copy of `t` (any float dtype).
Tensor as_f32(const Tensor& t) {
  Tensor r = Tensor::host(DType::kF32, t.shape());
  EXPECT_TRUE(
      convert_to_f32(t.dtype(), t.data(), r.data_as<float>(), static_cast<size_t>(t.numel())));
  return r;
}

// One call over latents [B, C, h, w] (host, any float dtype), the captions, one t for all,
// writing into a new host tensor of `out_dtype` shaped as the latents.
struct Call {
  TransformerCall call;
  Tensor t, out;
  std::vector<Tensor> keep;  // the tensors the views point into (a caller may pass temporaries)
};
Call make_call(const Tensor& latents, const std::vector<Tensor>& caps, float t_model,
               DType out_dtype = DType::kF32) {
  Call c;
  c.keep = caps;
  c.keep.push_back(latents);
  const int64_t b = latents.dim(0), ch = latents.dim(1), h = latents.dim(2), w = latents.dim(3);
  c.t = Tensor::host(DType::kF32, {b});
  for (int64_t i = 0; i < b; ++i) c.t.data_as<float>()[i] = t_model;
  c.out = Tensor::host(out_dtype, latents.shape());
  const size_t item = static_cast<size_t>(ch * h * w);
  for (int64_t i = 0; i < b; ++i) {
    c.call.x.push_back(view(latents, {ch, 1, h, w}, i * item * dtype_size(latents.dtype())));
    c.call.out.push_back(view(c.out, {ch, 1, h, w}, i * item * dtype_size(out_dtype)));
    c.call.cap_feats.push_back(
        view(caps[static_cast<size_t>(i)], caps[static_cast<size_t>(i)].shape()));
  }
  c.call.t = view(c.t, {b});
  return c;
}

// ---- against diffusers' recorded DiT outputs ----

// Step `step` of a golden case without CFG: the latents diffusers gave the DiT, each prompt's
// embeddings, its t; the output against debug/dit_out_step<step>.npy.
void check_golden_step(const std::string& name, int steps, int step) {
  const std::string dir = golden_dir(name);
  auto tr = load_cpu(dir + "/model");
  ASSERT_NE(tr, nullptr);
  const Tensor lat =
      npy(dir + (step == 0 ? std::string("/init_noise.npy")
                           : "/debug/latents_after_step" + std::to_string(step - 1) + ".npy"));
  ASSERT_TRUE(lat.defined());
  std::vector<Tensor> caps;
  for (int64_t i = 0; i < lat.dim(0); ++i)
    caps.push_back(npy(dir + "/prompt_embeds_" + std::to_string(i) + ".npy"));
  Call c = make_call(lat, caps, t_model_at(steps, step));
  const Status st = tr->forward(c.call);
  ASSERT_TRUE(st.ok()) << st.to_string();
  const Tensor ref = npy(dir + "/debug/dit_out_step" + std::to_string(step) + ".npy");
  const double err = max_abs_diff(c.out, ref);
  report("transformer api " + name + " dit step " + std::to_string(step), err);
  EXPECT_LE(err, kDitTol);
}

TEST(TransformerApi, GoldenDiTTurbo) {
  check_golden_step("v_turbo", 2, 0);
  check_golden_step("v_turbo", 2, 1);
}

TEST(TransformerApi, GoldenDiTBatchOfTwoCaptionLengths) {
  check_golden_step("v_batch", 2, 0);
  check_golden_step("v_batch", 2, 1);
}

TEST(TransformerApi, GoldenDiTWide) {
  check_golden_step("v_wide", 3, 0);
  check_golden_step("v_wide", 3, 2);
}

// ---- against the engine's own pipeline ----

// The v_turbo request through TextToImage: its init noise, prompt embeddings and each step's
// latents fed to the Transformer give the pipeline's DiT output bit for bit.
TEST(TransformerApi, EqualsThePipelinesDiT) {
  const test::GoldenCase gc = test::read_golden_case(test::GoldenFamily::kTextToImage, "v_turbo");
  auto be = create_cpu_backend(2);
  ASSERT_TRUE(be.ok()) << be.status().to_string();
  auto pipe = TextToImage::load(gc.model, **be);
  ASSERT_TRUE(pipe.ok()) << pipe.status().to_string();
  test::CaptureSink sink({"init_noise", "prompt_embeds.", "latents.step", "dit_out.step"});
  ASSERT_TRUE(test::run_captured(**pipe, gc.req, sink).has_value());
  auto tr = load_cpu(gc.model);
  ASSERT_NE(tr, nullptr);
  const Tensor cap = sink.get("prompt_embeds.0");
  ASSERT_TRUE(cap.defined());
  for (int k = 0; k < gc.req.steps; ++k) {
    const Tensor in = sink.get(k == 0 ? "init_noise" : "latents.step" + std::to_string(k - 1));
    const Tensor ref = sink.get("dit_out.step" + std::to_string(k));
    ASSERT_TRUE(in.defined() && ref.defined()) << "step " << k;
    Call c = make_call(in, {cap}, t_model_at(gc.req.steps, k));
    const Status st = tr->forward(c.call);
    ASSERT_TRUE(st.ok()) << st.to_string();
    const double err = max_abs_diff(c.out, ref);
    report("transformer api vs pipeline dit step " + std::to_string(k), err);
    EXPECT_EQ(err, 0.0) << "step " << k;
  }
}

// ---- dtypes, sizes, aliasing, threads ----

struct TurboInputs {
  Tensor lat;  // [1, 16, 4, 4] host f32
  Tensor cap;  // [L, 32]
  float t = 0;
};
TurboInputs turbo_inputs() {
  const std::string dir = golden_dir("v_turbo");
  return {npy(dir + "/init_noise.npy"), npy(dir + "/prompt_embeds_0.npy"), t_model_at(2, 0)};
}

// bf16 latents, f16 captions, a bf16 output and a scalar t give the f32 forward of the rounded
// inputs, rounded once to bf16.
TEST(TransformerApi, HalfPrecisionViewsAndScalarT) {
  auto tr = load_cpu(golden_dir("v_turbo") + "/model");
  ASSERT_NE(tr, nullptr);
  const TurboInputs in = turbo_inputs();
  const Tensor lat16 = as_dtype(in.lat, DType::kBF16), cap16 = as_dtype(in.cap, DType::kF16);
  Call ref = make_call(as_f32(lat16), {as_f32(cap16)}, in.t);
  ASSERT_TRUE(tr->forward(ref.call).ok());
  Call half = make_call(lat16, {cap16}, in.t, DType::kBF16);
  half.call.t = view(half.t, {});  // a single number for every item
  const Status st = tr->forward(half.call);
  ASSERT_TRUE(st.ok()) << st.to_string();
  const double err = max_abs_diff(half.out, as_dtype(ref.out, DType::kBF16));
  report("transformer api bf16/f16 views vs rounded f32", err);
  EXPECT_EQ(err, 0.0);
  EXPECT_GT(max_abs_diff(as_f32(half.out), ref.out), 0.0);  // the output really is bf16
}

// Two latent sizes in one call: each item equals its own call; outputs may alias the inputs.
TEST(TransformerApi, MixedSizesAndOutputsAliasingInputs) {
  auto tr = load_cpu(golden_dir("v_turbo") + "/model");
  ASSERT_NE(tr, nullptr);
  const TurboInputs in = turbo_inputs();
  const Tensor wide = npy(golden_dir("v_wide") + "/init_noise.npy");  // another h x w
  ASSERT_NE(wide.shape(), in.lat.shape());
  const Tensor wide0 = wide.slice0(0, 1);
  Call a = make_call(in.lat, {in.cap}, in.t);
  Call b = make_call(wide0, {in.cap}, 0.25f);
  ASSERT_TRUE(tr->forward(a.call).ok());
  ASSERT_TRUE(tr->forward(b.call).ok());
  // Both at once, into copies of the inputs (out = x).
  Tensor x0 = Tensor::host(DType::kF32, in.lat.shape()),
         x1 = Tensor::host(DType::kF32, wide0.shape());
  std::memcpy(x0.data(), in.lat.data(), in.lat.nbytes());
  std::memcpy(x1.data(), wide0.data(), wide0.nbytes());
  TransformerCall both;
  both.x = {view(x1, {16, 1, wide0.dim(2), wide0.dim(3)}),
            view(x0, {16, 1, in.lat.dim(2), in.lat.dim(3)})};
  both.out = both.x;
  both.cap_feats = {view(in.cap, in.cap.shape()), view(in.cap, in.cap.shape())};
  Tensor t = Tensor::host(DType::kF32, {2});
  t.data_as<float>()[0] = 0.25f;
  t.data_as<float>()[1] = in.t;
  both.t = view(t, {2});
  const Status st = tr->forward(both);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(max_abs_diff(x0, a.out), 0.0);
  EXPECT_EQ(max_abs_diff(x1, b.out), 0.0);
}

// Two threads sharing one Transformer get what one thread gets.
TEST(TransformerApi, TwoThreads) {
  auto tr = load_cpu(golden_dir("v_turbo") + "/model");
  ASSERT_NE(tr, nullptr);
  const TurboInputs in = turbo_inputs();
  Call ref = make_call(in.lat, {in.cap}, in.t);
  ASSERT_TRUE(tr->forward(ref.call).ok());
  std::vector<Call> calls;
  for (int i = 0; i < 2; ++i) calls.push_back(make_call(in.lat, {in.cap}, in.t));
  std::vector<Status> st(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i)
    threads.emplace_back([&, i] {
      for (int k = 0; k < 5 && st[static_cast<size_t>(i)].ok(); ++k)
        st[static_cast<size_t>(i)] = tr->forward(calls[static_cast<size_t>(i)].call);
    });
  for (auto& th : threads) th.join();
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(st[static_cast<size_t>(i)].ok()) << st[static_cast<size_t>(i)].to_string();
    EXPECT_EQ(max_abs_diff(calls[static_cast<size_t>(i)].out, ref.out), 0.0);
  }
}

// ---- loading ----

TEST(TransformerApi, LoadsModelFolderTransformerFolderAndSingleFile) {
  const std::string model = golden_dir("v_turbo") + "/model";
  auto from_model = load_cpu(model);
  auto from_folder = load_cpu(model + "/transformer");
  ASSERT_NE(from_model, nullptr);
  ASSERT_NE(from_folder, nullptr);
  const TransformerInfo& i = from_folder->info();
  EXPECT_EQ(i.source, model + "/transformer (config.json)");
  EXPECT_EQ(i.precision, "f32");
  EXPECT_EQ(i.memory.kind, MemoryDevice::Kind::kCPU);
  EXPECT_EQ(i.dim, 64);
  EXPECT_EQ(i.cap_feat_dim, 32);
  EXPECT_EQ(i.in_channels, 16);
  EXPECT_EQ(i.n_layers, 2);
  EXPECT_EQ(i.n_refiner_layers, 1);
  EXPECT_EQ(i.axes_dims, (std::vector<int>{8, 4, 4}));
  EXPECT_EQ(i.axes_lens, (std::vector<int>{256, 64, 64}));
  EXPECT_GT(i.max_caption_tokens, 0);
  // The two give the same output.
  const TurboInputs in = turbo_inputs();
  Call a = make_call(in.lat, {in.cap}, in.t), b = make_call(in.lat, {in.cap}, in.t);
  ASSERT_TRUE(from_model->forward(a.call).ok());
  ASSERT_TRUE(from_folder->forward(b.call).ok());
  EXPECT_EQ(max_abs_diff(a.out, b.out), 0.0);
  // A single file: its config inferred from the shapes (published RoPE proportions).
  auto from_file = load_cpu(model + "/transformer/diffusion_pytorch_model.safetensors");
  ASSERT_NE(from_file, nullptr);
  EXPECT_NE(from_file->info().source.find("config inferred from the tensor shapes"),
            std::string::npos)
      << from_file->info().source;
  EXPECT_EQ(from_file->info().dim, 64);
}

// A bad option: kInvalidArgument / kNotFound naming it.
TEST(TransformerApi, BadOptionsNameTheOption) {
  const std::string model = golden_dir("v_turbo") + "/model";
  struct Bad {
    std::string field;
    std::function<void(TransformerOptions&)> edit;
  };
  const std::vector<Bad> bad = {
      {"path", [](TransformerOptions& o) { o.path.clear(); }},
      {"path", [](TransformerOptions& o) { o.path = "/no/such/transformer"; }},
      {"path", [&](TransformerOptions& o) { o.path = model + "/vae"; }},  // wrong config class
      {"path", [&](TransformerOptions& o) { o.path = model + "/tokenizer"; }},
      {"device", [](TransformerOptions& o) { o.device = "tpu"; }},
      {"precision", [](TransformerOptions& o) { o.precision = "f8"; }},
      {"precision", [](TransformerOptions& o) { o.precision = "bf16"; }},  // on the CPU
      {"weights", [](TransformerOptions& o) { o.weights = "int4"; }},
      {"fp8_layers", [](TransformerOptions& o) { o.fp8_layers = "qkv,bogus"; }},
      {"fp8_layers", [](TransformerOptions& o) { o.fp8_layers = "qkv"; }},  // precision f32
      {"threads", [](TransformerOptions& o) { o.threads = -1; }},
      {"loras[0]",
       [](TransformerOptions& o) {
         o.loras = {{"", 1.0f}};
       }},
      {"loras[0]",
       [](TransformerOptions& o) {
         o.loras = {{"x.safetensors", NAN}};
       }},
  };
  for (const Bad& b : bad) {
    TransformerOptions o;
    o.path = model;
    o.device = "cpu";
    b.edit(o);
    auto t = Transformer::load(o);
    ASSERT_FALSE(t.ok()) << b.field;
    EXPECT_EQ(t.status().field(), b.field) << t.status().to_string();
    EXPECT_EQ(t.status().message().rfind(b.field + ": ", 0), 0u) << t.status().to_string();
  }
}

// ---- bad arguments ----

TEST(TransformerApi, BadArgumentsNameTheArgument) {
  auto tr = load_cpu(golden_dir("v_turbo") + "/model");
  ASSERT_NE(tr, nullptr);
  const TurboInputs in = turbo_inputs();
  const int64_t h = in.lat.dim(2), w = in.lat.dim(3);
  Tensor big = Tensor::host(DType::kF32, {16, 1, 2 * h, 2 * w});
  Tensor long_cap = Tensor::host(DType::kF32, {tr->info().max_caption_tokens + 1, 32});
  struct Bad {
    std::string field, words;
    std::function<void(TransformerCall&)> edit;
  };
  const std::vector<Bad> bad = {
      {"x", "no latents", [](TransformerCall& c) { c.x.clear(); }},
      {"cap_feats", "has 2 items, x has 1",
       [](TransformerCall& c) { c.cap_feats.push_back(c.cap_feats[0]); }},
      {"out", "has 0 items", [](TransformerCall& c) { c.out.clear(); }},
      {"x[0]", "is not [16, 1, H, W]",
       [](TransformerCall& c) {
         c.x[0].shape = {8, 1, 8, 8};
       }},
      {"x[0]", "is not [16, 1, H, W]",
       [](TransformerCall& c) {
         c.x[0].shape = {16, 2, 2, 4};
       }},
      {"x[0]", "is not [16, 1, H, W]",
       [](TransformerCall& c) {
         c.x[0].shape = {16, 4, 4};
       }},
      {"x[0]", "multiples of the patch size",
       [](TransformerCall& c) {
         c.x[0].shape = {16, 1, 3, 4};
         c.out[0].shape = {16, 1, 3, 4};
       }},
      {"x[0]", "RoPE",
       [](TransformerCall& c) {
         c.x[0].shape = {16, 1, 130, 2};
         c.out[0].shape = c.x[0].shape;
       }},
      {"x[0]", "not contiguous",
       [&](TransformerCall& c) {
         c.x[0].strides = {h * w, h * w, 1, h};
       }},  // W, H swapped
      {"x[0]", "strides for",
       [](TransformerCall& c) {
         c.x[0].strides = {1, 1};
       }},
      {"x[0]", "null pointer", [](TransformerCall& c) { c.x[0].data = nullptr; }},
      {"x[0]", "negative size",
       [](TransformerCall& c) {
         c.x[0].shape = {16, 1, -4, 4};
       }},
      {"x[0]", "is on cuda:0, the transformer runs on cpu",
       [](TransformerCall& c) {
         c.x[0].device = {MemoryDevice::Kind::kCUDA, 0};
       }},
      {"x[0]", "dtype", [](TransformerCall& c) { c.x[0].dtype = static_cast<ElementType>(9); }},
      {"out[0]", "differs from x[0]'s",
       [&](TransformerCall& c) { c.out[0] = view(big, big.shape()); }},
      {"out[0]", "is on cuda:1",
       [](TransformerCall& c) {
         c.out[0].device = {MemoryDevice::Kind::kCUDA, 1};
       }},
      {"cap_feats[0]", "is not [L, 32]",
       [](TransformerCall& c) {
         c.cap_feats[0].shape = {c.cap_feats[0].shape[0], 16};
       }},
      {"cap_feats[0]", "0 caption tokens",
       [](TransformerCall& c) {
         c.cap_feats[0].shape = {0, 32};
       }},
      {"cap_feats[0]", "fit the RoPE tables",
       [&](TransformerCall& c) { c.cap_feats[0] = view(long_cap, long_cap.shape()); }},
      {"t", "is not [1]", [](TransformerCall& c) { c.t.shape = {3}; }},
      {"t", "is not [1]",
       [](TransformerCall& c) {
         c.t.shape = {1, 1};
       }},
      {"t", "is on cuda:0",
       [](TransformerCall& c) {
         c.t.device = {MemoryDevice::Kind::kCUDA, 0};
       }},
  };
  for (const Bad& b : bad) {
    Call c = make_call(in.lat, {in.cap}, in.t);
    float* out = c.out.data_as<float>();
    for (int64_t k = 0; k < c.out.numel(); ++k) out[k] = 7.0f;
    b.edit(c.call);
    const Status v = tr->validate(c.call);
    const Status f = tr->forward(c.call);
    for (const Status* st : {&v, &f}) {
      EXPECT_EQ(st->code(), ErrorCode::kInvalidArgument) << b.field << ": " << st->to_string();
      EXPECT_EQ(st->field(), b.field) << st->to_string();
      EXPECT_NE(st->message().find(b.words), std::string::npos)
          << "expected '" << b.words << "' in: " << st->message();
    }
    for (int64_t k = 0; k < c.out.numel(); ++k)
      ASSERT_EQ(out[k], 7.0f) << b.field << ": out written";
  }
  // The same call without an edit runs.
  Call ok = make_call(in.lat, {in.cap}, in.t);
  EXPECT_TRUE(tr->validate(ok.call).ok());
}

}  // namespace
}  // namespace zimage
