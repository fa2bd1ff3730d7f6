// Non-finite values (NaN, Inf) in what the pipeline produces, and where they came from. Why: one
// NaN in a weight, or an activation that overflows bf16, turns the whole picture black while
// every call "succeeds" (the most reported Z-Image failure elsewhere). The pipeline checks each
// phase's output on the host, where it already is (DiT output per step, the decoded image), at
// no measurable cost; only when a check fails are the weight files scanned to name the culprit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "io/model/model_source.h"

namespace zimage {

// How many of the n floats are NaN or +-Inf.
int64_t count_nonfinite(const float* x, size_t n);

// Scans every floating-point tensor of `component` ("transformer", "text_encoder", "vae") in the
// diffusers folder `model_dir` and says, in a sentence for an error message, which tensors hold
// NaN/Inf values, or, when all are finite, the largest magnitude found (values near the bf16/f16
// maximum overflow the activations). Never fails: a folder it cannot read is said so.
std::string diagnose_weights(const std::string& model_dir, const std::string& component);
// The same for a model folder and/or single files (the component's file when it has one).
std::string diagnose_weights(const ModelPaths& paths, const std::string& component);

}  // namespace zimage
