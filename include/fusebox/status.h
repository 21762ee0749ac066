// fusebox: status and result types used across the whole public API.
// No exceptions cross the API: every fallible call returns Status or Result<T>.
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace fusebox {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // the caller's graph, option or file content is wrong
  kParseError,          // a file could not be parsed (JSON, .npy, device file)
  kNotSupported,        // valid, but no engine / backend accepts it
  kIoError,             // a file could not be read or written
  kCudnnError,          // cuDNN or the frontend reported an error
  kCudaError,           // the CUDA runtime reported an error
  kNoDevice,            // a GPU is needed and none is present
  kVersionMismatch,     // runtime library older than the headers we were built with
  kVerificationFailed,  // outputs do not match the reference
  kInternal,            // a fusebox bug
};

const char* status_code_name(StatusCode code);

// Cheap to copy when ok (no message). Messages start with where the problem
// is, e.g. "[conv_fprop 'conv1'] input 'w': ...".
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "InvalidArgument: [conv_fprop 'conv1'] ..."
  std::string ToString() const;

  // Returns a copy whose message is prefixed with "context: ".
  Status WithContext(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status ParseError(std::string m) { return {StatusCode::kParseError, std::move(m)}; }
inline Status NotSupported(std::string m) { return {StatusCode::kNotSupported, std::move(m)}; }
inline Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// A value or the Status explaining why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    if (status_.ok()) status_ = Internal("Result constructed from an ok Status without a value");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace fusebox

#define FUSEBOX_CONCAT_INNER(a, b) a##b
#define FUSEBOX_CONCAT(a, b) FUSEBOX_CONCAT_INNER(a, b)

#define FUSEBOX_RETURN_IF_ERROR(expr)  \
  do {                                 \
    ::fusebox::Status _fb_st = (expr); \
    if (!_fb_st.ok()) return _fb_st;   \
  } while (0)

#define FUSEBOX_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()

// FUSEBOX_ASSIGN_OR_RETURN(auto x, make_x());
#define FUSEBOX_ASSIGN_OR_RETURN(lhs, expr) \
  FUSEBOX_ASSIGN_OR_RETURN_IMPL(FUSEBOX_CONCAT(_fb_res_, __LINE__), lhs, expr)
