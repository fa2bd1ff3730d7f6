// One argument contract per op, shared by every backend: the shapes, ranks, dtypes, aliasing and
// optional tensors an op of backend/backend.h accepts, checked in one place and answered with the
// same message whichever backend runs it ("matmul: x f32[3, 5] and w f32[4, 6]: K differs (5 vs
// 6)"). A backend's op calls its contract first, then does only what is its own: the residue
// (a dtype only it computes in, a size its kernels cannot take, CUDA alignment) and the work.
//
// Why a shared checker each backend calls first, not a non-virtual Backend::op() that checks and
// then calls a protected virtual (NVI): the check-only backend (backend/check) answers every
// compute op kUnsupported without reading its arguments, and its tensors have no bytes behind
// them, so a checking front would change what it answers; the checks need each backend's own
// rules (where a tensor must live, which dtypes it computes in, which error code a dtype it lacks
// gets), which a front in Backend would have to fetch through more virtuals; and renaming every
// op virtual would touch every backend and every override for no gain in what is checked. Each
// rule is still written once: a backend's op body starts with its contract call and holds only
// its residue. The backend's rules plug in through OpEnv, so a contract checks each tensor's
// placement in the order it reads the arguments.
#pragma once

#include <cstdint>
#include <string>

#include "backend/backend.h"
#include "core/status.h"
#include "core/tensor.h"

