// Small text helpers shared by the settings parsers.
#pragma once

#include <string>
#include <vector>

namespace zimage {

// The parts of `text` between `sep`s, empty parts kept: "a,,b" -> {"a", "", "b"}, "" -> {""}.
inline std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  for (size_t pos = 0;;) {
    const size_t at = text.find(sep, pos);
    parts.push_back(text.substr(pos, at == std::string::npos ? at : at - pos));
    if (at == std::string::npos) return parts;
    pos = at + 1;
  }
}

}  // namespace zimage
