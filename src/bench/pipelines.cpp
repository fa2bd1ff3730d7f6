// zimage bench --pipeline t2i,img2img,inpaint,controlnet,controlnet-inpaint: time per image and
// peak GPU memory of the image-conditioned pipelines (issue 13), next to text-to-image, on one
// model folder (normally the full-size random-weight one) and a ControlNet (zimage
// make-random-model --controlnet writes a full-size 2.1 one). tools/diffusers_pipelines_bench.py
// measures diffusers' ZImageImg2ImgPipeline, ZImageInpaintPipeline, ZImageControlNetPipeline and
// ZImageControlNetInpaintPipeline the same way on the same folders and the same input files;
// scripts/gpu_run.sh stage `pipelines` runs both and puts them side by side.
//
// Per pipeline, one process, one loaded model: the DiT's recorded graphs and the allocator's idle
// memory are dropped first (a fresh start for that shape), then one warm-up image (its time is
// reported as first_call_s) and the median of --iters images, each a whole request as a user
// sends it: text encoder, VAE encoder (init image, masked image or control image), the denoising
// steps (fewer for img2img / inpainting: int(steps · strength)), VAE decode and RGB8 conversion.
// Memory: the driver's view (total - free, sampled every millisecond; context included) over the
// warm-up and the timed images, and the caching allocator's peaks (bytes in tensors, bytes held),
// what torch.cuda.max_memory_allocated / max_memory_reserved report for diffusers. The rows
// without a ControlNet run before the ControlNet is loaded, so their memory does not include it.
//
// Inputs: --init-image, --mask, --control-image, or generated ones at the image size written as
// PNG to --inputs-dir (default: a temporary folder): a colour gradient with a checker pattern, a
// white centre square half the side (white = repaint), and white circles and lines on black (an
// edge map).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/common.h"
#include "io/fs/file_io.h"
#include "io/image/png.h"
#include "pipeline/text_to_image.h"

namespace zimage::bench {
namespace {

namespace fs = std::filesystem;

constexpr const char* kOrder[] = {"t2i", "img2img", "inpaint", "controlnet", "controlnet-inpaint"};

bool uses_controlnet(const std::string& p) {
  return p.rfind("controlnet", 0) == 0;
}

// Deterministic inputs (integer arithmetic only), RGB row-major.
std::vector<uint8_t> init_picture(int w, int h) {
  std::vector<uint8_t> px(size_t{3} * w * h);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      uint8_t* p = &px[(size_t{1} * y * w + x) * 3];
      p[0] = static_cast<uint8_t>(x * 255 / std::max(1, w - 1));
      p[1] = static_cast<uint8_t>(y * 255 / std::max(1, h - 1));
      p[2] = ((x * 8 / w) + (y * 8 / h)) % 2 ? 200 : 60;
    }
  return px;
}

std::vector<uint8_t> mask_picture(int w, int h) {
  std::vector<uint8_t> px(size_t{3} * w * h, 0);
  for (int y = h / 4; y < h - h / 4; ++y)
    for (int x = w / 4; x < w - w / 4; ++x)
      std::fill_n(&px[(size_t{1} * y * w + x) * 3], 3, uint8_t{255});
  return px;
}

std::vector<uint8_t> control_picture(int w, int h) {
  std::vector<uint8_t> px(size_t{3} * w * h, 0);
  const int64_t cx = w / 2, cy = h / 2, line = std::max(1, std::min(w, h) / 128);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      const int64_t dx = x - cx, dy = y - cy, d2 = dx * dx + dy * dy;
      bool on = false;
      for (int64_t r : {int64_t{std::min(w, h)} / 6, int64_t{std::min(w, h)} / 3}) {
        const int64_t lo = (r - line) * (r - line), hi = (r + line) * (r + line);
        on = on || (d2 >= lo && d2 <= hi);
      }
      on = on || std::abs(x - y * w / std::max(1, h)) <= line || std::abs(y - h / 8) <= line;
      if (on) std::fill_n(&px[(size_t{1} * y * w + x) * 3], 3, uint8_t{255});
    }
  return px;
}