namespace zimage::contract {

// What a backend brings to the shared checks.
struct OpEnv {
  Device device;  // named in dtype messages: "dtype must be f32 on the cpu backend"
  DType act;      // the compute dtype activations and weights must have
  // A defined tensor is usable by this backend: on its device, bytes inside its storage.
  Status (*placed)(const char* op, const char* name, const Tensor& t);
  // The backend computes on t's dtype, for compute ops that take any float dtype (the CPU: f32
  // only, kInvalidArgument; CUDA: f32, bf16, f16, else kUnsupported).
  Status (*computes)(const char* op, const char* name, const Tensor& t);
  // The same for the elementwise ops that read any float dtype on every backend (axpby,
  // sum_squares, count_nonfinite; the CPU: f32, bf16, f16, else kInvalidArgument).
  Status (*any_float)(const char* op, const char* name, const Tensor& t);
};

// ---- building blocks (also used by the backends for the ops without a contract here) ----

// "f32[3, 5]", or "undefined".
std::string desc(const Tensor& t);
// t is defined, a host (CPU) tensor and its bytes lie inside its storage.
Status check_host(const char* op, const char* name, const Tensor& t);
// Rank check: "rope_half: x f32[2, 3] must have rank 4".
Status check_rank(const char* op, const char* name, const Tensor& t, int rank);
// Same shape: "silu: x f32[2, 3] and y f32[3, 2]: shapes differ".
Status check_same_shape(const char* op, const char* a_name, const Tensor& a, const char* b_name,
                        const Tensor& b);
// Whether the byte ranges of a and b intersect / are exactly the same range.
bool overlaps(const Tensor& a, const Tensor& b);
bool same_data(const Tensor& a, const Tensor& b);
// out may be exactly `in` (when in_place_ok) or disjoint from it; partial overlap is an error.
Status check_alias(const char* op, const char* in_name, const Tensor& in, const char* out_name,
                   const Tensor& out, bool in_place_ok);

// ---- normalisation ----

// Rows of a row norm: x read as [rows, d] over its last dimension; `group` rows share one row of
// the scale / gate (0 when there is none).
struct RowNorm {
  int64_t rows = 0;
  int64_t d = 0;
  int64_t group = 0;
};
Result<RowNorm> rms_norm(const OpEnv& env, const Tensor& x, const Tensor& w, const Tensor& scale,
                         const Tensor& y);
Result<RowNorm> layer_norm(const OpEnv& env, const Tensor& x, const Tensor& w, const Tensor& b,
                           const Tensor& scale, const Tensor& y);
Result<RowNorm> residual_rms_norm_gate(const OpEnv& env, const Tensor& x, const Tensor& y,
                                       const Tensor& w, const Tensor& gate);
Status group_norm(const OpEnv& env, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                  int groups, const Tensor& y);

// ---- position encodings ----
Status rope_half(const OpEnv& env, const Tensor& x, const Tensor& cos, const Tensor& sin);
Status rope_interleaved(const OpEnv& env, const Tensor& x, const Tensor& freqs);

// ---- elementwise ----
// silu, tanh (and clamp after its bounds): y of x's shape and dtype, in place allowed.
Status unary(const OpEnv& env, const char* op, const Tensor& x, const Tensor& y);
Status clamp(const OpEnv& env, const Tensor& x, float lo, float hi, const Tensor& y);
// x[.., 2F] = [gate | up] -> y[.., F] of x's dtype; y may start at x's address (in place).
Status swiglu(const OpEnv& env, const Tensor& x, const Tensor& y);
Status matmul_swiglu(const OpEnv& env, const Tensor& x, const Tensor& w13, int64_t block,
                     const Tensor& y);
// x, y, out of one float dtype and element count; out is x or y, or disjoint from both.
Status axpby(const OpEnv& env, const Tensor& x, const Tensor& y, const Tensor& out);
// out of x's shape; y's element count divides x's; out is x, or disjoint from x and y.
Status add(const OpEnv& env, const Tensor& x, const Tensor& y, const Tensor& out);
// pos, neg (optional) and latents f32 of one element count.
Status guided_euler_step(const OpEnv& env, const Tensor& pos, const Tensor& neg,
                         const Tensor& latents);
// latents f32 [n, channels, h, w] with 1 <= channels <= LatentRgbMap::kMaxChannels; rgb kU8
// [n, h, w, 3].
Status latent_to_rgb(const OpEnv& env, const Tensor& latents, int channels, const Tensor& rgb);
Status sum_squares(const OpEnv& env, const Tensor& x);
Status count_nonfinite(const OpEnv& env, const Tensor& x);
// x any float dtype (env.any_float); rgb kU8 of x's shape, not overlapping x.
Status image_to_rgb8(const OpEnv& env, const Tensor& x, const Tensor& rgb);

// ---- attention ----
// q[B, Sq, Hq, D], k and v[B, Sk, Hkv, D] of q's dtype, Hq a multiple of Hkv, out of q's shape
// and disjoint from q, k and v; key_len empty or one entry in [0, Sk] per batch item.
Status attention(const OpEnv& env, const Tensor& q, const Tensor& k, const Tensor& v,
                 const AttentionParams& p, const Tensor& out);

// ---- convolution / resampling (NHWC) ----
// x[B, H, W, Cin], w[Cout, kh, kw, Cin], bias [Cout], y[B, Ho, Wo, Cout], compute dtype; no tensor
// aliases y.
Status conv2d(const OpEnv& env, const Tensor& x, const Tensor& w, const Tensor& bias,
              const Conv2dParams& p, const Tensor& y);
// conv2d's contract, and residual: the act dtype, y's shape, disjoint from y.
Status conv2d_add(const OpEnv& env, const Tensor& x, const Tensor& w, const Tensor& bias,
                  const Tensor& residual, const Conv2dParams& p, const Tensor& y);
Status upsample_nearest2x(const OpEnv& env, const Tensor& x, const Tensor& y);

// ---- layout ----
// table[V, D], ids a host i32 [N] with every id in [0, V), out [N, D] (any leading shape of N
// rows) of table's dtype, disjoint from table.
Status embedding(const OpEnv& env, const Tensor& table, const Tensor& ids, const Tensor& out);
Status patchify(const OpEnv& env, const Tensor& latents, int p, const Tensor& tokens);
Status unpatchify(const OpEnv& env, const Tensor& tokens, int p, const Tensor& out);

// ---- linear algebra ----
// y[.., N] = x[.., K] · w[N, K]ᵀ (+ bias[N]): y holds the rows of x (its last dim N, as many
// elements as x has rows times N), no tensor aliases y.
Status matmul(const OpEnv& env, const Tensor& x, const Tensor& w, const Tensor& bias,
              const Tensor& y);
// x8 = e4m3(x / s): x of a dtype the backend computes in, x8 f8e4m3 of x's shape, scale one f32.
Status quantize_fp8(const OpEnv& env, const Tensor& x, const Tensor& x8, const Tensor& scale);
// The FP8 GEMMs: x[.., K] and y[.., N] in the compute dtype, y holding x.numel() / K rows and
// disjoint from x; w8 f8e4m3 [N, K] with one f32 scale (matmul_fp8) or one per row (_rows, with
// an optional bias [N] in the compute dtype, disjoint from y).
Status matmul_fp8(const OpEnv& env, const Tensor& x, const Tensor& w8, const Tensor& w_scale,
                  const Tensor& y);
Status matmul_fp8_rows(const OpEnv& env, const Tensor& x, const Tensor& w8, const Tensor& w_scale,
                       const Tensor& bias, const Tensor& y);
// An op's rows quantised to FP8 (Backend::residual_norm_gate_then_norm_fp8, swiglu_fp8): q
// f8e4m3 [rows, cols] (any leading shape), scale f32 of `rows` elements, the two disjoint.
Status fp8_rows_out(const OpEnv& env, const char* op, int64_t rows, int64_t cols, const Tensor& q,
                    const Tensor& scale);
// matmul_fp8_rows' checks with x8 f8e4m3 [.., K] in place of x and x_scale f32, one per row.
Status matmul_fp8_quantized(const OpEnv& env, const Tensor& x8, const Tensor& x_scale,
                            const Tensor& w8, const Tensor& w_scale, const Tensor& bias,
                            const Tensor& y);
// Backend::matmul_fp8_swiglu: x8 f8e4m3 [.., K] with x_scale f32 (one a row), w13_8 f8e4m3
// [2F, K] with w13_scale f32 [2F], `block` 0 or a divisor of F, y (compute dtype) holding x8's
// rows of F and disjoint from the operands; y8 and y_scale both or neither, as fp8_rows_out for
// those rows, disjoint from y (they may share x8's and x_scale's memory).
Status matmul_fp8_swiglu(const OpEnv& env, const Tensor& x8, const Tensor& x_scale,
                         const Tensor& w13_8, const Tensor& w13_scale, int64_t block,
                         const Tensor& y, const Tensor& y8, const Tensor& y_scale);
// w8 f8e4m3 or f8e5m2 [N, K], scale f32 [N], y (compute dtype) of N * K elements.
Status dequantize_fp8_rows(const OpEnv& env, const Tensor& w8, const Tensor& scale,
                           const Tensor& y);

}  // namespace zimage::contract
