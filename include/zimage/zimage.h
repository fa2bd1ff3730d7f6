// Public C++ API of the zimage engine: load a Z-Image model once, then turn many text prompts
// into images. Why this shape: the CLI, the HTTP server and any bindings all sit on this one
// header; it exposes no engine internals (pimpl), only plain structs, so the engine can change
// behind it. Errors are values (zimage/status.h); nothing here throws or aborts.
//
//   auto engine = zimage::Engine::load({.model_dir = "Z-Image-Turbo", .device = "auto"});
//   if (!engine.ok()) { puts(engine.status().to_string().c_str()); return 1; }
//   zimage::GenerateRequest req;
//   req.prompts = {"a red fox in snow"};
//   auto result = (*engine)->generate(req);  // result->images[0].rgb: width*height*3 bytes
//
// One Engine serves requests one at a time (generate() holds a mutex); it may be called from
// any thread. Cancellation and progress are per call (GenerateHooks).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "zimage/status.h"

namespace zimage {

inline constexpr const char* kVersion = "0.1.0";

// A LoRA for the transformer: a safetensors file in any common key layout (diffusers/PEFT,
// ai-toolkit, kohya, ComfyUI fused qkv, LoHa, LoKr; docs/FORMATS.md) and its strength.
struct LoraSpec {
  std::string path;
  float scale = 1.0f;  // finite; 0 leaves the weights as they are
};

struct EngineOptions {
  std::string model_dir;  // a diffusers Z-Image folder (model_index.json, transformer/, ...)
  // Single .safetensors files (ComfyUI / original-release names, plain or scaled FP8, all-in-one
  // checkpoints; docs/FORMATS.md), each replacing that component of model_dir. With all three,
  // model_dir may be empty: the configs are inferred from the tensor shapes, the scheduler is the
  // published one and tokenizer_dir names the Qwen3 tokenizer (the zimage program has one built
  // in).
  std::string dit_file;
  std::string text_encoder_file;
  std::string vae_file;
  std::string tokenizer_dir;    // a folder holding tokenizer.json; overrides model_dir/tokenizer
  std::string device = "auto";  // "cpu", "cuda" (GPU 0), "cuda:N", or "auto" (CUDA if usable)
  // "auto" (bf16 on CUDA, f32 on CPU), "bf16", "f32", or "fp8": bf16 with the DiT's big linears
  // as W8A8 FP8 e4m3 GEMMs (weights with one scale per output channel, activations with one
  // scale per token; CUDA, Ada/Hopper or newer). Its measured quality is in docs/BENCHMARKS.md.
  std::string precision = "auto";
  // With precision "fp8": which DiT linears run in FP8, "all" (= qkv,out,w13,w2,refiners) or a
  // comma-separated subset of qkv, out, w13, w2, ffn (= w13,w2), attn (= qkv,out), refiners (the
  // noise and context refiner blocks too, not only the 30 main layers).
  std::string fp8_layers = "all";
  int threads = 0;  // CPU worker threads; 0 = all hardware threads
  // Device memory the process may hold, in GiB, the CUDA context included (CUDA only). 0 = no
  // limit: everything resident. Below what the model needs, the memory planner keeps text-
  // encoder layers and DiT blocks in host memory and streams them in (same images, slower); a
  // budget below the minimum fails at load with a message stating that minimum.
  double vram_budget_gib = 0;
  // Host memory the weights streamed under vram_budget_gib may page-lock, in GiB (page-locked
  // memory streams at the link's full rate but cannot be swapped out). 0 = half of the machine's
  // memory (or of the container's limit); with streamed_weights "files", 0 = none: the copies
  // that mode still makes (FP8 rows) stay pageable, which a process of a few images gains from.
  // Streamed weights beyond it are held in pageable memory: the same images, streamed more
  // slowly. Info-level logs show the split (the memory plan).
  double host_memory_gib = 0;
  // Where weights streamed under vram_budget_gib come from at each step: "copy" (a host copy made
  // at load, page-locked up to host_memory_gib: the fastest steps, but the copy costs seconds at
  // load) or "files" (read again from the memory-mapped weight files through a small page-locked
  // staging buffer: no load-time copy, so a first image comes sooner, each step reads the page
  // cache; weights the files do not hold in the compute dtype, such as --weights fp8 rows, are
  // still copied), or "locked-files" (as "files", with the files' pages page-locked in place up
  // to host_memory_gib, so they stream at the link's rate without a copy at load or per step;
  // the page cache they hold cannot be reclaimed while the engine lives). "files" suits a process
  // that makes a few images; a long-lived one (server) is better served by "copy", which also
  // keeps working if a weight file is replaced while it runs.
  std::string streamed_weights = "copy";
  // "bf16" (weights in the compute dtype) or "fp8": the DiT's and text encoder's big linear
  // weights stored as FP8 e4m3 with one scale per output channel (half the memory and the
  // streamed bytes; widened to bf16 just before each GEMM; a small quality cost, see
  // docs/BENCHMARKS.md).
  std::string weights = "bf16";
  // VAE decode in tiles as diffusers' vae.enable_tiling(): "on", "off", or "auto" (tiled when
  // the untiled decode would not fit the device memory left, within vram_budget_gib when set;
  // never on the CPU). Tiling only applies to latents larger than one tile (the VAE config's
  // sample_size, 1024 px for Z-Image).
  std::string vae_tiling = "auto";
  // Limits every request is checked against (the server may lower them).
  int max_side = 4096;                        // width and height at most this (pixels)
  int64_t max_pixels = int64_t{4096} * 4096;  // width*height*images in one request at most
  int max_batch = 16;                         // prompts x images_per_prompt at most
  size_t max_prompt_bytes = 16384;  // each prompt and the negative prompt, before tokenizing
  // LoRAs merged into the transformer's weights at load, in this order (they add up).
  std::vector<LoraSpec> loras;
  // A LoRA key that matches no transformer weight: a warning (the key is skipped) instead of an
  // error. Shape mismatches stay errors.
  bool lora_lenient = false;
  // Per-request LoRAs (GenerateRequest::loras): how they are applied ("auto": merged into
  // weights resident in the compute dtype, side GEMMs for the rest; "merge"; "side": a low-rank
  // side GEMM wherever the layer has one; docs/FORMATS.md) and the bytes of parsed LoRA files
  // kept in host memory between requests (least recently used dropped first).
  std::string lora_method = "auto";
  uint64_t lora_cache_bytes = uint64_t{2} << 30;
  // A Z-Image ControlNet (Fun-Controlnet-Union: a diffusers folder or a published single file,
  // versions 1.0, 2.0, 2.1, 2.1-lite; docs/FORMATS.md), loaded once with the engine; requests with
  // a control_image use it.
  std::string controlnet;
  // Sequence parallelism (docs/PARALLEL.md): one image's DiT forward split over these devices
  // ("cuda:0", "cuda:1", ...; "cpu" several times for tests), the first one replacing `device`;
  // the transformer is loaded once per device. Empty or one device: the ordinary path. The
  // communicator: "auto" (NCCL when every device is its own GPU and zimage has NCCL, else
  // "local"), "nccl", or "local" (in-process copies; several ranks may share one GPU).
  std::vector<std::string> sequence_parallel_devices;
  std::string sequence_parallel_comm = "auto";
};

// An 8-bit RGB image, rows top to bottom, no padding: rgb.size() == width * height * 3.
struct Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;
};

