// Where a command writes several images: FILE.png for one, FILE_0.png, FILE_1.png, ... for
// several (zimage generate and zimage submit --wait name their files alike).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace zimage::cli {

std::vector<std::string> output_paths(const std::string& output, size_t count);

}  // namespace zimage::cli
