// The CUDA backend: every op of backend/backend.h on one device and one stream, in bf16 or f32,
// plus what the engine needs beyond the op interface: the stream, allocator statistics, and CUDA
// graph capture/replay. Create it with make_cuda_backend() and dynamic_cast the Backend to
// CudaBackend for the extras (what the benchmarks switch and read is on Backend itself). This
// header pulls in no cuBLAS/cuDNN headers.
//
// Threading: one host thread drives a backend at a time. All work goes to stream(); ops return
// once their work is queued (download and sum_squares wait for it).
//
// Graph capture: between begin_capture() and end_capture() every op is recorded instead of run.
// Recorded kernels keep the raw device addresses of their tensors: keep those tensors alive (and
// do not let their memory be reused) for as long as the graph is replayed. Temporaries allocated
// during capture are safe only in a private memory pool: begin_memory_pool() before
// begin_capture(), end_memory_pool() after end_capture(), release_memory_pool() once the graph is
// destroyed; a warm-up run in the same pool first means capture needs no cudaMalloc. Ops that
// synchronise with the host (upload, download, sum_squares, embedding's id upload) cannot be
// captured, and the first call of a new matmul/conv shape (which plans it) should happen before
// capture.
#pragma once

#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_settings.h"
#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/libs/gemm_cutlass.h"
#include "backend/cuda/runtime/allocator.h"
#include "backend/cuda/runtime/locked_ranges.h"
#include "backend/cuda/runtime/op_profiler.h"
#include "backend/cuda/runtime/slot_stager.h"
#include "backend/cuda/runtime/uploader.h"

namespace zimage {
class PlanCache;  // io/fs/plan_cache.h
}  // namespace zimage

namespace zimage::cuda {

struct Fa3Request;  // libs/attention_fa3.h

class LtGemm;
class ConvPlanner;
class CudnnSdpa;
class ConvGraphs;

// An instantiated CUDA graph; move-only, destroyed with its owner.
class CudaGraph {
 public:
  CudaGraph() = default;
  explicit CudaGraph(cudaGraphExec_t exec) : exec_(exec) {}
  CudaGraph(CudaGraph&& o) noexcept : exec_(o.exec_) { o.exec_ = nullptr; }
  CudaGraph& operator=(CudaGraph&& o) noexcept;
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  ~CudaGraph();
  bool valid() const { return exec_ != nullptr; }
  cudaGraphExec_t exec() const { return exec_; }

 private:
  cudaGraphExec_t exec_ = nullptr;
};

// AttentionPath: cuda_settings.h.
class CudaBackend final : public Backend {
 public:
  static Result<std::unique_ptr<CudaBackend>> create(int device_index, DType act_dtype);
  ~CudaBackend() override;

