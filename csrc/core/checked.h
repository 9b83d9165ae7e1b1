// Overflow-checked size arithmetic for sizes that come from the user or the network: a product or
// sum that wraps around would let a small buffer pass for a large one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "error.h"

namespace pycomm {

// a * b, or InvalidUsageError naming `what` if it does not fit.
inline size_t checkedMul(size_t a, size_t b, const std::string& what) {
  size_t out;
  PYCOMM_CHECK(!__builtin_mul_overflow(a, b, &out), InvalidUsageError, what, ": ", a, " x ", b,
               " overflows a 64-bit size");
  return out;
}

// a + b, or InvalidUsageError naming `what` if it does not fit.
inline size_t checkedAdd(size_t a, size_t b, const std::string& what) {
  size_t out;
  PYCOMM_CHECK(!__builtin_add_overflow(a, b, &out), InvalidUsageError, what, ": ", a, " + ", b,
               " overflows a 64-bit size");
  return out;
}

}  // namespace pycomm
