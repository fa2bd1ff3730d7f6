// zimage bench --lora FILE: per-request LoRA costs of the two runtime methods (model/
// lora_runtime.h) on one loaded pipeline, to choose LoraMethod::kAuto's rule from numbers:
//   switch    applying the set to the base model and taking it off again (synchronised), median
//   image     one whole image (text encoder, --steps DiT forwards, VAE) with the set applied:
//             the first one after applying it (re-recording the DiT's CUDA graph where side GEMMs
//             came in) and the steady median
//   alternate requests alternating between the LoRA and the base model, each paying its switch:
//             the cost per request a server sees when consecutive requests differ
// and the same image without LoRA. The verdict line names the faster method per request.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench/common.h"
#include "io/lora/lora.h"
#include "model/adapters/lora_runtime.h"

namespace zimage::bench {
namespace {

// This mode's failures say which mode failed.
[[noreturn]] void lora_fail(const Status& s) {
  fail(s, "zimage bench --lora");
}
void lora_check(const Status& s) {
  if (!s.ok()) lora_fail(s);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double gib(uint64_t b) {
  return static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0);
}

// The loaded pipeline, the LoRA set, and how to time an image and a switch.
struct LoraRun {
  const Options& o;
  std::unique_ptr<Backend> be;
  std::unique_ptr<TextToImage> pipe;
  std::vector<RuntimeLora> set;
  int64_t max_rank = 0;
  GenerateRequest req;

  double image() {
    const double s = now_s();
    auto out = pipe->run(req, {});
    if (!out.ok()) lora_fail(out.status());
    lora_check(be->synchronize());
    return now_s() - s;
  }
  double use(const std::vector<RuntimeLora>& l, LoraMethod m) {
    const double s = now_s();
    lora_check(pipe->transformer().set_loras(l, m, false));
    lora_check(be->synchronize());
    return now_s() - s;
  }
};

// The pipeline on a new backend and the LoRA file read, both timed.
void load(LoraRun& run, const std::string& dir, json& R) {
  const Options& o = run.o;
  auto b = make_backend(o.device, DType::kBF16, o.threads);
  if (!b.ok()) lora_fail(b.status());
  run.be = std::move(*b);
  PipelineLoadOptions lo;
  lo.fp8_weights = o.weights == "fp8";
  double t0 = now_s();
  auto pipe = TextToImage::load(dir, *run.be, lo);
  if (!pipe.ok()) lora_fail(pipe.status());
  run.pipe = std::move(*pipe);
  run.pipe->set_float_image(false);  // as the engine runs it
  R["device"] = run.be->name();
  R["weights"] = o.weights;
  R["load_s"] = now_s() - t0;

  t0 = now_s();
  auto file = read_lora(o.lora, 1.0f);
  if (!file.ok()) lora_fail(file.status());
  R["lora"] = o.lora;
  R["lora_read_ms"] = (now_s() - t0) * 1e3;
  for (const LoraPatch& p : file->patches) run.max_rank = std::max(run.max_rank, p.rank);
  R["lora_patches"] = file->patches.size();
  R["lora_rank"] = run.max_rank;
  run.set = {{std::make_shared<const LoraFile>(std::move(*file)), o.lora_scale}};
  std::fprintf(stderr, "bench --lora: loaded in %.1f s on %s; %zu patches, rank %lld\n",
               R["load_s"].get<double>(), run.be->name().c_str(), run.set[0].file->patches.size(),
               static_cast<long long>(run.max_rank));
}

// One method's figures: switch times, images with the set applied, alternating requests.
json measure_method(LoraRun& run, LoraMethod m) {
  const int iters = run.o.iters;
  ZImageDiT& dit = run.pipe->transformer();
  json j;
  std::vector<double> apply, remove;
  for (int i = 0; i < iters; ++i) {
    apply.push_back(run.use(run.set, m));
    if (i == 0) {
      j["merged_weights"] = dit.applied_loras().merged_weights;
      j["side_weights"] = dit.applied_loras().side_weights;
      const Backend::MemoryUse mu = run.be->memory_use();
      j["device_in_use_gib_applied"] = gib(mu.in_use);
    }
    remove.push_back(run.use({}, m));
  }
  j["apply_ms"] = median(apply) * 1e3;
  j["remove_ms"] = median(remove) * 1e3;
  // Images with the set applied: the first pays any graph re-recording.
  run.use(run.set, m);
  j["first_image_s"] = run.image();
  std::vector<double> steady;
  for (int i = 0; i < iters; ++i) steady.push_back(run.image());
  j["image_s"] = median(steady);
  run.use({}, m);
  // Alternating requests: LoRA, base, LoRA, base ... each with its switch.
  std::vector<double> alt;
  run.image();  // the base graph back in place
  for (int i = 0; i < iters; ++i) {
    double s = run.use(run.set, m);
    s += run.image();
    alt.push_back(s);
    s = run.use({}, m);
    s += run.image();
    alt.push_back(s);
  }
  j["alternating_request_s"] = median(alt);
  std::fprintf(stderr,
               "bench --lora: %s: apply %.1f ms, remove %.1f ms, image %.3f s (first %.3f s), "
               "alternating %.3f s/request\n",
               lora_method_name(m), j["apply_ms"].get<double>(), j["remove_ms"].get<double>(),
               j["image_s"].get<double>(), j["first_image_s"].get<double>(),
               j["alternating_request_s"].get<double>());
  return j;
}

void print_lora_report(const LoraRun& run, const json& R) {
  const Options& o = run.o;
  const json& methods = R["methods"];
  std::printf("\nPer-request LoRA, %d² x %d steps, %s weights, rank %lld, %s\n\n", o.sizes.front(),
              o.steps, o.weights.c_str(), static_cast<long long>(run.max_rank),
              run.be->name().c_str());
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
  emit_json(o, R, "zimage bench --lora");
}

}  // namespace

void run_lora_bench(const Options& o, const std::string& dir) {
  json R;
  LoraRun run{o, {}, {}, {}, 0, {}};
  load(run, dir, R);
  run.req.prompts = {kPrompt};
  run.req.width = run.req.height = o.sizes.front();
  run.req.steps = o.steps;
  run.req.seed = 1;

  // The base model: warm (graphs recorded), then the steady median.
  run.image();
  std::vector<double> base;
  for (int i = 0; i < o.iters; ++i) base.push_back(run.image());
  R["base_image_s"] = median(base);

  json methods = json::object();
  for (LoraMethod m : {LoraMethod::kMerge, LoraMethod::kSide})
    methods[lora_method_name(m)] = measure_method(run, m);
  R["methods"] = methods;
  const json& mg = methods["merge"];
  const json& sd = methods["side"];
  const double merge_req = mg["alternating_request_s"].get<double>();
  const double side_req = sd["alternating_request_s"].get<double>();
  R["faster_when_alternating"] = merge_req <= side_req ? "merge" : "side";
  R["faster_same_set"] =
      mg["image_s"].get<double>() <= sd["image_s"].get<double>() ? "merge" : "side";
  print_lora_report(run, R);
}

}  // namespace zimage::bench