struct Inputs {
  std::string init, mask, control;  // paths
  Image init_image, mask_image, control_image;
};

Inputs make_inputs(const Options& o, int size) {
  Inputs in{o.init_image, o.mask, o.control_image, {}, {}, {}};
  std::string dir = o.inputs_dir;
  if (dir.empty())
    dir =
        (fs::temp_directory_path() / ("zimage-bench-inputs-" + std::to_string(getpid()))).string();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail(IoError("--inputs-dir " + dir + ": " + ec.message()));
  auto write = [&](std::string& path, const char* name, const std::vector<uint8_t>& px) {
    if (!path.empty()) return;
    path = (fs::path(dir) / name).string();
    check(write_png(path, px.data(), size, size, {}));
  };
  write(in.init, "init.png", init_picture(size, size));
  write(in.mask, "mask.png", mask_picture(size, size));
  write(in.control, "control.png", control_picture(size, size));
  auto read = [](const std::string& path, bool mask) {
    auto r = mask ? mask_load(path) : image_load(path);
    if (!r.ok()) fail(r.status().with_context(path));
    return std::move(r).value();
  };
  in.init_image = read(in.init, false);
  in.mask_image = read(in.mask, true);
  in.control_image = read(in.control, false);
  return in;
}

GenerateRequest make_request(const Options& o, const std::string& pipeline, const Inputs& in,
                             int size) {
  GenerateRequest req;
  req.prompts = {kPrompt};
  req.width = req.height = size;
  req.steps = o.steps;
  req.guidance = 0.0f;
  req.seed = 42;
  if (pipeline == "img2img" || pipeline == "inpaint" || pipeline == "controlnet-inpaint")
    req.init_image = in.init_image;
  if (pipeline == "inpaint" || pipeline == "controlnet-inpaint") req.mask = in.mask_image;
  if (pipeline == "img2img" || pipeline == "inpaint") req.strength = o.strength;
  if (uses_controlnet(pipeline)) {
    req.control_image = in.control_image;
    req.control_scale = o.control_scale;
  }
  return req;
}

std::string gib_str(const json& row, const char* key) {
  char b[32] = "";
  if (row.contains(key)) std::snprintf(b, sizeof b, "%.2f", row[key].get<double>());
  return b;
}

// One pipeline's row: a fresh start for its shape, one warm-up image, the median of --iters.
json pipeline_row(const Options& o, const std::string& name, const Inputs& in, int size, Backend& b,
                  TextToImage& pipe, DriverPeak& peak) {
  const GenerateRequest req = make_request(o, name, in, size);
  fresh_memory(b, pipe.transformer());
  b.reset_peak_memory();
  peak.reset();
  json row = {{"pipeline", name}, {"denoising_steps", denoising_steps(req)}};
  PhaseTimings last;
  auto run = [&]() -> Status {
    auto r = pipe.run(req, {});
    if (!r.ok()) return r.status();
    last = r->timings;
    return Status::Ok();
  };
  const double t0 = now_s();
  check(run());
  check(b.synchronize());
  row["first_call_s"] = now_s() - t0;
  const Stats s = timed(b, 0, o.iters, run);
  row["image_s"] = s.median_ms / 1e3;
  row["image_s_min"] = s.min_ms / 1e3;
  row["image_s_max"] = s.max_ms / 1e3;
  row["text_encoder_s"] = last.text_encoder_s;
  row["vae_encode_s"] = last.vae_encode_s;
  row["denoise_s"] = last.denoise_s();
  row["vae_decode_s"] = last.vae_s;
  const AllocCounters ac = alloc_counters(b);
  row["driver_peak_gib"] = static_cast<double>(peak.peak()) / (1024.0 * 1024 * 1024);
  row["alloc_peak_gib"] = ac.peak_gib;
  row["alloc_peak_reserved_gib"] = ac.reserved_peak_gib;
  std::fprintf(stderr, "bench: %s %.3f s / image (first call %.2f s)\n", name.c_str(),
               s.median_ms / 1e3, row["first_call_s"].get<double>());
  return row;
}

