// Finite checks and the weight scan behind their error messages (see finite_check.h).
#include "pipeline/finite_check.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "io/model/model_folder.h"
#include "io/weights/weights.h"

namespace zimage {

int64_t count_nonfinite(const float* x, size_t n) {
  int64_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += std::isfinite(x[i]) ? 0 : 1;
  return bad;
}

namespace {

struct Scan {
  int64_t nonfinite = 0;
  float max_abs = 0.0f;
};

// Exponent bits all ones = NaN or Inf, in each format; the magnitude only for finite values.
Scan scan_tensor(const Tensor& t) {
  Scan s;
  const int64_t n = t.numel();
  switch (t.dtype()) {
    case DType::kF32: {
      const auto* p = static_cast<const uint32_t*>(t.data());
      for (int64_t i = 0; i < n; ++i) {
        if ((p[i] & 0x7f800000u) == 0x7f800000u) {
          ++s.nonfinite;
        } else {
          float f;
          std::memcpy(&f, &p[i], 4);
          s.max_abs = std::max(s.max_abs, std::fabs(f));
        }
      }
      break;
    }
    case DType::kBF16: {
      const auto* p = static_cast<const uint16_t*>(t.data());
      uint16_t max_bits = 0;  // |x| orders like its bits for finite values
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t a = p[i] & 0x7fffu;
        if (a >= 0x7f80u) {
          ++s.nonfinite;
        } else if (a > max_bits) {
          max_bits = a;
        }
      }
      s.max_abs = bf16_to_f32(max_bits);
      break;
    }
    case DType::kF16: {
      const auto* p = static_cast<const uint16_t*>(t.data());
      uint16_t max_bits = 0;
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t a = p[i] & 0x7fffu;
        if (a >= 0x7c00u) {
          ++s.nonfinite;
        } else if (a > max_bits) {
          max_bits = a;
        }
      }
      s.max_abs = f16_to_f32(max_bits);
      break;
    }
    default:
      break;  // integer and 8-bit float tensors: nothing a model multiplies in as is
  }
  return s;
}

std::string fmt_g(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g", v);
  return buf;
}

}  // namespace

std::string diagnose_weights(const std::string& model_dir, const std::string& component) {
  ModelPaths paths;
  paths.model_dir = model_dir;
  return diagnose_weights(paths, component);
}

std::string diagnose_weights(const ModelPaths& paths, const std::string& component) {
  auto source = ModelSource::open(paths);
  if (!source.ok()) return "its weights could not be checked (" + source.status().message() + ")";
  auto store = source->open_weights(component);
  if (!store.ok()) return "its weights could not be checked (" + store.status().message() + ")";
  std::vector<std::string> bad;
  int64_t bad_values = 0;
  float max_abs = 0.0f;
  std::string max_name;
  for (const std::string& name : store->names()) {
    auto t = store->get(name);
    if (!t.ok()) continue;
    const Scan s = scan_tensor(t.value());
    if (s.nonfinite > 0) {
      bad_values += s.nonfinite;
      if (bad.size() < 3) bad.push_back("'" + name + "' (" + std::to_string(s.nonfinite) + ")");
    }
    if (s.max_abs > max_abs) {
      max_abs = s.max_abs;
      max_name = name;
    }
  }
  if (!bad.empty()) {
    std::string list;
    for (const std::string& b : bad) list += (list.empty() ? "" : ", ") + b;
    return "the " + component + " weights hold " + std::to_string(bad_values) +
           " NaN/Inf value(s), in " + list + (bad.size() == 3 ? " and maybe more" : "") +
           ": the model file is corrupt";
  }
  std::string s = "the " + component + " weights are all finite";
  if (!max_name.empty()) {
    s += " (largest magnitude " + fmt_g(max_abs) + " in '" + max_name + "')";
    if (max_abs > 1e4f) s += ": values that large overflow the activations; the file looks corrupt";
  }
  return s;
}

}  // namespace zimage
