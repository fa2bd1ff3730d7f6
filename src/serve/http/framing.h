// The strict reading of a request's framing, before any route sees it: what a request head may
// carry, and the errors (with their HTTP status) for what it may not. Why strict: behind a proxy,
// a server that reads a request differently from the proxy (two Content-Lengths, a space before
// a colon, two Hosts) lets a client smuggle a second request past the proxy's checks; and a
// head, a body or an encoding without bounds lets one small request take the server's memory.
//
// The server (http/server.h) parses with Boost.Beast and calls check_head() once the head is
// in; parse_request() runs the same parser and checks over bytes in memory (tests, fuzzing).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "serve/http/message.h"

namespace zimage::serve::http {

struct FramingLimits {
  size_t max_header_bytes = 32 * 1024;  // request line and header fields together
  size_t max_headers = 100;             // header fields
  size_t max_path_bytes = 2048;         // the decoded path (414 past it)
  size_t max_target_bytes = 8192;       // path and query as sent (414 past it)
};

// An error the transport answers itself: status, message (starting with the field it is
// about), and that field.
struct TransportError {
  int status = 400;
  std::string message;
  std::string param;
};

// Checks a parsed head: one Host (HTTP/1.1 needs it), at most one Content-Length and
// Transfer-Encoding (only "chunked"), no Content-Encoding but identity (415: a compressed body
// would inflate past any limit), Expect only 100-continue, an origin-form target, at most
// max_headers fields (431).
std::optional<TransportError> check_head(const Request& head, const FramingLimits& limits);

// Parses a whole request held in memory with the server's parser and checks: the head, then a
// body of at most `body_limit` bytes (Content-Length or chunked). A request whose bytes stop
// early is an error. The parts of a multipart body are parsed too.
struct ParsedRequest {
  Request request;
  std::optional<TransportError> error;
};
ParsedRequest parse_request(std::string_view bytes, size_t body_limit, const FramingLimits& limits);

// The multipart/form-data parts of `req` into req->files (nothing for other content types).
std::optional<TransportError> parse_form(Request* req);

}  // namespace zimage::serve::http
