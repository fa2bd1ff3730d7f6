// The op interface every model is written against. The CPU backend (backend/cpu) is the
// oracle: plain code, fp32 accumulation. The CUDA backend (backend/cuda) implements the same
// ops with fused kernels, cuBLASLt and cuDNN, and is tested op by op against the CPU one.
//
// Rules for every op:
//  * Inputs and outputs are contiguous tensors on this backend's device (see core/tensor.h for
//    layouts). Outputs are allocated by the caller (`alloc`) and fully overwritten.
//  * `out` may alias an input only where the op says so ("in place allowed").
//  * Activations are in the backend's compute dtype (`act_dtype()`): f32 on the CPU, bf16 or f32
//    on CUDA. Ops marked "f32" take float32 tensors whatever the compute dtype (latents,
//    scheduler).
//  * Every op validates shapes and dtypes and returns a Status; none aborts.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace zimage {

struct AttentionParams {
  float scale = 1.0f;  // usually 1/sqrt(head_dim)
  bool causal = false;
  // Per batch item, the number of valid keys (key-padding mask: keys >= key_len[b] are masked).
  // Empty = all keys valid. Causal masking, if on, is applied on top (query i sees keys <= i).
  std::vector<int32_t> key_len;
};

// A fixed linear map from latent channels to RGB (live previews, latent_to_rgb): channel c
// contributes weight[c][k] to colour k, then bias[k] is added.
struct LatentRgbMap {
  static constexpr int kMaxChannels = 16;
  int channels = 0;
  float weight[kMaxChannels][3] = {};
  float bias[3] = {};
};

struct Conv2dParams {
  int stride = 1;
  int pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;  // zero padding
};

// Device work recorded once and replayed (a CUDA graph): replay() re-runs the recorded ops on the
// same buffers. Destroying it releases what the recording holds.
class RecordedWork {
 public:
  virtual ~RecordedWork() = default;
  virtual Status replay() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual Device device() const = 0;
  virtual std::string name() const = 0;  // "cpu (OpenBLAS, 16 threads)", "cuda:0 NVIDIA H200"
  // The device's PCI bus id ("0000:18:00.0"), for tools that read it elsewhere (NVML); "" for
  // the CPU.
  virtual std::string pci_bus_id() const { return {}; }
  virtual DType act_dtype() const = 0;  // compute dtype of activations and weights

