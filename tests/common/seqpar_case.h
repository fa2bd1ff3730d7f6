// Sequence-parallel DiT runs for the CPU and GPU tests (tests/parity/test_dit_parallel.cpp,
// tests/gpu/test_seqpar_gpu.cpp): seeded random DiT inputs, the ordinary one-backend forward, and
// forward_parallel on P ranks (one thread and one backend each) through given communicators.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/comm.h"
#include "io/model/model_config.h"

namespace zimage::test {

// Host f32 inputs of one DiT forward: latents [B, C, h, w], B timesteps, B captions [L_i, Fc].
struct DitInputs {
  Tensor latents;
  std::vector<float> t_model;
  std::vector<Tensor> caps;
};
DitInputs random_dit_inputs(const TransformerConfig& cfg, int64_t h, int64_t w,
                            const std::vector<int64_t>& cap_lens, uint32_t seed);

// The transformer in `dir` (diffusers folder) on `be`, ZImageDiT::forward; host f32 output.
Result<Tensor> dit_forward_single(const TransformerConfig& cfg, const std::string& dir, Backend& be,
                                  const DitInputs& in, bool graphs = false);
// The same model loaded on each backend, ZImageDiT::forward_parallel on rank r = backends[r] with
// comms[r], all ranks at once on their own threads; every rank's output (host f32), or the first
// rank's error. `graphs`: ZImageDiT::set_use_graphs on every rank (recorded only where the
// communicator is recordable).
Result<std::vector<Tensor>> dit_forward_ranks(const TransformerConfig& cfg, const std::string& dir,
                                              const std::vector<Backend*>& backends,
                                              const std::vector<Communicator*>& comms,
                                              const DitInputs& in, bool graphs = true);

// The transformer config of a model folder (a failure names the folder).
Result<TransformerConfig> transformer_config(const std::string& model_dir);
// A random-weight model folder (io/writers/random_model.h) whose DiT has Z-Image's 30 heads (8 wide, 2
// layers, 1 refiner layer each) with the text encoder and VAE configs of `like_dir`, written once
// per process into a temporary folder (removed at exit); its path.
Result<std::string> heads30_model_dir(const std::string& like_dir);

double max_abs(const Tensor& a);

}  // namespace zimage::test
