// Element types and reduce operations the core understands. The adapter maps torch's to these.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pycomm {

enum class DataType : uint8_t {
  kFloat32 = 0,
  kFloat64,
  kFloat16,
  kBFloat16,
  kInt8,
  kUInt8,
  kInt16,
  kInt32,
  kInt64,
  kBool,
  kCount,  // not a type: the number of types
};

// The core knows SUM, PRODUCT, MIN, MAX and the bitwise ops. AVG and PREMUL_SUM are SUM with a
// division after or a scale before (ReduceSpec, reduce_spec.h), so the reduction kernels stay one
// per (dtype, op).
enum class ReduceOp : uint8_t {
  kSum = 0,
  kProduct,
  kMin,
  kMax,
  kBand,
  kBor,
  kBxor,
  kCount,
};

size_t elementSize(DataType dtype);
const char* dtypeName(DataType dtype);
const char* reduceOpName(ReduceOp op);
bool isFloating(DataType dtype);

// Whether reduceInto supports this pair; bitwise ops are for integers and bool only.
bool supportsReduce(DataType dtype, ReduceOp op);

}  // namespace pycomm
