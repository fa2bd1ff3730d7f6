// HTTP message helpers (see message.h).
#include "serve/http/message.h"

#include <algorithm>

namespace zimage::serve::http {

namespace {

char lower(char c) {
  return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (lower(a[i]) != lower(b[i])) return false;
  return true;
}

void Headers::add(std::string name, std::string value) {
  fields_.emplace_back(std::move(name), std::move(value));
}

void Headers::set(const std::string& name, std::string value) {
  fields_.erase(std::remove_if(fields_.begin(), fields_.end(),
                               [&](const auto& f) { return iequals(f.first, name); }),
                fields_.end());
  fields_.emplace_back(name, std::move(value));
}

bool Headers::has(std::string_view name) const {
  return count(name) > 0;
}

size_t Headers::count(std::string_view name) const {
  return static_cast<size_t>(std::count_if(fields_.begin(), fields_.end(),
                                           [&](const auto& f) { return iequals(f.first, name); }));
}

const std::string& Headers::get(std::string_view name) const {
  static const std::string kEmpty;
  for (const auto& f : fields_)
    if (iequals(f.first, name)) return f.second;
  return kEmpty;
}

bool Request::is_multipart_form_data() const {
  const std::string& type = headers.get("Content-Type");
  constexpr std::string_view kType = "multipart/form-data";
  return type.size() >= kType.size() &&
         iequals(std::string_view(type).substr(0, kType.size()), kType);
}

void Response::set_content(std::string content, const std::string& content_type) {
  body = std::move(content);
  provider = nullptr;
  set_header("Content-Type", content_type);
}

void Response::set_content(const char* data, size_t size, const std::string& content_type) {
  set_content(std::string(data, size), content_type);
}

void Response::set_chunked_content_provider(const std::string& content_type, ChunkedProvider p) {
  body.clear();
  provider = std::move(p);
  set_header("Content-Type", content_type);
}

std::string percent_decode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      const int hi = hex_value(s[i + 1]);
      const int lo = hex_value(s[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out.push_back(static_cast<char>(hi * 16 + lo));
        i += 2;
        continue;
      }
    }
    out.push_back(s[i]);
  }
  return out;
}

}  // namespace zimage::serve::http
