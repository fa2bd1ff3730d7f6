// Small text helpers shared by the settings parsers (environment variables, option lists).
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

#include "core/status.h"

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

// An on/off setting's text: "1" or "0"; anything else is an error naming the setting and the value
// (a misspelt "ture" must not quietly mean off).
inline Result<bool> parse_switch(const std::string& name, const std::string& text) {
  if (text == "1") return true;
  if (text == "0") return false;
  return InvalidArgument(name + "='" + text + "': expected 1 (on) or 0 (off)");
}

// An on/off environment variable: unset leaves `on` as it is, "1" or "0" sets it, anything else is
// parse_switch's error.
inline Status env_switch(const char* name, bool& on) {
  const char* v = std::getenv(name);
  if (v == nullptr) return Status::Ok();
  Result<bool> r = parse_switch(name, v);
  if (!r.ok()) return r.status();
  on = *r;
  return Status::Ok();
}

}  // namespace zimage
