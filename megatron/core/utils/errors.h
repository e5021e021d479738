// Error handling shared by the whole project.
//
// Two kinds of failure:
//  * user-facing problems (bad flag, bad file, bad record) throw megatron::UserError whose
//    message is one line naming the file/line/flag/field and what to do; programs print it and
//    exit non-zero;
//  * internal invariants use MEGATRON_CHECK(cond) << "message with shapes"; a failure throws
//    megatron::InternalError carrying the source location.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace megatron {

/// A problem the user can fix (bad input, bad flag). what() is a single line.
class UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& msg) : std::runtime_error(msg) {}
};

/// A violated internal invariant (a bug, or an unsupported combination reaching a kernel).
class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& msg) : std::logic_error(msg) {}
};

namespace detail {
/// Collects a streamed message and throws on destruction (used by MEGATRON_CHECK).
class CheckFailure {
 public:
  CheckFailure(const char* cond, const char* file, int line) {
    os_ << file << ":" << line << ": check failed: " << cond << " ";
  }
  [[noreturn]] ~CheckFailure() noexcept(false) { throw InternalError(os_.str()); }
  template <class T>
  CheckFailure& operator<<(const T& v) {
    os_ << v;
    return *this;
  }

 private:
  std::ostringstream os_;
};

/// Builds a UserError message from streamed parts.
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

/// Throws UserError with the streamed-together arguments as message.
template <class... Args>
[[noreturn]] void user_error(const Args&... args) {
  throw UserError(detail::concat(args...));
}

}  // namespace megatron

#define MEGATRON_CHECK(cond) \
  if (cond) {                \
  } else                     \
    ::megatron::detail::CheckFailure(#cond, __FILE__, __LINE__)