  // ---- memory ----
  virtual Result<Tensor> alloc(DType dtype, const Shape& shape) = 0;  // contents unspecified
  // Copies a host tensor of any float dtype into a new tensor of `dtype` on this device,
  // converting element by element (e.g. bf16 file weights -> f32 on the CPU).
  virtual Result<Tensor> upload(const Tensor& host, DType dtype) = 0;
  // Copies `src` (this device) into `host` (CPU, same shape), converting to host's dtype.
  virtual Status download(const Tensor& src, Tensor& host) = 0;
  // dst = src converted to dst's dtype (same numel). In place not allowed unless same dtype.
  virtual Status convert(const Tensor& src, Tensor& dst) = 0;
  // Strided copy for concatenation / splitting: copies a [rows, cols] block of elements.
  // src element (r, c) is at src_base + r*src_row_stride + c, same for dst; strides in elements.
  // Same dtype on both sides.
  virtual Status copy_2d(const Tensor& src, int64_t src_offset, int64_t src_row_stride, Tensor& dst,
                         int64_t dst_offset, int64_t dst_row_stride, int64_t rows,
                         int64_t cols) = 0;
  virtual Status fill(Tensor& t, float value) = 0;
  virtual Status synchronize() = 0;
  // Records the device work `work` queues (only ops of this interface on tensors that stay
  // alive) for replay. `work` runs twice: once for real (the warm-up: plans, heuristics and
  // allocations that cannot be recorded happen here, and its results are those of an eager run),
  // then once while it is recorded, which runs nothing on the device. So the call that records
  // needs no replay: its results are already there. The default answers kUnsupported: the caller
  // then runs eagerly.
  virtual Result<std::unique_ptr<RecordedWork>> record(const std::function<Status()>& work);
  // Waits until every upload so far is on the device and drops memory kept only to speed up bulk
  // uploads (CUDA: pinned staging buffers). Loaders call it once at the end, so a measured load
  // time includes every copy.
  virtual Status finish_uploads() { return synchronize(); }
  // Readies what bulk uploads use before the first weight arrives (CUDA: the page-locked staging
  // buffers and copy threads that finish_uploads frees), so that a caller can overlap it with
  // other start-up work. Optional: the first large upload does it otherwise. Never fails (a
  // backend that cannot stage uploads copies without staging).
  virtual void prepare_uploads() noexcept {}
  // What the first image will run, as far as a load knows it (the model's shapes at its planned
  // size): warm_up loads the kernels of these products ahead.
  struct WarmUpHints {
    // Row-major y[m, n] = x[m, k] · w[n, k]ᵀ in the activation dtype ({m, n, k}).
    std::vector<std::array<int64_t, 3>> linears;
    // Inputs {n, h, w} of the first image's convolutions (the VAE decode at the planned size):
    // their saved plans are preloaded before other sizes'.
    std::vector<std::array<int64_t, 3>> conv_inputs;
    // Device memory the warm-up may hold for a moment beside the weights being loaded (0: none):
    // the first image's convolutions then run once on scratch operands ahead of it.
    uint64_t scratch_bytes = 0;
  };
  // Starts what the first image would otherwise start on its critical path (CUDA: cuDNN's
  // libraries, the saved convolution plans and their kernels, cuBLAS's kernels for the VAE's
  // attention and, where asked, the hinted products'), for a caller to run on a thread of its own
  // while the weights load. It must return before the first op that it warms runs (the engine
  // joins it at the end of the load). Optional and never fails: what it does not warm starts at
  // its first use, as without it.
  virtual void warm_up(const WarmUpHints& hints) noexcept { (void)hints; }
  void warm_up() noexcept { warm_up(WarmUpHints{}); }
  // Device memory the backend's allocator holds (0 on the CPU). Safe from any thread.
  struct MemoryUse {
    uint64_t in_use = 0;       // live tensors
    uint64_t reserved = 0;     // obtained from the driver: in use + cached
    uint64_t peak_in_use = 0;  // high-water mark of in_use
  };
  virtual MemoryUse memory_use() const { return {}; }
  // Device bytes new tensors could still get: what the driver has free plus what the allocator
  // holds unused. nullopt where the backend has no such limit (the CPU).
  virtual std::optional<uint64_t> available_memory() const { return std::nullopt; }
  // Makes this backend's device the calling thread's current one (CUDA: cudaSetDevice). The
  // Engine calls it at the start of every call, so any thread may drive any backend.
  virtual Status bind_thread() { return Status::Ok(); }
  // A caller's stream (the drop-in transformer, include/zimage/transformer.h), on the device
  // side only, no host wait. wait_for_stream: the work queued on this backend from now on runs
  // after the work queued so far on `stream`. signal_stream: the work queued on `stream` from
  // now on runs after the work queued so far on this backend. CUDA: `stream` is a cudaStream_t
  // of this backend's device (nullptr: the legacy default stream), ordered by an event; another
  // device's stream is kInvalidArgument. The CPU backend runs each op to completion: Ok.
  virtual Status wait_for_stream(void* stream) {
    (void)stream;
    return Status::Ok();
  }
  virtual Status signal_stream(void* stream) {
    (void)stream;
    return Status::Ok();
  }