// One request: text to image, or image to image / inpainting with init_image (and mask). Defaults
// are the Z-Image-Turbo recipe (1024x1024, 8 steps, no CFG).
struct GenerateRequest {
  std::vector<std::string> prompts;            // one or more (UTF-8): they run as one batch
  std::optional<std::string> negative_prompt;  // used only with guidance > 0 (default "")
  int width = 1024;                            // a multiple of Engine::size_multiple()
  int height = 1024;
  int steps = 8;                   // 1 .. 1000
  float guidance = 0.0f;           // CFG scale (diffusers form); 0 = off
  uint64_t seed = 0;               // torch.Generator('cpu').manual_seed(seed)
  int images_per_prompt = 1;       // images per prompt, noise drawn in one call
  float cfg_truncation = 1.0f;     // CFG only while t_norm <= this (1 = always)
  float cfg_normalization = 0.0f;  // > 0: clip |guided| to this x |positive|
  int max_sequence_length = 512;   // prompt tokens kept (template included), 1..512

  // ---- image-to-image and inpainting (diffusers' ZImageImg2ImgPipeline / ZImageInpaintPipeline)
  // With init_image, the image is resized to width x height when its size differs (PIL Lanczos,
  // as diffusers' VaeImageProcessor), VAE-encoded, noised to the schedule's step t_start =
  // int(steps - steps * strength) and denoised from there; every image of the batch starts from
  // it. With mask as well (white = repaint; gray masks as RGB with R = G = B; the same size as
  // init_image), the rest of the image is put back after every step. Both at most 2^26 pixels.
  std::optional<Image> init_image;
  std::optional<Image> mask;  // needs init_image
  // (0, 1]; unset: 0.6 (img2img) or 1.0 (inpainting), diffusers' defaults. A double, as Python's.
  std::optional<double> strength;
  // LoRAs for this request only, on top of EngineOptions::loras, applied to the transformer
  // without reloading it (EngineOptions::lora_method) and taken off for the next request with a
  // different set. Keys matching no weight follow EngineOptions::lora_lenient. At most 16.
  std::vector<LoraSpec> loras;

