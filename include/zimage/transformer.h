// Public C++ API of the drop-in transformer: zimage's Z-Image DiT called the way diffusers calls
// ZImageTransformer2DModel.forward, on memory the caller owns. The Python drop-in
// (zimage.torch.ZImageTransformer2DModel, python/zimage/torch.py) and the ComfyUI MODEL node sit
// on it; it runs the engine's own DiT (the one `zimage generate` runs), not a second one.
//
//   auto tr = zimage::Transformer::load({.path = "Z-Image-Turbo/transformer", .device = "cuda"});
//   zimage::TransformerCall call;
//   call.x = {view of latents [16, 1, H, W]};  call.t = view of [B];
//   call.cap_feats = {view of [L, 2560]};      call.out = {view of [16, 1, H, W]};
//   call.cuda_stream = torch's current stream;
//   zimage::Status st = (*tr)->forward(call);
//
// Memory: TensorView describes the caller's memory as DLPack does (pointer, dtype, shape,
// strides, device). On CUDA, inputs are read from and outputs written to the caller's device
// memory with device-to-device conversions into / out of the engine's own buffers (the DiT's
// CUDA-graph replay needs fixed buffers): no host round trip for x, cap_feats or out. The
// timesteps t (B numbers) are read on the host: a t in device memory costs one small
// device-to-host copy, which waits for the caller's stream to reach the call.
//
// Streams: the engine's stream first waits on an event recorded on `cuda_stream` (so inputs the
// caller wrote just before the call are seen), and `cuda_stream` then waits on an event recorded
// after the outputs are written: the call returns once the work is queued, and work the caller
// queues next on that stream sees the outputs (and may free or reuse the inputs). The CPU needs
// no stream: the call returns with the outputs written.
//
// Errors are values (zimage/status.h): a bad argument is kInvalidArgument naming it in field()
// ("x[1]", "t", "cap_feats[0]", "out[2]", "cuda_stream"). Nothing throws or aborts. One
// Transformer runs one call at a time (forward holds a mutex); any thread may call it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zimage/status.h"
#include "zimage/zimage.h"

namespace zimage {

enum class ElementType : uint8_t { kF32, kBF16, kF16 };
const char* element_type_name(ElementType t);  // "f32", "bf16", "f16"

// Where memory lives: the host, or CUDA device `index` (DLPack's kDLCPU / kDLCUDA). Pinned host
// memory (kDLCUDAHost) counts as the host.
struct MemoryDevice {
  enum class Kind : uint8_t { kCPU, kCUDA };
  Kind kind = Kind::kCPU;
  int index = 0;
};

// The caller's memory: `data` points at element [0, 0, ...] (DLPack's data + byte_offset).
// `strides` in elements per dimension (DLPack's strides); empty = contiguous row-major. The engine
// reads and writes row-major contiguous tensors only (strides of size-1 dimensions are ignored);
// make a strided tensor contiguous first.
struct TensorView {
  void* data = nullptr;
  ElementType dtype = ElementType::kF32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  MemoryDevice device;
};

struct TransformerOptions {
  // A diffusers model folder (its transformer/ is used), a transformer folder (config.json and
  // diffusion_pytorch_model*.safetensors), or one file holding a transformer: .safetensors in
  // diffusers, ComfyUI or original names (plain, scaled FP8, all-in-one checkpoints) or .gguf,
  // its config inferred from the tensor shapes (docs/FORMATS.md).
  std::string path;
  std::string device = "auto";     // "cpu", "cuda", "cuda:N", or "auto" (CUDA if usable)
  std::string precision = "auto";  // "auto" (bf16 on CUDA, f32 on CPU), "bf16", "f32", "fp8"
  std::string fp8_layers = "all";  // with precision fp8: EngineOptions::fp8_layers
  std::string weights = "bf16";    // "bf16" or "fp8": EngineOptions::weights
  std::vector<LoraSpec> loras;     // merged into the weights at load, in order
  bool lora_lenient = false;       // EngineOptions::lora_lenient
  int threads = 0;                 // CPU worker threads; 0 = all hardware threads
};

// The loaded model: diffusers' config values (what ZImageTransformer2DModel.config holds) and
// where it runs.
struct TransformerInfo {
  std::string device;     // backend description, e.g. "cuda:0 NVIDIA H200"
  MemoryDevice memory;    // where inputs and outputs must live
  std::string precision;  // "bf16", "fp8" or "f32"
  std::string source;     // what was loaded: "DIR/transformer (config.json)", ...
  int patch_size = 2;     // all_patch_size[0]
  int f_patch_size = 1;   // all_f_patch_size[0]
  int in_channels = 16;
  int dim = 3840;
  int n_layers = 30;
  int n_refiner_layers = 2;
  int n_heads = 30;
  int n_kv_heads = 30;
  float norm_eps = 1e-5f;
  bool qk_norm = true;
  int cap_feat_dim = 2560;
  float rope_theta = 256.0f;
  float t_scale = 1000.0f;
  std::vector<int> axes_dims;
  std::vector<int> axes_lens;
  int max_caption_tokens = 0;  // longest caption the RoPE tables place
};

// One forward: B = x.size() = cap_feats.size() = out.size() = t.shape[0].
struct TransformerCall {
  // Latents, each [in_channels, 1, H, W] (diffusers' [C, F, H, W], F = 1), H and W multiples of
  // the patch size; items may differ in size (each size runs as its own batch).
  std::vector<TensorView> x;
  // [B] (or a single number for every item): the model's timestep as ZImagePipeline passes it,
  // (1000 - T) / 1000 for the scheduler's T; the model multiplies it by t_scale. Host or device.
  TensorView t;
  // Caption features, each [L_i, cap_feat_dim] (the text encoder's hidden_states[-2] rows of the
  // real tokens), 1 <= L_i <= max_caption_tokens.
  std::vector<TensorView> cap_feats;
  // Outputs written here, each shaped as x[i]: the raw model output (diffusers' return value;
  // the pipeline negates it). Any of the three float types; may alias x[i].
  std::vector<TensorView> out;
  // cudaStream_t the work is ordered with (PyTorch's torch.cuda.current_stream().cuda_stream);
  // nullptr = the legacy default stream. Ignored on the CPU.
  void* cuda_stream = nullptr;
};

class Transformer {
 public:
  // Picks the device, reads the config (or infers it from a single file's tensors), loads and
  // uploads the weights. Errors name the option or file at fault (field() "path", "device",
  // "precision", "weights", "fp8_layers", "loras[i]", "threads").
  static Result<std::unique_ptr<Transformer>> load(const TransformerOptions& options);
  ~Transformer();
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  const TransformerInfo& info() const;
  // Checks every argument of `call` (dtypes, shapes against the config, strides, devices, the
  // stream's device) without running anything. forward() runs it first.
  Status validate(const TransformerCall& call) const;
  // Runs the DiT on the call's inputs and writes its outputs (see the top of this file).
  Status forward(const TransformerCall& call);

  struct Impl;

 private:
  explicit Transformer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zimage
