// HTTP-facing errors. Why a type of its own: the engine speaks zimage::Status ("width: 1000 is not
// a multiple of 16"); a client needs an HTTP status, an OpenAI-style type and the request field at
// fault. Every error response of the server is {"error": {"message", "type", "param"}} built here.
#pragma once

#include <string>
#include <string_view>

#include "zimage/status.h"

namespace zimage::serve {

struct ApiError {
  int status = 400;                            // HTTP status code
  std::string type = "invalid_request_error";  // OpenAI-style error type
  std::string message;
  std::string param;  // the request field at fault; empty = null
};

// The JSON body {"error": {"message": ..., "type": ..., "param": ... or null}}. Never throws on
// odd bytes: invalid UTF-8 in a message is replaced.
std::string error_body(const ApiError& e);

// A Status as an ApiError: kInvalidArgument -> 400, kNotFound -> 404, kCancelled -> 409,
// kOutOfMemory -> 503, others 500. The field is the message's prefix before ": " when that is a
// field name ("width: ..." -> param "width").
ApiError api_error(const Status& st);

// Convenience constructors.
ApiError bad_request(std::string param, std::string message);
ApiError not_found(std::string param, std::string message);

// The field-name prefix of a message ("prompts[0]: too long" -> "prompts[0]"); empty if none.
std::string_view field_of(std::string_view message);

}  // namespace zimage::serve
