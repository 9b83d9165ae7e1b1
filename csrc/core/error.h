// Error types of the core and the PYCOMM_CHECK macro.
//
// Every error carries its context (rank, peer, op, sequence number) in the message, built once per op
// (see OpContext), so that a user reading one line knows who failed, talking to whom, doing what.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace pycomm {

// Base of every error the core raises; the adapter maps each kind to a Python exception.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The caller asked for something invalid (bad dtype, bad option, mismatched sizes across ranks).
class InvalidUsageError : public Error {
 public:
  using Error::Error;
};

// A peer failed: connection closed or reset, malformed frame, or a peer reported an error.
class RemoteError : public Error {
 public:
  using Error::Error;
};

// A wait ran past the group's timeout.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// A broken invariant inside the library.
class InternalError : public Error {
 public:
  using Error::Error;
};

namespace detail {
inline void appendAll(std::ostringstream&) {}
template <typename T, typename... Rest>
void appendAll(std::ostringstream& os, const T& value, const Rest&... rest) {
  os << value;
  appendAll(os, rest...);
}
}  // namespace detail

template <typename... Args>
std::string strCat(const Args&... args) {
  std::ostringstream os;
  detail::appendAll(os, args...);
  return os.str();
}

}  // namespace pycomm

// PYCOMM_CHECK(cond, ErrorType, "context", parts...): throws ErrorType with the parts joined.
#define PYCOMM_CHECK(cond, ErrorType, ...)                                  \
  do {                                                                      \
    if (!(cond)) {                                                          \
      throw ErrorType(::pycomm::strCat(__VA_ARGS__));                       \
    }                                                                       \
  } while (0)
