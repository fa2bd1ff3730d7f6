// The Z-Image single-stream DiT (spec §4-5): latents + timestep + caption features -> the raw
// flow prediction. Sequence per batch item = [image tokens (Np), caption tokens (Lp)], each part
// padded to a multiple of 32 with learned pad tokens, items batch-padded with key-length masks.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/comm.h"
#include "core/status.h"
#include "io/model/model_config.h"
#include "io/weights/weights.h"
#include "model/adapters/lora_runtime.h"
#include "model/common/debug.h"
#include "model/common/linear.h"
#include "model/common/quantized_linear.h"
#include "model/common/weight_streamer.h"

namespace zimage {

// ControlNet residuals (model/adapters/zimage_controlnet.h): after main layer layers[k] the DiT
// adds hints[k] ([B, S, D] in the act dtype, already scaled) to its unified sequence, as diffusers
// adds controlnet_block_samples.
struct ControlResiduals {
  std::vector<int> layers;
  std::vector<Tensor> hints;
};

class ZImageDiT {
 public:
  static constexpr int kSeqMultiple = 32;  // image and caption parts are padded to this
  static int64_t padded(int64_t n) { return (n + kSeqMultiple - 1) / kSeqMultiple * kSeqMultiple; }
  static constexpr int kTimeFreqDim = 256;  // timestep sinusoid width
  static constexpr int kTimeMidDim = 1024;  // t_embedder hidden width

  // Accepts the diffusers names (spec §5.1) and the ComfyUI / original single-file names
  // (§5.2: fused attention.qkv, x_embedder, final_layer, attention.out, q_norm/k_norm, optional
  // "model.diffusion_model." prefix, norm_final.weight ignored). Missing, wrongly shaped and
  // unused tensors are errors naming them.
  // `placement` (from the memory planner): FP8 weight storage and which blocks (in execution
  // order: noise refiners, context refiners, main layers) stay in host memory and stream in.
  static Result<std::unique_ptr<ZImageDiT>> load(const TransformerConfig& cfg,
                                                 const WeightStore& ws, Backend& be,
                                                 const WeightPlacement& placement = {});
  // Blocks in execution order (what WeightPlacement::streamed indexes).
  int num_blocks() const {
    return static_cast<int>(noise_refiner_.size() + context_refiner_.size() + layers_.size());
  }
  // Device bytes of one block's weights (the largest block), of all non-block weights, and of
  // the weight-streaming slots; host bytes streamed per forward.
  static int64_t block_weight_bytes(const TransformerConfig& cfg, DType act, bool fp8_weights);
  // As block_weight_bytes, for the weights as `ws` stores them: linears a quantised file keeps
  // quantised (model/common/quantized_linear.h) count their stored bytes; the largest block.
  static int64_t stored_block_weight_bytes(const TransformerConfig& cfg, const WeightStore& ws,
                                           DType act, const WeightPlacement& placement);
  // What the load kept quantised.
  const KeptQuantStats& kept_quantized() const { return kept_; }
  uint64_t streaming_slot_bytes() const { return streamer_ ? streamer_->slot_bytes() : 0; }
  // Streamed units read from the weight files at each stream, of streamed_units() (the rest from
  // host copies made at load).
  int streamed_units() const { return streamer_ ? streamer_->units() : 0; }
  int streamed_units_from_files() const { return streamer_ ? streamer_->units_from_files() : 0; }
  // Bytes of weight-file pages page-locked in place for streaming (WeightPlacement::lock_files).
  uint64_t streamed_locked_bytes() const { return streamer_ ? streamer_->locked_bytes() : 0; }
  uint64_t streamed_bytes_per_forward() const { return streamer_ ? streamer_->stream_bytes() : 0; }
  // Blocks copied in so far (WeightStreamer::loads).
  uint64_t streamed_loads() const { return streamer_ ? streamer_->loads() : 0; }
  // Of those, the copies a forward waited for at the block (WeightStreamer::late_loads).
  uint64_t streamed_late_loads() const { return streamer_ ? streamer_->late_loads() : 0; }

