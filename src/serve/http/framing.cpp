// Request framing checks (see framing.h).
#include "serve/http/framing.h"

#include <boost/beast/http.hpp>

#include "serve/http/beast_util.h"
#include "serve/http/multipart.h"

namespace zimage::serve::http {

std::optional<TransportError> check_head(const Request& head, const FramingLimits& limits) {
  const Headers& h = head.headers;
  if (h.size() > limits.max_headers)
    return TransportError{
        431, "headers: more than " + std::to_string(limits.max_headers) + " header fields",
        "headers"};
  // std::regex (the routes) recurses per character: paths stay short.
  if (head.target.size() > limits.max_target_bytes || head.path.size() > limits.max_path_bytes)
    return TransportError{414,
                          "target: longer than " + std::to_string(limits.max_path_bytes) +
                              " bytes of path or " + std::to_string(limits.max_target_bytes) +
                              " in all",
                          "target"};
  if (head.target.empty() || head.target[0] != '/')
    return TransportError{400, "target: only origin-form request targets (\"/path?query\")",
                          "target"};
  const size_t hosts = h.count("Host");
  if (hosts > 1) return TransportError{400, "Host: more than one Host header", "Host"};
  if (hosts == 0 && head.version >= 11)
    return TransportError{400, "Host: missing (HTTP/1.1 requires it)", "Host"};
  if (h.count("Content-Length") > 1)
    return TransportError{400, "Content-Length: more than one Content-Length header",
                          "Content-Length"};
  if (const size_t te = h.count("Transfer-Encoding"); te > 0) {
    if (te > 1 || !iequals(h.get("Transfer-Encoding"), "chunked"))
      return TransportError{400, "Transfer-Encoding: only a single \"chunked\" is accepted",
                            "Transfer-Encoding"};
    if (h.has("Content-Length"))
      return TransportError{400, "Transfer-Encoding: not allowed together with Content-Length",
                            "Transfer-Encoding"};
  }
  for (const auto& [name, value] : h.fields())
    if (iequals(name, "Content-Encoding") && !iequals(value, "identity"))
      return TransportError{415,
                            "Content-Encoding: compressed request bodies are not accepted (" +
                                value.substr(0, 40) + ")",
                            "Content-Encoding"};
  if (h.has("Expect") && !iequals(h.get("Expect"), "100-continue"))
    return TransportError{417, "Expect: only 100-continue is supported", "Expect"};
  return std::nullopt;
}

std::optional<TransportError> parse_form(Request* req) {
  if (!req->is_multipart_form_data()) return std::nullopt;
  auto parts =
      parse_multipart(req->body, multipart_boundary(req->get_header_value("Content-Type")));
  if (!parts.ok()) return TransportError{400, parts.status().message(), "body"};
  req->files = std::move(parts).value();
  return std::nullopt;
}

ParsedRequest parse_request(std::string_view bytes, size_t body_limit,
                            const FramingLimits& limits) {
  namespace bhttp = boost::beast::http;
  ParsedRequest out;
  bhttp::request_parser<bhttp::string_body> parser;
  parser.header_limit(static_cast<std::uint32_t>(limits.max_header_bytes));
  parser.body_limit(body_limit);
  parser.eager(true);
  boost::beast::error_code ec;
  size_t used = 0;
  bool head_checked = false;
  while (!parser.is_done()) {
    const size_t n = parser.put(boost::asio::buffer(bytes.data() + used, bytes.size() - used), ec);
    used += n;
    // Everything left is passed each time: needing more means the bytes end inside it.
    if (ec == bhttp::error::need_more) break;
    if (ec) {
      out.error = detail::parse_error(ec, limits, body_limit);
      return out;
    }
    if (parser.is_header_done() && !head_checked) {
      head_checked = true;
      detail::copy_head(parser.get(), &out.request);
      if (auto e = check_head(out.request, limits)) {
        out.error = std::move(e);
        return out;
      }
    }
    if (n == 0 && !parser.is_done()) break;
  }
  if (!parser.is_done()) {
    out.error = TransportError{400, "request: the bytes end before the request does", "request"};
    return out;
  }
  if (!head_checked) {
    detail::copy_head(parser.get(), &out.request);
    if (auto e = check_head(out.request, limits)) {
      out.error = std::move(e);
      return out;
    }
  }
  out.request.body = std::move(parser.get().body());
  out.error = parse_form(&out.request);
  return out;
}

}  // namespace zimage::serve::http
