// Strict JSON for untrusted files (safetensors headers, index files, model configs): the strict
// parser itself is public (include/zimage/json.h, the server parses requests with it); this adds
// file reading and typed config access.
// nlohmann's DOM parser silently keeps the last of two equal object keys, so a header could say one
// thing to us and another to a different loader; here duplicate keys are errors. Nesting is capped
// so a hostile file cannot exhaust the stack, and every error names the file and what is wrong.
// JsonObjectReader reads typed config keys with range checks and "file: key 'x': ..." messages.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "zimage/json.h"  // parse_strict, printable, type_name, kMaxJsonDepth

namespace zimage::json_util {

// Reads a whole (small) file as text. A missing file is NotFound, an unreadable one Io, a file
// larger than `max_bytes` a FormatError.
Result<std::string> read_text(const std::string& path, size_t max_bytes = size_t{64} << 20);

// Reads a whole (small) file and parses it as above. A missing file is NotFound, an unreadable
// one Io, a file larger than `max_bytes` a FormatError.
Result<nlohmann::json> read_file(const std::string& path, size_t max_bytes = size_t{64} << 20);

// Typed access to the keys of one JSON object (a config file). Absent keys and keys whose value
// is null leave the output unchanged (class defaults) unless the key is required. Every error
// names the file and the key.
class JsonObjectReader {
 public:
  // `obj` must outlive the reader. `file` is used in messages.
  JsonObjectReader(const nlohmann::json& obj, std::string file)
      : obj_(obj), file_(std::move(file)) {}

  // Present and not null.
  bool has(const char* key) const;
  const nlohmann::json* find(const char* key) const;  // nullptr when absent (null is returned)

  Status get_int(const char* key, int* out, bool required, int64_t min, int64_t max) const;
  Status get_float(const char* key, float* out, bool required) const;    // finite
  Status get_double(const char* key, double* out, bool required) const;  // finite
  Status get_bool(const char* key, bool* out, bool required) const;
  Status get_string(const char* key, std::string* out, bool required) const;
  Status get_int_list(const char* key, std::vector<int>* out, bool required, int64_t min,
                      int64_t max) const;
  Status get_string_list(const char* key, std::vector<std::string>* out, bool required) const;

  // "file: key 'x': <what>" as a FormatError.
  Status error(const char* key, const std::string& what) const;
  const std::string& file() const { return file_; }

 private:
  Status missing(const char* key) const;
  Status int_value(const char* key, const nlohmann::json& v, int64_t min, int64_t max,
                   int* out) const;

  const nlohmann::json& obj_;
  std::string file_;
};

}  // namespace zimage::json_util
