// ApiError helpers (see api_error.h): Status -> HTTP status, type and field.
#include "serve/api_error.h"

#include <nlohmann/json.hpp>

namespace zimage::serve {

std::string error_body(const ApiError& e) {
  nlohmann::json j;
  j["error"]["message"] = e.message;
  j["error"]["type"] = e.type;
  j["error"]["param"] = e.param.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.param);
  j["error"]["code"] = e.status;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string_view field_of(std::string_view m) {
  const size_t colon = m.find(": ");
  if (colon == std::string_view::npos || colon == 0 || colon > 64) return {};
  for (size_t i = 0; i < colon; ++i) {
    const char c = m[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '[' || c == ']' || c == '.' || c == '-';
    if (!ok) return {};
  }
  return m.substr(0, colon);
}

ApiError api_error(const Status& st) {
  ApiError e;
  e.message = st.message().empty() ? st.to_string() : st.message();
  e.param = std::string(field_of(e.message));
  switch (st.code()) {
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kUnsupported:
      e.status = 400;
      e.type = "invalid_request_error";
      break;
    case ErrorCode::kNotFound:
      e.status = 404;
      e.type = "not_found_error";
      break;
    case ErrorCode::kCancelled:
      e.status = 409;
      e.type = "cancelled";
      break;
    case ErrorCode::kOutOfMemory:
      e.status = 503;
      e.type = "server_error";
      break;
    default:
      e.status = 500;
      e.type = "server_error";
      break;
  }
  return e;
}

ApiError bad_request(std::string param, std::string message) {
  return ApiError{400, "invalid_request_error", std::move(message), std::move(param)};
}

ApiError not_found(std::string param, std::string message) {
  return ApiError{404, "not_found_error", std::move(message), std::move(param)};
}

}  // namespace zimage::serve