  // ---- ControlNet (diffusers' ZImageControlNetPipeline; needs EngineOptions::controlnet) ----
  // The control image (pose, depth, edges, ...), resized to width x height as init_image is; its
  // VAE latents condition every step. With init_image and mask as well: ControlNet inpainting
  // (ZImageControlNetInpaintPipeline, 2.x ControlNets; strength does not apply).
  std::optional<Image> control_image;
  float control_scale = 0.75f;  // controlnet_conditioning_scale (diffusers' default), finite

  // ---- one part of a larger batch (zimage generate --devices splits a batch over engines) ----
  // This request's images are images first_image, first_image + 1, ... of a batch with the same
  // seed: the generator first draws (and drops) the noise of the first_image images before
  // them, so each image gets the noise it has in the whole batch. 0 .. 1024 (0: a whole batch).
  int first_image = 0;
};

// The denoising steps `req` runs: steps, or with init_image steps - t_start (0 for a strength
// too small to leave a step, which validation refuses).
int denoising_steps(const GenerateRequest& req);
// The request's strength, or the pipeline's default for its kind (0.6 image-to-image, 1.0
// inpainting: diffusers' defaults).
double effective_strength(const GenerateRequest& req);

// kVaeEncode: the init image (and, for dumps, the masked image) through the VAE encoder, between
// the text encoder and the denoising steps of an image-conditioned request.
enum class Phase { kTokenize, kTextEncoder, kDenoise, kVae, kVaeEncode };
// "tokenize", "text_encoder", "denoise", "vae", "vae_encode"
const char* phase_name(Phase p);

// Wall-clock seconds per phase of one generate() call.
struct PhaseTimings {
  double tokenize_s = 0;
  double text_encoder_s = 0;  // text to image: includes the initial noise, made meanwhile
  std::vector<double> dit_s;  // one entry per denoising step (the DiT forward and the Euler step)
  double vae_s = 0;
  double vae_encode_s = 0;  // image-conditioned requests: preprocessing and the VAE encoder
  double total_s = 0;
  double denoise_s() const {
    double s = 0;
    for (double d : dit_s) s += d;
    return s;
  }
};

struct GenerateResult {
  // prompts.size() * images_per_prompt images: prompt 0's images first, then prompt 1's, ...
  std::vector<Image> images;
  PhaseTimings timings;
  uint64_t seed = 0;
  std::string device;  // the backend that ran it, e.g. "cpu (OpenBLAS, 16 threads)"
};

