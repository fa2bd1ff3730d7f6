// zimage._zimage.Engine: the public Engine (include/zimage/zimage.h) for Python. Only plain
// types cross here (str, int, float, uint8 arrays [H, W, 3]); python/zimage/_engine.py turns the
// user's arguments (PIL images, prompt lists, LoRA forms) into them and checks what the engine
// cannot name (Python types). The GIL is released while the engine loads and generates; the
// engine serialises generate() itself, so Python threads may share one Engine.
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "zimage/zimage.h"

namespace zimage::python {

namespace {

using LoraList = std::vector<std::pair<std::string, float>>;
// An RGB image as the Python side hands it over: C-contiguous uint8 [H, W, 3] on the host.
using RgbIn = nb::ndarray<const uint8_t, nb::ndim<3>, nb::c_contig, nb::device::cpu>;
using RgbOut = nb::ndarray<nb::numpy, uint8_t, nb::ndim<3>>;

std::vector<LoraSpec> to_loras(const LoraList& list) {
  std::vector<LoraSpec> out;
  out.reserve(list.size());
  for (const auto& [path, scale] : list) out.push_back({path, scale});
  return out;
}

std::optional<Image> to_image(const std::optional<RgbIn>& in) {
  if (!in) return std::nullopt;
  Image image;
  image.height = static_cast<int>(in->shape(0));
  image.width = static_cast<int>(in->shape(1));
  image.rgb.resize(in->size());
  if (in->size() > 0) std::memcpy(image.rgb.data(), in->data(), in->size());
  return image;
}

RgbOut to_array(Image&& image) {
  auto* pixels = new std::vector<uint8_t>(std::move(image.rgb));
  nb::capsule owner(pixels, [](void* p) noexcept { delete static_cast<std::vector<uint8_t>*>(p); });
  const size_t shape[3] = {static_cast<size_t>(image.height), static_cast<size_t>(image.width), 3};
  return RgbOut(pixels->data(), 3, shape, owner);
}

// What on_step did during one generate() call: asked to stop (returned False), or raised.
struct StepState {
  nb::object on_step;
  std::atomic<bool> cancel{false};
  bool stopped_by_false = false;
  int stopped_at = 0;
  int total = 0;
  std::optional<nb::python_error> error;  // handled with the GIL held only
};

void on_progress(StepState& state, const Progress& p) {
  nb::gil_scoped_acquire gil;
  if (state.cancel.load()) return;
  // Ctrl-C while the engine runs: Python sees the signal here and the call stops at the next
  // step, raising KeyboardInterrupt.
  if (PyErr_CheckSignals() != 0) {
    state.error.emplace();
    state.cancel.store(true);
    return;
  }
  if (p.phase != Phase::kDenoise || p.step == 0 || !state.on_step.is_valid() ||
      state.on_step.is_none())
    return;
  try {
    nb::object answer = state.on_step(p.step, p.total);
    if (answer.ptr() == Py_False) {
      state.stopped_by_false = true;
      state.stopped_at = p.step;
      state.total = p.total;
      state.cancel.store(true);
    }
  } catch (nb::python_error& e) {
    state.error.emplace(std::move(e));
    state.cancel.store(true);
  }
}

struct PyEngine {
  std::unique_ptr<Engine> engine;
};

void init_engine(PyEngine* self, const std::string& model_dir, const std::string& dit_file,
                 const std::string& text_encoder_file, const std::string& vae_file,
                 const std::string& tokenizer_dir, const std::string& device,
                 const std::string& precision, const std::string& fp8_layers,
                 const std::string& weights, double vram_budget_gib, double host_memory_gib,
                 const std::string& streamed_weights, const std::string& vae_tiling, int threads,
                 const LoraList& loras, bool lora_lenient, const std::string& controlnet) {
  EngineOptions o;
  o.model_dir = model_dir;
  o.dit_file = dit_file;
  o.text_encoder_file = text_encoder_file;
  o.vae_file = vae_file;
  o.tokenizer_dir = tokenizer_dir;
  o.device = device;
  o.precision = precision;
  o.fp8_layers = fp8_layers;
  o.weights = weights;
  o.vram_budget_gib = vram_budget_gib;
  o.host_memory_gib = host_memory_gib;
  o.streamed_weights = streamed_weights;
  o.vae_tiling = vae_tiling;
  o.threads = threads;
  o.loras = to_loras(loras);
  o.lora_lenient = lora_lenient;
  o.controlnet = controlnet;
  Result<std::unique_ptr<Engine>> engine = [&] {
    nb::gil_scoped_release release;
    return Engine::load(o);
  }();
  if (!engine.ok()) raise_status(engine.status());
  new (self) PyEngine{std::move(engine).value()};
}

std::vector<RgbOut> generate(PyEngine& self, const std::vector<std::string>& prompts,
                             const std::optional<std::string>& negative_prompt, int width,
                             int height, int steps, float guidance, uint64_t seed,
                             int images_per_prompt, float cfg_truncation, float cfg_normalization,
                             int max_sequence_length, const std::optional<RgbIn>& init_image,
                             const std::optional<RgbIn>& mask, std::optional<double> strength,
                             const std::optional<RgbIn>& control_image, float control_scale,
                             const LoraList& loras, nb::object on_step) {
  GenerateRequest req;
  req.prompts = prompts;
  req.negative_prompt = negative_prompt;
  req.width = width;
  req.height = height;
  req.steps = steps;
  req.guidance = guidance;
  req.seed = seed;
  req.images_per_prompt = images_per_prompt;
  req.cfg_truncation = cfg_truncation;
  req.cfg_normalization = cfg_normalization;
  req.max_sequence_length = max_sequence_length;
  req.init_image = to_image(init_image);
  req.mask = to_image(mask);
  req.strength = strength;
  req.control_image = to_image(control_image);
  req.control_scale = control_scale;
  req.loras = to_loras(loras);

  StepState state;
  state.on_step = std::move(on_step);
  GenerateHooks hooks;
  hooks.cancel = &state.cancel;
  hooks.on_progress = [&state](const Progress& p) { on_progress(state, p); };
  Result<GenerateResult> result = [&] {
    nb::gil_scoped_release release;
    return self.engine->generate(req, hooks);
  }();
  if (state.error) {  // on_step raised (or Ctrl-C): that exception, as it was
    nb::python_error error = std::move(*state.error);
    state.error.reset();
    throw error;
  }
  if (state.stopped_by_false) {
    raise_status(Cancelled("cancelled: on_step returned False after step " +
                           std::to_string(state.stopped_at) + " of " +
                           std::to_string(state.total)));
  }
  if (!result.ok()) raise_status(result.status());
  std::vector<RgbOut> images;
  images.reserve(result->images.size());
  for (Image& image : result->images) images.push_back(to_array(std::move(image)));
  return images;
}

nb::dict info(const PyEngine& self) {
  // Without the GIL: were the engine to wait for a running generate(), whose on_step needs
  // the GIL, holding it here would deadlock.
  EngineInfo i;
  Engine::Memory mem;
  {
    nb::gil_scoped_release release;
    i = self.engine->info();
    mem = self.engine->memory();
  }
  nb::dict d;
  d["device"] = i.device;
  d["precision"] = i.precision;
  d["fp8_layers"] = i.fp8_layers;
  d["weights"] = i.weights;
  d["size_multiple"] = i.size_multiple;
  d["vae_factor"] = i.vae_factor;
  d["latent_channels"] = i.latent_channels;
  d["max_side"] = i.max_side;
  d["max_batch"] = i.max_batch;
  d["memory_plan"] = i.memory_plan;
  d["device_memory_in_use"] = mem.in_use_bytes;
  d["device_memory_reserved"] = mem.reserved_bytes;
  d["device_memory_peak"] = mem.peak_in_use_bytes;
  return d;
}

}  // namespace

void bind_engine(nb::module_& m) {
  nb::class_<PyEngine>(m, "Engine", "The native engine; use zimage.Engine.")
      .def("__init__", &init_engine, nb::arg("model_dir"), nb::arg("dit_file"),
           nb::arg("text_encoder_file"), nb::arg("vae_file"), nb::arg("tokenizer_dir"),
           nb::arg("device"), nb::arg("precision"), nb::arg("fp8_layers"), nb::arg("weights"),
           nb::arg("vram_budget_gib"), nb::arg("host_memory_gib"), nb::arg("streamed_weights"),
           nb::arg("vae_tiling"), nb::arg("threads"), nb::arg("loras"), nb::arg("lora_lenient"),
           nb::arg("controlnet"))
      .def("generate", &generate, nb::arg("prompts"), nb::arg("negative_prompt").none(),
           nb::arg("width"), nb::arg("height"), nb::arg("steps"), nb::arg("guidance"),
           nb::arg("seed"), nb::arg("images_per_prompt"), nb::arg("cfg_truncation"),
           nb::arg("cfg_normalization"), nb::arg("max_sequence_length"),
           nb::arg("init_image").none(), nb::arg("mask").none(), nb::arg("strength").none(),
           nb::arg("control_image").none(), nb::arg("control_scale"), nb::arg("loras"),
           nb::arg("on_step").none())
      .def("info", &info);
}

}  // namespace zimage::python