  // latents [B, C, h, w] f32 on the backend; t_model: B host floats ((1000 - T)/1000, spec §6.1);
  // caps: B tensors [L_i, cap_feat_dim] in act dtype (lengths may differ). out: [B, C, h, w] f32,
  // the raw model output (the pipeline negates it); allocated here when undefined.
  // Intermediates: <prefix>.t_emb, .x_embed, .noise_refiner.<i>, .cap_embed,
  // .context_refiner.<i>, .layers.<i>, .final, .out.
  // Longest caption (tokens) the RoPE tables place: the padded caption and the image tokens that
  // follow it must fit axes_lens[0] (see forward's RoPE layout).
  int64_t max_caption_tokens() const;

  // `control` (optional): ControlNet residuals for this input; a recorded forward with control
  // is keyed apart from one without and copies the hints into its own buffers before replay.
  Status forward(const Tensor& latents, const std::vector<float>& t_model,
                 const std::vector<Tensor>& caps, Tensor& out, DebugSink* dbg = nullptr,
                 const std::string& dbg_prefix = "dit", const ControlResiduals* control = nullptr);

  // ---- caption tokens refined once ----
  // The caption embedder and the context refiner read the caption features alone (the context
  // refiner is unmodulated, spec §4): every step of a denoising loop would compute the same caption
  // tokens. refine_captions computes them once, as forward would from `caps`, and forward_refined
  // runs the rest of forward on them: its output is forward's bit for bit (the same ops on the
  // same shapes; tests/parity/test_refined_captions.cpp). Dumps <prefix>.cap_embed and
  // .context_refiner.<i> come from refine_captions.
  struct RefinedCaptions {
    std::vector<int64_t> cap_len;  // each caption's tokens
    Tensor tokens;                 // [B, Lp, D] act dtype: each caption's tokens and pads
    uint64_t weights_version = 0;  // weights_version() when they were made
    bool defined() const { return tokens.defined(); }
  };
  Result<RefinedCaptions> refine_captions(const std::vector<Tensor>& caps, DebugSink* dbg = nullptr,
                                          const std::string& dbg_prefix = "dit");
  // forward with the caption tokens of refine_captions (made for this batch's B captions, with
  // the weights as they are now: tokens of another weights_version() are refused).
  Status forward_refined(const Tensor& latents, const std::vector<float>& t_model,
                         const RefinedCaptions& caps, Tensor& out, DebugSink* dbg = nullptr,
                         const std::string& dbg_prefix = "dit",
                         const ControlResiduals* control = nullptr);
  // Changes whenever the weights do (runtime LoRAs set or taken off); no two models share one.
  uint64_t weights_version() const { return weights_version_; }
  // How many times the caption tokens were computed: by refine_captions and by forward on one
  // device (each call that succeeded in making them; replays included).
  uint64_t caption_refinements() const { return caption_refinements_; }

  const TransformerConfig& config() const { return cfg_; }

  // Sequence parallelism (zimage_dit_parallel.cpp, docs/PARALLEL.md): called on every rank of
  // `comm` at once with the same inputs (each rank holds this model on its own backend); the
  // main layers run on the rank's contiguous chunk of the unified sequence, attention by Ulysses
  // all-to-all over a share of the heads; `out` equals forward's, on every rank. Recorded per
  // input shape and replayed as forward is when `comm` is recordable() (NCCL) and the backend
  // can record, else eager. No debug dumps or ControlNet residuals. One rank: forward itself. On
  // an error the rank aborts `comm`, so the other ranks fail too instead of waiting.
  Status forward_parallel(Communicator& comm, const Tensor& latents,
                          const std::vector<float>& t_model, const std::vector<Tensor>& caps,
                          Tensor& out);