// Progress of one call: `phase` started (step 0) or advanced; for kDenoise, `step` of `total`
// denoising steps have finished. `elapsed_s` counts from the start of generate().
struct Progress {
  Phase phase = Phase::kTokenize;
  int step = 0;
  int total = 0;
  double elapsed_s = 0;
};
using ProgressCallback = std::function<void(const Progress&)>;

// A live preview (GenerateHooks::on_preview): the first image's latents after denoising step
// `step` of `total`, as RGB8 rows at latent resolution (width = image width / vae_factor), a fixed
// linear map of the latent channels computed on the device (ComfyUI's "latent2rgb").
struct Preview {
  int step = 0;
  int total = 0;
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;  // width * height * 3 bytes
};
using PreviewCallback = std::function<void(const Preview&)>;

// Per-call hooks; all optional.
struct GenerateHooks {
  // Called from the generating thread: at the start of each phase, and once after every
  // denoising step (step = 1..steps). Keep it short; it must not call back into the Engine.
  ProgressCallback on_progress;
  // Polled before each phase and each denoising step; when it reads true, generate() stops and
  // returns kCancelled. The caller owns it and keeps it alive during the call.
  const std::atomic<bool>* cancel = nullptr;
  // Live previews: when set, called from the generating thread after every denoising step with
  // a preview of the latents, at the steps where `preview_enabled` is null or reads true (a
  // flag the caller may turn on once the call runs: a client started watching). Unset (the
  // default) or reading false, no preview work is done at all.
  PreviewCallback on_preview;
  const std::atomic<bool>* preview_enabled = nullptr;
  // Debug dumps: every named intermediate (token ids, prompt embeddings, DiT output and latents
  // per step, model internals) whose name contains dump_filter is written to
  // <dump_dir>/<name>.npy. Empty dump_dir = no dumps. Trusted input: never take it from a client.
  std::string dump_dir;
  std::string dump_filter;
};

// What the loaded model accepts.
struct EngineInfo {
  std::string device;      // backend description
  std::string precision;   // "bf16", "fp8" or "f32"
  std::string fp8_layers;  // precision fp8: the DiT linears in FP8 ("qkv,out,w13,w2,refiners")
  int size_multiple = 16;  // width and height must be multiples of this (VAE factor x patch)
  int vae_factor = 8;      // image pixels per latent pixel
  int latent_channels = 16;
  int max_side = 4096;
  int max_batch = 16;
  std::string weights = "bf16";
  std::string memory_plan;  // what the planner decided (resident / streamed, bytes)
};

// What one step of the shared batch finished (Engine::batch_step).
struct BatchOutcome {
  uint64_t id = 0;
  Result<GenerateResult> result = Status(ErrorCode::kInternal, "not run");
};

