// Strict JSON parsing through nlohmann's SAX interface (see json_util.h for why).
#include "io/fs/json_util.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <new>

#include "io/fs/file_io.h"

namespace zimage::json_util {
namespace {

using nlohmann::json;

// Builds a DOM like nlohmann's own parser, but stops at the first duplicate key or at excessive
// depth, and keeps the error text instead of throwing.
class StrictDomBuilder {
 public:
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  bool null() { return put(json(nullptr)); }
  bool boolean(bool v) { return put(json(v)); }
  bool number_integer(number_integer_t v) { return put(json(v)); }
  bool number_unsigned(number_unsigned_t v) { return put(json(v)); }
  bool number_float(number_float_t v, const string_t& /*text*/) { return put(json(v)); }
  bool string(string_t& v) { return put(json(std::move(v))); }
  bool binary(binary_t& /*v*/) {
    error_ = "binary values are not JSON";
    return false;
  }

  bool start_object(std::size_t /*n*/) { return open(json::object()); }
  bool end_object() { return close(); }
  bool start_array(std::size_t /*n*/) { return open(json::array()); }
  bool end_array() { return close(); }

  bool key(string_t& k) {
    json* obj = stack_.back();
    if (obj->contains(k)) {
      error_ = "duplicate key '" + printable(k) + "'" + where();
      return false;
    }
    pending_key_ = k;
    element_ = &(*obj)[k];
    return true;
  }

  bool parse_error(std::size_t position, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& ex) {
    std::string msg = ex.what();
    // Drop nlohmann's "[json.exception.parse_error.101] " tag.
    if (!msg.empty() && msg[0] == '[') {
      const size_t close_at = msg.find("] ");
      if (close_at != std::string::npos) msg = msg.substr(close_at + 2);
    }
    error_ = "invalid JSON at byte " + std::to_string(position) + ": " + printable(msg);
    return false;
  }

  json& root() { return root_; }
  const std::string& error() const { return error_; }

 private:
  // Where the current container is, for messages: " in object 'a.b'" or "" at the top.
  std::string where() const {
    std::string path;
    for (const std::string& p : path_) {
      if (p.empty()) continue;
      if (!path.empty()) path += '.';
      path += p;
    }
    return path.empty() ? std::string(" at the top level") : " in object '" + printable(path) + "'";
  }

  // Stores `v` at the current position and returns where it went.
  json* place(json&& v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json* top = stack_.back();
    if (top->is_array()) {
      top->push_back(std::move(v));
      return &top->back();
    }
    *element_ = std::move(v);
    return element_;
  }

  bool put(json&& v) {
    place(std::move(v));
    return true;
  }

  bool open(json&& container) {
    if (static_cast<int>(stack_.size()) >= kMaxJsonDepth) {
      error_ = "JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels";
      return false;
    }
    const bool in_object = !stack_.empty() && stack_.back()->is_object();
    path_.push_back(in_object ? pending_key_ : std::string());
    stack_.push_back(place(std::move(container)));
    return true;
  }

  bool close() {
    stack_.pop_back();
    path_.pop_back();
    return true;
  }

  json root_;
  std::vector<json*> stack_;
  std::vector<std::string> path_;
  std::string pending_key_;
  json* element_ = nullptr;
  std::string error_;
};

}  // namespace

Result<json> parse_strict(std::string_view text, const std::string& what) {
  // nlohmann's lexer takes a NUL byte for the end of input and would ignore whatever follows;
  // a raw NUL is never valid JSON (inside strings it must be escaped), so refuse it here.
  const size_t nul = text.find('\0');
  if (nul != std::string_view::npos) {
    return FormatError(what + ": invalid JSON at byte " + std::to_string(nul) + ": NUL byte");
  }
  try {
    StrictDomBuilder builder;
    const bool ok = json::sax_parse(text.data(), text.data() + text.size(), &builder,
                                    json::input_format_t::json, /*strict=*/true);
    if (!ok) {
      const std::string err = builder.error().empty() ? "invalid JSON" : builder.error();
      return FormatError(what + ": " + err);
    }
    return std::move(builder.root());
  } catch (const std::bad_alloc&) {
    return OutOfMemory(what + ": out of memory while parsing JSON");
  } catch (const std::exception& e) {
    return FormatError(what + ": invalid JSON: " + e.what());
  }
}

Result<std::string> read_text(const std::string& path, size_t max_bytes) {
  return read_input_file(path, max_bytes);  // regular files only, checked before reading
}

Result<json> read_file(const std::string& path, size_t max_bytes) {
  ZI_ASSIGN_OR_RETURN(std::string text, read_text(path, max_bytes));
  return parse_strict(text, path);
}

std::string printable(std::string_view s) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size());
  auto escape = [&](unsigned char c) {
    out += "\\x";
    out += kHex[c >> 4];
    out += kHex[c & 15];
  };
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if (c < 0x20 || c == 0x7f) {
        escape(c);
      } else {
        out += static_cast<char>(c);
      }
      ++i;
      continue;
    }
    // Length and lowest code point of a UTF-8 sequence starting with c.
    size_t len = 0;
    uint32_t cp = 0, min = 0;
    if ((c & 0xe0) == 0xc0) {
      len = 2, cp = c & 0x1f, min = 0x80;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3, cp = c & 0x0f, min = 0x800;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4, cp = c & 0x07, min = 0x10000;
    }
    bool ok = len != 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) ok = false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    ok = ok && cp >= min && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff);
    if (!ok) {
      escape(c);
      ++i;
      continue;
    }
    if (cp < 0xa0) {  // a C1 control (U+0080..U+009F; U+009B is CSI on some terminals)
      for (size_t k = 0; k < len; ++k) escape(static_cast<unsigned char>(s[i + k]));
      i += len;
      continue;
    }
    out.append(s.substr(i, len));
    i += len;
  }
  return out;
}

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::object:
      return "object";
    case json::value_t::array:
      return "array";
    case json::value_t::string:
      return "string";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "integer";
    case json::value_t::number_float:
      return "number";
    case json::value_t::boolean:
      return "boolean";
    case json::value_t::null:
      return "null";
    default:
      return "binary";
  }
}

