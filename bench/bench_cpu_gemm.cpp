// GEMM throughput of the CPU backend's matmul (validation + cblas_sgemm + bias pass) against a
// direct cblas_sgemm call on the same buffers, so the overhead of the op wrapper can be read off
// as the ratio of the two GFLOP/s counters. Shapes: tiny-model projections (dims 32-96, ~100
// tokens) where per-call overhead dominates, and full-model DiT shapes (K = N = 3840).
#include <benchmark/benchmark.h>

#include <memory>
#include <random>

#include "backend/backend.h"
#include "backend/cpu/cpu_gemm.h"

namespace {

using zimage::Backend;
using zimage::DType;
using zimage::Tensor;

Backend& backend() {
  static std::unique_ptr<Backend> be = zimage::make_cpu_backend(0);
  return *be;
}

Tensor random_tensor(zimage::Shape shape, uint32_t seed) {
  Tensor t = Tensor::host(DType::kF32, std::move(shape));
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = dist(gen);
  return t;
}

void set_counters(benchmark::State& state, int64_t m, int64_t n, int64_t k) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * m * n * k * 1e-9 * state.iterations(), benchmark::Counter::kIsRate);
}

// args: M, N, K
void BM_BackendMatmul(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  Tensor x = random_tensor({m, k}, 1), w = random_tensor({n, k}, 2), b = random_tensor({n}, 3);
  Tensor y = Tensor::host(DType::kF32, {m, n});
  for (auto _ : state) {
    zimage::Status s = backend().matmul(x, w, b, y);
    if (!s.ok()) {
      state.SkipWithError(s.to_string().c_str());
      break;
    }
    benchmark::DoNotOptimize(y.data());
  }
  set_counters(state, m, n, k);
}

void BM_DirectSgemm(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  backend();  // same OpenBLAS thread count as the backend benchmark
  Tensor x = random_tensor({m, k}, 1), w = random_tensor({n, k}, 2);
  Tensor y = Tensor::host(DType::kF32, {m, n});
  for (auto _ : state) {
    zimage::cpu::sgemm_nt(m, n, k, 1.0f, x.data_as<float>(), k, w.data_as<float>(), k, 0.0f,
                          y.data_as<float>(), n);
    benchmark::DoNotOptimize(y.data());
  }
  set_counters(state, m, n, k);
}

void Shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "N", "K"});
  b->Args({100, 32, 32});   // tiny model: q/k/v projection
  b->Args({128, 96, 96});   // tiny model: attention out
  b->Args({128, 256, 96});  // tiny model: MLP up
  b->Args({1024, 1024, 1024});
  b->Args({1024, 3840, 3840});   // DiT attention projection at 512² (N = 1024 tokens)
  b->Args({1024, 10240, 3840});  // DiT feed-forward w1
  b->Unit(benchmark::kMicrosecond);
  b->UseRealTime();
}

BENCHMARK(BM_BackendMatmul)->Apply(Shapes);
BENCHMARK(BM_DirectSgemm)->Apply(Shapes);

}  // namespace

BENCHMARK_MAIN();