class Engine {
 public:
  // Opens the model folder, picks the device, loads and uploads every weight. Errors name the
  // file, tensor or option at fault (a missing folder: kNotFound; a bad option: kInvalidArgument;
  // no CUDA device when "cuda" was asked: kUnsupported).
  static Result<std::unique_ptr<Engine>> load(const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Checks every field of `req` against the model and the limits, without running anything;
  // the error (kInvalidArgument) names the field: "width: 1000 is not a multiple of 16".
  // generate() runs the same check first. Thread-safe.
  Status validate(const GenerateRequest& req) const;

  // Runs one request to completion (or until cancelled). Serialised: concurrent calls wait.
  Result<GenerateResult> generate(const GenerateRequest& req, const GenerateHooks& hooks = {});

  EngineInfo info() const;
  // Reads (through the engine's LoRA cache) and checks `loras` as a request's LoRAs would be:
  // files, key layouts, keys matching transformer weights, shapes; applies nothing. Thread-safe
  // (the server checks requests as they arrive). Errors name the file and key.
  Status check_loras(const std::vector<LoraSpec>& loras) const;

  // ---- continuous batching (for a server's step scheduler) ----------------------------------
  // Requests of one image size share each DiT forward, joining and leaving at step boundaries:
  // nobody waits for a whole batch to drain. A request's image does not depend on its company in
  // what the engine controls: its noise comes from its own generator, its prompt is encoded
  // alone, and its scheduler and CFG arithmetic are its own (the DiT's GEMMs see more rows; see
  // docs/SERVER.md for the measured difference). Drive it from one thread; generate() calls from
  // other threads interleave between steps.
  //
  // Validates `req`, tokenizes and encodes its prompts and draws its noise (the text encoder
  // runs now); the request then takes part in the next batch_step() calls. `hooks` work as in
  // generate(): per-step progress, the cancel flag (polled before each step), dumps.
  Result<uint64_t> batch_add(const GenerateRequest& req, const GenerateHooks& hooks = {});
  // One denoising step for every active request of one image size (that of the oldest request),
  // as one DiT forward. Requests whose cancel flag is set leave first (kCancelled); requests that
  // took their last step are VAE-decoded and returned; an error of the step itself fails the
  // requests that took part in it, and only them.
  std::vector<BatchOutcome> batch_step();
  // Requests added and not yet returned by batch_step().
  int batch_active() const;

  // Device memory the engine holds through its allocator (0 on the CPU): live tensors, what it
  // keeps from the driver (live + cached), and the live peak. The CUDA context and library
  // workspaces are not included. Safe from any thread, also during generate().
  struct Memory {
    uint64_t in_use_bytes = 0;
    uint64_t reserved_bytes = 0;
    uint64_t peak_in_use_bytes = 0;
  };
  Memory memory() const;

 private:
  struct Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  static Result<std::unique_ptr<Engine>> load_impl(const EngineOptions& options);
  Status validate_impl(const GenerateRequest& req) const;
  Result<GenerateResult> generate_impl(const GenerateRequest& req, const GenerateHooks& hooks);
  std::unique_ptr<Impl> impl_;
};

// ---- several engines (data parallel: one engine per device, e.g. zimage serve --devices) -------
// CUDA devices this process can use; 0 without CUDA support, a driver or a GPU.
int cuda_device_count();
// A device list, one device per engine: "cuda:0,cuda:1", "all" (every device cuda_device_count()
// reports), "cpu,cpu", "cuda:0-3". Items are cpu, cuda (= cuda:0), cuda:N or a range cuda:A-B
// (A <= B), comma-separated, at most 64 devices;
// "cuda" comes back as "cuda:0". A device may repeat (engines sharing one GPU); cpu and cuda
// items may not mix (an image would depend on which engine ran it). Errors (kInvalidArgument)
// name the item at fault and its position; "all" without a GPU is kUnsupported.
Result<std::vector<std::string>> parse_device_list(const std::string& list);
// Loads one engine per entry of `devices` with `options` (its `device` replaced), engines on
// different devices at the same time, engines sharing a device one after another (so the
// second plans its memory with the first one's weights already resident). All or nothing: the
// first failure in list order is returned, naming the device and the engine's position (with
// one device: Engine::load's error as it is).
Result<std::vector<std::unique_ptr<Engine>>> load_engines(const EngineOptions& options,
                                                          const std::vector<std::string>& devices);
// Splits `req`'s images (prompts x images_per_prompt, in result order) into at most `parts`
// contiguous runs, sizes differing by at most one (the larger first), one request each with
// first_image set: run part k on engine k and concatenate the images in part order, and each
// image is the one `req` makes at its index (same prompt, same noise; the DiT and the text
// encoder see fewer rows, so their GEMMs may round a few values differently: 1/255 on the CPU).
// Fewer parts than asked when there are fewer images; {req} itself for parts <= 1.
std::vector<GenerateRequest> split_batch(const GenerateRequest& req, int parts);

// ---- image files --------------------------------------------------------------------------------
// (keyword, UTF-8 value) pairs stored as PNG iTXt chunks, e.g. {"prompt", "a red fox"}.
using PngTextChunks = std::vector<std::pair<std::string, std::string>>;
// The text chunks zimage writes into image `image_index` of `req`'s result (as `zimage generate`
// and `zimage serve` do): prompt, negative_prompt, seed, batch_index, steps, guidance, the CFG
// options when set, size and software version. Never a path or a key.
PngTextChunks png_metadata(const GenerateRequest& req, size_t image_index);
// Encodes `image` as a PNG in memory (for a server response). kInvalidArgument for an image whose
// rgb size does not match width*height*3, a keyword PNG does not allow, or a compression level
// outside 0..9 (zlib's levels; the default 1 is 4-9x faster than zlib's default 6 on a generated
// 1024x1024 image for 12-17 % more bytes).
inline constexpr int kPngCompression = 1;
Result<std::vector<uint8_t>> png_encode(const Image& image, const PngTextChunks& text = {},
                                        int compression = kPngCompression);
// png_encode, then writes `path` (replacing it); kIo names the path when it cannot be written.
Status png_save(const std::string& path, const Image& image, const PngTextChunks& text = {},
                int compression = kPngCompression);
// Reads a PNG file as 8-bit RGB (alpha dropped); its text chunks into `text` when non-null.
Result<Image> png_load(const std::string& path, PngTextChunks* text = nullptr);

// Image inputs (init_image, mask), read as diffusers.utils.load_image reads them: PNG, JPEG or
// WebP (told by content), EXIF / XMP orientation applied as PIL's ImageOps.exif_transpose,
// converted to RGB as PIL's convert("RGB") (gray replicated, alpha dropped). Refused with a
// message naming the file: other formats, 16-bit grayscale PNG, CMYK JPEG, animated WebP,
// corrupt or truncated data, more than 2^26 pixels (from the header, before decoding).
Result<Image> image_load(const std::string& path);
Result<Image> image_decode(const uint8_t* data, size_t size, const std::string& name);
// An image with the channels its file has, as PIL opens it: 1 gray ("L"), 2 gray + alpha ("LA"),
// 3 RGB, 4 RGBA; rows top to bottom, pixels.size() == width * height * channels. For callers that
// need the alpha channel (the server's masks); everything else takes Image.
struct ImagePixels {
  int width = 0;
  int height = 0;
  int channels = 0;
  std::vector<uint8_t> pixels;
};
// image_decode with the file's channels (orientation applied; the same checks and messages).
Result<ImagePixels> image_decode_pixels(const uint8_t* data, size_t size, const std::string& name);
// PIL's convert("RGB"): gray replicated, alpha dropped (not composited).
Result<Image> image_to_rgb(const ImagePixels& image);
// PIL's convert("L"): ITU-R 601-2 luma in PIL's fixed point, alpha dropped; gray stays as it is.
Result<ImagePixels> image_to_gray(const ImagePixels& image);
// A mask file: as image_load, but a file with an alpha channel is refused (transparency or
// colour would be a guess; OpenAI-style transparent-means-edit masks are the server's
// /v1/images/edits concern). Gray masks come back as RGB with R = G = B.
Result<Image> mask_load(const std::string& path);

// Writes contents[i] to paths[i], all or nothing: each file goes to a temporary sibling first
// (flushed to disk), and only when every one was written are they renamed into place. A failed
// write (full disk: "No space left on device") removes only the temporaries; existing files are
// untouched. An existing device or FIFO (/dev/stdout) is written in place, never replaced.
Status write_files_atomically(const std::vector<std::string>& paths,
                              const std::vector<std::vector<uint8_t>>& contents);
// Checks, before any work, that `path` can be written: its folder exists and accepts a new file,
// and it is not a folder. `what` names it in messages ("--output"): kInvalidArgument for a path
// of the wrong kind, kIo when the folder refuses (read-only, no permission).
Status check_writable_path(const std::string& path, const std::string& what);

// Engine messages on stderr: 0 errors only, 1 warnings (default; env ZIMAGE_LOG overrides),
// 2 info (load and per-phase times), 3 debug.
void set_log_verbosity(int level);
// The level in force (0-3, as above).
int log_verbosity();

}  // namespace zimage
