#include "output_paths.h"

#include <filesystem>

namespace zimage::cli {

std::vector<std::string> output_paths(const std::string& output, size_t count) {
  if (count == 1) return {output};
  const std::filesystem::path p(output);
  const std::string stem = (p.parent_path() / p.stem()).string();
  const std::string ext = p.has_extension() ? p.extension().string() : ".png";
  std::vector<std::string> paths;
  for (size_t i = 0; i < count; ++i) paths.push_back(stem + "_" + std::to_string(i) + ext);
  return paths;
}

}  // namespace zimage::cli