void print_pipeline_table(const Options& o, int size, const json& rows) {
  std::printf(
      "| pipeline (%d², %d steps) | denoising steps | s / image (median of %d) | min - max | first "
      "call s | VAE encode s | driver peak GiB | GiB in tensors (peak) | GiB reserved (peak) "
      "|\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
      size, o.steps, o.iters);
  for (const json& r : rows)
    std::printf("| %s | %d | %.3f | %.3f - %.3f | %.2f | %.3f | %s | %s | %s |\n",
                r["pipeline"].get<std::string>().c_str(), r["denoising_steps"].get<int>(),
                r["image_s"].get<double>(), r["image_s_min"].get<double>(),
                r["image_s_max"].get<double>(), r["first_call_s"].get<double>(),
                r["vae_encode_s"].get<double>(), gib_str(r, "driver_peak_gib").c_str(),
                gib_str(r, "alloc_peak_gib").c_str(),
                gib_str(r, "alloc_peak_reserved_gib").c_str());
  std::fflush(stdout);
}

}  // namespace

void run_pipeline_bench(const Options& o, const std::string& dir, json& R) {
  std::vector<std::string> todo;
  for (const char* p : kOrder)  // ControlNet rows last: the others run before it is loaded
    if (std::find(o.pipelines.begin(), o.pipelines.end(), p) != o.pipelines.end())
      todo.emplace_back(p);
  const bool need_cn = std::any_of(todo.begin(), todo.end(), uses_controlnet);
  if (need_cn && o.controlnet.empty())
    fail(InvalidArgument("--pipeline controlnet / controlnet-inpaint: give --controlnet PATH"));
  const int size = o.sizes.front();
  const Inputs in = make_inputs(o, size);

  auto be = make_backend(o.device, DType::kBF16, o.threads);
  if (!be.ok()) fail(be.status());
  Backend& b = **be;
  DriverPeak peak(b);
  PipelineLoadOptions lo;
  lo.plan_width = lo.plan_height = size;
  double t0 = now_s();
  auto pipe = TextToImage::load(dir, b, lo);
  if (!pipe.ok()) fail(pipe.status());
  (*pipe)->set_float_image(false);  // as the engine runs it
  check(b.finish_uploads());        // every copy landed: the time is the whole load
  R["load_s"] = now_s() - t0;
  R["device"] = b.name();
  R["size"] = size;
  R["steps"] = o.steps;
  R["strength"] = o.strength;
  R["control_scale"] = o.control_scale;
  R["iters"] = o.iters;
  R["prompt"] = kPrompt;
  R["inputs"] = {{"init_image", in.init}, {"mask", in.mask}, {"control_image", in.control}};
  if (need_cn) R["controlnet"] = o.controlnet;
  R["driver_gib_after_load"] = gpu_used_gib();
  std::fprintf(stderr, "bench: loaded %s in %.2f s on %s\n", dir.c_str(), R["load_s"].get<double>(),
               b.name().c_str());

  json rows = json::array();
  bool cn_loaded = false;
  for (const std::string& name : todo) {
    if (uses_controlnet(name) && !cn_loaded) {
      t0 = now_s();
      check((*pipe)->load_controlnet(o.controlnet));
      check(b.finish_uploads());
      R["controlnet_load_s"] = now_s() - t0;
      R["controlnet_version"] = (*pipe)->controlnet()->config().version;
      cn_loaded = true;
    }
    rows.push_back(pipeline_row(o, name, in, size, b, **pipe, peak));
  }
  R["pipelines"] = rows;
  print_pipeline_table(o, size, rows);
  if (!o.json_path.empty()) check(write_output_file(o.json_path, R.dump(1) + "\n"));
}

}  // namespace zimage::bench
