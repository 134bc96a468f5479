#include "kiln/status.h"

namespace kiln {

std::string_view code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk: return "ok";
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kNotFound: return "not found";
    case ErrorCode::kAlreadyExists: return "already exists";
    case ErrorCode::kFailedPrecondition: return "failed precondition";
    case ErrorCode::kOutOfRange: return "out of range";
    case ErrorCode::kUnimplemented: return "unimplemented";
    case ErrorCode::kInternal: return "internal error";
    case ErrorCode::kUnavailable: return "unavailable";
    case ErrorCode::kCancelled: return "cancelled";
    case ErrorCode::kTimeout: return "timeout";
    case ErrorCode::kCompileError: return "compile error";
    case ErrorCode::kNoDriver: return "no CUDA driver";
    case ErrorCode::kNoDevice: return "no CUDA device";
    case ErrorCode::kCudaError: return "CUDA error";
    case ErrorCode::kLibraryError: return "library error";
    case ErrorCode::kCorrupt: return "corrupt data";
    case ErrorCode::kIoError: return "I/O error";
    case ErrorCode::kShutdown: return "shut down";
    case ErrorCode::kWorkerCrashed: return "worker crashed";
    case ErrorCode::kWrongResult: return "wrong result";
  }
  return "unknown error";
}

Status::Status(ErrorCode code, std::string message, std::string detail) {
  if (code == ErrorCode::kOk) return;
  rep_ = std::make_unique<Rep>(Rep{code, std::move(message), std::move(detail), {}});
}

Status::Status(const Status& other) : rep_(other.rep_ ? std::make_unique<Rep>(*other.rep_) : nullptr) {}

Status& Status::operator=(const Status& other) {
  if (this != &other) rep_ = other.rep_ ? std::make_unique<Rep>(*other.rep_) : nullptr;
  return *this;
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return rep_ ? rep_->message : kEmpty;
}

const std::string& Status::detail() const {
  static const std::string kEmpty;
  return rep_ ? rep_->detail : kEmpty;
}

const std::vector<std::string>& Status::context() const {
  static const std::vector<std::string> kEmpty;
  return rep_ ? rep_->context : kEmpty;
}

Status& Status::with_context(std::string context) & {
  if (rep_) rep_->context.push_back(std::move(context));
  return *this;
}

Status&& Status::with_context(std::string context) && {
  if (rep_) rep_->context.push_back(std::move(context));
  return std::move(*this);
}

std::string Status::to_string() const {
  if (!rep_) return "ok";
  std::string s(code_name(rep_->code));
  s += ": ";
  s += rep_->message;
  if (!rep_->context.empty()) {
    s += " (";
    for (size_t i = 0; i < rep_->context.size(); ++i) {
      if (i) s += "; ";
      s += "while ";
      s += rep_->context[i];
    }
    s += ")";
  }
  return s;
}

std::string Status::to_string_with_detail() const {
  std::string s = to_string();
  if (rep_ && !rep_->detail.empty()) {
    s += "\n";
    s += rep_->detail;
  }
  return s;
}

Status make_error(ErrorCode code, std::string message, std::string detail) {
  if (code == ErrorCode::kOk) return Status(ErrorCode::kInternal, "make_error called with kOk: " + message);
  return Status(code, std::move(message), std::move(detail));
}

}  // namespace kiln
