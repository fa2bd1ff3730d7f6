// Private to src/serve/http: Boost.Beast's parsed head into our Request, and Beast's parse
// errors into the statuses the server answers with. Kept in one header so the server and
// parse_request() read requests the same way.
#pragma once

#include <boost/beast/http.hpp>
#include <string>

#include "serve/http/framing.h"
#include "serve/http/message.h"

namespace zimage::serve::http::detail {

template <class Body>
void copy_head(const boost::beast::http::request<Body>& m, Request* req) {
  req->method = std::string(m.method_string());
  req->target = std::string(m.target());
  req->version = static_cast<int>(m.version());
  const size_t q = req->target.find('?');
  req->path = percent_decode(std::string_view(req->target).substr(0, q));
  req->query = q == std::string::npos ? "" : req->target.substr(q + 1);
  for (const auto& f : m) req->headers.add(std::string(f.name_string()), std::string(f.value()));
}

// The answer to a parse error of Beast's (a bad head or chunk, a limit reached).
inline TransportError parse_error(const boost::beast::error_code& ec, const FramingLimits& limits,
                                  size_t body_limit) {
  namespace bhttp = boost::beast::http;
  if (ec == bhttp::error::header_limit || ec == bhttp::error::buffer_overflow)
    return {431,
            "headers: the request head is larger than " + std::to_string(limits.max_header_bytes) +
                " bytes",
            "headers"};
  if (ec == bhttp::error::body_limit)
    return {413, "body: larger than the " + std::to_string(body_limit) + "-byte limit", "body"};
  if (ec == bhttp::error::bad_content_length)
    return {400,
            "Content-Length: malformed, several that disagree, or given with Transfer-Encoding",
            "Content-Length"};
  if (ec == bhttp::error::bad_transfer_encoding)
    return {400, "Transfer-Encoding: malformed, or given with Content-Length", "Transfer-Encoding"};
  if (ec == bhttp::error::bad_field || ec == bhttp::error::bad_value ||
      ec == bhttp::error::bad_obs_fold)
    return {400, "headers: a malformed header field (" + ec.message() + ")", "headers"};
  if (ec == bhttp::error::bad_chunk || ec == bhttp::error::bad_chunk_extension)
    return {400, "body: a malformed chunk", "body"};
  return {400, "request: malformed HTTP (" + ec.message() + ")", "request"};
}

}  // namespace zimage::serve::http::detail
