// zimage bench --devices LIST --parallel sequence: the sequence-parallel scaling table
// (docs/PARALLEL.md). The transformer is loaded once per device; for each rank count P (1, 2, 4,
// 8, ... up to the list's length, and the length itself) one DiT forward per --sizes entry (one
// image, a 35-token caption of random features, t = 0.5) is timed over the first P devices, eager
// and recorded (CUDA graphs; P > 1 only over NCCL). P = 1 is the ordinary forward.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/comm.h"
#include "bench/common.h"
#include "io/model/model_source.h"
#include "model/common/load_util.h"
#include "pipeline/rng.h"

namespace zimage::bench {

namespace {

Result<std::unique_ptr<Backend>> backend_for(const std::string& device, int threads) {
  if (device == "cpu") return create_cpu_backend(threads);
  if (device == "cuda") return make_cuda_backend(0, DType::kBF16);
  if (device.rfind("cuda:", 0) == 0 && device.size() > 5 &&
      device.find_first_not_of("0123456789", 5) == std::string::npos)
    return make_cuda_backend(std::stoi(device.substr(5)), DType::kBF16);
  return InvalidArgument("--devices: '" + device + "' is not cpu, cuda or cuda:N");
}

struct Rank {
  std::unique_ptr<Backend> be;
  std::unique_ptr<ZImageDiT> dit;
  Tensor lat, out;
  std::vector<Tensor> caps;
};

// The transformer on every device of the list, one rank each.
std::vector<Rank> load_ranks(const Options& o, ModelSource& src) {
  const std::vector<std::string>& devices = o.parallel.devices;
  const TransformerConfig& cfg = src.configs().transformer;
  std::vector<Rank> ranks(devices.size());
  for (size_t r = 0; r < devices.size(); ++r) {
    auto be = backend_for(devices[r], o.threads);
    if (!be.ok()) fail(be.status());
    ranks[r].be = std::move(be).value();
    check(ranks[r].be->bind_thread());
    auto ws = src.open_weights("transformer");
    if (!ws.ok()) fail(ws.status());
    auto dit = ZImageDiT::load(cfg, *ws, *ranks[r].be);
    if (!dit.ok()) fail(dit.status());
    ranks[r].dit = std::move(dit).value();
    check(ranks[r].be->finish_uploads());
    std::fprintf(stderr, "bench: transformer loaded on %s\n", ranks[r].be->name().c_str());
  }
  return ranks;
}

// The same latents (seed 1) and random caption features (35 tokens) on every rank.
void upload_inputs(const TransformerConfig& cfg, int res, std::vector<Rank>& ranks) {
  const int fac = 8;  // Z-Image's VAE factor
  TorchCpuGenerator gen(1);
  auto lat = gen.randn({1, cfg.in_channels, res / fac, res / fac});
  if (!lat.ok()) fail(lat.status());
  Tensor cap = Tensor::host(DType::kF32, {35, cfg.cap_feat_dim});
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t i = 0; i < cap.numel(); ++i) cap.data_as<float>()[i] = nd(rng);
  for (Rank& rk : ranks) {
    check(rk.be->bind_thread());
    auto l = load::upload_host(*rk.be, *lat, DType::kF32);
    auto c = load::upload_host(*rk.be, cap, rk.be->act_dtype());
    if (!l.ok() || !c.ok()) fail(l.ok() ? c.status() : l.status());
    rk.lat = *l;
    rk.caps = {*c};
    rk.out = Tensor();
  }
}

// The communicators of the first p ranks: NCCL where asked (or, with auto, on distinct GPUs),
// else in-process copies.
struct Comms {
  std::unique_ptr<LocalCommGroup> local;
  std::vector<std::unique_ptr<Communicator>> owned;
  std::vector<Communicator*> comms;
};
void make_comms(const std::string& comm_kind, std::vector<Rank>& ranks, int p, Comms& c) {
  std::vector<Backend*> bes;
  for (int r = 0; r < p; ++r) bes.push_back(ranks[r].be.get());
  if (comm_kind == "nccl" ||
      (comm_kind == "auto" && nccl_available() && ranks[0].be->device() == Device::kCUDA)) {
    auto g = make_nccl_group(bes);
    if (!g.ok()) fail(g.status());
    c.owned = std::move(g).value();
    for (auto& x : c.owned) c.comms.push_back(x.get());
  } else {
    c.local = std::make_unique<LocalCommGroup>(p);
    for (int r = 0; r < p; ++r) {
      c.local->attach(r, bes[r]);
      c.comms.push_back(&c.local->comm(r));
    }
  }
}

// One sequence-parallel forward over the first p ranks, rank 0 on this thread.
Status parallel_step(std::vector<Rank>& ranks, const std::vector<Communicator*>& comms, int p,
                     const std::vector<float>& t) {
  std::vector<Status> st(p);
  std::vector<std::thread> th;
  for (int r = 1; r < p; ++r)
    th.emplace_back([&, r] {
      Rank& rk = ranks[r];
      st[r] = rk.be->bind_thread();
      if (st[r].ok()) st[r] = rk.dit->forward_parallel(*comms[r], rk.lat, t, rk.caps, rk.out);
      if (st[r].ok()) st[r] = rk.be->synchronize();
      if (!st[r].ok()) comms[r]->abort(st[r]);
    });
  st[0] = ranks[0].dit->forward_parallel(*comms[0], ranks[0].lat, t, ranks[0].caps, ranks[0].out);
  for (std::thread& x : th) x.join();
  for (const Status& s : st) ZI_TRY(s);
  return Status::Ok();
}

// The rows of one size: P = 1 (the ordinary forward, eager and recorded), then every count > 1.
void size_rows(const Options& o, int res, const std::vector<int>& counts, std::vector<Rank>& ranks,
               json& rows) {
  const std::vector<float> t{0.5f};
  double base_ms = 0, graphs_ms = 0;
  for (bool graphs : {false, true}) {  // P = 1: the ordinary forward
    ranks[0].dit->set_use_graphs(graphs);
    Rank& r0 = ranks[0];
    const Stats s =
        timed(*r0.be, 2, o.iters, [&] { return r0.dit->forward(r0.lat, t, r0.caps, r0.out); });
    (graphs ? graphs_ms : base_ms) = s.median_ms;
    json j = s.to_json();
    j.update({{"size", res}, {"ranks", 1}, {"comm", graphs ? "none, CUDA graphs" : "none"}});
    rows.push_back(j);
    std::fprintf(stderr, "bench: seqpar %d P=1%s %.1f ms\n", res, graphs ? " graphs" : "",
                 s.median_ms);
  }
  for (Rank& rk : ranks) rk.dit->set_use_graphs(false);
  for (int p : counts) {
    if (p == 1) continue;
    Comms c;
    make_comms(o.parallel.comm, ranks, p, c);
    for (bool graphs : {false, true}) {  // recorded only where the communicator allows it
      if (graphs && !c.comms[0]->recordable()) continue;
      for (int r = 0; r < p; ++r) ranks[r].dit->set_use_graphs(graphs);
      const Stats s =
          timed(*ranks[0].be, 2, o.iters, [&] { return parallel_step(ranks, c.comms, p, t); });
      json j = s.to_json();
      j.update({{"size", res},
                {"ranks", p},
                {"comm", c.comms[0]->name() + (graphs ? ", CUDA graphs" : "")},
                {"speedup_vs_eager_p1", base_ms / s.median_ms},
                {"speedup_vs_graphs_p1", graphs_ms / s.median_ms}});
      rows.push_back(j);
      std::fprintf(stderr, "bench: seqpar %d P=%d%s %.1f ms\n", res, p, graphs ? " graphs" : "",
                   s.median_ms);
    }
    for (int r = 0; r < p; ++r) ranks[r].dit->set_use_graphs(false);  // frees the recordings
  }
}

void print_seqpar_table(const json& rows) {
  std::printf(
      "\n| size | ranks | communicator | DiT forward ms (median) | vs P=1 eager | "
      "vs P=1 graphs |\n");
  std::printf("| --- | --- | --- | --- | --- | --- |\n");
  auto ratio = [](const json& j, const char* k) {
    char buf[32] = "-";
    if (j.contains(k)) std::snprintf(buf, sizeof buf, "%.2fx", j[k].get<double>());
    return std::string(buf);
  };
  for (const json& j : rows)
    std::printf("| %d² | %d | %s | %.1f | %s | %s |\n", j["size"].get<int>(), j["ranks"].get<int>(),
                j["comm"].get<std::string>().c_str(), j["median_ms"].get<double>(),
                ratio(j, "speedup_vs_eager_p1").c_str(), ratio(j, "speedup_vs_graphs_p1").c_str());
}

}  // namespace

void run_seqpar_bench(const Options& o, const std::string& dir, json& R) {
  ModelPaths paths;
  paths.model_dir = dir;
  auto src = ModelSource::open(paths);
  if (!src.ok()) fail(src.status());
  std::vector<Rank> ranks = load_ranks(o, *src);
  const int n = static_cast<int>(ranks.size());
  std::vector<int> counts;
  for (int p = 1; p <= n; p *= 2) counts.push_back(p);
  if (counts.back() != n) counts.push_back(n);

  json rows = json::array();
  for (int res : o.sizes) {
    upload_inputs(src->configs().transformer, res, ranks);
    check(ranks[0].be->bind_thread());
    size_rows(o, res, counts, ranks, rows);
  }
  R["sequence_parallel"] = rows;
  print_seqpar_table(rows);
}

}  // namespace zimage::bench