  // ---- weight streaming (the memory planner keeps some weights in host memory) ----
  // A host tensor in page-locked memory, which the device copies from at full link speed (CUDA:
  // cudaHostAlloc). The default (CPU) is an ordinary host tensor.
  virtual Result<Tensor> alloc_pinned(DType dtype, const Shape& shape);
  // A new host tensor [sum of numel] holding the elements of `parts` (host tensors of one dtype,
  // e.g. views of a weight file) one after another: page-locked when `pinned` and the backend
  // has such memory, else ordinary memory. CUDA copies on several threads (reading a file mapping
  // is page faults, which run in parallel). The default copies on the calling thread.
  virtual Result<Tensor> host_copy(const std::vector<Tensor>& parts, bool pinned);
  // Page-locks the host bytes [p, p + bytes) in place, read-only (CUDA: cudaHostRegister with
  // cudaHostRegisterReadOnly; p and bytes page-aligned), so copies from them go straight to the
  // DMA engine, for as long as the returned handle lives (its release waits for the device's work
  // before unlocking). For the page cache behind a file mapping, the weights streamed from the
  // files. A null handle: the backend has nothing to lock (the CPU). An error: not locked.
  virtual Result<std::shared_ptr<void>> lock_host_range(const void* p, size_t bytes) {
    (void)p;
    (void)bytes;
    return std::shared_ptr<void>();
  }
  // Whether loading should page-lock each weight file's mapping in place (lock_host_range) while
  // it uploads from it, so uploads go straight to the DMA engine instead of through staging
  // copies (CUDA: ZIMAGE_UPLOAD=locked; off by default until measured).
  virtual bool upload_from_locked_files() const { return false; }
  // host_copy's argument check: the elements of `parts`, or the error naming the bad part.
  static Result<int64_t> host_copy_elements(const std::vector<Tensor>& parts);
  // Queues copies of host tensors into device tensors of the same element count (pairs: host,
  // device) for weight slot `slot` (0..kStreamSlots-1): on CUDA on a separate copy stream, after
  // the compute that last used the slot (release_slot), so they overlap other compute. The CPU
  // backend copies at once. A host tensor may be page-locked (alloc_pinned) or ordinary memory,
  // a view of a memory-mapped weight file included: CUDA copies the latter through page-locked
  // staging of its own. When stream_in returns, the host bytes have been read. The dtypes must
  // be equal, or a pair can_stream() accepts (the CPU widens to f32 as it copies).
  static constexpr int kStreamSlots = 4;
  virtual Status stream_in(int slot, const std::vector<std::pair<Tensor, Tensor>>& copies);
  // Of `host_parts` (one unit's host tensors), the bytes stream_in would copy through staging of
  // its own rather than hand to the DMA engine directly (CUDA: those not page-locked).
  virtual uint64_t staged_stream_bytes(const std::vector<Tensor>& host_parts) const {
    (void)host_parts;
    return 0;
  }
  // A hint at load: stream_in for `slot` will stage up to `bytes` a call. CUDA page-locks that
  // staging now, on a thread of its own, instead of at the first stream_in (the first text
  // encoding or DiT step of a budgeted process paid ~0.1-0.3 s for it). Never fails: a staging
  // not prepared is allocated at first use, as before.
  virtual void prepare_stream_staging(int slot, uint64_t bytes) noexcept {
    (void)slot;
    (void)bytes;
  }
  // Whether stream_in takes host elements of `host` into a device tensor of `device`.
  virtual bool can_stream(DType host, DType device) const {
    return host == device || (device == DType::kF32 && dtype_is_float(host));
  }
  // Makes compute queued from now on wait until `slot`'s copies have landed (no host wait).
  virtual Status wait_slot(int slot) {
    (void)slot;
    return Status::Ok();
  }
  // Marks the compute queued so far as the last use of `slot`'s contents: the next stream_in of
  // the slot waits for it.
  virtual Status release_slot(int slot) {
    (void)slot;
    return Status::Ok();
  }
  // The whole device's memory as the driver reports it: {total, free} bytes (CUDA:
  // cudaMemGetInfo). kUnsupported on the CPU.
  virtual Result<std::pair<uint64_t, uint64_t>> device_memory() const {
    return Unsupported(name() + " has no device memory");
  }
  // Caps the bytes the backend's allocator may obtain from the driver (0 = no cap); beyond it
  // allocations fail with OutOfMemory. No effect on the CPU.
  virtual void set_memory_limit(size_t bytes) { (void)bytes; }
  // Host-to-device bytes copied so far by stream_in (for the planner's reports).
  virtual uint64_t streamed_bytes() const { return 0; }

