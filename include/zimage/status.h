// Public: errors are values: every fallible function returns a Status or a Result<T>.
// Nothing in the engine aborts on bad input; the API edge turns a Status into a message
// (CLI) or an HTTP error (server). Messages name what is wrong (file, tensor, field); an error
// about a request field also carries the field's name (field()), so the server and the CLI can
// word it with their own names ("size", "--width") without reading the message.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace zimage {

enum class ErrorCode {
  kOk = 0,
  kInvalidArgument,  // a bad flag, request field or API argument
  kNotFound,         // a missing file, tensor or config key
  kIo,               // open/read/write/mmap failed
  kFormat,           // a file exists but its contents are malformed
  kUnsupported,      // well-formed but not something the engine can do
  kOutOfMemory,      // host or device allocation failed
  kDevice,           // a CUDA / cuBLAS / cuDNN call failed
  kCancelled,        // the caller asked to stop
  kInternal,         // a bug: an invariant the engine itself broke
};

// In words for messages: "invalid argument", "i/o error", ...
const char* error_code_name(ErrorCode code);
// As an identifier for protocols and bindings: "invalid_argument", "io", "format", "device", ...
// (the broker's result "code", the Python exceptions' .code).
const char* error_code_slug(ErrorCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "format error: model.safetensors: header length 12 exceeds file size 8"
  std::string to_string() const;

  // Prepends context: "loading transformer: " + message. The field, if any, is kept.
  Status with_context(const std::string& context) const;

  // The request field the error is about ("width", "prompts[0]", "init_image"), or empty. Its
  // message then starts with "<field>: " unless a context was put before it since.
  const std::string& field() const { return field_; }
  // This status, about `field` (an OK status stays OK, without a field).
  Status with_field(std::string field) const;
  // The message after its leading "<field>: " ("63 is not a multiple of 16"); nullopt without a
  // field or when a context was put before it.
  std::optional<std::string> field_detail() const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
  std::string field_;
};

inline Status InvalidArgument(std::string m) {
  return {ErrorCode::kInvalidArgument, std::move(m)};
}
inline Status NotFound(std::string m) {
  return {ErrorCode::kNotFound, std::move(m)};
}
inline Status IoError(std::string m) {
  return {ErrorCode::kIo, std::move(m)};
}
inline Status FormatError(std::string m) {
  return {ErrorCode::kFormat, std::move(m)};
}
inline Status Unsupported(std::string m) {
  return {ErrorCode::kUnsupported, std::move(m)};
}
inline Status OutOfMemory(std::string m) {
  return {ErrorCode::kOutOfMemory, std::move(m)};
}
inline Status DeviceError(std::string m) {
  return {ErrorCode::kDevice, std::move(m)};
}
inline Status Cancelled(std::string m) {
  return {ErrorCode::kCancelled, std::move(m)};
}
inline Status InternalError(std::string m) {
  return {ErrorCode::kInternal, std::move(m)};
}
// kInvalidArgument about a request field: message "<field>: <detail>", field() == field.
inline Status FieldError(const std::string& field, const std::string& detail) {
  return InvalidArgument(field + ": " + detail).with_field(field);
}

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {
    assert(!std::get<Status>(v_).ok() && "Result built from an OK status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace zimage

#define ZI_CONCAT_INNER(a, b) a##b
#define ZI_CONCAT(a, b) ZI_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function if `expr` failed.
#define ZI_TRY(expr)                         \
  do {                                       \
    ::zimage::Status zi_status_ = (expr);    \
    if (!zi_status_.ok()) return zi_status_; \
  } while (0)

// `ZI_ASSIGN_OR_RETURN(auto x, make_x());`
#define ZI_ASSIGN_OR_RETURN(lhs, expr) \
  ZI_ASSIGN_OR_RETURN_IMPL(ZI_CONCAT(zi_result_, __LINE__), lhs, expr)
#define ZI_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
