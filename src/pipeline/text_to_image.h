// The text-to-image pipeline (diffusers ZImagePipeline.__call__, model spec §1, §6, §7): prompts
// -> chat template + tokens -> Qwen3 hidden states -> seeded noise -> N FlowMatch Euler steps of
// the DiT (positive and negative passes as one batch of 2B when CFG is on) -> VAE decode ->
// round(255·x). Why one class: the components are loaded once and reused by every request; the
// loop itself is short enough to read top to bottom next to the Python it mirrors.
//
// Data between the stages (n = prompts x images_per_prompt, h = H / vae factor):
//   token ids       per prompt, host                       (dump "tokens.<i>", "tokens.negative")
//   embeddings      per prompt [L_i, cap_feat_dim], backend (dump "prompt_embeds.<i>",
//                                                             "negative_embeds")
//   latents         [n, 16, h, w] f32 on the backend; the CFG combine and the Euler step run
//                   there, with the host's float32 roundings (dump "init_noise",
//                                                             "latents.step<k>")
//   DiT output      [n or 2n, 16, h, w] f32 (dump "dit_out.step<k>", raw, before negation)
//   image           [n, H, W, 3] f32 in [0, 1], host; then RGB8
#pragma once

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "io/fs/prefetch.h"
#include "io/model/model_config.h"
#include "io/model/model_folder.h"
#include "io/model/model_source.h"
#include "model/adapters/zimage_controlnet.h"
#include "model/common/debug.h"
#include "model/dit/zimage_dit.h"
#include "model/text_encoder/qwen3_encoder.h"
#include "model/vae/vae.h"
#include "model/vae/vae_tiling.h"
#include "pipeline/image_to_image.h"
#include "pipeline/memory_plan.h"
#include "pipeline/scheduler.h"
#include "pipeline/seqpar.h"
#include "pipeline/tokenizer/tokenizer.h"
#include "zimage/zimage.h"

