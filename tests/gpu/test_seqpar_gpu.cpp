// Sequence parallelism on CUDA (docs/PARALLEL.md), label gpu:
//  * the in-process communicator with P = 2, 3 (and 4) ranks, each a CUDA backend of its own on
//    ONE GPU (device-to-device copies): collectives with uneven counts, and the DiT forward of the
//    tiny golden model (4 heads) and of a 30-head model (8, 8, 7, 7 over 4 ranks) against the
//    one-rank forward, in f32 (tight) and bf16 (stated tolerance), max errors printed;
//  * NCCL with P = 1 on one GPU (its collectives, and the forward through forward_parallel);
//  * NCCL with P = every visible GPU when there are at least 2 (else a visible skip), eager and
//    recorded into CUDA graphs.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <thread>

#include "backend/comm.h"
#include "common/npy.h"
#include "common/seqpar_case.h"
#include "gpu/cuda_test_util.h"
#include "model/common/load_util.h"

using namespace zimage;
using namespace zimage::test;

namespace {

std::string tiny_dir() {
  return std::string(ZIMAGE_GOLDEN_DIR) + "/v_turbo/model";
}

int gpu_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// P CUDA backends in dtype dt: on GPU 0 (all of them) or one per GPU.
std::vector<std::unique_ptr<Backend>> cuda_ranks(int p, DType dt, bool one_gpu) {
  std::vector<std::unique_ptr<Backend>> out;
  for (int r = 0; r < p; ++r) {
    auto be = make_cuda_backend(one_gpu ? 0 : r, dt);
    EXPECT_TRUE(be.ok()) << be.status().to_string();
    if (!be.ok()) return {};
    out.push_back(std::move(be).value());
  }
  return out;
}

std::vector<Backend*> ptrs(const std::vector<std::unique_ptr<Backend>>& v) {
  std::vector<Backend*> out;
  for (const auto& b : v) out.push_back(b.get());
  return out;
}

// all_to_all_v and all_gather_v with uneven (and empty) counts on every rank at once; each rank's
// result checked element by element against what it must hold.
void check_collectives(const std::vector<Backend*>& be, const std::vector<Communicator*>& comms) {
  const int p = static_cast<int>(be.size());
  auto count = [](int from, int to) -> int64_t { return (from * 3 + to * 5 + 1) % 4 * 1000; };
  auto value = [](int from, int to, int64_t k) {
    return static_cast<float>(100 * from + 10 * to + k % 7);
  };
  std::vector<std::string> errors(p);
  std::vector<std::thread> th;
  for (int r = 0; r < p; ++r) {
    th.emplace_back([&, r] {
      auto run = [&]() -> Status {
        Backend& b = *be[r];
        ZI_TRY(b.bind_thread());
        std::vector<int64_t> sc(p), rc(p);
        int64_t ns = 0, nr = 0;
        for (int j = 0; j < p; ++j) ns += sc[j] = count(r, j), nr += rc[j] = count(j, r);
        Tensor hs = Tensor::host(DType::kF32, {ns + 1});
        int64_t at = 0;
        for (int j = 0; j < p; ++j)
          for (int64_t k = 0; k < sc[j]; ++k) hs.data_as<float>()[at++] = value(r, j, k);
        ZI_ASSIGN_OR_RETURN(Tensor send, b.upload(hs, DType::kF32));
        ZI_ASSIGN_OR_RETURN(Tensor recv, b.alloc(DType::kF32, {nr + 1}));
        ZI_TRY(comms[r]->all_to_all_v(send, sc, recv, rc));
        Tensor hr = Tensor::host(DType::kF32, {nr + 1});
        ZI_TRY(b.download(recv, hr));
        at = 0;
        for (int i = 0; i < p; ++i)
          for (int64_t k = 0; k < rc[i]; ++k, ++at)
            if (hr.data_as<float>()[at] != value(i, r, k))
              return InternalError("all_to_all_v: wrong element " + std::to_string(at) +
                                   " from rank " + std::to_string(i));
        std::vector<int64_t> gc(p);
        int64_t ng = 0;
        for (int i = 0; i < p; ++i) ng += gc[i] = count(i, 0);
        ZI_ASSIGN_OR_RETURN(Tensor gathered, b.alloc(DType::kF32, {ng + 1}));
        ZI_TRY(comms[r]->all_gather_v(send, gathered, gc));
        Tensor hg = Tensor::host(DType::kF32, {ng + 1});
        ZI_TRY(b.download(gathered, hg));
        at = 0;
        for (int i = 0; i < p; ++i)
          for (int64_t k = 0; k < gc[i]; ++k, ++at)
            if (hg.data_as<float>()[at] != value(i, 0, k))
              return InternalError("all_gather_v: wrong element " + std::to_string(at));
        return comms[r]->barrier();
      };
      const Status st = run();
      if (!st.ok()) {
        comms[r]->abort(st);
        errors[r] = st.to_string();
      }
    });
  }
  for (auto& t : th) t.join();
  for (int r = 0; r < p; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// forward_parallel over the given ranks vs the one-backend forward (same dtype, GPU 0); prints
// and checks the largest error over all ranks, relative to the output's largest magnitude.
void check_forward(const std::string& model_dir, const std::vector<Backend*>& be,
                   const std::vector<Communicator*>& comms, DType dt, double rel_tol,
                   const std::string& what, bool graphs = false) {
  auto cfg = transformer_config(model_dir);
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  const DitInputs in = random_dit_inputs(*cfg, 12, 20, {40, 7}, 21);  // ragged batch of 2
  Backend* one = gpu(dt);
  ASSERT_NE(one, nullptr);
  auto ref = dit_forward_single(*cfg, model_dir + "/transformer", *one, in);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  auto oracle = dit_forward_single(*cfg, model_dir + "/transformer", cpu_oracle(), in);
  ASSERT_TRUE(oracle.ok()) << oracle.status().to_string();
  auto outs = dit_forward_ranks(*cfg, model_dir + "/transformer", be, comms, in, graphs);
  ASSERT_TRUE(outs.ok()) << outs.status().to_string();
  const double scale = std::max(1.0, max_abs(*ref));
  double err = 0;
  for (const Tensor& o : *outs) err = std::max(err, max_abs_diff(o, *ref));
  const double one_vs_cpu = max_abs_diff(*ref, *oracle);
  std::printf(
      "[ seqpar ] %s %s P=%zu: max |P ranks - 1 rank| = %.3g, (1 rank vs CPU: %.3g), "
      "output max %.3g\n",
      what.c_str(), dtype_name(dt), be.size(), err, one_vs_cpu, scale);
  EXPECT_LE(err, rel_tol * scale) << what;
}

constexpr double kF32Tol = 1e-4;   // relative to the output's largest magnitude
constexpr double kBf16Tol = 4e-2;  // bf16 roundings in other places (GEMM shapes differ per rank)

}  // namespace

TEST(SeqParGpu, LocalCollectivesOnOneGpu) {
  ZI_REQUIRE_GPU();
  for (int p : {2, 3}) {
    auto be = cuda_ranks(p, DType::kF32, true);
    ASSERT_EQ(static_cast<int>(be.size()), p);
    LocalCommGroup g(p);
    std::vector<Communicator*> comms;
    for (int r = 0; r < p; ++r) g.attach(r, be[r].get()), comms.push_back(&g.comm(r));
    check_collectives(ptrs(be), comms);
  }
}

TEST(SeqParGpu, LocalRanksOnOneGpuMatchOneRank) {
  ZI_REQUIRE_GPU();
  auto heads30 = heads30_model_dir(tiny_dir());
  ASSERT_TRUE(heads30.ok()) << heads30.status().to_string();
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int p : {2, 3, 4}) {
      auto be = cuda_ranks(p, dt, true);
      ASSERT_EQ(static_cast<int>(be.size()), p);
      for (const std::string& dir : {tiny_dir(), *heads30}) {
        if (p == 4 && dir == tiny_dir()) continue;
        LocalCommGroup g(p);
        std::vector<Communicator*> comms;
        for (int r = 0; r < p; ++r) g.attach(r, be[r].get()), comms.push_back(&g.comm(r));
        check_forward(dir, ptrs(be), comms, dt, dt == DType::kF32 ? kF32Tol : kBf16Tol,
                      dir == tiny_dir() ? "tiny (4 heads), local" : "30 heads, local");
      }
    }
  }
}

