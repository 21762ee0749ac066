// fusebox: Status helpers.
#include "fusebox/status.h"

namespace fusebox {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "Ok";
    case StatusCode::kInvalidArgument:
      return "InvalidArgument";
    case StatusCode::kParseError:
      return "ParseError";
    case StatusCode::kNotSupported:
      return "NotSupported";
    case StatusCode::kIoError:
      return "IoError";
    case StatusCode::kCudnnError:
      return "CudnnError";
    case StatusCode::kCudaError:
      return "CudaError";
    case StatusCode::kNoDevice:
      return "NoDevice";
    case StatusCode::kVersionMismatch:
      return "VersionMismatch";
    case StatusCode::kVerificationFailed:
      return "VerificationFailed";
    case StatusCode::kInternal:
      return "Internal";
  }
  return "Unknown";
}

std::string Status::ToString() const {
  if (ok()) return "Ok";
  return std::string(status_code_name(code_)) + ": " + message_;
}

Status Status::WithContext(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + message_);
}

}  // namespace fusebox