namespace zimage {

// Everything the pipeline runs, already loaded onto one backend.
struct TextToImageComponents {
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<Qwen3Encoder> text_encoder;
  std::unique_ptr<ZImageDiT> transformer;
  std::unique_ptr<VaeDecoder> vae;
  SchedulerConfig scheduler;
  // Optional: the VAE encoder for image-conditioned requests. When null, it is loaded from the
  // model folder on the first such request (TextToImage::vae_encoder).
  std::unique_ptr<VaeEncoder> vae_encoder;
};

struct TextToImageHooks {
  ProgressCallback on_progress;                        // see GenerateHooks (zimage/zimage.h)
  PreviewCallback on_preview;                          // the same; unset = no preview op runs
  const std::atomic<bool>* preview_enabled = nullptr;  // the same
  const std::atomic<bool>* cancel = nullptr;
  DebugSink* debug = nullptr;  // named intermediates, see the list above
};

// One request between its denoising steps: what begin() prepared and step() advances. The
// caller keeps `hooks.debug` alive until finish().
struct DenoiseState {
  GenerateRequest req;
  TextToImageHooks hooks;
  bool cfg = false;            // guidance > 0
  std::vector<Tensor> embeds;  // per prompt, then the negative under CFG (backend)
  Tensor latents;              // [n, C, h, w] f32, on the backend between steps
  std::optional<FlowMatchEulerScheduler> scheduler;
  int step = 0;  // the scheduler index of the next step (steps done, counting skipped ones)
  // Image-to-image / inpainting (pipeline/image_to_image.h): the schedule starts at first_step
  // (diffusers' t_start; 0 for text-to-image), and inpainting puts the known region back after
  // every step.
  int first_step = 0;
  std::optional<InpaintLatents> inpaint;
  // ControlNet requests (pipeline/controlnet.h): the control context [n, Cc, h, w] f32 on the
  // backend; undefined without control.
  Tensor control;
  PhaseTimings timings;
  double start_s = 0;                         // steady clock at begin()
  int64_t n = 0, channels = 0, h = 0, w = 0;  // latent batch and shape
  bool done() const { return step >= req.steps; }
  int steps_done() const { return step - first_step; }        // denoising steps run so far
  int steps_total() const { return req.steps - first_step; }  // denoising steps this request runs
};

struct TextToImageOutput {
  // [n, H, W, 3] f32 in [0, 1], host (what diffusers returns as "np"); empty unless the pipeline
  // keeps it (TextToImage::set_float_image) or the decode was tiled.
  Tensor image;
  std::vector<Image> images;  // the same as RGB8: round(255·x)
  PhaseTimings timings;
};

// How to hold the model in memory (see pipeline/memory_plan.h).
struct PipelineLoadOptions {
  // Device bytes the process may hold (context included): 0 = no limit (everything resident),
  // else the planner streams what does not fit, and the allocator is capped to it.
  uint64_t vram_budget = 0;
  // Host bytes streamed weights may page-lock (MemoryPlanInput::host_pinned_limit); 0 = no limit.
  uint64_t host_pinned_limit = 0;
  // false: streamed host copies stay pageable (MemoryPlanInput::pin_copies).
  bool pin_host_copies = true;
  // Streamed weights the files hold in the compute dtype are read from the memory-mapped files
  // at each stream instead of copied into host memory at load (WeightPlacement).
  bool stream_from_files = false;
  // With stream_from_files: their file pages page-locked in place up to host_pinned_limit.
  bool lock_files = false;
  bool fp8_weights = false;  // big linear weights of the DiT and text encoder as FP8 rows
  // --precision fp8: these DiT linears (Fp8Layers bits, model/common/linear.h) run as W8A8 FP8
  // GEMMs.
  unsigned dit_fp8_compute = 0;
  // Linear weights an FP8 or GGUF file stores quantised stay so on the device, dequantised per
  // layer (model/common/quantized_linear.h); false widens them at load.
  bool keep_quantized = true;
  // The largest request to plan activations for.
  int plan_width = 1024, plan_height = 1024, plan_batch = 1;
  // LoRAs merged into the transformer's weights as they are read (model/adapters/lora_merge.h).
  std::vector<LoraSpec> loras;
  bool lora_lenient = false;  // LoRA keys that match no weight: warn instead of fail
  int lora_threads = 0;       // host threads for the merge (0: all)
};

// The part of a load that needs no backend: the model's sources opened and every config checked,
// the tokenizer being parsed, and the weight files being read into the page cache in the order the
// loaders will read them (io/fs/prefetch.h). The engine makes it while the backend starts
// (api/engine.cpp), so CUDA's start-up overlaps the file work; then load() takes it.
struct PreparedLoad {
  ModelPaths paths;
  std::unique_ptr<ModelSource> source;
  // The tokenizer, parsed on a thread of its own (0.35-0.6 s for Qwen3's 11 MB tokenizer.json,
  // longer than the CUDA start it used to extend) while the backend starts and the weights load;
  // load() takes it between components once it is ready, at the latest after the weights. Not
  // valid: load() parses it itself.
  std::future<Result<std::unique_ptr<Tokenizer>>> tokenizer;
  std::chrono::steady_clock::time_point started;  // when prepare() began
  std::unique_ptr<FilePrefetcher> prefetch;       // null: no prefetch
  double seconds = 0;                             // how long prepare() took
};

class TextToImage {
 public:
  // Everything load() does before it needs the backend (PreparedLoad).
  static Result<PreparedLoad> prepare(const ModelPaths& paths);
  // load() from a prepared source.
  static Result<std::unique_ptr<TextToImage>> load(PreparedLoad prepared, Backend& be,
                                                   const PipelineLoadOptions& options = {});
  // Opens the diffusers folder `model_dir` and loads the tokenizer, text encoder, transformer,
  // VAE decoder and scheduler config onto `be`, which must outlive the pipeline. Errors name the
  // component ("loading transformer: ...").
  static Result<std::unique_ptr<TextToImage>> load(const std::string& model_dir, Backend& be,
                                                   const PipelineLoadOptions& options = {});
  // Every check load() makes on `model_dir` (configs, tokenizer parsed, each model's tensors
  // present with the right shape and a float dtype, no unexpected tensors, the components
  // consistent) without uploading a weight: the loaders bind against the check-only backend.
  // Returns the errors worded as load() words them, the one load() would return first; each
  // component is checked even after another failed. Empty: load() would succeed.
  static std::vector<Status> check_folder(const std::string& model_dir);
  // The same two for a model folder and/or single files (io/model/model_source.h): `--dit`,
  // `--text-encoder`, `--vae` replace components of the folder, or stand alone with a tokenizer.
  static Result<std::unique_ptr<TextToImage>> load(const ModelPaths& paths, Backend& be,
                                                   const PipelineLoadOptions& options = {});
  static std::vector<Status> check(const ModelPaths& paths);
  // `zimage info FILE`: for each component a single file holds (io/weights/single_file.h), its
  // config inferred and its loader bound on the check-only backend. Errors as load() would word
  // them.
  static std::vector<Status> check_file(const std::string& path);
  // The memory planner's input for `configs`: weight bytes per block / layer in `act` (or FP8
  // rows), activations of the largest planned request, the VAE's parameter count, and `fixed`
  // device bytes (context and libraries, from the driver).
  static MemoryPlanInput plan_input(const ZImageConfigs& configs, DType act,
                                    const PipelineLoadOptions& o, uint64_t vae_params,
                                    uint64_t fixed);
  // The products the first image at the planned size will run (Backend::warm_up): the text
  // encoder's four linears at a few prompt lengths, the DiT's at its main, image-only and
  // caption-only sequence lengths, and its adaLN projection.
  static Backend::WarmUpHints warm_up_hints(const ZImageConfigs& configs,
                                            const PipelineLoadOptions& o);
  // Assembles a pipeline from loaded components (all non-null, consistent with each other).
  static Result<std::unique_ptr<TextToImage>> create(TextToImageComponents parts, Backend& be);

