// Strict JSON for untrusted input: model files (safetensors headers, configs) and the server's
// requests are read with the same parser. nlohmann's DOM parser silently keeps the last of two
// equal object keys, so a body could say one thing to us and another to a different reader; here
// duplicate keys are errors. Nesting is capped so hostile input cannot exhaust the stack, and
// every error names what was parsed and what is wrong. Implemented by the engine's io layer.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "zimage/status.h"

namespace zimage::json_util {

inline constexpr int kMaxJsonDepth = 64;

// Parses `text` as exactly one JSON value (surrounding whitespace allowed). Rejects malformed
// JSON, invalid UTF-8, duplicate object keys and nesting deeper than kMaxJsonDepth. Errors are
// FormatErrors starting with `what` (usually the file name). Never throws.
Result<nlohmann::json> parse_strict(std::string_view text, const std::string& what);

// `s` made safe to print in an error message: control bytes (C0, DEL and the UTF-8 encoded C1
// controls U+0080..U+009F) and bytes that are not part of valid UTF-8 become \xNN, so a hostile
// name cannot inject terminal escapes or break a JSON log line.
std::string printable(std::string_view s);

// "object", "array", "string", "integer", "number", "boolean", "null".
const char* type_name(const nlohmann::json& v);

}  // namespace zimage::json_util