  // Record each input shape's forward once and replay it (CUDA graphs on the CUDA backend; a
  // backend that cannot record runs eagerly). On by default; benchmarks switch it off.
  void set_use_graphs(bool on) {
    use_graphs_ = on;
    if (!on) graphs_.clear(), par_graphs_.clear();
  }
  bool use_graphs() const { return use_graphs_; }
  // At most `n` recorded forwards (input shapes) kept at once (default 4); the memory planner
  // keeps one under a budget, each holds a forward's activations.
  void set_max_graphs(size_t n) {
    max_graphs_ = n < 1 ? 1 : n;
    if (graphs_.size() > max_graphs_) graphs_.clear();
  }
  // Drops the recorded forwards and the device memory they hold.
  void release_graphs() { graphs_.clear(), par_graphs_.clear(); }

  // The linears that run as W8A8 FP8 GEMMs (WeightPlacement::fp8_compute; 0 = none).
  unsigned fp8_compute() const { return placement_.fp8_compute; }

  // ---- runtime LoRAs (model/adapters/lora_runtime.h; zimage_dit_lora.cpp) ----
  // Makes `loras` the model's LoRA set: the previous set is taken off first (merged rows restored
  // bit for bit, side GEMMs dropped), unless it is the same set (then nothing happens). Empty:
  // the base model. Recorded forwards are dropped when side GEMMs come or go (they hold the
  // side buffers' addresses); merges change weights in place and keep them. On an error the
  // model is left as the base model.
  Status set_loras(const std::vector<RuntimeLora>& loras, LoraMethod method, bool lenient);
  const AppliedLoras& applied_loras() const { return lora_applied_; }
  // set_loras' key and shape checks without applying anything. Reads only what loading fixed, so
  // it may run beside a forward on another thread.
  Status check_loras(const std::vector<RuntimeLora>& loras, bool lenient) {
    return check_runtime_loras(loras, lenient,
                               [this](const std::string& c) { return lora_slot(c); });
  }
  // Where a diffusers-named weight ("layers.3.attention.to_k.weight") lives in this model.
  Result<LoraSlot> lora_slot(const std::string& canonical);

 private:
  struct Block {
    bool modulated = false;
    Tensor adaln_w, adaln_b;  // [4D, adaln], [4D]: scale_attn | gate_attn | scale_ffn | gate_ffn
    LinearWeight wqkv;        // [3D, D]: q rows, then k, then v
    Tensor norm_q, norm_k;    // [Dh] (undefined when qk_norm is off)
    LinearWeight wo;          // [D, D]
    Tensor attn_norm1, attn_norm2, ffn_norm1, ffn_norm2;  // [D] each
    LinearWeight w13;                                     // [2F, D]: w1 (gate) rows, then w3 (up)
    LinearWeight w2;                                      // [D, F]
    // The attention itself on e4m3 operands (--fp8-layers ...,sdpa; Backend::attention_packed_fp8).
    bool fp8_attention = false;
    std::vector<LinearWeight*> linears() { return {&wqkv, &wo, &w13, &w2}; }
    // Every tensor, in fixed positions (weight streaming moves them as a unit).
    std::vector<Tensor*> tensors() {
      return {&adaln_w, &adaln_b,   &wqkv.w,     &wqkv.scale, &norm_q,    &norm_k,
              &wo.w,    &wo.scale,  &attn_norm1, &attn_norm2, &ffn_norm1, &ffn_norm2,
              &w13.w,   &w13.scale, &w2.w,       &w2.scale};
    }
  };
  struct Scratch;  // per-sequence activation buffers (zimage_dit.cpp)
  // What a forward needs that depends only on the input shapes: sizes, per-item caption and
  // sequence lengths, and the RoPE tables on the device ([B, S, Dh/2, 2] f32 each).
  struct Layout {
    int64_t b = 0, lh = 0, lw = 0, n_img = 0, np = 0, lp_max = 0, s_max = 0;
    std::vector<int64_t> cap_len, cap_pad, seq;
    bool ragged = false;  // caption lengths differ: key-length masks
    Tensor img_freqs, cap_freqs, uni_freqs;
  };
  // A recorded forward with its fixed input/output buffers.
  struct Graphed {
    Layout layout;
    Tensor latents, sinusoid, out;
    std::vector<Tensor> caps;
    Tensor refined;            // forward_refined's: the caption tokens [B, Lp, D]
    ControlResiduals control;  // the hints' fixed buffers (forwards with control)
    std::unique_ptr<RecordedWork> work;
  };
  size_t max_graphs_ = 4;
  // A new recording's fixed buffers for inputs and outputs shaped as these (forward's and
  // forward_parallel's).
  Status alloc_graph_buffers(const Tensor& latents, const std::vector<Tensor>& caps,
                             const Tensor& out, Graphed& g);

