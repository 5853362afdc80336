// Status and Result<T>: how errors cross module boundaries (conventions.md rule 7). A Status
// carries a code and a human-readable message that names the file, tensor or field and the rule
// that failed; nothing that a client or a weight file supplies may turn into an abort.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace ds {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,    // a caller or user supplied a bad value (flag, field, request)
  kNotFound,           // a file, tensor or key does not exist
  kOutOfRange,         // a value outside its allowed range
  kCorrupt,            // bytes from a file break a format rule
  kIoError,            // the operating system refused an I/O operation
  kUnimplemented,      // a valid input that deepserve does not support (yet)
  kResourceExhausted,  // memory, queue or capacity limits
  kFailedPrecondition, // the system is not in a state where the call can run
  kInternal,           // a bug; details in the log
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "CODE: message", for logs and CLI output.
  std::string to_string() const;

  // Returns a copy whose message is prefixed with `context: `.
  Status with_context(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status ok_status() { return Status(); }
inline Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status out_of_range(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status corrupt(std::string m) { return {StatusCode::kCorrupt, std::move(m)}; }
inline Status io_error(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status resource_exhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status failed_precondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// Result<T>: a value or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}                // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {          // NOLINT: implicit by design
    if (std::get<Status>(v_).ok()) v_ = Status(StatusCode::kInternal, "Result from ok Status");
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

}  // namespace ds

#define DS_CONCAT_INNER_(a, b) a##b
#define DS_CONCAT_(a, b) DS_CONCAT_INNER_(a, b)

// Returns the Status of `expr` from the enclosing function when it is not ok.
#define DS_RETURN_IF_ERROR(expr)               \
  do {                                         \
    ::ds::Status ds_status_ = (expr);          \
    if (!ds_status_.ok()) return ds_status_;   \
  } while (0)

// `DS_ASSIGN_OR_RETURN(auto x, make_x());` declares x from a Result or returns its Status.
#define DS_ASSIGN_OR_RETURN(lhs, expr) DS_ASSIGN_OR_RETURN_IMPL_(DS_CONCAT_(ds_res_, __LINE__), lhs, expr)
#define DS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
