// The CPU backend: the numerical oracle every other backend and every model is tested against.
// Plain float32 code with float32 (or double, for norm statistics) accumulation; GEMMs through
// OpenBLAS, everything else parallelised over rows with a persistent ThreadPool. Each op family
// lives in its own file: cpu_backend.cpp (memory), cpu_gemm.cpp, cpu_norm.cpp,
// cpu_attention.cpp, cpu_conv.cpp, cpu_elementwise.cpp, cpu_layout.cpp.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/thread_pool.h"

namespace zimage::cpu {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads);

  Device device() const override { return Device::kCPU; }
  std::string name() const override;
  DType act_dtype() const override { return DType::kF32; }
  ThreadPool& pool() { return pool_; }
  int threads() const { return threads_; }
  // Attention computes the scores of a block of queries at a time, at most this many floats
  // (default 2^24 = 64 MiB; at least one query row): memory stays bounded whatever the sequence
  // length (the VAE's mid-block attends over every latent pixel). Tests lower it.
  void set_attention_score_floats(int64_t n) { attention_score_floats_ = n; }
  int64_t attention_score_floats() const { return attention_score_floats_; }
  // The row-block layout of w1|w3 weights on the oracle: with a block set, models put their
  // feed-forward weights in blocks of it (where it divides F) and matmul_swiglu runs Backend's
  // GEMM + swiglu over them, so the CPU suite covers the layout code the GPU's fused GEMM relies
  // on (loading, runtime LoRAs). 0 (the default): gate rows first.
  void set_swiglu_block(int64_t block) { swiglu_block_ = block; }
  int64_t swiglu_block(int64_t f, int64_t k) const override {
    return swiglu_block_ > 0 && f > 0 && k > 0 && f % swiglu_block_ == 0 ? swiglu_block_ : 0;
  }
  // The same for W8A8 w1|w3 weights (matmul_fp8_swiglu runs Backend's composition over them).
  void set_fp8_swiglu_block(int64_t block) { fp8_swiglu_block_ = block; }
  int64_t fp8_swiglu_block(int64_t f, int64_t k) const override {
    return fp8_swiglu_block_ > 0 && f > 0 && k > 0 && f % fp8_swiglu_block_ == 0 ? fp8_swiglu_block_
                                                                                 : 0;
  }

  // memory (cpu_backend.cpp)
  Result<Tensor> alloc(DType dtype, const Shape& shape) override;
  Result<Tensor> upload(const Tensor& host, DType dtype) override;
  Status download(const Tensor& src, Tensor& host) override;
  Status convert(const Tensor& src, Tensor& dst) override;
  Status copy_2d(const Tensor& src, int64_t src_offset, int64_t src_row_stride, Tensor& dst,
                 int64_t dst_offset, int64_t dst_row_stride, int64_t rows, int64_t cols) override;
  Status fill(Tensor& t, float value) override;
  Status synchronize() override { return Status::Ok(); }

  // cpu_gemm.cpp
  Status matmul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y) override;
  Status quantize_fp8(const Tensor& x, Tensor& x8, Tensor& scale) override;
  Status matmul_fp8(const Tensor& x, const Tensor& w8, const Tensor& w_scale, Tensor& y) override;
  Status matmul_fp8_rows(const Tensor& x, const Tensor& w8, const Tensor& w_scale,
                         const Tensor& bias, Tensor& y) override;
  bool takes_fp8_inputs() const override { return true; }
  Status matmul_fp8_quantized(const Tensor& x8, const Tensor& x_scale, const Tensor& w8,
                              const Tensor& w_scale, const Tensor& bias, Tensor& y) override;
  Status quantize_fp8_rows(const Tensor& w, Tensor& w8, Tensor& scale) override;
  Status dequantize_fp8_rows(const Tensor& w8, const Tensor& scale, Tensor& y) override;
  Status dequantize_packed(uint32_t ggml_type, const Tensor& blocks, Tensor& y) override;

  // cpu_norm.cpp
  Status rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& scale,
                  Tensor& y) override;
  Status layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps,
                    const Tensor& scale, Tensor& y) override;
  Status residual_rms_norm_gate(Tensor& x, const Tensor& y, const Tensor& w, float eps,
                                const Tensor& gate) override;
  Status group_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, int groups, float eps,
                    bool silu, Tensor& y) override;

  // cpu_elementwise.cpp
  Status rope_half(Tensor& x, const Tensor& cos, const Tensor& sin) override;
  Status rope_interleaved(Tensor& x, const Tensor& freqs) override;
  Status silu(const Tensor& x, Tensor& y) override;
  Status tanh(const Tensor& x, Tensor& y) override;
  Status clamp(const Tensor& x, float lo, float hi, Tensor& y) override;
  Status swiglu(const Tensor& x, Tensor& y) override;
  // The oracle of the fused op: the contract, then Backend's GEMM + swiglu.
  Status matmul_swiglu(const Tensor& x, const Tensor& w13, int64_t block, Tensor& y) override;
  Status axpby(float a, const Tensor& x, float b, const Tensor& y, Tensor& out) override;
  Status add(const Tensor& x, const Tensor& y, Tensor& out) override;
  Result<std::vector<double>> sum_squares(const Tensor& x) override;
  Status guided_euler_step(const Tensor& pos, const Tensor& neg, float g, float dt,
                           Tensor& latents) override;
  Status latent_to_rgb(const Tensor& latents, const LatentRgbMap& map, Tensor& rgb) override;
  Result<int64_t> count_nonfinite(const Tensor& x) override;
  Status image_to_rgb8(const Tensor& x, Tensor& rgb) override;

  // cpu_attention.cpp
  Status attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p,
                   Tensor& out) override;
  Status attention_packed_fp8(const Tensor& qkv, int64_t hq, int64_t hkv, const Tensor& norm_q,
                              const Tensor& norm_k, float eps, const Tensor& freqs,
                              const AttentionParams& p, Tensor& out) override;
  Status fp8_attention_support() const override { return Status::Ok(); }

  // cpu_conv.cpp
  Status conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p,
                Tensor& y) override;
  Status upsample_nearest2x(const Tensor& x, Tensor& y) override;

  // cpu_layout.cpp
  Status embedding(const Tensor& table, const Tensor& ids, Tensor& out) override;
  Status patchify(const Tensor& latents, int p, Tensor& tokens) override;
  Status unpatchify(const Tensor& tokens, int p, float alpha, Tensor& out) override;

 private:
  int threads_;
  ThreadPool pool_;
  int64_t swiglu_block_ = 0;
  int64_t fp8_swiglu_block_ = 0;
  int64_t attention_score_floats_ = int64_t{1} << 24;
};

}  // namespace zimage::cpu
