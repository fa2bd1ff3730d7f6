// The tiny golden model (v_turbo: random weights in the diffusers layout, the real tokenizer) as
// the tests load it: one place for its folder and for a CPU engine on it.
#pragma once

#include <memory>
#include <string>

#include "zimage/zimage.h"

namespace zimage::test {

std::string tiny_model_dir();
// A CPU engine (2 threads) on the tiny model; records a test failure and returns null if it
// cannot be loaded.
std::unique_ptr<Engine> load_tiny_engine();

}  // namespace zimage::test