  ZImageDiT(const TransformerConfig& cfg, Backend& be) : cfg_(cfg), be_(be) {}
  // zimage_dit_weights.cpp
  Status load_weights(const WeightStore& ws);
  // Block `index` (execution order; -1: a block outside the placement, always loaded). A block
  // the placement streams from the files records the file views of what the files hold as
  // streamable (block_sources_) instead of loading it.
  Status load_block(const WeightStore& ws, const std::string& prefix, bool modulated, int index,
                    Block& b);
  Result<Tensor> load_pad_block(const WeightStore& ws, const std::string& name);
  void build_rope_tables();
  // Writes the Dh/2 (cos, sin) pairs of position (p0, p1, p2) to dst; false when out of range.
  bool rope_row(int64_t p0, int64_t p1, int64_t p2, float* dst) const;

  // zimage_dit.cpp
  Tensor timestep_sinusoid(const std::vector<float>& t_model) const;  // host [B, 256] f32
  Status timestep_embedding(const Tensor& sinusoid, Tensor& c);
  // forward's and forward_parallel's input checks; the caption lengths. Allocates `out` when
  // undefined, else checks its shape.
  // `caps` or `refined` (the other null).
  Result<std::vector<int64_t>> check_inputs(const Tensor& latents,
                                            const std::vector<float>& t_model,
                                            const std::vector<Tensor>* caps,
                                            const RefinedCaptions* refined, Tensor& out);
  // The captions' shapes ([L_i, cap_feat_dim], L_i >= 1): their lengths.
  Result<std::vector<int64_t>> check_captions(const std::vector<Tensor>& caps) const;
  // refine_captions' tokens for a batch of b, from these weights.
  Status check_refined(const RefinedCaptions& r, int64_t b) const;
  Result<Layout> make_layout(int64_t b, int64_t lh, int64_t lw,
                             const std::vector<int64_t>& cap_len);
  // The caption part of a Layout (b, cap_len, cap_pad, lp_max, ragged, cap_freqs): refine_captions'
  // and the start of make_layout's, which also takes the host rows of cap_freqs (`host`).
  Result<Layout> caption_layout(const std::vector<int64_t>& cap_len, Tensor* host = nullptr);
  Result<Tensor> caption_rope_host(const std::vector<int64_t>& cap_len,
                                   const std::vector<int64_t>& cap_pad, int64_t lp_max) const;
  // The whole forward on device inputs: only backend ops, so it can be recorded. `refined`
  // (defined): the caption tokens refine_captions made, instead of computing them from `caps`.
  Status compute(const Layout& L, const Tensor& latents, const Tensor& sinusoid,
                 const std::vector<Tensor>& caps, const Tensor& refined, Tensor& out,
                 DebugSink* dbg, const std::string& pfx, const ControlResiduals* control = nullptr);
  // forward and forward_refined: `caps` or `refined` (the other null).
  Status forward_impl(const Tensor& latents, const std::vector<float>& t_model,
                      const std::vector<Tensor>* caps, const RefinedCaptions* refined, Tensor& out,
                      DebugSink* dbg, const std::string& pfx, const ControlResiduals* control);
  // The ControlNet (model/adapters/zimage_controlnet.cpp) runs this model's embedders, refiners,
  // RoPE tables and block code on its own tokens.
  friend class ZImageControlNet;
  Result<std::shared_ptr<Scratch>> make_scratch(int64_t b, int64_t s);
  Status check_control(const ControlResiduals& control, int64_t b, int64_t lh, int64_t lw,
                       const std::vector<int64_t>& cap_len) const;
  // run_block's attention step, q/k/v/out [B, S, H, Dh]: be_.attention unless `attn` is given
  // (sequence parallelism's Ulysses exchange, zimage_dit_parallel.cpp).
  using AttentionFn = std::function<Status(const Tensor& q, const Tensor& k, const Tensor& v,
                                           const AttentionParams& ap, Tensor& out)>;
  Status run_block(const Block& blk, Tensor& x, const Tensor& freqs, const Tensor& c,
                   const AttentionParams& ap, Scratch& s, const AttentionFn* attn = nullptr);
  // The same with the block's modulation already in s.mods[set] (modulate); `prenormed`: s.norm
  // already holds its attention pre-norm; `next` (optional): the block that runs next, whose
  // modulation is in the other set: the last op also makes its pre-norm into s.norm.
  Status run_block(const Block& blk, int set, bool prenormed, const Block* next, Tensor& x,
                   const Tensor& freqs, const AttentionParams& ap, Scratch& s,
                   const AttentionFn* attn);
  // The feed-forward of run_block: s.proj = w2 · swiglu(w1|w3 · s.norm). `in8`: its input is in
  // s.x8 (FP8 rows, made by the norm before it); w2's input is made as FP8 rows by the SwiGLU
  // where w2 takes them (takes_fp8_input).
  Status feed_forward(const Block& blk, bool in8, Scratch& s);
  // Whether the scratch holds FP8 rows for the W8A8 linears (the backend takes them and some
  // linear runs in FP8), and whether blk's q|k|v linear takes them in this forward.
  bool fp8_rows() const;
  bool qkv_takes_fp8(const Block& blk, const Scratch& s, const AttentionFn* attn) const;
  // blk's adaLN modulation from the conditioning c into s.mods[set] (nothing when unmodulated).
  Status modulate(const Block& blk, const Tensor& c, Scratch& s, int set);

