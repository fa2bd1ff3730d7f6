// Device and precision options -> a backend (api/backend_choice.h).
#include "api/backend_choice.h"

#include <utility>

#include "core/log.h"

namespace zimage {

int cuda_index(const std::string& device) {
  if (device == "cuda") return 0;
  if (device.rfind("cuda:", 0) != 0 || device.size() == 5 || device.size() > 8) return -1;
  int idx = 0;
  for (size_t i = 5; i < device.size(); ++i) {
    if (device[i] < '0' || device[i] > '9') return -1;
    idx = idx * 10 + (device[i] - '0');
  }
  return idx;
}

Result<std::unique_ptr<Backend>> make_backend(const std::string& device,
                                              const std::string& precision_option, int threads,
                                              std::string& precision) {
  const std::string& p = precision_option;
  if (p != "auto" && p != "bf16" && p != "f32" && p != "fp8")
    return FieldError("precision", "'" + p + "' is not one of auto, bf16, fp8, f32");
  if (Status st = check_cpu_threads(threads); !st.ok()) return st.with_field("threads");
  const bool want_cpu = device == "cpu";
  const int gpu = cuda_index(device);
  if (!want_cpu && gpu < 0 && device != "auto")
    return FieldError("device", "'" + device + "' is not one of auto, cpu, cuda, cuda:N");
  if (!want_cpu) {
    const DType act = p == "f32" ? DType::kF32 : DType::kBF16;
    auto cuda = make_cuda_backend(gpu < 0 ? 0 : gpu, act);
    if (cuda.ok()) {
      precision = act == DType::kF32 ? "f32" : (p == "fp8" ? "fp8" : "bf16");
      return std::move(cuda).value();
    }
    if (gpu >= 0) return cuda.status().with_context("device " + device).with_field("device");
    // A bad setting (ZIMAGE_ATTENTION) is an error, not a reason to fall back to the CPU; so is
    // a GPU whose cuBLAS cannot be loaded (NotFound naming the library): the CPU would take
    // minutes where the user expects the GPU.
    if (cuda.status().code() == ErrorCode::kInvalidArgument ||
        cuda.status().code() == ErrorCode::kNotFound)
      return cuda.status();
    ZI_INFO("device auto: using the CPU (%s)", cuda.status().to_string().c_str());
  }
  if (p == "bf16" || p == "fp8")
    return FieldError("precision", p + " needs the CUDA backend; the CPU computes in f32");
  precision = "f32";
  return create_cpu_backend(threads);
}

}  // namespace zimage
