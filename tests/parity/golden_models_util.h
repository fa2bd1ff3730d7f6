// Shared helpers of the golden model tests (tests/parity/test_golden_*.cpp): the CPU oracle
// backend, one golden case (its configs and token ids, tests/data/golden), host/device copies,
// the three models loaded from a case, and the per-comparison report line.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/model/model_config.h"
#include "model/text_encoder/qwen3_encoder.h"
#include "model/vae/vae.h"
#include "model/dit/zimage_dit.h"

namespace zimage::golden {

Backend& cpu();  // the CPU backend every golden model test runs on
nlohmann::json read_json(const std::string& path);

struct Case {
  std::string name;
  std::string dir;
  int steps = 0;
  bool cfg = false;
  double cfg_truncation = 1.0;
  int images_per_prompt = 1;
  std::vector<std::vector<int32_t>> ids;  // positive prompts
  std::vector<int32_t> neg_ids;           // with CFG ("" when the case has no negative prompt)
  TextEncoderConfig te;
  TransformerConfig dit;
  VaeConfig vae;
};
Case load_case(const std::string& name);

Tensor npy(const std::string& path);            // a golden .npy file as a host f32 tensor
Tensor to_host(const Tensor& t);                // a CPU-backend tensor as host f32
Tensor to_device(const Tensor& host);           // host f32 -> the CPU backend
Tensor cat0(const std::vector<Tensor>& parts);  // host f32 tensors concatenated along dim 0
// t_model of step i of n (spec §6.1), in float32 as torch computes it.
float t_model_at(int n, int i);

// The case's models (or those of another component folder with the case's configs).
std::unique_ptr<Qwen3Encoder> load_te(const Case& c, const std::string& folder = "");
std::unique_ptr<ZImageDiT> load_dit(const Case& c, const std::string& folder = "");
std::unique_ptr<VaeDecoder> load_vae(const Case& c, const std::string& folder = "");

// Prints "[ parity ] what max |diff| = err" and records it as a test property.
void report(const std::string& what, double err);

}  // namespace zimage::golden