  // ---- the stages compute() and compute_parallel() are built from (zimage_dit.cpp) ----
  // The three runs of blocks, in execution order.
  enum class Stage { kNoiseRefiner, kContextRefiner, kLayers };
  // What one forward's stages share.
  struct Pass {
    const Layout& L;
    Tensor c;                  // timestep conditioning [B, adaln]
    DebugSink* dbg = nullptr;  // dumps <pfx>.<stage>.<l> (none when null)
    std::string pfx;
    const ControlResiduals* control = nullptr;  // added after the main layers they name
    // Every modulated block's modulation, made at once from c (modulate_all): [M, 4, B, D], and
    // each block index's layer in it (-1: unmodulated). Undefined with streamed blocks.
    Tensor mods;
    std::vector<int> mod_slot;
  };
  // P.mods and P.mod_slot from P.c when every block is resident (Backend::dit_modulation_layers).
  Status modulate_all(Pass& P);
  // Block `index`'s modulation into s.mods[set]: its views of P.mods, else modulate.
  Status modulate_block(const Pass& P, int index, const Block& blk, const Tensor& c, Scratch& s,
                        int set);
  // The latents' patches [B, N, p*p*C].
  Result<Tensor> patch_tokens(const Layout& L, const Tensor& latents);
  // x_embedder of the patches, each item's N rows followed by Np - N pad tokens: [B, Np, D].
  Result<Tensor> embed_image(const Layout& L, const Tensor& tokens);
  // cap_embedder of each caption, then its pad tokens: [B, Lp, D] (zeros past a short one).
  Result<Tensor> embed_caption(const Layout& L, const std::vector<Tensor>& caps);
  // The caption tokens [B, Lp, D]: embed_caption, then the context refiner (in `scratch`).
  Result<Tensor> caption_tokens(const Pass& P, const std::vector<Tensor>& caps,
                                const Scratch& scratch);
  // [image ; caption] per item [B, S, D] (zeros past a short one); x and cap are released.
  Result<Tensor> unify(const Layout& L, Tensor x, Tensor cap);
  // The blocks of `st` on x [B, S, D] with the RoPE table `freqs` [B, S, Dh/2, 2], in views of
  // `scratch` (made for S tokens or more); `attn` as run_block's.
  Status run_stage(const Pass& P, Stage st, Tensor& x, const Tensor& freqs, const Scratch& scratch,
                   const AttentionFn* attn = nullptr);
  // FinalLayer on u [B, S, D]: LayerNorm(no affine) ⊙ (1 + W·silu(c) + b), Linear -> [B, S, p*p*C].
  Result<Tensor> final_layer(const Tensor& u, const Tensor& c);
  // zimage_dit_parallel.cpp: compute()'s sequence-parallel sibling.
  Status compute_parallel(Communicator& comm, const Layout& L, const Tensor& latents,
                          const Tensor& sinusoid, const std::vector<Tensor>& caps, Tensor& out);
  // Block `index` (execution order) ready on the device: the resident one, or a streamed one's
  // slot views (wait for its copy); done_block releases a streamed block's slot.
  Result<Block> use_block(int index);
  Status done_block(int index);
  Block& block_at(int index);
  // After loading: FP8 rows and host placement as `placement` says; the streamer.
  Status apply_placement(const WeightPlacement& placement);
  Status place_block(Block& b, int index);
  // With streamed blocks: tells the streamer whether the coming forwards skip the context
  // refiner's blocks (forward_refined), so its copies stay ahead of the blocks that run.
  Status skip_streamed_context(bool skip);
  // A resident block's w1|w3 put in the row blocks the backend fuses (Backend::swiglu_block),
  // when it can; block_ffn_weights does it for every resident block (after LoRAs come off).
  Status block_ffn_weight(Block& b);
  Status block_ffn_weights();

