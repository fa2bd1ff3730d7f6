// `zimage bench --fp8-quality GROUPS...`: what --precision fp8 costs in quality and buys in speed,
// per group of DiT linears (model/common/linear.h Fp8Layers), each row a fresh load of the same
// folder:
//   * DiT output against the bf16 model at three timesteps (t = 0.9, 0.5, 0.1, the same latents
//     and caption features): the smallest cosine and the largest relative L2 error;
//   * the whole image (seed 42, --steps) against the bf16 image: PSNR and max |diff| in 1/255;
//   * DiT forward and whole-image time (medians) and the peak of live tensors.
// Run it on a folder with outlier channels too (make-random-model --outlier-channels): plain
// Gaussian weights flatter quantisation.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/common.h"

namespace zimage::bench {
namespace {

struct Quality {
  double cosine = 1, rel_l2 = 0;
};

Quality compare(const Tensor& ref, const Tensor& got) {
  double ab = 0, aa = 0, bb = 0, dd = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double x = ref.data_as<float>()[i], y = got.data_as<float>()[i];
    ab += x * y, aa += x * x, bb += y * y, dd += (x - y) * (x - y);
  }
  return {ab / std::sqrt(aa * bb), std::sqrt(dd / aa)};
}

Tensor to_host(Backend& be, const Tensor& t) {
  Tensor h = Tensor::host(DType::kF32, t.shape());
  if (!h.defined()) fail(OutOfMemory("host copy of " + t.describe()));
  check(be.download(t, h));
  return h;
}

// PSNR (dB) and max |diff| in 1/255 of `image` against `ref` into `row`.
void image_quality(const Tensor& ref, const Tensor& image, json& row) {
  double se = 0, mx = 0;
  for (int64_t i = 0; i < image.numel(); ++i) {
    const double d = static_cast<double>(image.data_as<float>()[i]) - ref.data_as<float>()[i];
    se += d * d;
    mx = std::max(mx, std::fabs(d));
  }
  const double mse = se / static_cast<double>(image.numel());
  row["image_psnr_db"] = mse > 0 ? 10.0 * std::log10(1.0 / mse) : 999.0;
  row["image_max_diff_255"] = mx * 255.0;
}

// The bf16 reference: DiT outputs per timestep (host f32) and the image.
struct Reference {
  std::vector<Tensor> out;
  Tensor image;
};

// One configuration's row on a fresh load (bits == 0: bf16, which fills `ref`).
json quality_row(const Options& o, const std::string& dir, const std::string& name, unsigned bits,
                 Reference& ref) {
  const int res = o.sizes.front();
  const std::vector<float> ts{0.9f, 0.5f, 0.1f};
  WeightPlacement place;
  place.fp8_compute = bits;
  auto loaded = load_all(dir, o.device, DType::kBF16, o.threads, place);
  if (!loaded.ok()) fail(loaded.status());
  Loaded& L = *loaded;
  Backend& be = *L.be;
  L.pipe->set_float_image(true);  // the PSNR below compares the f32 images
  auto ids = encode_prompt(*L.tok, kPrompt, 512);
  if (!ids.ok()) fail(ids.status());
  auto caps = L.te->encode({*ids});
  if (!caps.ok()) fail(caps.status());
  const int fac = L.pipe->vae_factor();
  const Tensor lat = random_latents(be, 1, 1, res, fac);
  json row{{"layers", name}, {"load_s", L.load_s}};
  Quality worst;
  for (size_t i = 0; i < ts.size(); ++i) {
    Tensor out;
    check(L.dit->forward(lat, {ts[i]}, *caps, out));
    Tensor h = to_host(be, out);
    if (bits == 0) {
      ref.out.push_back(h);
      continue;
    }
    const Quality q = compare(ref.out[i], h);
    worst.cosine = std::min(worst.cosine, q.cosine);
    worst.rel_l2 = std::max(worst.rel_l2, q.rel_l2);
    row["dit_cosine_t" + std::to_string(ts[i]).substr(0, 3)] = q.cosine;
  }
  row["dit_cosine_min"] = worst.cosine;
  row["dit_rel_l2_max"] = worst.rel_l2;
  Tensor out;
  be.reset_peak_memory();
  row["dit_ms"] =
      timed(be, 2, o.iters, [&] { return L.dit->forward(lat, {0.5f}, *caps, out); }).median_ms;
  GenerateRequest req;
  req.prompts = {kPrompt};
  req.width = req.height = res;
  req.steps = o.steps;
  req.seed = 42;
  Tensor image;
  row["image_ms"] = timed(be, 1, std::max(2, o.iters / 2), [&]() -> Status {
                      auto r = L.pipe->run(req, {});
                      if (!r.ok()) return r.status();
                      image = r->image;
                      return Status::Ok();
                    }).median_ms;
  row["alloc_peak_gib"] = alloc_counters(be).peak_gib;
  if (bits == 0) {
    ref.image = image;
  } else {
    image_quality(ref.image, image, row);
  }
  std::fprintf(stderr, "bench: fp8 quality [%s]: DiT %.1f ms, image %.0f ms\n", name.c_str(),
               row["dit_ms"].get<double>(), row["image_ms"].get<double>());
  return row;
}

void print_quality_table(int res, const json& rows) {
  std::printf(
      "| DiT linears in FP8 (W8A8) | DiT cosine (min over t) | DiT rel. L2 (max) | image PSNR | "
      "image max diff (/255) | DiT forward %d² | image | GiB in tensors (peak) |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- |\n",
      res);
  const double bf16_dit = rows[0]["dit_ms"].get<double>();
  for (const json& r : rows) {
    const bool ref = r["layers"] == "bf16";
    char q[160] = "reference | - | - | -";
    if (!ref)
      std::snprintf(q, sizeof q, "%.5f | %.2e | %.1f dB | %.0f", r["dit_cosine_min"].get<double>(),
                    r["dit_rel_l2_max"].get<double>(), r["image_psnr_db"].get<double>(),
                    r["image_max_diff_255"].get<double>());
    std::printf("| %s | %s | %.1f ms (%.2fx) | %.0f ms | %.1f |\n",
                ref ? "none (bf16)" : r["layers"].get<std::string>().c_str(), q,
                r["dit_ms"].get<double>(), bf16_dit / r["dit_ms"].get<double>(),
                r["image_ms"].get<double>(), r["alloc_peak_gib"].get<double>());
  }
}

}  // namespace

void run_fp8_quality(const Options& o, const std::string& dir, json& R) {
  std::vector<std::pair<std::string, unsigned>> configs{{"bf16", 0u}};
  for (const std::string& g : o.fp8_groups) {
    auto bits = parse_fp8_layers(g);
    if (!bits.ok()) fail(bits.status());
    configs.emplace_back(fp8_layers_string(*bits), *bits);
  }
  Reference ref;
  json rows = json::array();
  for (const auto& [name, bits] : configs) rows.push_back(quality_row(o, dir, name, bits, ref));
  R["fp8_quality"] = rows;
  print_quality_table(o.sizes.front(), rows);
}

}  // namespace zimage::bench
