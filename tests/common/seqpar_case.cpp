#include "common/seqpar_case.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include "io/model/model_source.h"
#include "io/writers/random_model.h"
#include "io/weights/weights.h"
#include "model/common/load_util.h"
#include "model/dit/zimage_dit.h"

namespace zimage::test {

namespace {

Tensor random_host(const Shape& shape, std::mt19937& rng, float sd) {
  Tensor t = Tensor::host(DType::kF32, shape);
  std::normal_distribution<float> n(0.0f, sd);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = n(rng);
  return t;
}

Result<std::unique_ptr<ZImageDiT>> load_on(const TransformerConfig& cfg, const std::string& dir,
                                           Backend& be) {
  ZI_ASSIGN_OR_RETURN(WeightStore ws, WeightStore::open(dir));
  return ZImageDiT::load(cfg, ws, be);
}

Result<Tensor> to_host_f32(Backend& be, const Tensor& t) {
  Tensor h = Tensor::host(DType::kF32, t.shape());
  ZI_TRY(be.download(t, h));
  return h;
}

Result<Tensor> forward_on(ZImageDiT& dit, Backend& be, Communicator* comm, const DitInputs& in) {
  ZI_ASSIGN_OR_RETURN(Tensor lat, load::upload_host(be, in.latents, DType::kF32));
  std::vector<Tensor> caps;
  for (const Tensor& c : in.caps) {
    ZI_ASSIGN_OR_RETURN(Tensor d, load::upload_host(be, c, be.act_dtype()));
    caps.push_back(d);
  }
  Tensor out;
  if (comm != nullptr) {
    ZI_TRY(dit.forward_parallel(*comm, lat, in.t_model, caps, out));
  } else {
    ZI_TRY(dit.forward(lat, in.t_model, caps, out));
  }
  return to_host_f32(be, out);
}

}  // namespace

DitInputs random_dit_inputs(const TransformerConfig& cfg, int64_t h, int64_t w,
                            const std::vector<int64_t>& cap_lens, uint32_t seed) {
  std::mt19937 rng(seed);
  DitInputs in;
  const int64_t b = static_cast<int64_t>(cap_lens.size());
  in.latents = random_host({b, cfg.in_channels, h, w}, rng, 1.0f);
  for (int64_t i = 0; i < b; ++i) {
    in.t_model.push_back(0.2f + 0.6f * static_cast<float>(i) / static_cast<float>(b));
    in.caps.push_back(random_host({cap_lens[i], cfg.cap_feat_dim}, rng, 1.0f));
  }
  return in;
}

Result<Tensor> dit_forward_single(const TransformerConfig& cfg, const std::string& dir, Backend& be,
                                  const DitInputs& in, bool graphs) {
  ZI_TRY(be.bind_thread());
  ZI_ASSIGN_OR_RETURN(std::unique_ptr<ZImageDiT> dit, load_on(cfg, dir, be));
  dit->set_use_graphs(graphs);
  return forward_on(*dit, be, nullptr, in);
}

Result<std::vector<Tensor>> dit_forward_ranks(const TransformerConfig& cfg, const std::string& dir,
                                              const std::vector<Backend*>& backends,
                                              const std::vector<Communicator*>& comms,
                                              const DitInputs& in, bool graphs) {
  const size_t p = backends.size();
  if (comms.size() != p) return InvalidArgument("dit_forward_ranks: backends and comms differ");
  std::vector<Result<Tensor>> outs(p, Result<Tensor>(InternalError("rank did not run")));
  std::vector<std::thread> threads;
  for (size_t r = 0; r < p; ++r) {
    threads.emplace_back([&, r] {
      auto run = [&]() -> Result<Tensor> {
        Backend& be = *backends[r];
        ZI_TRY(be.bind_thread());
        auto dit = load_on(cfg, dir, be);
        if (!dit.ok()) {
          comms[r]->abort(dit.status());  // the others must not wait for this rank
          return dit.status();
        }
        (*dit)->set_use_graphs(graphs);
        return forward_on(**dit, be, comms[r], in);
      };
      outs[r] = run();
    });
  }
  for (std::thread& t : threads) t.join();
  std::vector<Tensor> result;
  for (size_t r = 0; r < p; ++r) {
    if (!outs[r].ok()) return outs[r].status();
    result.push_back(std::move(outs[r]).value());
  }
  return result;
}

Result<TransformerConfig> transformer_config(const std::string& model_dir) {
  ModelPaths paths;
  paths.model_dir = model_dir;
  ZI_ASSIGN_OR_RETURN(ModelSource src, ModelSource::open(paths));
  return src.configs().transformer;
}

Result<std::string> heads30_model_dir(const std::string& like_dir) {
  static std::mutex mu;
  static std::string made;
  std::lock_guard<std::mutex> lock(mu);
  if (!made.empty()) return made;
  ModelPaths paths;
  paths.model_dir = like_dir;
  ZI_ASSIGN_OR_RETURN(ModelSource src, ModelSource::open(paths));
  RandomModelOptions ro;
  ro.dit = src.configs().transformer;
  ro.dit.n_heads = ro.dit.n_kv_heads = 30;
  ro.dit.dim = 30 * 8;
  ro.dit.n_layers = 2;
  ro.dit.n_refiner_layers = 1;
  ro.dit.axes_dims = {4, 2, 2};  // sums to the head width
  ro.text_encoder = src.configs().text_encoder;
  ro.vae = src.configs().vae;
  ro.tokenizer_dir = like_dir + "/tokenizer";
  ro.dtype = DType::kF32;
  ro.seed = 30;
  ro.threads = 2;
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("zimage-heads30-" + std::to_string(::getpid())))
          .string();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  ZI_TRY(write_random_model(dir, ro));
  made = dir;
  static const std::string* to_remove = new std::string(dir);
  std::atexit([] {
    std::error_code e;
    std::filesystem::remove_all(*to_remove, e);
  });
  return made;
}

double max_abs(const Tensor& a) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    m = std::max(m, std::fabs(static_cast<double>(a.data_as<float>()[i])));
  return m;
}

}  // namespace zimage::test
