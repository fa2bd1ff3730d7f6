// How a model holds its big weights, as the memory planner decides (pipeline/memory_plan.h):
//  * LinearWeight: a linear layer's weight in the compute dtype, or (--weights fp8) as FP8 e4m3
//    with one scale per output channel, widened into a scratch buffer just before its GEMM, so
//    the GEMM itself is the same bf16 GEMM (half the bytes resident and streamed, one extra pass
//    over the weight per use).
//  * WeightPlacement: which of a model's blocks live on the device and which in (pinned) host
//    memory, streamed in before use (model/common/weight_streamer.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "core/tensor.h"

namespace zimage {

// Runtime LoRAs on one linear weight (model/adapters/lora_runtime.h), applied after its GEMM as a
// low-rank side GEMM: y += (x · aᵀ) · bᵀ. The LoRAs of a request are stacked along the rank: a [R,
// K] holds every down, b [N, R] every up times its whole scale, zero on rows a LoRA does not touch
// (a LoRA on to_k lands on the middle third of the rows of the fused q|k|v weight). Act dtype, on
// the device; immutable once made, so a recorded forward may hold their addresses.
struct LoraSide {
  Tensor a;  // [R, K]
  Tensor b;  // [N, R]
};

struct LinearWeight {
  Tensor w;      // [N, K]: the backend's act dtype, or kF8E4M3 / kF8E5M2 when `scale` is defined,
                 // or kU8 [N, row bytes] holding GGUF blocks when `packed_cols` > 0
  Tensor scale;  // [N] f32: per-output-channel dequantisation scale (FP8 only)
  std::shared_ptr<const LoraSide> lora;  // runtime LoRA side GEMM; null: none
  // W8A8 (--precision fp8): the FP8 weight meets activations quantised per token in an FP8 GEMM
  // (Backend::matmul_fp8_rows) instead of being widened for a bf16 GEMM.
  bool fp8_compute = false;
  // Packed GGUF rows (model/common/quantized_linear.h): the ggml type id of the blocks and K, the
  // elements per row; dequantised into the scratch before the GEMM (Backend::dequantize_packed).
  uint32_t ggml_type = 0;
  int64_t packed_cols = 0;
  // A feed-forward's w1|w3 weight [2F, K] with its rows interleaved in blocks of this many
  // (Backend::matmul_swiglu, set_swiglu_block); 0: gate rows first, as the files hold them.
  int64_t swiglu_block = 0;
  bool fp8() const { return scale.defined(); }
  bool packed() const { return packed_cols > 0; }
  bool quantized() const { return fp8() || packed(); }
  bool defined() const { return w.defined(); }
  int64_t rows() const { return w.defined() ? w.dim(0) : 0; }
  int64_t cols() const { return packed() ? packed_cols : (w.defined() ? w.dim(1) : 0); }
};

// The DiT linears that run as W8A8 FP8 GEMMs under --precision fp8 (bits of
// WeightPlacement::fp8_compute): attention q|k|v and out, feed-forward w1|w3 and w2, in the main
// layers, and in the noise and context refiners too with kFp8Refiners. Embedders, adaLN and the
// final layer stay in the compute dtype (small GEMMs, and where FP8 hurts most). kFp8Sdpa is
// not a linear: the attention itself (softmax(QKᵀ)V) on e4m3 operands
// (Backend::attention_packed_fp8), opt-in, outside the default set, in the same layers.
enum Fp8Layers : unsigned {
  kFp8Qkv = 1u,
  kFp8Out = 2u,
  kFp8W13 = 4u,
  kFp8W2 = 8u,
  kFp8Refiners = 16u,
  kFp8Sdpa = 32u,
  kFp8AllLinears = kFp8Qkv | kFp8Out | kFp8W13 | kFp8W2,
  kFp8Default = kFp8AllLinears | kFp8Refiners,
};
// "qkv,out,w13,w2,refiners,sdpa" (any subset, comma-separated), "all" (= the default set, also
// inside a list: "all,sdpa"), "ffn" (= w13,w2), "attn" (= qkv,out) or "none"; an unknown name is
// an error naming it.
Result<unsigned> parse_fp8_layers(const std::string& list);
std::string fp8_layers_string(unsigned layers);  // "qkv,out,w13,w2,refiners,sdpa"

struct WeightPlacement {
  // Store the blocks' big linear weights (attention q|k|v and out, feed-forward) as FP8 rows.
  bool fp8_weights = false;
  // Fp8Layers bits: these linears become FP8 rows with fp8_compute set (the DiT only).
  unsigned fp8_compute = 0;
  // Keep weights the file stores quantised (FP8 with scales, GGUF blocks) in that form on the
  // device, dequantised per layer before each GEMM (model/common/quantized_linear.h). False:
  // widened to the act dtype at load (the reference the kept path is tested against).
  bool keep_quantized = true;
  // Per block in execution order: true = kept in host memory and streamed in before use.
  // Empty = every block on the device.
  std::vector<bool> streamed;
  // Per block: a streamed block's host copy in pageable memory rather than page-locked (over the
  // host-memory limit, pipeline/memory_plan.h). Empty = every streamed block pinned.
  std::vector<bool> pageable;
  bool is_pageable(int index) const {
    return index >= 0 && index < static_cast<int>(pageable.size()) && pageable[index];
  }
  // Streamed weights the files hold in a form the backend streams as it is (bf16 files on a bf16
  // GPU) stay views of the memory-mapped files: no load-time copy, and every stream reads the
  // file pages (model/common/weight_streamer.h). False: every streamed weight is loaded and held
  // as a host copy (pinned or pageable above), which streams faster but costs the copy at load.
  bool stream_from_files = false;
  // With stream_from_files: the file pages of the streamed blocks not marked pageable are
  // page-locked in place (WeightStreamer::lock_file_pages), so they stream at the link's rate
  // with no host copy at load or per step; the pageable ones stream through staging.
  bool lock_files = false;
  // The backend stream slots the model may use: [first_slot, first_slot + slots).
  int first_slot = 0;
  int slots = 2;
  bool any_streamed() const {
    for (bool s : streamed)
      if (s) return true;
    return false;
  }
};

// y[M, N] = x[M, K] · wᵀ (+ bias). An FP8 or packed weight is first dequantised into `scratch`
// (act dtype, at least N*K elements; its leading N*K elements are overwritten).
Status linear(Backend& be, const Tensor& x, const LinearWeight& w, const Tensor& bias,
              const Tensor& scratch, Tensor& y);

// Whether `w` takes its input as FP8 rows made by the op before it (Backend::takes_fp8_inputs,
// e.g. residual_norm_gate_then_norm_fp8): a W8A8 weight (fp8_compute) without a runtime LoRA
// side, whose side GEMM would read the act-dtype input.
bool takes_fp8_input(const Backend& be, const LinearWeight& w);
// linear() of the rows x8 [M, K] e4m3 with one scale a row x_scale [M] f32 (the activation the
// W8A8 GEMM would have quantised itself): Backend::matmul_fp8_quantized. `w` must take it.
Status linear_fp8_input(Backend& be, const Tensor& x8, const Tensor& x_scale, const LinearWeight& w,
                        const Tensor& bias, Tensor& y);

// A feed-forward's gate and up linears and SwiGLU: y[M, F] = silu(x · w1ᵀ) * (x · w3ᵀ) for a
// w1|w3 weight [2F, K]. A weight in blocks (swiglu_block > 0, no LoRA side) runs as one fused op
// (Backend::matmul_swiglu); any other goes through linear() into `wide` ([M, 2F] act dtype, taken
// from the backend when undefined) and Backend::swiglu, in the weight's row order.
Status linear_swiglu(Backend& be, const Tensor& x, const LinearWeight& w13, const Tensor& scratch,
                     const Tensor& wide, Tensor& y);

// A block's q|k|v linear and attention prologue (Backend::qkv_split_norm_rope): one fused op
// (Backend::matmul_qkv_norm_rope) for a weight in the act dtype with no LoRA side; otherwise
// linear() into `qkv` ([rows, N] act dtype) and the prologue.
Status linear_qkv_norm_rope(Backend& be, const Tensor& x, const LinearWeight& wqkv,
                            const Tensor& norm_q, const Tensor& norm_k, float eps,
                            const Tensor& freqs, const Tensor& scratch, Tensor& qkv, Tensor& q,
                            Tensor& k, Tensor& v);

// Reorders the rows of a w1|w3 weight [2F, K] in the act dtype, or of a W8A8 one (fp8_compute)
// with its row scales, in place (through a temporary copy): into blocks of `block` rows (gate
// block t at rows [2tB, 2tB + B), its up block next), or with `block` 0 back to gate rows first.
// The addresses of w.w (and w.scale) stay; a recorded forward that used the old order must be
// recorded again. A blocked act-dtype weight runs as Backend::matmul_swiglu, a blocked W8A8 one
// as Backend::matmul_fp8_swiglu.
Status set_swiglu_block(Backend& be, LinearWeight& w, int64_t block);

// y[M, N] += (x[M, K] · side.aᵀ) · side.bᵀ through two act-dtype buffers ([M, R] and [M, N]) taken
// from the backend's allocator (a recorded forward keeps them in its private pool).
Status apply_lora_side(Backend& be, const Tensor& x, const LoraSide& side, Tensor& y);

// Replaces a weight loaded in the act dtype by its FP8 rows (Backend::quantize_fp8_rows); the
// wide copy is released.
Status to_fp8_rows(Backend& be, LinearWeight& w, const std::string& what);

// Makes `w` an FP8 e4m3 row weight with fp8_compute set (--precision fp8): a compute-dtype weight
// is quantised per row; a weight kept as its file stores it (GGUF blocks, e5m2) is widened first
// and then quantised; an e4m3 row weight is used as it is.
Status to_fp8_compute(Backend& be, LinearWeight& w, const std::string& what);

// Moves device tensors into host memory, in place: each defined tensor is downloaded and replaced
// by its host copy, page-locked (Backend::alloc_pinned) or, with `pinned` false, pageable. The
// bytes are exactly those on the device.
Status move_to_host(Backend& be, const std::vector<Tensor*>& tensors, bool pinned = true);

}  // namespace zimage
