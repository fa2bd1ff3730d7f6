#include "common/tiny_engine.h"

#include <gtest/gtest.h>

#include "common/npy.h"

namespace zimage::test {

std::string tiny_model_dir() {
  return golden_dir("v_turbo") + "/model";
}

std::unique_ptr<Engine> load_tiny_engine() {
  EngineOptions o;
  o.model_dir = tiny_model_dir();
  o.device = "cpu";
  o.threads = 2;
  auto e = Engine::load(o);
  if (!e.ok()) {
    ADD_FAILURE() << "loading the tiny model: " << e.status().to_string();
    return nullptr;
  }
  return std::move(e).value();
}

}  // namespace zimage::test