// ---- JsonObjectReader ------------------------------------------------------------------------

const json* JsonObjectReader::find(const char* key) const {
  if (!obj_.is_object()) return nullptr;
  auto it = obj_.find(key);
  return it == obj_.end() ? nullptr : &*it;
}

bool JsonObjectReader::has(const char* key) const {
  const json* v = find(key);
  return v != nullptr && !v->is_null();
}

Status JsonObjectReader::error(const char* key, const std::string& what) const {
  return FormatError(file_ + ": key '" + key + "': " + what);
}

Status JsonObjectReader::missing(const char* key) const {
  return NotFound(file_ + ": required key '" + std::string(key) + "' is missing");
}

Status JsonObjectReader::int_value(const char* key, const json& v, int64_t min, int64_t max,
                                   int* out) const {
  int64_t value = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return error(key, "value " + std::to_string(u) + " is out of range [" + std::to_string(min) +
                            ", " + std::to_string(max) + "]");
    }
    value = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    value = v.get<int64_t>();
  } else {
    return error(key, std::string("expected an integer, got ") + type_name(v) + " " + v.dump());
  }
  if (value < min || value > max) {
    return error(key, "value " + std::to_string(value) + " is out of range [" +
                          std::to_string(min) + ", " + std::to_string(max) + "]");
  }
  *out = static_cast<int>(value);
  return Status::Ok();
}

Status JsonObjectReader::get_int(const char* key, int* out, bool required, int64_t min,
                                 int64_t max) const {
  const json* v = find(key);
  if (!v || v->is_null()) return required ? missing(key) : Status::Ok();
  min = std::max<int64_t>(min, std::numeric_limits<int>::min());
  max = std::min<int64_t>(max, std::numeric_limits<int>::max());
  return int_value(key, *v, min, max, out);
}

Status JsonObjectReader::get_double(const char* key, double* out, bool required) const {
  const json* v = find(key);
  if (!v || v->is_null()) return required ? missing(key) : Status::Ok();
  if (!v->is_number()) {
    return error(key, std::string("expected a number, got ") + type_name(*v) + " " + v->dump());
  }
  const double d = v->get<double>();
  if (!std::isfinite(d)) return error(key, "value is not finite");
  *out = d;
  return Status::Ok();
}

Status JsonObjectReader::get_float(const char* key, float* out, bool required) const {
  double d = 0;
  const bool present = has(key);
  ZI_TRY(get_double(key, &d, required));
  if (!present) return Status::Ok();
  if (std::fabs(d) > static_cast<double>(std::numeric_limits<float>::max())) {
    return error(key, "value " + std::to_string(d) + " does not fit a float32");
  }
  *out = static_cast<float>(d);
  return Status::Ok();
}

Status JsonObjectReader::get_bool(const char* key, bool* out, bool required) const {
  const json* v = find(key);
  if (!v || v->is_null()) return required ? missing(key) : Status::Ok();
  if (!v->is_boolean()) {
    return error(key,
                 std::string("expected true or false, got ") + type_name(*v) + " " + v->dump());
  }
  *out = v->get<bool>();
  return Status::Ok();
}

Status JsonObjectReader::get_string(const char* key, std::string* out, bool required) const {
  const json* v = find(key);
  if (!v || v->is_null()) return required ? missing(key) : Status::Ok();
  if (!v->is_string()) {
    return error(key, std::string("expected a string, got ") + type_name(*v) + " " + v->dump());
  }
  *out = v->get<std::string>();
  return Status::Ok();
}

Status JsonObjectReader::get_int_list(const char* key, std::vector<int>* out, bool required,
                                      int64_t min, int64_t max) const {
  const json* v = find(key);
  if (!v || v->is_null()) return required ? missing(key) : Status::Ok();
  if (!v->is_array()) {
    return error(
        key, std::string("expected a list of integers, got ") + type_name(*v) + " " + v->dump());
  }
  min = std::max<int64_t>(min, std::numeric_limits<int>::min());
  max = std::min<int64_t>(max, std::numeric_limits<int>::max());
  std::vector<int> values;
  for (size_t i = 0; i < v->size(); ++i) {
    int x = 0;
    const std::string item = std::string(key) + "[" + std::to_string(i) + "]";
    ZI_TRY(int_value(item.c_str(), (*v)[i], min, max, &x));
    values.push_back(x);
  }
  *out = std::move(values);
  return Status::Ok();
}

Status JsonObjectReader::get_string_list(const char* key, std::vector<std::string>* out,
                                         bool required) const {
  const json* v = find(key);
  if (!v || v->is_null()) return required ? missing(key) : Status::Ok();
  if (!v->is_array()) {
    return error(key, std::string("expected a list of strings, got ") + type_name(*v));
  }
  std::vector<std::string> values;
  for (size_t i = 0; i < v->size(); ++i) {
    if (!(*v)[i].is_string()) {
      return error(
          key, "item " + std::to_string(i) + " is a " + type_name((*v)[i]) + ", expected a string");
    }
    values.push_back((*v)[i].get<std::string>());
  }
  *out = std::move(values);
  return Status::Ok();
}

}  // namespace zimage::json_util