  // ---- linear algebra ----
  // y[M, N] = x[M, K] · w[N, K]ᵀ (+ bias[N]). bias may be an undefined Tensor.
  virtual Status matmul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y) = 0;

  // FP8 (e4m3) with one scale per tensor: x8 = saturate(x / s), s = max|x| / 448 (1 when x is
  // all zero); x8 kF8E4M3 of x's shape, scale f32 [1] on this device.
  virtual Status quantize_fp8(const Tensor& x, Tensor& x8, Tensor& scale);
  // y[M, N] = (sx * x8) · (w_scale * w8)ᵀ where x8, sx = quantize_fp8(x): the activations are
  // quantised here, the weight w8 [N, K] (kF8E4M3) with its scale [1] beforehand. x, y in the
  // compute dtype. The default answers kUnsupported (backends without FP8).
  virtual Status matmul_fp8(const Tensor& x, const Tensor& w8, const Tensor& w_scale, Tensor& y);

  // FP8 weights with one scale per output channel (--weights fp8): for w[N, K] (any float
  // dtype), s[n] = max|w[n, :]| / 448 (1 for an all-zero or non-finite row), w8 = e4m3(clamp(w ·
  // (1 / s[n]), ±448)) rounded to nearest even. w8 kF8E4M3 [N, K], scale f32 [N].
  virtual Status quantize_fp8_rows(const Tensor& w, Tensor& w8, Tensor& scale);
  // y[N, K] (act dtype) = float(w8) · s[n], rounded once to y's dtype: the weight a GEMM uses.
  // w8 is kF8E4M3 or kF8E5M2 (an FP8 checkpoint's weights, kept as the file stores them).
  virtual Status dequantize_fp8_rows(const Tensor& w8, const Tensor& scale, Tensor& y);
  // GGUF blocks kept packed on the device: blocks kU8 [N, row bytes] holding N rows of ggml type
  // `ggml_type` (io/gguf/gguf_quants.h), y[N, K] (act dtype) = their dequantisation, each value the
  // CPU oracle's float32 (dequantize_rows) rounded once to y's dtype. The default answers
  // kUnsupported.
  virtual Status dequantize_packed(uint32_t ggml_type, const Tensor& blocks, Tensor& y);

  // W8A8 FP8 linear (--precision fp8): the activations are quantised per row (token) exactly as
  // quantize_fp8_rows quantises a weight, x8[m] = e4m3(x[m, :] / sx[m]) with sx[m] =
  // max|x[m, :]| / 448, then y[m, n] = sx[m] · sw[n] · Σ_k x8[m, k] · w8[n, k] (+ bias[n]), fp32
  // accumulation, y in the compute dtype. x [..., K] and y [..., N] in the compute dtype, w8
  // kF8E4M3 [N, K], w_scale f32 [N], bias undefined or [N]. The default answers kUnsupported.
  virtual Status matmul_fp8_rows(const Tensor& x, const Tensor& w8, const Tensor& w_scale,
                                 const Tensor& bias, Tensor& y);

  // ---- FP8 activations made by the op that produces them (the W8A8 linears' inputs) ----
  // Rows quantised as quantize_fp8_rows quantises them: x8 kF8E4M3 [M, K] and x_scale f32 [M].
  // Whether this backend runs the three ops below (else the model quantises inside
  // matmul_fp8_rows).
  virtual bool takes_fp8_inputs() const { return false; }
  // matmul_fp8_rows after its quantisation: y[m, n] = sx[m] · sw[n] · Σ_k x8[m, k] · w8[n, k]
  // (+ bias[n]), the same result as matmul_fp8_rows of the rows x8 came from. The default
  // answers kUnsupported.
  virtual Status matmul_fp8_quantized(const Tensor& x8, const Tensor& x_scale, const Tensor& w8,
                                      const Tensor& w_scale, const Tensor& bias, Tensor& y);
  // residual_norm_gate_then_norm with its output quantised per row into out8 [R, D] and
  // out_scale [R]: the bytes of residual_norm_gate_then_norm into `out` (act dtype [R, D]) then
  // quantize_fp8_rows(out), which is what the default runs; a backend may fuse them and leave
  // `out` unwritten.
  virtual Status residual_norm_gate_then_norm_fp8(Tensor& x, const Tensor& y, const Tensor& w,
                                                  float eps, const Tensor& gate,
                                                  const Tensor& w_next, const Tensor& scale_next,
                                                  Tensor& out, Tensor& out8, Tensor& out_scale);
  // swiglu with its output quantised per row into y8 [M, F] and y_scale [M]: the bytes of
  // swiglu(x, y) then quantize_fp8_rows(y), which is what the default runs (y: act dtype [M, F]);
  // a backend may fuse them and leave y unwritten.
  virtual Status swiglu_fp8(const Tensor& x, Tensor& y, Tensor& y8, Tensor& y_scale);
  // The W8A8 feed-forward's w1|w3 linear and its SwiGLU in one op, from the FP8 rows x8 [.., K]
  // and x_scale (one f32 a row): y [rows, F] (act dtype) = swiglu of matmul_fp8_quantized(x8,
  // x_scale, w13_8, w13_scale) for a w1|w3 weight w13_8 f8e4m3 [2F, K] with its row scales
  // w13_scale f32 [2F], both in row blocks of `block` (the layout matmul_swiglu describes;
  // fp8_swiglu_block() asks for it; 0: gate rows first). With y8 and y_scale defined (both or
  // neither), y is also quantised per row into them: the bytes of swiglu_fp8. They may be the
  // memory x8 and x_scale use (the w2 input after the w1|w3 input): they are written after the
  // GEMM has read those. What the default runs: matmul_fp8_quantized into an [rows, 2F] buffer,
  // swiglu over it (in blocks, as matmul_swiglu does), then the rows' quantisation.
  virtual Status matmul_fp8_swiglu(const Tensor& x8, const Tensor& x_scale, const Tensor& w13_8,
                                   const Tensor& w13_scale, int64_t block, Tensor& y, Tensor& y8,
                                   Tensor& y_scale);
  // The row block in which this backend runs matmul_fp8_swiglu fused, for W8A8 w1|w3 weights of
  // width K and 2F rows: a model reorders such a weight (and its scales) once at load. 0: none.
  virtual int64_t fp8_swiglu_block(int64_t f, int64_t k) const {
    (void)f, (void)k;
    return 0;
  }

 protected:
  // The FP8 row ops' defaults: quantize_fp8_rows over x's last dimension, any leading shape.
  Status quantize_rows_of(const Tensor& x, Tensor& q, Tensor& scale);

 public:
  // ---- normalisation ----
  // y[R, D] = x / sqrt(mean(x², over D) + eps) * w[D]; w undefined = no weight. In place allowed.
  // If `scale` is defined ([B, D], rows split evenly into B groups of R/B rows), the result is
  // further multiplied by scale[b] (the DiT's (1 + s) modulation, already including the 1).
  virtual Status rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& scale,
                          Tensor& y) = 0;
  // y[R, D] = (x - mean) / sqrt(var + eps) (* w + b if defined); `scale` as in rms_norm.
  virtual Status layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps,
                            const Tensor& scale, Tensor& y) = 0;
  // x[B, S, D] += gate[b] ⊙ (rms_norm(y, w, eps)); gate [B, D], undefined = 1. The DiT's
  // post-norm + tanh-gated residual (gate already tanh'ed).
  virtual Status residual_rms_norm_gate(Tensor& x, const Tensor& y, const Tensor& w, float eps,
                                        const Tensor& gate) = 0;
  // residual_rms_norm_gate(x, y, w, eps, gate), then out[R, D] = rms_norm(x, w_next, eps,
  // scale_next) of the x just updated: the DiT's gated residual and the next sub-block's
  // modulated pre-norm. The default runs the two ops; a backend may fuse them (one pass over x),
  // with the same roundings.
  virtual Status residual_norm_gate_then_norm(Tensor& x, const Tensor& y, const Tensor& w,
                                              float eps, const Tensor& gate, const Tensor& w_next,
                                              const Tensor& scale_next, Tensor& out);
  // NHWC group norm: x[B, H, W, C], `groups` groups of C/groups channels, affine gamma/beta [C],
  // then SiLU if `silu`. In place allowed.
  virtual Status group_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, int groups,
                            float eps, bool silu, Tensor& y) = 0;

  // ---- position encodings (in place) ----
  // Rotate-half RoPE (Qwen3/NeoX): x[B, S, H, Dh]; cos/sin [S, Dh] (f32), shared over batch.
  // x' = x * cos + rotate_half(x) * sin, rotate_half(x) = [-x[Dh/2:], x[:Dh/2]].
  virtual Status rope_half(Tensor& x, const Tensor& cos, const Tensor& sin) = 0;
  // Interleaved complex RoPE (Z-Image DiT): x[B, S, H, Dh]; freqs [B, S, Dh/2, 2] (f32 cos, sin).
  // (x[2j], x[2j+1]) <- (x0*c - x1*s, x0*s + x1*c), computed in f32.
  virtual Status rope_interleaved(Tensor& x, const Tensor& freqs) = 0;

  // ---- fused model-specific prologues (the defaults compose the ops above; backends fuse) ----
  // A transformer block's attention prologue: qkv[B*S, (Hq + 2*Hkv) * Dh] is split into
  // q[B, S, Hq, Dh], k and v[B, S, Hkv, Dh]; q and k get a per-head RMS norm with weights
  // norm_q / norm_k [Dh] (both undefined = no norm), then the interleaved RoPE with freqs
  // [B, S, Dh/2, 2] f32 (undefined = none). Same roundings as the composed ops.
  virtual Status qkv_split_norm_rope(const Tensor& qkv, const Tensor& norm_q, const Tensor& norm_k,
                                     float eps, const Tensor& freqs, Tensor& q, Tensor& k,
                                     Tensor& v);
  // The block's q|k|v linear and that prologue in one op: qkv = x[rows, K] · wqkvᵀ, then
  // qkv_split_norm_rope(qkv, ...). `qkv` ([rows, (Hq + 2·Hkv)·Dh], act dtype) holds the projection
  // where the op is not fused (undefined: taken from alloc). The default runs the two ops; a
  // backend may fuse them with the same roundings.
  virtual Status matmul_qkv_norm_rope(const Tensor& x, const Tensor& wqkv, const Tensor& norm_q,
                                      const Tensor& norm_k, float eps, const Tensor& freqs,
                                      Tensor& qkv, Tensor& q, Tensor& k, Tensor& v);
  // The same prologue in place on the packed projection qkv[B, S, (Hq + 2·Hkv)·Dh] (each token's
  // q heads, then its k heads, then its v heads), for attention_packed: the q and k heads get
  // qkv_split_norm_rope's norm and RoPE with the same roundings; the v heads are left as they are.
  // The default splits, runs qkv_split_norm_rope and copies q and k back.
  virtual Status qk_norm_rope_packed(Tensor& qkv, int64_t hq, int64_t hkv, const Tensor& norm_q,
                                     const Tensor& norm_k, float eps, const Tensor& freqs);
  // The DiT's adaLN modulation: mod[B, 4D] = [s_a | g_a | s_f | g_f] ->
  // scale_a = 1 + s_a, gate_a = tanh(g_a), scale_f = 1 + s_f, gate_f = tanh(g_f), each [B, D].
  virtual Status dit_modulation(const Tensor& mod, Tensor& scale_a, Tensor& gate_a, Tensor& scale_f,
                                Tensor& gate_f);
  // The block's adaLN projection and that modulation in one op: mod = c[B, K] · wᵀ + bias (w
  // [4D, K], bias [4D] or undefined; mod rounded to the act dtype as matmul rounds it), then
  // dit_modulation(mod, ...). `mod` ([B, 4D]) holds the projection where the op is not fused.
  // The default runs the two ops; a backend may fuse them with the same roundings.
  virtual Status matmul_dit_modulation(const Tensor& c, const Tensor& w, const Tensor& bias,
                                       Tensor& mod, Tensor& scale_a, Tensor& gate_a,
                                       Tensor& scale_f, Tensor& gate_f);
  // matmul_dit_modulation for many blocks at once (the DiT's conditioning c [B, K] is the same for
  // all of them): w[l] [4D, K], bias[l] [4D] or undefined; out [L, 4, B, D] holds block l's
  // scale_a, gate_a, scale_f, gate_f (dit_modulation_of gives them as views). The default runs
  // matmul_dit_modulation block by block; a backend may run all in one op with the same roundings.
  virtual Status dit_modulation_layers(const Tensor& c, const std::vector<Tensor>& w,
                                       const std::vector<Tensor>& bias, Tensor& out);

  // ---- attention ----
  // q[B, Sq, Hq, D], k/v[B, Sk, Hkv, D] (Hq a multiple of Hkv: GQA), out[B, Sq, Hq, D].
  virtual Status attention(const Tensor& q, const Tensor& k, const Tensor& v,
                           const AttentionParams& p, Tensor& out) = 0;
  // attention() over the three parts of a packed projection qkv[B, S, (Hq + 2·Hkv)·D] (each
  // token's q heads, then k, then v: the q|k|v linear's output after qk_norm_rope_packed);
  // out[B, S, Hq, D]. The default copies the parts out and calls attention(); a backend whose
  // kernel takes strided operands reads them in place (reads_packed_qkv).
  virtual Status attention_packed(const Tensor& qkv, int64_t hq, int64_t hkv,
                                  const AttentionParams& p, Tensor& out);
  // Whether attention_packed and qk_norm_rope_packed work in place here, so that a model saves
  // the split (the copy of q, k and v) by keeping its projection packed.
  virtual bool reads_packed_qkv() const { return false; }
  // FP8 attention (opt-in; the DiT's `--fp8-layers ...,sdpa`): attention_packed over the
  // packed projection qkv[B, S, (Hq + 2·Hkv)·Dh] after qk_norm_rope_packed's norm and RoPE of q
  // and k (norm_q and norm_k required; qkv itself is not written), with q, k and v rounded to
  // e4m3 first: q and k each divided by one scale, fp8_attention_qk_scale(max |norm weight|, Dh), v
  // by one per KV head, fp8_attention_v_scale(max |v| over the batch's rows)
  // (backend/fp8_attention.h); the scales are multiplied back in f32. out[B, S, Hq, Dh] in the act
  // dtype. The CPU backend computes exactly this with an exact softmax (the oracle); CUDA's
  // kernel also rounds the probabilities to e4m3 before P·V. The default answers kUnsupported.
  virtual Status attention_packed_fp8(const Tensor& qkv, int64_t hq, int64_t hkv,
                                      const Tensor& norm_q, const Tensor& norm_k, float eps,
                                      const Tensor& freqs, const AttentionParams& p, Tensor& out);
  // Ok where attention_packed_fp8 runs on this backend; otherwise why it does not.
  virtual Status fp8_attention_support() const;

  // ---- activations / elementwise (same shape unless stated; in place allowed) ----
  virtual Status silu(const Tensor& x, Tensor& y) = 0;
  virtual Status tanh(const Tensor& x, Tensor& y) = 0;
  // y = min(max(x, lo), hi).
  virtual Status clamp(const Tensor& x, float lo, float hi, Tensor& y) = 0;
  // x[M, 2F] holds [gate | up] per row; y[M, F] = silu(gate) * up.
  virtual Status swiglu(const Tensor& x, Tensor& y) = 0;
  // A feed-forward's gate and up linears and their SwiGLU in one op:
  //   y[M, F] = silu(x[M, K] · w1ᵀ) * (x · w3ᵀ)
  // with w13 [2F, K] holding w1's rows and w3's: gate rows first (block 0), or interleaved in
  // blocks of `block` rows, gate block t at rows [2tB, 2tB + B) and up block t right after it
  // (block > 0 divides F; the layout swiglu_block() asks for). The default runs matmul into an
  // [M, 2F] buffer and swiglu on it (an [M, 2F] row in blocks is M·F/B rows of [gate | up]), the
  // rounding of two ops; a backend may fuse the two, with the same roundings.
  virtual Status matmul_swiglu(const Tensor& x, const Tensor& w13, int64_t block, Tensor& y);
  // swiglu over h [M, 2F], the w1|w3 linear's output for a weight in row blocks of `block` (0:
  // gate rows first): each run of 2B values of a row is [gate | up] for B outputs, in order, so
  // it is swiglu over M·F/B rows of 2B. y [M, F]. What the fused ops' defaults end with.
  Status swiglu_in_blocks(const Tensor& h, int64_t block, Tensor& y);
  // The row block in which this backend runs matmul_swiglu fused, for w13 weights of width K
  // and 2F rows in the act dtype: a model reorders such a weight once at load
  // (set_swiglu_block, model/common/linear.h). 0: no fused path, keep gate rows first.
  virtual int64_t swiglu_block(int64_t f, int64_t k) const {
    (void)f, (void)k;
    return 0;
  }
  // out = a*x + b*y (+ c). Any dtype, all three tensors same dtype.
  virtual Status axpby(float a, const Tensor& x, float b, const Tensor& y, Tensor& out) = 0;
  // out = x + y where y may broadcast over leading dims: y.numel() divides x.numel().
  virtual Status add(const Tensor& x, const Tensor& y, Tensor& out) = 0;
  // Sum of squares of all elements, per leading-dim row: x[B, ...] -> host vector of B doubles.
  virtual Result<std::vector<double>> sum_squares(const Tensor& x) = 0;
  // One request's denoising update in float32, element for element as the reference pipeline
  // computes it on the host (pipeline/scheduler.h: cfg_combine, negation, euler_step; separate
  // roundings, no fused multiply-add): pred = pos + g·(pos − neg) when `neg` is defined, else
  // pos; latents = latents + dt·(−pred). pos, neg, latents: f32 with equal numel.
  virtual Status guided_euler_step(const Tensor& pos, const Tensor& neg, float g, float dt,
                                   Tensor& latents) = 0;
  // Live-preview colours of latents[n, C, h, w] (f32, C = map.channels): rgb[n, h, w, 3] (kU8),
  // per pixel v_k = bias[k] + Σ_c weight[c][k]·x_c (c in order, one rounding per operation, no
  // fused multiply-add) and rgb_k = trunc(255·clamp((v_k + 1) / 2, 0, 1)), as ComfyUI's latent2rgb
  // previewer turns its projection into bytes.
  virtual Status latent_to_rgb(const Tensor& latents, const LatentRgbMap& map, Tensor& rgb) = 0;
  // How many elements of x (f32, bf16 or f16) are NaN or +-Inf. Waits for x (a host read).
  virtual Result<int64_t> count_nonfinite(const Tensor& x) = 0;
  // The VAE's raw output x (f32, bf16 or f16) as 8-bit colours, element for element what
  // VaeDecoder::postprocess and the pipeline's to_u8 make of it: v = clamp(r(r(0.5·x) + 0.5), 0,
  // 1) with r the rounding to x's dtype after each operation, rgb = nearbyint(255·v) (ties to
  // even). A NaN or ±Inf gives 0 (the pipeline counts them with count_nonfinite first).
  // rgb: kU8 of x's shape.
  virtual Status image_to_rgb8(const Tensor& x, Tensor& rgb) = 0;

  // ---- convolution / resampling (NHWC) ----
  // x[B, H, W, Cin], w[Cout, kh, kw, Cin], bias[Cout] (optional), y[B, Ho, Wo, Cout].
  virtual Status conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p,
                        Tensor& y) = 0;
  // y = conv2d(x, w, bias) + residual, residual[B, Ho, Wo, Cout] like y (may alias neither x nor
  // y). The default runs conv2d, then add(residual, y): the convolution's output rounded to the
  // storage type before the sum. A backend may fuse the sum into the convolution's epilogue and
  // round once (the CUDA backend's cuDNN graphs).
  virtual Status conv2d_add(const Tensor& x, const Tensor& w, const Tensor& bias,
                            const Tensor& residual, const Conv2dParams& p, Tensor& y);
  // Nearest-neighbour ×2: x[B, H, W, C] -> y[B, 2H, 2W, C].
  virtual Status upsample_nearest2x(const Tensor& x, Tensor& y) = 0;

  // ---- model-specific layout ops ----
  // Row gather: out[N, D] = table[ids[n], :]; ids is a host I32 tensor [N]. Ids are checked.
  virtual Status embedding(const Tensor& table, const Tensor& ids, Tensor& out) = 0;
  // latents[B, C, H, W] (f32) -> tokens[B, (H/p)*(W/p), p*p*C] (act dtype), token n = r*(W/p)+s,
  // feature (ph*p + pw)*C + c.
  virtual Status patchify(const Tensor& latents, int p, Tensor& tokens) = 0;
  // Inverse of patchify for the first (H/p)*(W/p) rows of tokens[B, S, p*p*C] (S may be larger):
  // out[B, C, H, W] (f32) = alpha * token value.
  virtual Status unpatchify(const Tensor& tokens, int p, float alpha, Tensor& out) = 0;

  // ---- measurement and technique switches (zimage bench, src/bench) ----
  // What the benchmarks read and switch beyond the ops. The defaults fit a backend with nothing to
  // measure or switch (the CPU): no profiler, no caching allocator, one way to run each op.
  // Per-op device timing: switch it on, run the work, then take the report (costliest first;
  // taking it clears it). kUnsupported where the backend has no op profiler.
  struct OpProfileEntry {
    std::string op;  // op name and shapes: "conv2d bf16[1, 128, 128, 512] * bf16[...]"
    int64_t calls = 0;
    double total_ms = 0;  // device time inside the op
    double host_ms = 0;   // host time inside the op call (planning, library overhead)
  };
  virtual void set_profiling(bool on) { (void)on; }
  // Profile what runs inside recorded work (CUDA graphs) instead of what runs eagerly: ops
  // recorded while this is on carry timing marks into the recording, the report gives their times
  // in its latest replay, plus a "(between ops)" entry for the time the replay spent between one
  // op's end and the next op's start. Release the recordings made this way afterwards (their marks
  // cost a little each replay). A no-op without a profiler.
  virtual void set_profile_recorded(bool on) { (void)on; }
  virtual Result<std::vector<OpProfileEntry>> op_profile() {
    return Unsupported(name() + " has no op profiler");
  }
  // The caching allocator's counters (all zero without one): bytes in live tensors and their
  // high-water mark, the high-water mark of the device memory it holds, both since the last
  // reset_peak_memory(); and its device allocation + free calls so far.
  struct AllocatorCounters {
    uint64_t in_use = 0, peak_in_use = 0, peak_reserved = 0;
    uint64_t device_calls = 0;
  };
  virtual AllocatorCounters allocator_counters() const { return {}; }
  virtual void reset_peak_memory() {}
  // Gives the allocator's idle memory back to the driver.
  virtual Status empty_cache() { return Status::Ok(); }
  // The techniques the ablation rows switch off one by one. Attention: kAuto the fastest path
  // there is, kOwn the project's own kernels only, kGeneral GEMM + softmax. set_fused(false) runs
  // fused ops as the composed ops; set_cutlass / set_fp8_fast_accum choose the FP8 GEMM path and
  // its accumulation (recorded forwards keep the path they were recorded with).
  enum class AttentionChoice { kAuto, kOwn, kGeneral };
  virtual void set_attention_choice(AttentionChoice c) { (void)c; }
  virtual void set_fused(bool on) { (void)on; }
  virtual void set_cutlass(bool on) { (void)on; }
  virtual void set_fp8_fast_accum(bool on) { (void)on; }
};

