// multipart/form-data parsing (see multipart.h).
#include "serve/http/multipart.h"

namespace zimage::serve::http {

namespace {

Status malformed(const std::string& why) {
  return InvalidArgument("body: malformed multipart/form-data (" + why + ")");
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Parameters of a header value: `form-data; name="image"; filename="a.png"`. Values are tokens
// or quoted strings (a backslash escapes the next character). Returns false when malformed.
bool parse_params(std::string_view v, std::vector<std::pair<std::string, std::string>>* out) {
  size_t i = v.find(';');
  while (i != std::string_view::npos && i < v.size()) {
    ++i;  // past ';'
    while (i < v.size() && (v[i] == ' ' || v[i] == '\t')) ++i;
    if (i >= v.size()) break;
    const size_t eq = v.find('=', i);
    if (eq == std::string_view::npos) return false;
    std::string key(trim(v.substr(i, eq - i)));
    for (char& c : key)
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    i = eq + 1;
    while (i < v.size() && (v[i] == ' ' || v[i] == '\t')) ++i;
    std::string value;
    if (i < v.size() && v[i] == '"') {
      ++i;
      bool closed = false;
      while (i < v.size()) {
        const char c = v[i++];
        if (c == '\\' && i < v.size()) {
          value.push_back(v[i++]);
        } else if (c == '"') {
          closed = true;
          break;
        } else {
          value.push_back(c);
        }
      }
      if (!closed) return false;
      while (i < v.size() && v[i] != ';') {
        if (v[i] != ' ' && v[i] != '\t') return false;
        ++i;
      }
    } else {
      const size_t end = v.find(';', i);
      value =
          std::string(trim(v.substr(i, end == std::string_view::npos ? v.size() - i : end - i)));
      i = end == std::string_view::npos ? v.size() : end;
    }
    if (key.empty()) return false;
    out->emplace_back(std::move(key), std::move(value));
    if (i < v.size() && v[i] != ';') return false;
  }
  return true;
}

}  // namespace

std::string multipart_boundary(std::string_view content_type) {
  std::vector<std::pair<std::string, std::string>> params;
  if (!parse_params(content_type, &params)) return "";
  for (const auto& [k, v] : params)
    if (k == "boundary") return (v.empty() || v.size() > 70) ? "" : v;
  return "";
}

Result<std::vector<std::pair<std::string, FormFile>>> parse_multipart(
    std::string_view body, std::string_view boundary, const MultipartLimits& limits) {
  if (boundary.empty()) return malformed("no boundary in Content-Type");
  const std::string dash = "--" + std::string(boundary);
  const std::string delimiter = "\r\n" + dash;
  // The first delimiter may follow a preamble (ignored); after it, each part starts with CRLF.
  size_t pos;
  if (body.substr(0, dash.size()) == dash) {
    pos = dash.size();
  } else {
    const size_t first = body.find(delimiter);
    if (first == std::string_view::npos) return malformed("no boundary line");
    pos = first + delimiter.size();
  }
  std::vector<std::pair<std::string, FormFile>> parts;
  for (;;) {
    if (body.substr(pos, 2) == "--") return parts;  // the close delimiter; the epilogue is ignored
    // Transport padding (spaces, tabs) may follow a delimiter before its CRLF.
    while (pos < body.size() && (body[pos] == ' ' || body[pos] == '\t')) ++pos;
    if (body.substr(pos, 2) != "\r\n") return malformed("a boundary line does not end in CRLF");
    pos += 2;
    if (parts.size() >= limits.max_parts)
      return malformed("more than " + std::to_string(limits.max_parts) + " parts");
    const size_t header_end = body.find("\r\n\r\n", pos);
    if (header_end == std::string_view::npos || header_end - pos > limits.max_part_header_bytes)
      return malformed(header_end == std::string_view::npos ? "a part's headers do not end"
                                                            : "a part's headers are too long");
    std::string name;
    bool has_name = false;
    FormFile file;
    std::string_view headers = body.substr(pos, header_end - pos);
    while (!headers.empty()) {
      const size_t eol = headers.find("\r\n");
      const std::string_view line = headers.substr(0, eol);
      headers = eol == std::string_view::npos ? std::string_view() : headers.substr(eol + 2);
      const size_t colon = line.find(':');
      if (colon == std::string_view::npos || colon == 0) return malformed("a bad part header");
      const std::string_view field = line.substr(0, colon);
      const std::string_view value = trim(line.substr(colon + 1));
      if (iequals(field, "Content-Disposition")) {
        std::vector<std::pair<std::string, std::string>> params;
        if (!iequals(trim(value.substr(0, value.find(';'))), "form-data") ||
            !parse_params(value, &params))
          return malformed("a part's Content-Disposition is not form-data");
        for (auto& [k, v] : params) {
          if (k == "name") {
            name = std::move(v);
            has_name = true;
          } else if (k == "filename") {
            file.filename = std::move(v);
          }
        }
      } else if (iequals(field, "Content-Type")) {
        file.content_type = std::string(value);
      }
    }
    if (!has_name || name.empty()) return malformed("a part without a field name");
    pos = header_end + 4;
    const size_t end = body.find(delimiter, pos);
    if (end == std::string_view::npos) return malformed("the last part does not end");
    file.content = std::string(body.substr(pos, end - pos));
    parts.emplace_back(std::move(name), std::move(file));
    pos = end + delimiter.size();
  }
}

}  // namespace zimage::serve::http