TEST(SeqParGpu, NcclOneRank) {
  ZI_REQUIRE_GPU();
  if (!nccl_available()) GTEST_SKIP() << "this build has no NCCL";
  for (DType dt : {DType::kF32, DType::kBF16}) {
    auto be = cuda_ranks(1, dt, true);
    ASSERT_EQ(be.size(), 1u);
    auto group = make_nccl_group(ptrs(be));
    ASSERT_TRUE(group.ok()) << group.status().to_string();
    std::vector<Communicator*> comms{(*group)[0].get()};
    if (dt == DType::kF32) check_collectives(ptrs(be), comms);
    check_forward(tiny_dir(), ptrs(be), comms, dt, dt == DType::kF32 ? kF32Tol : kBf16Tol,
                  "tiny, nccl (the ordinary path)");
  }
}

TEST(SeqParGpu, NcclEveryGpu) {
  ZI_REQUIRE_GPU();
  if (!nccl_available()) GTEST_SKIP() << "this build has no NCCL";
  const int n = gpu_count();
  if (n < 2) GTEST_SKIP() << "NCCL over several GPUs needs at least 2 visible GPUs, found " << n;
  auto heads30 = heads30_model_dir(tiny_dir());
  ASSERT_TRUE(heads30.ok()) << heads30.status().to_string();
  for (DType dt : {DType::kF32, DType::kBF16}) {
    auto be = cuda_ranks(n, dt, false);
    ASSERT_EQ(static_cast<int>(be.size()), n);
    auto group = make_nccl_group(ptrs(be));
    ASSERT_TRUE(group.ok()) << group.status().to_string();
    std::vector<Communicator*> comms;
    for (auto& c : *group) comms.push_back(c.get());
    if (dt == DType::kF32) check_collectives(ptrs(be), comms);
    for (bool graphs : {false, true})  // eager, and recorded (CUDA graphs holding NCCL calls)
      for (const std::string& dir : {tiny_dir(), *heads30})
        check_forward(dir, ptrs(be), comms, dt, dt == DType::kF32 ? kF32Tol : kBf16Tol,
                      std::string(dir == tiny_dir() ? "tiny, nccl" : "30 heads, nccl") +
                          (graphs ? ", recorded" : ", eager"),
                      graphs);
  }
}

TEST(SeqParGpu, NcclRefusesTwoRanksOnOneGpu) {
  ZI_REQUIRE_GPU();
  if (!nccl_available()) GTEST_SKIP() << "this build has no NCCL";
  auto be = cuda_ranks(2, DType::kF32, true);
  ASSERT_EQ(be.size(), 2u);
  auto group = make_nccl_group(ptrs(be));
  ASSERT_FALSE(group.ok());
  EXPECT_NE(group.status().message().find("two ranks on cuda:0"), std::string::npos)
      << group.status().to_string();
}