  // Model-dependent checks of a request: sizes are multiples of size_multiple(), the latent fits
  // the DiT's RoPE tables, max_sequence_length fits the text encoder. Field-range checks
  // (zimage/request_check.h) come first; these assume them.
  Status check(const GenerateRequest& req) const;

  // Runs one request: begin(), step() until done, finish(). The caller serialises calls (the
  // backend's buffers are shared).
  Result<TextToImageOutput> run(const GenerateRequest& req, const TextToImageHooks& hooks);

  // The same, in pieces a scheduler can interleave (continuous batching):
  // begin: checks the request, tokenizes and encodes its prompts, draws its noise (with an init
  // image: encodes it and builds the start latents, pipeline/image_to_image.h).
  Result<std::unique_ptr<DenoiseState>> begin(const GenerateRequest& req,
                                              const TextToImageHooks& hooks);
  // One denoising step of every state, as ONE DiT forward over all their rows (each row with its
  // own timestep and caption): the states must share the latent size and not be done. Each
  // request's rows are the ones run() would give it (positives, then negatives under CFG), and
  // its noise, scheduler and CFG arithmetic are its own. Progress is reported per state.
  Status step(const std::vector<DenoiseState*>& states);
  // VAE decode and RGB8 conversion of a finished state.
  Result<TextToImageOutput> finish(DenoiseState& state);

  // The CFG combine and Euler step on the backend (default) or, for the ablation, on the host
  // with the DiT output downloaded every step (the same float32 result).
  void set_device_step(bool on) { device_step_ = on; }

  // Whether a denoising loop refines its captions once (ZImageDiT::refine_captions: the caption
  // embedder and the context refiner depend on the captions alone) and each step's forward reads
  // the tokens, or every forward computes them (off; ZIMAGE_CAPTION_CACHE=0 at load). The images
  // are the same bits. Kept while a step's rows read the same caption tensors with the same
  // weights; not with debug dumps (each step dumps its own) or in forwards split over several
  // GPUs. With streamed weights the context refiner's blocks are then copied in once per batch of
  // captions instead of at every step. Default on.
  void set_refine_captions_once(bool on) {
    refine_once_ = on;
    caption_cache_ = CaptionCache();
  }

