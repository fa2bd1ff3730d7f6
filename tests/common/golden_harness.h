// One harness for every golden test family (tests/parity/test_golden_*.cpp, the single-file,
// kept-quantised and LoRA parity tests, tests/gpu/test_golden*_gpu.cpp): the golden cases of
// tests/data/golden (text-to-image, image-to-image / inpainting, ControlNet) read into the
// request diffusers was given, a debug sink that keeps host copies of named intermediates, and
// the comparisons with diffusers' tensors (max abs / relative error, cosine, the worst element).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"
#include "model/common/debug.h"
#include "pipeline/text_to_image.h"
#include "zimage/zimage.h"

namespace zimage::test {

// ---- cases ----

enum class GoldenFamily {
  kTextToImage,  // ZIMAGE_GOLDEN_DIR/<case>: case.json, model/ and the reference tensors
  kImage,        // ZIMAGE_GOLDEN_DIR/image/<case>: on the model of the text-to-image case it names
  kControlNet,   // ZIMAGE_GOLDEN_DIR/controlnet/<case>: on common/controlnet_model.h's folder
};

// The folder holding a family's cases.
std::string golden_root(GoldenFamily family);
// The family's cases (folders with a case.json; text-to-image ones also with model/), sorted.
std::vector<std::string> golden_case_names(GoldenFamily family);
// The .tar.gz archives in tests/data/<subdir> (what the build unpacks into golden_root).
size_t golden_archive_count(const std::string& subdir);

struct GoldenCase {
  std::string name;
  std::string dir;        // the case folder
  std::string model;      // the model folder it runs on
  nlohmann::json spec;    // case.json
  GenerateRequest req;    // the request diffusers was given, input images and mask loaded
  bool inputs_ok = true;  // false when an input image could not be read (already a failure)
};
GoldenCase read_golden_case(GoldenFamily family, const std::string& name);
// The v_turbo case's request: the recipe the LoRA, single-file and kept-quantised cases were
// made from.
GenerateRequest turbo_request();

// A reference .npy file as a host tensor; a file that cannot be read is a failure naming it,
// and gives an undefined tensor.
Tensor load_reference(const std::string& path);

// ---- capture ----

// Keeps a host float32 copy of every tensor whose name starts with one of `prefixes`. A tensor
// that cannot be copied is a test failure naming it (and is not kept).
class CaptureSink final : public DebugSink {
 public:
  explicit CaptureSink(std::vector<std::string> prefixes) : prefixes_(std::move(prefixes)) {}
  bool wants(const std::string& name) const override;
  void tensor(const std::string& name, Backend& be, const Tensor& t) override;

  bool has(const std::string& name) const { return got_.count(name) != 0; }
  // The captured tensor; undefined when `name` was not captured.
  Tensor get(const std::string& name) const;
  const std::map<std::string, Tensor>& all() const { return got_; }

 private:
  std::vector<std::string> prefixes_;
  std::map<std::string, Tensor> got_;
};

// ---- comparison ----

// How far `ours` is from the reference, both read as float32.
struct Diff {
  double max_abs = INFINITY;  // max |ours - ref| (as max_abs_diff: infinite for a NaN, sizes
                              // that differ or an undefined tensor, never a passing value)
  double ref_max_abs = 0;     // max |ref|
  double rel = INFINITY;      // max_abs / max(max |ref|, 1e-12)
  double cosine = 0;          // of the two as vectors (0 where either is all zeros)
  int64_t worst = -1;         // flat index of the largest |ours - ref| (-1: none)
  Shape shape;                // the reference's, to name the worst element
  float worst_ours = 0, worst_ref = 0;
  // "max|diff| 3.1e-05 at [0, 2, 5, 1] (ours 0.25 vs 0.24998), rel 1.2e-05, cosine 0.999999"
  std::string describe() const;
};
Diff diff(const Tensor& ours, const Tensor& ref);

// One stage against diffusers: both must exist and have as many elements, and max |ours - ref|
// must be <= tol (a failure reports the worst element). Prints
// "  <what, padded to label_width> max|diff| E  (tolerance T)" and returns max |ours - ref|.
double expect_stage_close(const std::string& what, const Tensor& ours, const Tensor& ref,
                          double tol, int label_width = 28);

// The capture `name` against the reference file `ref_path`. A missing capture, an unreadable
// reference or a size mismatch is a failure ("<label>: no <name>") and an infinite Diff.
Diff diff_captured(const CaptureSink& sink, const std::string& name, const std::string& ref_path,
                   const std::string& label);

// The largest errors over several comparisons (the steps of a run, the layers' hints).
struct WorstDiff {
  double max_abs = 0, rel = 0;
  void add(const Diff& d) {
    max_abs = std::max(max_abs, d.max_abs);
    rel = std::max(rel, d.rel);
  }
};

// The RGB8 check: max |rgb[k] - round(255 * ref[k])| over image `i` of a float [N, H, W, 3]
// reference; rgb of another size than one reference image is a failure (and gives 256).
int rgb8_max_diff(const std::vector<uint8_t>& rgb, const Tensor& ref, int64_t i = 0);

// ---- the CLI on a case ----

// `zimage generate` on the CPU with the case's model, steps, guidance, seed, images per prompt,
// prompts and negative prompt, writing `output` quietly; a test appends its family's flags.
std::vector<std::string> cli_generate_args(const GoldenCase& c, const std::string& output);
// The PNG written for image i of n: `output` itself, or out_<i>.png beside it when n > 1.
std::string cli_png_path(const std::string& output, int64_t i, int64_t n);

// ---- running a case ----

// Runs `req` through `pipe` with `sink` as its debug sink; a failure is a test failure and gives
// nullopt.
std::optional<TextToImageOutput> run_captured(TextToImage& pipe, const GenerateRequest& req,
                                              CaptureSink& sink);

// ---- GPU ----

// True with a CUDA device; false (skip) only where there is none: a device whose backend cannot
// be created is a failure.
bool have_cuda_device();

// A case's pipeline on a backend of its own (declared first: it outlives the pipeline).
struct CudaPipeline {
  std::unique_ptr<Backend> be;
  std::unique_ptr<TextToImage> pipe;  // null when the backend or the model failed (a failure)
};
// The case's model on a new CUDA backend computing in `act`.
CudaPipeline load_on_cuda(const GoldenCase& c, DType act);

}  // namespace zimage::test
