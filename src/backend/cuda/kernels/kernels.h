// Launchers for the CUDA backend's own kernels. They know nothing of Tensor or Status: raw device
// pointers, sizes, a stream; each returns the launch's cudaError_t. The element type is chosen
// once here, at the boundary, by a KType; inside, kernels are templates on the C++ type and do
// their arithmetic in fp32 (fp64 for the few reductions that need it).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/kernels/row_tuning.h"

namespace zimage::cuda {

enum class KType : uint8_t { kF32, kBF16, kF16 };

// ---- elementwise (elementwise.cu) ----
enum class UnaryOp : uint8_t { kSilu, kTanh };
cudaError_t launch_fill(KType t, void* dst, int64_t n, float value, cudaStream_t s);
cudaError_t launch_convert(KType from, const void* src, KType to, void* dst, int64_t n,
                           cudaStream_t s);
cudaError_t launch_unary(UnaryOp op, KType t, const void* x, void* y, int64_t n, cudaStream_t s);
cudaError_t launch_clamp(KType t, const void* x, void* y, int64_t n, float lo, float hi,
                         cudaStream_t s);
// x[M, 2F] = [gate | up] -> y[M, F] = silu(gate) * up.
cudaError_t launch_swiglu(KType t, const void* x, void* y, int64_t m, int64_t f, cudaStream_t s);
// launch_swiglu's rows quantised per row as launch_quantize_fp8_rows would quantise y: y8 [m, f]
// e4m3, y_scale [m]. cudaErrorNotSupported for rows it does not take (f not a multiple of the
// 16-byte pack or above 16384 bf16 values, misaligned operands).
cudaError_t launch_swiglu_fp8(KType t, const void* x, void* y8, float* y_scale, int64_t m,
                              int64_t f, cudaStream_t s);
cudaError_t launch_axpby(KType t, float a, const void* x, float b, const void* y, void* out,
                         int64_t n, cudaStream_t s);
// out[i] = x[i] + y[i % ny]; ny divides n.
cudaError_t launch_add(KType t, const void* x, const void* y, void* out, int64_t n, int64_t ny,
                       cudaStream_t s);
// dst[i] = values.v[i] for i < values.n. The values travel as kernel arguments, so the write can
// be recorded into a CUDA graph (a host-to-device copy of pageable memory cannot).
struct I32Values {
  static constexpr int kMax = 64;
  int n = 0;
  int32_t v[kMax] = {};
};
cudaError_t launch_write_i32(int32_t* dst, const I32Values& values, cudaStream_t s);
// x = x + dt·(−pred), pred = pos + g·(pos − neg) (neg may be null: pred = pos), all f32, with
// the host's roundings (no FMA).
cudaError_t launch_guided_euler(const float* pos, const float* neg, float g, float dt, float* x,
                                int64_t n, cudaStream_t s);
// Live-preview colours (Backend::latent_to_rgb): x[n, channels, hw] f32 -> rgb[n, hw, 3] bytes,
// v_k = bias[k] + Σ_c w[c*3 + k]·x_c in channel order with the host's roundings (no FMA).
struct LatentRgbParams {
  static constexpr int kMaxChannels = 16;
  int channels = 0;
  float w[kMaxChannels * 3] = {};
  float bias[3] = {};
};
cudaError_t launch_latent_to_rgb(const float* x, int64_t n, int64_t hw, const LatentRgbParams& p,
                                 uint8_t* rgb, cudaStream_t s);
// Backend::image_to_rgb8: the VAE's raw output x (n elements of t) -> 8-bit colours, with the
// CPU oracle's roundings (0.5·x and + 0.5 each rounded to t, clamp, nearbyint(255·v); NaN and
// ±Inf give 0).
cudaError_t launch_image_to_rgb8(KType t, const void* x, int64_t n, uint8_t* rgb, cudaStream_t s);
// *out = number of NaN/Inf among the n elements of x (a device counter).
cudaError_t launch_count_nonfinite(KType t, const void* x, int64_t n, unsigned long long* out,
                                   cudaStream_t s);
// out[r] = sum over the row of x², for x[rows, cols]; out is a device array of `rows` doubles.
cudaError_t launch_sum_squares(KType t, const void* x, int64_t rows, int64_t cols, double* out,
                               cudaStream_t s);

// ---- FP8 (fp8.cu) ----
// q[n] = e4m3(x / s) saturated, s = max|x| / 448 (1 for an all-zero x) written to *scale; the max
// goes through amax_scratch (4 bytes of device memory). No host round trip.
cudaError_t launch_quantize_fp8(KType t, const void* x, int64_t n, void* amax_scratch, float* scale,
                                void* q, cudaStream_t s);
// The v heads of a packed projection qkv[rows, (hq + 2 hkv) * dh] as e4m3 at the same element
// offsets of out8, one scale per head: v_descale[h] = max over the rows of |v| in head h / 448
// (1 for an all-zero head), through amax_scratch (hkv unsigned ints of device memory). dh 128,
// 16-byte aligned qkv and out8, hkv * 128 / (16 / element size) at most 2048 (128 bf16 heads).
cudaError_t launch_quantize_packed_v_fp8(KType t, const void* qkv, void* out8, void* amax_scratch,
                                         float* v_descale, int64_t rows, int hq, int hkv, int dh,
                                         cudaStream_t s);
// Per-row weights: w[rows, cols] -> q (e4m3) and scale[rows] (s = max|row| / 448, 1 for a zero
// row), one block per row; and back: out[rows, cols] (type t) = float(q) * scale[row].
cudaError_t launch_quantize_fp8_rows(KType t, const void* w, int64_t rows, int64_t cols, void* q,
                                     float* scale, cudaStream_t s);
// launch_quantize_fp8_rows for rows x[rows, cols] whose max |value| the op that wrote them took:
// row_amax [rows] holds it as float bits (as atomicMax leaves it). The same codes and scales as
// launch_quantize_fp8_rows of x, in one pass. cols a multiple of 16 bytes' elements, x 16-byte
// aligned (cudaErrorInvalidValue otherwise).
cudaError_t launch_quantize_rows_amax(KType t, const void* x, const unsigned int* row_amax,
                                      int64_t rows, int64_t cols, void* q, float* scale,
                                      cudaStream_t s);
cudaError_t launch_dequantize_fp8_rows(KType t, const void* q, const float* scale, int64_t rows,
                                       int64_t cols, void* out, cudaStream_t s, bool e5m2 = false);
// y[m, n] = y[m, n] · sx[m] · sw[n] (+ bias[n] when not null), in place, computed in f32 and
// rounded once: the outer-product scales of a W8A8 GEMM run with unit scales.
cudaError_t launch_scale_rows_cols(KType t, void* y, const float* sx, const float* sw,
                                   const void* bias, int64_t m, int64_t n, cudaStream_t s);

// ---- tuning of the memory-bound row kernels (norm.cu; the fields: row_tuning.h) ----
void set_row_kernel_tuning(const RowKernelTuning& t);
RowKernelTuning row_kernel_tuning();  // as set (zeros for the defaults)
RowKernelTuning row_kernel_defaults();
// Whether the packed attention prologue runs as a block per token row that stages the row's q
// and k heads through shared memory with cp.async (where prologue_items is 0; the same bytes as
// the warp-item kernel). Process-wide like the tuning above; on by default (24-35 % faster per op,
// session 26; ZIMAGE_STAGED_ROWS=0 turns it off).
void set_staged_row_kernels(bool on);
bool staged_row_kernels();
// Whether the gated residual + next norm (bf16 rows of a block each) and the FP8 SwiGLU of bf16
// rows compute on bf16x2 pairs (bf16x2.cuh): the same bits as their fp32 forms with fewer
// instructions. Process-wide; on by default (ZIMAGE_PACKED_ROWS=0 turns it off).
void set_packed_row_kernels(bool on);
bool packed_row_kernels();

// ---- fused prologues (prologue.cu) ----
// qkv[rows, (hq + 2 hkv) * dh] -> q[rows, hq, dh], k/v[rows, hkv, dh]; q, k RMS-normed with wq/wk
// (both null = no norm) and RoPE'd with freqs[rows, dh/2, 2] (null = none). dh even, <= 256.
cudaError_t launch_qkv_norm_rope(KType t, const void* qkv, const void* wq, const void* wk,
                                 const float* freqs, void* q, void* k, void* v, int64_t rows,
                                 int64_t seq_if_shared, int hq, int hkv, int dh, float eps,
                                 cudaStream_t s);
// The same norm and RoPE in place on qkv[rows, (hq + 2 hkv) * dh] for its q and k heads; the v
// heads are not touched. dh 128 and 16-byte aligned operands only (qk_norm_rope_packed_fits; the
// weights and freqs may be null); cudaErrorInvalidValue else.
bool qk_norm_rope_packed_fits(const void* qkv, const void* wq, const void* wk, const float* freqs,
                              int dh);
cudaError_t launch_qk_norm_rope_packed(KType t, void* qkv, const void* wq, const void* wk,
                                       const float* freqs, int64_t rows, int64_t seq_if_shared,
                                       int hq, int hkv, int dh, float eps, cudaStream_t s);
// The FP8 attention's operand (CudaBackend::attention_packed_fp8): the same norm and RoPE of the
// q and k heads of qkv (read, not written), each divided by a scale bounded from its norm weight
// (prologue.cu says how) and written as e4m3 at the same element offsets of out8[rows, (hq + 2
// hkv) * dh]; descale[0] and descale[1] get the q and k scales. wq and wk must be given; dh 128
// and 16-byte aligned operands, as qk_norm_rope_packed_fits.
cudaError_t launch_qk_norm_rope_packed_fp8(KType t, const void* qkv, const void* wq, const void* wk,
                                           const float* freqs, void* out8, float* descale,
                                           int64_t rows, int64_t seq_if_shared, int hq, int hkv,
                                           int dh, float eps, cudaStream_t s);
// mod = c[b, k] · w[4d, k]ᵀ + bias[4d] (bias may be null; fp32 sums, rounded to the type), then
// launch_dit_modulation's outputs from it, without mod in memory. For b <= 4, k a multiple of
// the 16-byte pack, c and w 16-byte aligned (adaln_modulation_fits); cudaErrorInvalidValue else.
bool adaln_modulation_fits(int64_t b, int64_t k, const void* c, const void* w, const void* bias,
                           size_t elem);
cudaError_t launch_adaln_modulation(KType t, const void* c, const void* w, const void* bias,
                                    void* scale_a, void* gate_a, void* scale_f, void* gate_f,
                                    int64_t b, int64_t d, int64_t k, cudaStream_t s);
// launch_adaln_modulation for `layers` layers at once (the same c; layer l's w and bias from p,
// each as adaln_modulation_fits requires), into out [layers, 4, b, d]: layer l's scale_a, gate_a,
// scale_f, gate_f in that order. Up to kAdaLayers layers a launch.
constexpr int kAdaLayers = 64;
struct AdaLayerWeights {
  const void* w[kAdaLayers];
  const void* bias[kAdaLayers];  // null: no bias
};
cudaError_t launch_adaln_modulation_layers(KType t, const AdaLayerWeights& p, int layers,
                                           const void* c, void* out, int64_t b, int64_t d,
                                           int64_t k, cudaStream_t s);
// mod[b, 4d] -> 1 + mod[:, 0:d], tanh(mod[:, d:2d]), 1 + mod[:, 2d:3d], tanh(mod[:, 3d:4d]).
cudaError_t launch_dit_modulation(KType t, const void* mod, void* scale_a, void* gate_a,
                                  void* scale_f, void* gate_f, int64_t b, int64_t d,
                                  cudaStream_t s);

// ---- normalisation (norm.cu) ----
// Rows r of x[R, D]; `scale`/`gate` rows are indexed by r / rows_per_group. Null = absent.
cudaError_t launch_rms_norm(KType t, const void* x, const void* w, const void* scale, void* y,
                            int64_t rows, int64_t d, int64_t rows_per_group, float eps,
                            cudaStream_t s);
cudaError_t launch_layer_norm(KType t, const void* x, const void* w, const void* b,
                              const void* scale, void* y, int64_t rows, int64_t d,
                              int64_t rows_per_group, float eps, cudaStream_t s);
// x += gate[group] * rms_norm(y) * w.
cudaError_t launch_residual_rms_norm_gate(KType t, void* x, const void* y, const void* w,
                                          const void* gate, int64_t rows, int64_t d,
                                          int64_t rows_per_group, float eps, cudaStream_t s);
// launch_residual_rms_norm_gate, then out = rms_norm(x) * w_next * scale[group] from the x just
// stored, in one pass when the row fits the register-cached form (the same roundings as the two
// launches); cudaErrorNotSupported when it does not (the caller launches the two).
cudaError_t launch_residual_norm_then_norm(KType t, void* x, const void* y, const void* w,
                                           const void* gate, const void* w_next, const void* scale,
                                           void* out, int64_t rows, int64_t d,
                                           int64_t rows_per_group, float eps, cudaStream_t s);
// The same with the normed rows quantised per row (launch_quantize_fp8_rows' bytes of the rows
// `out` would hold) into out8 [rows, d] e4m3 and out_scale [rows]; cudaErrorNotSupported where
// launch_residual_norm_then_norm is.
cudaError_t launch_residual_norm_then_norm_fp8(KType t, void* x, const void* y, const void* w,
                                               const void* gate, const void* w_next,
                                               const void* scale, void* out8, float* out_scale,
                                               int64_t rows, int64_t d, int64_t rows_per_group,
                                               float eps, cudaStream_t s);
// NHWC group norm (+ SiLU). `workspace` must hold group_norm_workspace_bytes(...) bytes.
size_t group_norm_workspace_bytes(int64_t batch, int64_t hw, int64_t c, int groups);
cudaError_t launch_group_norm(KType t, const void* x, const void* gamma, const void* beta, void* y,
                              int64_t batch, int64_t hw, int64_t c, int groups, float eps,
                              bool silu, void* workspace, cudaStream_t s);

// ---- RoPE (rope.cu), in place on x[B, S, H, Dh] ----
cudaError_t launch_rope_half(KType t, void* x, const float* cos, const float* sin, int64_t batch,
                             int64_t seq, int64_t heads, int64_t head_dim, cudaStream_t s);
// freqs [B or 1, S, Dh/2, 2]; freqs_shared = true for a leading 1 (shared over the batch).
cudaError_t launch_rope_interleaved(KType t, void* x, const float* freqs, bool freqs_shared,
                                    int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                                    cudaStream_t s);

// ---- layout (layout.cu) ----
cudaError_t launch_patchify(KType out_t, const float* latents, void* tokens, int64_t batch,
                            int64_t c, int64_t h, int64_t w, int p, cudaStream_t s);
cudaError_t launch_unpatchify(KType in_t, const void* tokens, int64_t tokens_per_item, float* out,
                              int64_t batch, int64_t c, int64_t h, int64_t w, int p, float alpha,
                              cudaStream_t s);
cudaError_t launch_embedding(KType t, const void* table, const int32_t* ids, void* out, int64_t n,
                             int64_t d, cudaStream_t s);
cudaError_t launch_upsample_nearest2x(KType t, const void* x, void* y, int64_t batch, int64_t h,
                                      int64_t w, int64_t c, cudaStream_t s);
// y[B, H+top+bottom, W+left+right, C] = x zero-padded.
cudaError_t launch_pad_nhwc(KType t, const void* x, void* y, int64_t batch, int64_t h, int64_t w,
                            int64_t c, int top, int bottom, int left, int right, cudaStream_t s);

// ---- direct convolution (layout.cu): the fallback where cuDNN has no algorithm ----
struct ConvShape {
  int64_t batch, h, w, cin, cout, kh, kw, ho, wo;
  int stride, pad_top, pad_left;
};
cudaError_t launch_conv2d_direct(KType t, const void* x, const void* w, const void* bias, void* y,
                                 const ConvShape& shape, cudaStream_t s);

// ---- attention (attention_flash.cu, attention_softmax.cu) ----
constexpr int kMaxAttentionBatch = 256;
// Two builds of the flash kernel: Q fragments in registers (1 block/SM) or re-read from shared
// memory (2 blocks/SM). kAuto takes the one measured faster on the H200 for the head_dim
// (docs/CUDA_NOTES.md): registers for 128, shared memory for 64.
enum class FlashVariant : uint8_t { kAuto, kQInRegisters, kQInShared };
struct FlashArgs {
  const void* q;  // bf16 [B, Sq, Hq, D]
  const void* k;  // bf16 [B, Sk, Hkv, D]
  const void* v;  // bf16 [B, Sk, Hkv, D]
  void* out;      // bf16 [B, Sq, Hq, D]
  int batch, seq_q, seq_k, heads_q, heads_kv, head_dim;
  float scale;
  bool causal;
  bool has_key_len;
  FlashVariant variant;
  int32_t key_len[kMaxAttentionBatch];
};
// True when the flash kernel handles this head_dim and the pointers are 16-byte aligned.
bool flash_attention_supported(int head_dim, const FlashArgs& a);
cudaError_t launch_flash_attention(const FlashArgs& a, cudaStream_t s);

// Softmax over rows of scores[heads, rows, seq_k] (f32), row i of each head being query q0 + i,
// scaled by `scale`, keys >= key_len (< 0: none) and, if causal, keys > query masked; writes
// probabilities in `p_t` (may alias scores when p_t is f32). Fully masked rows become 0.
cudaError_t launch_masked_softmax(KType p_t, const float* scores, void* probs, int64_t heads,
                                  int64_t rows, int64_t seq_k, int64_t q0, float scale, bool causal,
                                  int64_t key_len, cudaStream_t s);
// Test and measurement hook: false makes launch_masked_softmax read every row three times from
// memory (the kernel before rows were kept on chip). Process-wide; default true.
void set_masked_softmax_on_chip(bool on);

// ---- GGUF dequantisation (gguf_dequant.cu; call it through gguf_dequant.h) ----
// Packed ggml blocks of `ggml_type` (io/gguf/gguf_quants.h GgmlType id), rows x row_bytes bytes,
// into out[rows, cols] (kF32 or kBF16). cols must be a multiple of 8 and of the block size.
cudaError_t launch_gguf_dequant(uint32_t ggml_type, const void* blocks, int64_t rows, int64_t cols,
                                int64_t row_bytes, int block_size, int type_size, KType out_type,
                                void* out, cudaStream_t s);

}  // namespace zimage::cuda