  // ---- Backend ----
  Device device() const override { return Device::kCUDA; }
  std::string name() const override { return name_; }
  DType act_dtype() const override { return act_; }
  Result<Tensor> alloc(DType dtype, const Shape& shape) override;
  Result<Tensor> upload(const Tensor& host, DType dtype) override;
  Status download(const Tensor& src, Tensor& host) override;
  Status convert(const Tensor& src, Tensor& dst) override;
  Status copy_2d(const Tensor& src, int64_t src_offset, int64_t src_row_stride, Tensor& dst,
                 int64_t dst_offset, int64_t dst_row_stride, int64_t rows, int64_t cols) override;
  Status fill(Tensor& t, float value) override;
  Status synchronize() override;
  // A CUDA graph of `work`: one eager run inside a fresh private memory pool (plans GEMMs and cuDNN
  // graphs, fills the pool), then the capture, whose allocations the pool serves from the same
  // blocks. The pool stays reserved for the graph until the RecordedWork is destroyed. Capture
  // failures (an op that cannot be captured) answer kUnsupported; errors of `work` itself pass.
  Result<std::unique_ptr<RecordedWork>> record(const std::function<Status()>& work) override;
  // Waits for every upload and frees the pinned staging buffers (uploader.h) until the next bulk
  // upload. Loaders call it once at the end.
  Status finish_uploads() override;
  void prepare_uploads() noexcept override;
  // On the caller's thread, with a stream of its own: ConvGraphs::preload_saved, then the
  // general attention's GEMMs recorded (not run) at the VAE decoder's 1024² shape, then (level 2)
  // the hinted linears recorded on a cuBLASLt handle of their own. A debug line says what it
  // loaded and how long it took. ZIMAGE_WARM_UP: 0 off, 1 (default) convolutions and attention,
  // 2 also the linears.
  using Backend::warm_up;
  void warm_up(const WarmUpHints& hints) noexcept override;
  // What the last warm_up() did (tests): the saved plans it loaded, whether cuBLAS recorded the
  // attention's GEMMs.
  struct WarmUp {
    int plans = 0;
    int plans_executed = 0;  // of those, run once on scratch operands (WarmUpHints::scratch_bytes)
    bool attention = false;
    int linears = 0;  // hinted products recorded
  };
  WarmUp last_warm_up() const { return last_warm_up_; }
  Status bind_thread() override;
  // A caller's stream (cuda_streaming.cpp): one event each way, recorded and waited on the device.
  Status wait_for_stream(void* stream) override;
  Status signal_stream(void* stream) override;
  Status matmul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y) override;
  Status quantize_fp8(const Tensor& x, Tensor& x8, Tensor& scale) override;
  Status matmul_fp8(const Tensor& x, const Tensor& w8, const Tensor& w_scale, Tensor& y) override;
  Status matmul_fp8_rows(const Tensor& x, const Tensor& w8, const Tensor& w_scale,
                         const Tensor& bias, Tensor& y) override;
  bool takes_fp8_inputs() const override { return fp8_inputs_ && sm_ >= 89; }
  // Test hook: off, the W8A8 linears quantise their own inputs (the path before the fused ops).
  void set_fp8_inputs(bool on) { fp8_inputs_ = on; }
  Status matmul_fp8_quantized(const Tensor& x8, const Tensor& x_scale, const Tensor& w8,
                              const Tensor& w_scale, const Tensor& bias, Tensor& y) override;
  Status residual_norm_gate_then_norm_fp8(Tensor& x, const Tensor& y, const Tensor& w, float eps,
                                          const Tensor& gate, const Tensor& w_next,
                                          const Tensor& scale_next, Tensor& out, Tensor& out8,
                                          Tensor& out_scale) override;
  Status swiglu_fp8(const Tensor& x, Tensor& y, Tensor& y8, Tensor& y_scale) override;
  Status quantize_fp8_rows(const Tensor& w, Tensor& w8, Tensor& scale) override;
  Status dequantize_fp8_rows(const Tensor& w8, const Tensor& scale, Tensor& y) override;
  Status dequantize_packed(uint32_t ggml_type, const Tensor& blocks, Tensor& y) override;
  // Weight streaming (cuda_streaming.cpp): pinned host tensors, a copy stream, per-slot events.
  Result<Tensor> alloc_pinned(DType dtype, const Shape& shape) override;
  Result<Tensor> host_copy(const std::vector<Tensor>& parts, bool pinned) override;
  Result<std::shared_ptr<void>> lock_host_range(const void* p, size_t bytes) override;
  bool upload_from_locked_files() const override { return upload_locked_; }
  void set_upload_from_locked_files(bool on) { upload_locked_ = on; }
  // How host_copy page-locks: false, runtime/pinned_host.h's memory (huge pages zeroed on
  // several threads and registered; cudaHostAlloc with ZIMAGE_HOST_PIN=alloc) then the copy;
  // true (ZIMAGE_HOST_PIN=register), ordinary memory first touched by the parallel copy, then
  // locked in place by cudaHostRegister.
  void set_pin_by_register(bool on) { pin_by_register_ = on; }
  Status stream_in(int slot, const std::vector<std::pair<Tensor, Tensor>>& copies) override;
  bool can_stream(DType host, DType device) const override { return host == device; }
  uint64_t staged_stream_bytes(const std::vector<Tensor>& host_parts) const override;
  void prepare_stream_staging(int slot, uint64_t bytes) noexcept override;
  Status wait_slot(int slot) override;
  Status release_slot(int slot) override;
  uint64_t streamed_bytes() const override { return streamed_bytes_; }
  // The streaming staging page-locked so far (prepare_stream_staging, stream_in), once every
  // prepared request has been served.
  uint64_t stream_staging_bytes() const { return stager_ ? stager_->pinned_bytes() : 0; }
  Status rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& scale,
                  Tensor& y) override;
  Status layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps,
                    const Tensor& scale, Tensor& y) override;
  Status residual_rms_norm_gate(Tensor& x, const Tensor& y, const Tensor& w, float eps,
                                const Tensor& gate) override;
  Status residual_norm_gate_then_norm(Tensor& x, const Tensor& y, const Tensor& w, float eps,
                                      const Tensor& gate, const Tensor& w_next,
                                      const Tensor& scale_next, Tensor& out) override;
  // Whether residual_norm_gate_then_norm runs its fused kernel (the default: the same bits as the
  // two kernels, 0.052 against 0.062 ms at 4224 x 3840 on the H200) or the two kernels
  // (ZIMAGE_FUSED_NORM=0).
  void set_fused_norm(bool on) { fused_norm_ = on; }
  // swiglu_fp8 as one kernel (the default: 0.085 against 0.138 ms for the SwiGLU, then the row
  // quantisation, at 4160 x 10240 on an H100, session 24) or as those two
  // (ZIMAGE_FUSED_SWIGLU_FP8=0).
  void set_fused_swiglu_fp8(bool on) { fused_swiglu_fp8_ = on; }
  bool fused_norm() const { return fused_norm_; }
  // Whether conv2d_add sums the residual in the cuDNN graph's epilogue (the default; one rounding)
  // or runs conv2d, then add (ZIMAGE_FUSED_CONV_ADD=0; the CPU oracle's two roundings).
  void set_fused_conv_add(bool on) { fused_conv_add_ = on; }
  bool fused_conv_add() const { return fused_conv_add_; }
  Status group_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, int groups, float eps,
                    bool silu, Tensor& y) override;
  Status rope_half(Tensor& x, const Tensor& cos, const Tensor& sin) override;
  Status rope_interleaved(Tensor& x, const Tensor& freqs) override;
  Status qkv_split_norm_rope(const Tensor& qkv, const Tensor& norm_q, const Tensor& norm_k,
                             float eps, const Tensor& freqs, Tensor& q, Tensor& k,
                             Tensor& v) override;
  Status qk_norm_rope_packed(Tensor& qkv, int64_t hq, int64_t hkv, const Tensor& norm_q,
                             const Tensor& norm_k, float eps, const Tensor& freqs) override;
  // In place where FlashInfer's kernel runs the attention (bf16 on sm_90, the auto or FA3 path,
  // the fused q|k|v GEMM off): it reads q, k and v out of the projection by their strides, so the
  // prologue normalises and rotates q and k where they are and never copies v. ZIMAGE_PACKED_QKV=0
  // keeps the split.
  bool reads_packed_qkv() const override;
  Status attention_packed(const Tensor& qkv, int64_t hq, int64_t hkv, const AttentionParams& p,
                          Tensor& out) override;
  // FlashAttention-3's e4m3 kernel (sm_90, bf16 activations, head_dim 128, Hq == Hkv): the
  // prologue writes q and k as e4m3 into a packed buffer from the allocator, v follows with its
  // per-head scales, then the kernel (cuda_attention.cpp).
  Status attention_packed_fp8(const Tensor& qkv, int64_t hq, int64_t hkv, const Tensor& norm_q,
                              const Tensor& norm_k, float eps, const Tensor& freqs,
                              const AttentionParams& p, Tensor& out) override;
  Status fp8_attention_support() const override;
  // Fused, when switched on (ZIMAGE_FUSED_QKV=1; off by default: on the H200 the fused GEMM has
  // not yet beaten cuBLASLt's GEMM + the prologue kernel, docs/BENCHMARKS.md "Session 12"), on
  // sm_90 for head_dim 128 in bf16 (CUTLASS's Hopper GEMM with the prologue in its epilogue,
  // gemm_cutlass.h); otherwise Backend's two ops. ZIMAGE_QKV_GEMM: how (parse_gemm_tuning).
  Status matmul_qkv_norm_rope(const Tensor& x, const Tensor& wqkv, const Tensor& norm_q,
                              const Tensor& norm_k, float eps, const Tensor& freqs, Tensor& qkv,
                              Tensor& q, Tensor& k, Tensor& v) override;
  void set_fused_qkv(bool on) { fused_qkv_ = on; }
  void set_packed_qkv(bool on) { packed_qkv_ = on; }
  bool fused_qkv() const { return fused_qkv_; }
  void set_qkv_tuning(const GemmTuning& t) { qkv_tuning_ = t; }
  const GemmTuning& qkv_tuning() const { return qkv_tuning_; }
  Status dit_modulation(const Tensor& mod, Tensor& scale_a, Tensor& gate_a, Tensor& scale_f,
                        Tensor& gate_f) override;
  // One kernel (a GEMV with the modulation applied to its sums) for act-dtype operands and
  // batches up to 4, when switched on (ZIMAGE_FUSED_ADALN=1) or while dit_modulation_layers runs
  // its one kernel (the default: the blocks that make their own, streamed or a ControlNet's, then
  // get its sums); else the two ops (cuBLASLt's GEMV and the modulation kernel).
  Status matmul_dit_modulation(const Tensor& c, const Tensor& w, const Tensor& bias, Tensor& mod,
                               Tensor& scale_a, Tensor& gate_a, Tensor& scale_f,
                               Tensor& gate_f) override;
  void set_fused_adaln(bool on) { fused_adaln_ = on; }
  bool fused_adaln() const { return fused_adaln_; }
  // Every block's projection and modulation in one kernel (launch_adaln_modulation_layers) for
  // act-dtype operands and batches up to 4: one read of the weights instead of 32 GEMVs and 32
  // modulation kernels a forward (ZIMAGE_ADALN_LAYERS=0: block by block); else the default.
  Status dit_modulation_layers(const Tensor& c, const std::vector<Tensor>& w,
                               const std::vector<Tensor>& bias, Tensor& out) override;
  void set_adaln_layers(bool on) { adaln_layers_ = on; }
  bool adaln_layers() const { return adaln_layers_; }
  Status attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p,
                   Tensor& out) override;
  Status silu(const Tensor& x, Tensor& y) override;
  Status tanh(const Tensor& x, Tensor& y) override;
  Status clamp(const Tensor& x, float lo, float hi, Tensor& y) override;
  Status swiglu(const Tensor& x, Tensor& y) override;
  // Fused on sm_90 (CUTLASS's Hopper GEMM with the SwiGLU in its epilogue, gemm_cutlass.h) for
  // bf16 weights in the row blocks swiglu_block() asks for; otherwise Backend's GEMM + swiglu.
  Status matmul_swiglu(const Tensor& x, const Tensor& w13, int64_t block, Tensor& y) override;
  int64_t swiglu_block(int64_t f, int64_t k) const override;
  // The W8A8 w1|w3 GEMM with its SwiGLU and each row's max in the epilogue, then one pass for the
  // codes (gemm_cutlass.h cutlass_fp8_swiglu_rows, launch_quantize_rows_amax), for weights in the
  // blocks fp8_swiglu_block() asks for: sm_90, FP8 fast accumulation, a build with the fused
  // GEMMs, and ZIMAGE_FUSED_SWIGLU_GEMM_FP8 (set_fused_swiglu_gemm_fp8; opt-in: on an H100 the
  // epilogue costs the cooperative GEMM more than the bytes it saves, 0.743 against 0.562 ms at
  // 4160 rows, docs/BENCHMARKS.md "Session 30"). Otherwise Backend's composition.
  Status matmul_fp8_swiglu(const Tensor& x8, const Tensor& x_scale, const Tensor& w13_8,
                           const Tensor& w13_scale, int64_t block, Tensor& y, Tensor& y8,
                           Tensor& y_scale) override;
  int64_t fp8_swiglu_block(int64_t f, int64_t k) const override;
  void set_fused_swiglu_gemm_fp8(bool on) { fused_swiglu_gemm_fp8_ = on; }
  bool fused_swiglu_gemm_fp8() const { return fused_swiglu_gemm_fp8_; }
  // Whether matmul_swiglu may fuse (ZIMAGE_FUSED_SWIGLU=1; off by default for the same reason as
  // the q|k|v GEMM's), and how (ZIMAGE_SWIGLU_GEMM, parse_gemm_tuning). A weight blocked under
  // one tuning falls back to the unfused path under a tuning of another block.
  void set_fused_swiglu(bool on) { fused_swiglu_ = on; }
  bool fused_swiglu() const { return fused_swiglu_; }
  void set_swiglu_tuning(const GemmTuning& t) { swiglu_tuning_ = t; }
  const GemmTuning& swiglu_tuning() const { return swiglu_tuning_; }
  Status axpby(float a, const Tensor& x, float b, const Tensor& y, Tensor& out) override;
  Status add(const Tensor& x, const Tensor& y, Tensor& out) override;
  Result<std::vector<double>> sum_squares(const Tensor& x) override;
  Status guided_euler_step(const Tensor& pos, const Tensor& neg, float g, float dt,
                           Tensor& latents) override;
  Status latent_to_rgb(const Tensor& latents, const LatentRgbMap& map, Tensor& rgb) override;
  Result<int64_t> count_nonfinite(const Tensor& x) override;
  Status image_to_rgb8(const Tensor& x, Tensor& rgb) override;
  Status conv2d_add(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& residual,
                    const Conv2dParams& p, Tensor& y) override;
  Status conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p,
                Tensor& y) override;
  Status upsample_nearest2x(const Tensor& x, Tensor& y) override;
  Status embedding(const Tensor& table, const Tensor& ids, Tensor& out) override;
  Status patchify(const Tensor& latents, int p, Tensor& tokens) override;
  Status unpatchify(const Tensor& tokens, int p, float alpha, Tensor& out) override;

  // ---- extras ----
  cudaStream_t stream() const { return stream_; }
  int device_index() const { return device_; }
  LtGemm* lt_gemm() { return gemm_.get(); }
  std::string pci_bus_id() const override;
  AllocatorStats memory_stats() const { return allocator_->stats(); }
  MemoryUse memory_use() const override {
    const AllocatorStats s = memory_stats();
    return {s.in_use_bytes, s.reserved_bytes, s.peak_in_use_bytes};
  }
  // cudaMemGetInfo's free bytes plus the allocator's cached (unused) bytes, at most the
  // allocator's cap (set_memory_limit) less what is in use.
  std::optional<uint64_t> available_memory() const override;
  AllocatorCounters allocator_counters() const override;
  void reset_peak_memory() override { allocator_->reset_peak(); }
  Status empty_cache() override { return allocator_->empty_cache(); }
  // Private pools for graph capture (see the comment at the top and core/block_allocator.h).
  Status begin_memory_pool(PoolId id) { return allocator_->begin_pool(id); }
  Status end_memory_pool() { return allocator_->end_pool(); }
  Status release_memory_pool(PoolId id) { return allocator_->release_pool(id); }
  Status begin_capture();
  Result<CudaGraph> end_capture();
  Status replay(const CudaGraph& graph);
  // Which attention implementation to use (tests and benchmarks force one; see AttentionPath).
  void set_attention_path(AttentionPath p) { attention_path_ = p; }
  AttentionPath attention_path() const { return attention_path_; }
  // Bytes of scores (and probabilities) the general attention path computes at once; 0, the
  // default, = a quarter of available_memory() within [256 MiB, 1 GiB] at a shape's first call,
  // kept for that shape. Tests fix it to force several chunks.
  void set_attention_score_budget(int64_t bytes) { score_budget_ = bytes; }
  // Backend's choice: kAuto, kOwn, kGeneral as the AttentionPath of the same name.
  void set_attention_choice(AttentionChoice c) override;
  // Whether cuDNN's fused attention is built in and loaded.
  bool has_cudnn_attention() const;
  // Whether FlashInfer's Hopper (FA3-class) attention is built in and runs on this GPU.
  bool has_fa3_attention() const { return fa3_; }
  // Whether FlashAttention-3's own Hopper kernel is built in and runs on this GPU.
  bool has_flash3_attention() const { return flash3_; }
  // FlashAttention-3's clusters: 1 CTA, or 2 on neighbouring query tiles sharing K and V by
  // multicast (the same bytes either way). 0, the default: each kernel's measured choice, 1 for
  // bf16 and 2 for e4m3 (docs/BENCHMARKS.md, session 33); ZIMAGE_FLASH3_CLUSTER=1|2 forces both.
  void set_flash3_cluster(int cluster_m) { flash3_cluster_ = cluster_m; }
  int flash3_cluster() const { return flash3_cluster_; }
  // The cluster size the bf16 (fp8 false) or e4m3 kernel runs with.
  int flash3_cluster_for(bool fp8) const {
    return flash3_cluster_ != 0 ? flash3_cluster_ : fp8 ? 2 : 1;
  }
  // ConvGraphs::set_runtime_compile (ZIMAGE_CONV_RUNTIME_COMPILE; tests of the fused residual).
  void set_conv_runtime_compile(bool on);
  // The device's SM count (FlashAttention-3's persistent grid; tests call its kernels directly).
  int num_sms() const { return num_sms_; }
  // Which build of the flash kernel to use (benchmarks compare them).
  void set_flash_variant(FlashVariant v) { flash_variant_ = v; }
  FlashVariant flash_variant() const { return flash_variant_; }
  // Per-op GPU timing (see op_profiler.h): switch on, run, then report (sorted, clears).
  void set_profiling(bool on) override { profiler_->set_enabled(on); }
  void set_profile_recorded(bool on) override { profiler_->set_recorded(on); }
  Result<std::vector<OpProfileRow>> profile_report() { return profiler_->report(); }
  // profile_report() as Backend's rows.
  Result<std::vector<OpProfileEntry>> op_profile() override;
  // Fused kernels on (default) or off (benchmark ablation): off, the fused prologues run as the
  // composed ops of backend.h, GEMM biases as a separate add, and convolutions on the legacy
  // cuDNN call with a separate bias add.
  void set_fused(bool on) override { fused_ = on; }
  bool fused() const { return fused_; }
  // Convolutions through cuDNN graphs with a fused bias (default, bf16) or the legacy cuDNN call
  // (benchmarks compare them; see conv_graph.h).
  void set_conv_graphs(bool on) { use_conv_graphs_ = on; }
  // Convolutions with output channels not a multiple of 8 (the VAE's conv_out) run padded to 8
  // first instead of as they are (ZIMAGE_CONV_PAD_COUT=1; off by default until measured).
  void set_pad_narrow_conv(bool on) { pad_narrow_conv_ = on; }
  // W8A8 FP8 GEMMs through CUTLASS with the scales in the epilogue (default, where built and on
  // sm_90) or cuBLASLt's per-tensor FP8 GEMM plus a scaling pass (benchmarks compare them).
  // Recorded forwards keep the path they were recorded with: drop them after switching.
  void set_cutlass(bool on) override { use_cutlass_ = on; }
  // The CUTLASS FP8 GEMMs' accumulation: CUTLASS's FP8FastAccum (default: the DiT's quality
  // against bf16 measured the same as with fp32 promotion, 8 % faster) or promoted to fp32
  // (ZIMAGE_FP8_ACCUM=fp32, or this; benchmarks and tests compare them).
  void set_fp8_fast_accum(bool on) override { fp8_fast_accum_ = on; }
  // The FP8 GEMM's tile (ZIMAGE_FP8_GEMM; kAuto: fp8_tile_for's choice per shape).
  void set_fp8_tile(Fp8Tile tile) { fp8_tile_ = tile; }
  // The order over the output tiles of the CUTLASS GEMMs with CUTLASS's own epilogue (the FP8
  // GEMM, the bf16 256 × 192 tile; not the opt-in GEMMs with an epilogue of ours, such as the
  // fused FP8 SwiGLU; ZIMAGE_GEMM_ORDER; the same bytes in any order). Unset: gemm_order_for's
  // choice per shape. A recorded forward keeps the order it was recorded with.
  void set_gemm_order(std::optional<GemmOrder> order) { gemm_order_ = order; }
  const std::optional<GemmOrder>& gemm_order() const { return gemm_order_; }
  // The order an m × n × k GEMM (the FP8 one, else the bf16 tile) runs in: the one set, else the
  // measured rule (cuda_ops.cpp).
  GemmOrder gemm_order_for(int64_t m, int64_t n, int64_t k, bool fp8) const;
  // bf16 GEMMs without a bias from 1024 rows (the DiT's linears) in CUTLASS's 256 × 192 tile
  // instead of cuBLASLt's kernel (ZIMAGE_BF16_GEMM=cutlass-256x192; the default `cublaslt`):
  // opt-in, to be measured as whole forwards (gemm_cutlass.h cutlass_bf16_gemm_tile).
  void set_bf16_gemm_wide_tile(bool on) { bf16_wide_tile_ = on; }
  // Whether cuDNN loaded; without it conv2d runs a direct (slow) kernel.
  bool has_cudnn() const;
  // Caps the device memory the allocator may hold (0 = no cap): the memory planner's budget less
  // what the CUDA context and libraries took. Allocations beyond it fail with OutOfMemory.
  void set_memory_limit(size_t bytes) override { allocator_->set_limit(bytes); }
  // What the driver reports for the whole device: total and free bytes (cudaMemGetInfo).
  Result<std::pair<uint64_t, uint64_t>> device_memory() const override;
  // The staged upload path (tests and benchmarks read its statistics or tune its options).
  PinnedUploader& uploader() { return *uploader_; }

 private:
  CudaBackend(int device, DType act);
  // The settings read_cuda_settings found set, onto this backend (and the process-wide row
  // kernel choices); create() calls it once the backend's parts exist.
  void apply_settings(const CudaSettings& s, const std::shared_ptr<PlanCache>& plan_cache);
  Status check_fp8_capable() const;
  // matmul_fp8_rows' and matmul_fp8_quantized's GEMM on checked operands: x8 [m, k], sx [m].
  Status fp8_gemm(const Tensor& x8, const Tensor& sx, const Tensor& w8, const Tensor& w_scale,
                  const Tensor& bias, Tensor& y);
  Status attention_general(const Tensor& q, const Tensor& k, const Tensor& v,
                           const AttentionParams& p, Tensor& out);

  int device_;
  DType act_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  std::shared_ptr<CachingAllocator> allocator_;
  std::unique_ptr<LtGemm> gemm_;
  std::unique_ptr<ConvPlanner> conv_;
  std::unique_ptr<CudnnSdpa> sdpa_;
  // FlashAttention-3's kernel with its log-sum-exp scratch from the allocator (cuda_attention.cpp);
  // that scratch alone (the FP8 path's).
  Status run_flash3(const Fa3Request& r);
  Result<Tensor> flash3_scratch(const Fa3Request& r);
  // Whether the attention path in force lets FlashAttention-3's / FlashInfer's kernel run (and
  // this GPU has it): the one rule attention(), attention_packed() and reads_packed_qkv() share.
  bool flash3_allowed() const;
  bool fa3_allowed() const;
  bool fa3_ = false;        // FlashInfer's Hopper attention is built in and this GPU is sm_90
  bool flash3_ = false;     // FlashAttention-3's Hopper kernel is built in and this GPU is sm_90
  int num_sms_ = 0;         // the device's SM count (FlashAttention-3's persistent grid)
  int flash3_cluster_ = 0;  // FlashAttention-3's CTAs a cluster (set_flash3_cluster)
  std::unique_ptr<ConvGraphs> conv_graphs_;
  bool use_conv_graphs_ = true;
  bool pad_narrow_conv_ = false;  // ZIMAGE_CONV_PAD_COUT
  bool warm_execute_ = true;      // ZIMAGE_WARM_EXECUTE: the warm-up may use its scratch grant
  bool packed_qkv_ = true;        // ZIMAGE_PACKED_QKV: reads_packed_qkv() where it can
  bool use_cutlass_ = true;
  bool fp8_fast_accum_ = true;  // ZIMAGE_FP8_ACCUM=fp32 turns it off (create applies it)
  Fp8Tile fp8_tile_ = Fp8Tile::kAuto;
  std::optional<GemmOrder> gemm_order_;
  bool bf16_wide_tile_ = false;
  bool fp8_inputs_ = true;
  bool fused_ = true;
  int sm_ = 0;              // compute capability, major * 10 + minor
  uint64_t next_pool_ = 1;  // private allocator pools for recorded work
  std::unique_ptr<OpProfiler> profiler_;
  std::unique_ptr<PinnedUploader> uploader_;  // every host -> device copy (uploader.h)
  // Weight streaming: copies run on copy_stream_; loaded_[s] is recorded after slot s's copies,
  // released_[s] after the compute that last read slot s.
  Status ensure_streaming();
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t loaded_[kStreamSlots] = {};
  cudaEvent_t released_[kStreamSlots] = {};
  uint64_t streamed_bytes_ = 0;
  // Page-locked staging for streamed weights in ordinary memory (file views), per slot.
  std::unique_ptr<SlotStager> stager_;
  // The uploader's counters at the last finish_uploads (its debug line counts from there).
  PinnedUploader::Stats upload_stats_seen_;
  // host_copy's copy threads, while loading (released by finish_uploads).
  std::unique_ptr<ThreadPool> host_pool_;
  bool pin_by_register_ = false;
  bool fused_norm_ = true;
  bool fused_swiglu_fp8_ = true;
  bool fused_swiglu_gemm_fp8_ = false;  // ZIMAGE_FUSED_SWIGLU_GEMM_FP8
  bool fused_conv_add_ = true;
  int64_t score_budget_ = 0;
  int warm_up_ = 1;  // ZIMAGE_WARM_UP
  // prepare_stream_staging's requests made while a warm-up runs, started when it ends.
  std::mutex staging_mu_;
  bool warming_ = false;
  // ensure_streaming's one-time creation of the copy stream, events and stager.
  std::mutex streaming_init_mu_;
  bool streaming_ready_ = false;
  std::vector<std::pair<int, uint64_t>> staging_requests_;
  void start_staging_requests() noexcept;
  WarmUp last_warm_up_;
  // conv2d and conv2d_add: residual (optional) summed into y in the cuDNN graph's epilogue
  // where it runs, else by an add after the convolution.
  Status conv2d_impl(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor* residual,
                     const Conv2dParams& p, Tensor& y);
  // warm_up()'s part for attention_general: true when cuBLAS recorded both GEMMs.
  bool warm_general_attention(cudaStream_t side) noexcept;
  // The general attention path's query chunk per (kv heads, queries, keys, head dim, dtype).
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int>, int64_t> score_chunks_;
  bool fused_adaln_ = false;
  bool adaln_layers_ = true;
  bool fused_swiglu_ = false;
  GemmTuning swiglu_tuning_;
  bool fused_qkv_ = false;
  GemmTuning qkv_tuning_;
  bool upload_locked_ = false;
  // What lock_host_range locked (shared with the handles' release).
  std::shared_ptr<LockedRanges> locked_ = std::make_shared<LockedRanges>();
  // wait_for_stream / signal_stream: created on first use.
  Status check_external_stream(cudaStream_t s, const char* what);
  cudaEvent_t external_in_ = nullptr, external_out_ = nullptr;
  AttentionPath attention_path_ = AttentionPath::kAuto;
  FlashVariant flash_variant_ = FlashVariant::kAuto;
};

}  // namespace zimage::cuda