  TransformerConfig cfg_;
  Backend& be_;
  Tensor t_w1_, t_b1_, t_w2_, t_b2_;  // [1024, 256], [1024], [adaln, 1024], [adaln]
  Tensor x_w_, x_b_;                  // [D, p*p*C], [D]
  Tensor cap_norm_, cap_w_, cap_b_;   // [Fc], [D, Fc], [D]
  Tensor x_pad_, cap_pad_;            // [32, D]: the pad token repeated (one copy fills any pad)
  Tensor final_ada_w_, final_ada_b_;  // [D, adaln], [D]
  Tensor final_w_, final_b_;          // [p*p*C, D], [p*p*C]
  Tensor ones_;                       // [D] of 1.0: the "1 +" of the modulation scales
  std::vector<Block> noise_refiner_, context_refiner_, layers_;
  // Weight streaming: unit index per block (execution order), -1 = resident.
  std::vector<int> unit_of_block_;
  std::unique_ptr<WeightStreamer> streamer_;
  // While loading: per streamed block, its tensors' host side in Block::tensors() order (file
  // views, or the host copies place_block made); handed to the streamer by apply_placement.
  std::vector<std::vector<StreamSource>> block_sources_;
  Tensor wide_scratch_;  // FP8 and packed weights are widened here before their GEMM
  KeptQuantStats kept_;  // linears kept quantised as the file stores them
  WeightPlacement placement_;
  int loaded_blocks_ = 0;
  // Per RoPE axis a: cos/sin of float32(p * omega_k), [axes_lens[a], axes_dims[a]/2] row-major.
  std::vector<std::vector<float>> rope_cos_, rope_sin_;
  bool use_graphs_ = true;
  bool no_graphs_ = false;  // the backend answered that it cannot record
  std::map<std::vector<int64_t>, Graphed> graphs_;
  // Recorded sequence-parallel forwards (communicators that can be recorded: NCCL), per shape.
  std::map<std::vector<int64_t>, Graphed> par_graphs_;
  AppliedLoras lora_applied_;  // the runtime LoRA set now applied
  // Unique across models in the process (next_weights_version), so tokens refined by another
  // model are refused too.
  uint64_t weights_version_ = next_weights_version();
  static uint64_t next_weights_version();
  uint64_t caption_refinements_ = 0;
  bool refining_ = false;  // refine_captions is running (done_block: streamed releases)
};

}  // namespace zimage
