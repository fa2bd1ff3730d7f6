// Shared by the LoRA parity tests (load-time merge and runtime LoRA): the v_turbo golden
// request and a debug sink that keeps the DiT output of step 0.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/backend.h"
#include "common/npy.h"
#include "model/common/debug.h"
#include "zimage/zimage.h"

namespace zimage::test {

inline GenerateRequest turbo_request() {
  std::ifstream f(test::golden_dir("v_turbo") + "/case.json");
  const nlohmann::json s = nlohmann::json::parse(f);
  GenerateRequest req;
  for (const auto& p : s.at("prompts")) req.prompts.push_back(p.get<std::string>());
  req.width = s.at("W").get<int>();
  req.height = s.at("H").get<int>();
  req.steps = s.at("steps").get<int>();
  req.guidance = s.at("guidance").get<float>();
  req.seed = s.at("seed").get<uint64_t>();
  return req;
}

class Step0Sink final : public DebugSink {
 public:
  bool wants(const std::string& n) const override { return n == "dit_out.step0"; }
  void tensor(const std::string&, Backend& be, const Tensor& t) override {
    dit0 = Tensor::host(DType::kF32, t.shape());
    if (!be.download(t, dit0).ok()) dit0 = Tensor();
  }
  Tensor dit0;
};

}  // namespace zimage::test
