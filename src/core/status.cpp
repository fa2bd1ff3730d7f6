#include "core/status.h"

namespace zimage {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk:
      return "ok";
    case ErrorCode::kInvalidArgument:
      return "invalid argument";
    case ErrorCode::kNotFound:
      return "not found";
    case ErrorCode::kIo:
      return "i/o error";
    case ErrorCode::kFormat:
      return "format error";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kOutOfMemory:
      return "out of memory";
    case ErrorCode::kDevice:
      return "device error";
    case ErrorCode::kCancelled:
      return "cancelled";
    case ErrorCode::kInternal:
      return "internal error";
  }
  return "unknown error";
}

const char* error_code_slug(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk:
      return "ok";
    case ErrorCode::kInvalidArgument:
      return "invalid_argument";
    case ErrorCode::kNotFound:
      return "not_found";
    case ErrorCode::kIo:
      return "io";
    case ErrorCode::kFormat:
      return "format";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kOutOfMemory:
      return "out_of_memory";
    case ErrorCode::kDevice:
      return "device";
    case ErrorCode::kCancelled:
      return "cancelled";
    case ErrorCode::kInternal:
      return "internal";
  }
  return "internal";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return std::string(error_code_name(code_)) + ": " + message_;
}

Status Status::with_context(const std::string& context) const {
  if (ok()) return *this;
  Status s(code_, context + ": " + message_);
  s.field_ = field_;
  return s;
}

Status Status::with_field(std::string field) const {
  Status s = *this;
  if (!ok()) s.field_ = std::move(field);
  return s;
}

std::optional<std::string> Status::field_detail() const {
  const std::string prefix = field_ + ": ";
  if (field_.empty() || message_.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  return message_.substr(prefix.size());
}

}  // namespace zimage