  // How finish() decodes: tiled as diffusers' enable_tiling() or not (model/vae/vae_tiling.h).
  // Default: auto with the backend's free memory as the budget.
  void set_vae_tiling(const VaeTilingPolicy& p) { vae_tiling_ = p; }

  // Whether finish() also returns the f32 image (TextToImageOutput::image; default true: the
  // parity tests compare it). Off (the engine, the server, the CLI), an untiled decode turns the
  // VAE's output into RGB8 on the backend and downloads bytes (Backend::image_to_rgb8: the same
  // bytes as the f32 image's to_u8, a quarter of its size, no host pass over it).
  void set_float_image(bool on) { float_image_ = on; }

  // Loads a ControlNet (folder or single file, model/adapters/zimage_controlnet.h) for this
  // pipeline's transformer; requests with a control_image use it from then on.
  Status load_controlnet(const std::string& path);
  Status check_control(const GenerateRequest& req) const;
  const ZImageControlNet* controlnet() const { return controlnet_.get(); }

  int vae_factor() const;     // image pixels per latent pixel: 2^(len(block_out_channels) - 1)
  int size_multiple() const;  // vae_factor * patch_size: what width and height must divide by
  int latent_channels() const;
  int max_image_tokens_side() const;  // DiT RoPE limit on (latent side / patch)
  // The VAE encoder, loaded on first use from the model folder this pipeline was loaded from
  // (text-to-image never pays for it: 34M parameters, 69 MB in bf16 at full size). Errors:
  // a pipeline made by create() without an encoder, or the folder's encoder weights missing.
  Result<VaeEncoder*> vae_encoder();
  Backend& backend() const { return be_; }
  ZImageDiT& transformer() { return *c_.transformer; }  // runtime LoRAs (set_loras)
  // The memory plan the pipeline was loaded with.
  // The DiT linears that run as W8A8 FP8 GEMMs (Fp8Layers bits, 0 = none).
  unsigned fp8_layers() const { return c_.transformer->fp8_compute(); }
  const MemoryPlan& memory_plan() const { return plan_; }

  // Sequence parallelism (docs/PARALLEL.md, text_to_image_seqpar.cpp): the transformer loaded
  // again on each of `rank_backends` (ranks 1..P-1, outliving the pipeline; this pipeline's
  // backend is rank 0) with `options`' weights and LoRAs, resident, and from then on every DiT
  // forward split over the P ranks through `comm` ("auto", "local" or "nccl", see
  // pipeline/seqpar.h). Steps with ControlNet residuals or per-request LoRAs run on rank 0 alone.
  Status enable_sequence_parallel(const std::vector<Backend*>& rank_backends,
                                  const std::string& comm, const PipelineLoadOptions& options);
  const SequenceParallelDiT* sequence_parallel() const { return seqpar_.get(); }

 private:
  TextToImage(TextToImageComponents parts, Backend& be);
  // Tokenizes and runs the text encoder. Its work is queued on the backend, not waited for: the
  // caller makes the initial noise on the host meanwhile and then calls finish_text_encoder.
  Result<std::vector<Tensor>> encode_prompts(const GenerateRequest& req, bool cfg,
                                             const TextToImageHooks& hooks, PhaseTimings& t,
                                             double start_s, double& encoder_t0);
  // Waits for the text encoder, records its time from encoder_t0, and dumps its outputs.
  Status finish_text_encoder(const std::vector<Tensor>& embeds, bool cfg,
                             const TextToImageHooks& hooks, PhaseTimings& t, double encoder_t0);

