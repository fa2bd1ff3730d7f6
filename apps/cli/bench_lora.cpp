// zimage bench --lora FILE: per-request LoRA costs of the two runtime methods (model/
// lora_runtime.h) on one loaded pipeline, to choose LoraMethod::kAuto's rule from numbers:
//   switch    applying the set to the base model and taking it off again (synchronised), median
//   image     one whole image (text encoder, --steps DiT forwards, VAE) with the set applied:
//             the first one after applying it (re-recording the DiT's CUDA graph where side GEMMs
//             came in) and the steady median
//   alternate requests alternating between the LoRA and the base model, each paying its switch:
//             the cost per request a server sees when consecutive requests differ
// and the same image without LoRA. The verdict line names the faster method per request.
#include "bench_lora.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/fs/file_io.h"
#include "io/lora/lora.h"
#include "model/adapters/lora_runtime.h"
#include "pipeline/text_to_image.h"

namespace zimage::cli {
namespace {

using json = nlohmann::json;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

[[noreturn]] void fail(const Status& s) {
  std::fprintf(stderr, "zimage bench --lora: %s\n", s.to_string().c_str());
  throw CLI::RuntimeError(1);
}
void check(const Status& s) {
  if (!s.ok()) fail(s);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double gib(uint64_t b) {
  return static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0);
}

}  // namespace

void run_lora_bench(const LoraBenchOptions& o) {
  json R;
  std::unique_ptr<Backend> be;
  if (o.device == "cpu") {
    auto b = create_cpu_backend(o.threads);
    if (!b.ok()) fail(b.status());
    be = std::move(*b);
  } else {
    auto b = make_cuda_backend(0, DType::kBF16);
    if (!b.ok()) fail(b.status());
    be = std::move(*b);
  }
  PipelineLoadOptions lo;
  lo.fp8_weights = o.weights == "fp8";
  double t0 = now_s();
  auto pipe = TextToImage::load(o.model_dir, *be, lo);
  if (!pipe.ok()) fail(pipe.status());
  R["device"] = be->name();
  R["weights"] = o.weights;
  R["load_s"] = now_s() - t0;
  ZImageDiT& dit = (*pipe)->transformer();

  t0 = now_s();
  auto file = read_lora(o.lora, 1.0f);
  if (!file.ok()) fail(file.status());
  R["lora"] = o.lora;
  R["lora_read_ms"] = (now_s() - t0) * 1e3;
  int64_t max_rank = 0;
  for (const LoraPatch& p : file->patches) max_rank = std::max(max_rank, p.rank);
  R["lora_patches"] = file->patches.size();
  R["lora_rank"] = max_rank;
  const std::vector<RuntimeLora> set = {
      {std::make_shared<const LoraFile>(std::move(*file)), o.scale}};
  std::fprintf(stderr, "bench --lora: loaded in %.1f s on %s; %zu patches, rank %lld\n",
               R["load_s"].get<double>(), be->name().c_str(), set[0].file->patches.size(),
               static_cast<long long>(max_rank));

  GenerateRequest req;
  req.prompts = {o.prompt};
  req.width = req.height = o.size;
  req.steps = o.steps;
  req.seed = 1;
  auto image = [&]() -> double {
    const double s = now_s();
    auto out = (*pipe)->run(req, {});
    if (!out.ok()) fail(out.status());
    check(be->synchronize());
    return now_s() - s;
  };
  auto use = [&](const std::vector<RuntimeLora>& l, LoraMethod m) -> double {
    const double s = now_s();
    check(dit.set_loras(l, m, false));
    check(be->synchronize());
    return now_s() - s;
  };

  // The base model: warm (graphs recorded), then the steady median.
  image();
  std::vector<double> base;
  for (int i = 0; i < o.iters; ++i) base.push_back(image());
  R["base_image_s"] = median(base);

  json methods = json::object();
  for (LoraMethod m : {LoraMethod::kMerge, LoraMethod::kSide}) {
    json j;
    std::vector<double> apply, remove;
    for (int i = 0; i < o.iters; ++i) {
      apply.push_back(use(set, m));
      if (i == 0) {
        j["merged_weights"] = dit.applied_loras().merged_weights;
        j["side_weights"] = dit.applied_loras().side_weights;
        const Backend::MemoryUse mu = be->memory_use();
        j["device_in_use_gib_applied"] = gib(mu.in_use);
      }
      remove.push_back(use({}, m));
    }
    j["apply_ms"] = median(apply) * 1e3;
    j["remove_ms"] = median(remove) * 1e3;
    // Images with the set applied: the first pays any graph re-recording.
    use(set, m);
    j["first_image_s"] = image();
    std::vector<double> steady;
    for (int i = 0; i < o.iters; ++i) steady.push_back(image());
    j["image_s"] = median(steady);
    use({}, m);
    // Alternating requests: LoRA, base, LoRA, base ... each with its switch.
    std::vector<double> alt;
    image();  // the base graph back in place
    for (int i = 0; i < o.iters; ++i) {
      double s = use(set, m);
      s += image();
      alt.push_back(s);
      s = use({}, m);
      s += image();
      alt.push_back(s);
    }
    j["alternating_request_s"] = median(alt);
    methods[lora_method_name(m)] = j;
    std::fprintf(stderr,
                 "bench --lora: %s: apply %.1f ms, remove %.1f ms, image %.3f s (first %.3f s), "
                 "alternating %.3f s/request\n",
                 lora_method_name(m), j["apply_ms"].get<double>(), j["remove_ms"].get<double>(),
                 j["image_s"].get<double>(), j["first_image_s"].get<double>(),
                 j["alternating_request_s"].get<double>());
  }
  R["methods"] = methods;
  const json& mg = methods["merge"];
  const json& sd = methods["side"];
  const double merge_req = mg["alternating_request_s"].get<double>();
  const double side_req = sd["alternating_request_s"].get<double>();
  R["faster_when_alternating"] = merge_req <= side_req ? "merge" : "side";
  R["faster_same_set"] =
      mg["image_s"].get<double>() <= sd["image_s"].get<double>() ? "merge" : "side";

  std::printf("\nPer-request LoRA, %d² x %d steps, %s weights, rank %lld, %s\n\n", o.size, o.steps,
              o.weights.c_str(), static_cast<long long>(max_rank), be->name().c_str());
  std::printf(
      "| method | apply | remove | s/image (first after apply) | s/image (steady) | s/request "
      "alternating with base | GiB in use applied |\n| --- | --- | --- | --- | --- | --- | --- "
      "|\n");
  for (const char* name : {"merge", "side"}) {
    const json& j = methods[name];
    std::printf("| %s | %.1f ms | %.1f ms | %.3f | %.3f | %.3f | %.2f |\n", name,
                j["apply_ms"].get<double>(), j["remove_ms"].get<double>(),
                j["first_image_s"].get<double>(), j["image_s"].get<double>(),
                j["alternating_request_s"].get<double>(),
                j["device_in_use_gib_applied"].get<double>());
  }
  std::printf("| none | - | - | - | %.3f | - | - |\n", R["base_image_s"].get<double>());
  std::printf("\nfaster per request when consecutive requests differ: %s; with one set kept: %s\n",
              R["faster_when_alternating"].get<std::string>().c_str(),
              R["faster_same_set"].get<std::string>().c_str());
  const std::string js = R.dump(1);
  if (!o.json_path.empty()) {
    const Status st = write_output_file(o.json_path, js + "\n");
    if (!st.ok()) fail(st);
  } else {
    std::printf("\n%s\n", js.c_str());
  }
}

}  // namespace zimage::cli