// Creates the CPU backend (always available). threads = 0: all hardware threads.
std::unique_ptr<Backend> make_cpu_backend(int threads = 0);
// The same for a user-given thread count: kInvalidArgument outside 0..max_cpu_threads(), and an
// error (not a smaller pool, not a hang) when the system refuses to start the threads.
Result<std::unique_ptr<Backend>> create_cpu_backend(int threads);
// Most CPU threads a user may ask for: 4x the hardware threads (at least 4).
int max_cpu_threads();
// kInvalidArgument naming `field` when `threads` is outside 0..max_cpu_threads().
Status check_cpu_threads(int threads, const char* field = "threads");

// Creates the CUDA backend on `device_index` computing in `act_dtype` (kBF16 or kF32).
// Fails with kUnsupported when the engine was built without CUDA or no GPU is present.
Result<std::unique_ptr<Backend>> make_cuda_backend(int device_index, DType act_dtype);
// CUDA devices this process can use (cudaGetDeviceCount); 0 without CUDA, a driver or a GPU.
int cuda_visible_devices();
// The calling thread's current CUDA device's memory as the driver reports it, before any backend
// exists: {total, free} bytes (cudaMemGetInfo). kUnsupported without CUDA.
Result<std::pair<uint64_t, uint64_t>> cuda_device_memory();

// Block `layer`'s scale_a, gate_a, scale_f, gate_f ([B, D] views) in dit_modulation_layers' out.
std::array<Tensor, 4> dit_modulation_of(const Tensor& out, int64_t layer);
// dit_modulation_layers' operands as it documents them, or kInvalidArgument naming `op`.
Status check_dit_modulation_layers(const char* op, const Tensor& c, const std::vector<Tensor>& w,
                                   const std::vector<Tensor>& bias, const Tensor& out);

}  // namespace zimage