  // ---- step(), one concern a function (text_to_image.cpp) ----
  // One state's rows in a step's DiT batch: from row0, its n positive rows, then its n negative
  // rows when CFG applies at its current step (as run() alone lays them out).
  struct StepPart {
    DenoiseState* st;
    int64_t row0, rows;
    float guidance;  // 0: positive rows only at this step
  };
  struct StepBatch {
    std::vector<StepPart> parts;
    std::vector<float> t_model;  // per row
    std::vector<Tensor> caps;    // per row
    int64_t rows = 0;
  };
  // The rows of `states`, refused when they cannot share a forward (finished, another latent
  // size, ControlNet mixed with plain requests or at another control scale).
  Result<StepBatch> step_batch(const std::vector<DenoiseState*>& states) const;
  // Every part's `field` ([n, C, h, w] f32: latents or control context), twice under CFG, in row
  // order on the backend: [rows, C, h, w].
  Result<Tensor> stack_rows(const StepBatch& batch, Tensor DenoiseState::*field) const;
  // The ControlNet's residuals for the rows `in`; and the DiT forward of `in` (with them, or on
  // the sequence-parallel ranks when it can), named "<...>.step<k>" for the dumps. `refined`
  // (optional): the rows' caption tokens (refined_captions), which both then read.
  Status control_residuals(const StepBatch& batch, const Tensor& in, DebugSink* dbg,
                           const std::string& step_name, const ZImageDiT::RefinedCaptions* refined,
                           ControlResiduals& residuals);
  Status dit_forward(const StepBatch& batch, const Tensor& in, const ControlResiduals* residuals,
                     DebugSink* dbg, const std::string& step_name,
                     const ZImageDiT::RefinedCaptions* refined, Tensor& out);
  // Whether this step's DiT forward is split over the sequence-parallel ranks (no ControlNet
  // residuals, no runtime LoRAs).
  bool split_forward(bool control) const;
  // The caption tokens of a step's rows (caption_cache_'s when they read the same tensors with
  // the same weights, else refined now and kept).
  Result<const ZImageDiT::RefinedCaptions*> refined_captions(const StepBatch& batch);
  // A part's DiT output rows `o` free of NaN/Inf, else the error naming where they came from.
  Status check_dit_output(DenoiseState& st, const Tensor& o);
  // A part's CFG combine and Euler step from its output rows `o`, the inpainting blend, and its
  // step count advanced.
  Status advance(const StepPart& pt, const Tensor& o);
  // Inpainting: the known region put back after the Euler step at scheduler index i.
  Status inpaint_step(DenoiseState& st, int i);
  // One state's update on the host (cfg_normalization > 0, or the device step switched off).
  Status host_step(DenoiseState& st, const Tensor& pos, const Tensor& neg, float g, float dt);
  // The error for `bad` NaN/Inf values among `total` in `what`: blames the text encoder when
  // `embeds` (given for the DiT) hold NaN/Inf, else `component`, with the weight scan's finding.
  Status nonfinite_error(const std::string& what, int64_t bad, int64_t total,
                         const std::string& component, const std::vector<Tensor>* embeds);

  TextToImageComponents c_;
  Backend& be_;
  ModelPaths paths_;  // where the weights came from (scanned when an output is not finite)
  MemoryPlan plan_;
  VaeTilingPolicy vae_tiling_;
  bool device_step_ = true;
  bool float_image_ = true;
  bool refine_once_ = true;
  // The last refined captions and the caption tensors they came from (held, so their memory is
  // not reused while the tokens are kept; released when a state finishes and when a request
  // begins).
  struct CaptionCache {
    std::vector<Tensor> caps;
    ZImageDiT::RefinedCaptions refined;
  };
  CaptionCache caption_cache_;
  std::unique_ptr<Backend> host_;           // a 1-thread CPU backend: dumps of host tensors
  std::unique_ptr<ThreadPool> noise_pool_;  // the initial noise's Box-Muller blocks (up to 8)
  std::unique_ptr<ZImageControlNet> controlnet_;
  std::unique_ptr<SequenceParallelDiT> seqpar_;  // ranks 1..P-1 of a sequence-parallel DiT
};

// Loads the VAE encoder of the diffusers folder `model_dir` onto `be` (text_to_image_load.cpp).
Result<std::unique_ptr<VaeEncoder>> load_vae_encoder(const std::string& model_dir, Backend& be);
// The same from a folder and/or single files: the VAE file's encoder when one is given.
Result<std::unique_ptr<VaeEncoder>> load_vae_encoder(const ModelPaths& paths, Backend& be);

// round(255·x) with ties to even (NumPy's round), clamped to [0, 255]; NaN becomes 0.
uint8_t to_u8(float x);

}  // namespace zimage
