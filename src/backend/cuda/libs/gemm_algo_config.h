// ZIMAGE_GEMM_CONFIG's value (LtGemm::set_wide_config): fields of cuBLASLt's algorithm
// configuration, set over the heuristic's choice. Host-only, so the parser is tested on machines
// without a GPU.
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/text.h"

namespace zimage::cuda {

// cublasLt.h's ids for CUBLASLT_ALGO_CONFIG_TILE_ID, _STAGES_ID, _CLUSTER_SHAPE_ID,
// _CTA_SWIZZLING and _CUSTOM_OPTION; -1 leaves a field as the candidate has it.
struct GemmAlgoConfig {
  int tile = -1, stages = -1, cluster = -1, swizzle = -1, custom = -1;
  bool any() const {
    return tile >= 0 || stages >= 0 || cluster >= 0 || swizzle >= 0 || custom >= 0;
  }
  // "cluster=6,swizzle=1" (the fields set, in this order), "none" without any.
  std::string str() const {
    std::string s;
    const std::pair<const char*, int> fields[] = {{"tile", tile},
                                                  {"stages", stages},
                                                  {"cluster", cluster},
                                                  {"swizzle", swizzle},
                                                  {"custom", custom}};
    for (const auto& [name, v] : fields)
      if (v >= 0) s += (s.empty() ? "" : ",") + std::string(name) + "=" + std::to_string(v);
    return s.empty() ? std::string("none") : s;
  }
};

// "key=value[,key=value...]" with keys tile, stages, cluster, swizzle, custom and values from 0 to
// 65535, each key at most once; "" is no configuration. An error names the part that is wrong.
inline Result<GemmAlgoConfig> parse_gemm_algo_config(const std::string& text) {
  GemmAlgoConfig c;
  if (text.empty()) return c;
  for (const std::string& item : split(text, ',')) {
    const size_t eq = item.find('=');
    const std::string name = item.substr(0, eq);
    int* field = name == "tile"      ? &c.tile
                 : name == "stages"  ? &c.stages
                 : name == "cluster" ? &c.cluster
                 : name == "swizzle" ? &c.swizzle
                 : name == "custom"  ? &c.custom
                                     : nullptr;
    if (field == nullptr)
      return InvalidArgument("GEMM configuration '" + text + "': '" + item +
                             "' is not tile=, stages=, cluster=, swizzle= or custom= a number");
    const std::string value = eq == std::string::npos ? std::string() : item.substr(eq + 1);
    char* stop = nullptr;
    const long v = value.empty() ? -1 : std::strtol(value.c_str(), &stop, 10);
    if (value.empty() || *stop != '\0' || v < 0 || v > 65535)
      return InvalidArgument("GEMM configuration '" + text + "': " + name +
                             " takes a number from 0 to 65535, not '" + value + "'");
    if (*field >= 0)
      return InvalidArgument("GEMM configuration '" + text + "': " + name + " is given twice");
    *field = static_cast<int>(v);
  }
  return c;
}

}  // namespace zimage::cuda
