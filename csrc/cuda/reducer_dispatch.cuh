// Which reducer of element_ops.cuh combines two stored elements of a dtype under a reduce op: the
// (dtype, op) mapping of csrc/core/codecs/reduce.cc, written once for the kernels (reduce_kernels.cu)
// and for the host check of those reducers (tests/cuda/test_element_ops_host.cc), so the check runs
// the very mapping the kernels are instantiated from.
//
// withReducer(dtype, op, fn) calls fn(R{}) with R one of ops::Native, ops::Half, ops::Narrow,
// ops::Bool (empty structs: the caller takes decltype of the argument), and throws what the CPU
// throws for a pair it rejects. Host code only; plain C++ under a C++ compiler.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/error.h"
#include "element_ops.cuh"

namespace pycomm::cuda {

// The integer dtypes, shared by the arithmetic and the bitwise ops: narrow ones computed in int32
// and truncated back. False (fn not called) for any other dtype.
template <typename Op, typename Fn>
bool withIntegerReducer(DataType dtype, Fn& fn) {
  switch (dtype) {
    case DataType::kInt8: fn(ops::Narrow<Op, int8_t>{}); return true;
    case DataType::kUInt8: fn(ops::Narrow<Op, uint8_t>{}); return true;
    case DataType::kInt16: fn(ops::Narrow<Op, int16_t>{}); return true;
    case DataType::kInt32: fn(ops::Native<Op, int32_t>{}); return true;
    case DataType::kInt64: fn(ops::Native<Op, int64_t>{}); return true;
    default: return false;
  }
}

// SUM, PRODUCT, MIN, MAX: the floating types too (fp16/bf16 widened to fp32 and rounded once).
template <typename Op, typename Fn>
void withArithmeticReducer(DataType dtype, Fn& fn) {
  switch (dtype) {
    case DataType::kFloat32: return fn(ops::Native<Op, float>{});
    case DataType::kFloat64: return fn(ops::Native<Op, double>{});
    case DataType::kFloat16: return fn(ops::Half<Op, ops::Fp16>{});
    case DataType::kBFloat16: return fn(ops::Half<Op, ops::Bf16>{});
    default: break;
  }
  if (!withIntegerReducer<Op>(dtype, fn)) {
    throw InternalError(strCat("cuda reduce: unexpected dtype ", dtypeName(dtype)));
  }
}

template <typename Op, typename Fn>
void withBitwiseReducer(DataType dtype, Fn& fn) {
  if (!withIntegerReducer<Op>(dtype, fn)) {
    throw InvalidUsageError(strCat("reduce: bitwise op on non-integer dtype ", dtypeName(dtype)));
  }
}

template <typename Fn>
void withReducer(DataType dtype, ReduceOp op, Fn&& fn) {
  if (dtype == DataType::kBool) {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kMax:
      case ReduceOp::kBor:
        return fn(ops::Bool<ops::BoolOr>{});
      case ReduceOp::kProduct:
      case ReduceOp::kMin:
      case ReduceOp::kBand:
        return fn(ops::Bool<ops::BoolAnd>{});
      case ReduceOp::kBxor:
        return fn(ops::Bool<ops::BoolXor>{});
      default:
        break;
    }
    throw InvalidUsageError(strCat("reduce: unsupported op ", reduceOpName(op), " for bool"));
  }
  switch (op) {
    case ReduceOp::kSum: return withArithmeticReducer<ops::Sum>(dtype, fn);
    case ReduceOp::kProduct: return withArithmeticReducer<ops::Product>(dtype, fn);
    case ReduceOp::kMin: return withArithmeticReducer<ops::Min>(dtype, fn);
    case ReduceOp::kMax: return withArithmeticReducer<ops::Max>(dtype, fn);
    case ReduceOp::kBand: return withBitwiseReducer<ops::Band>(dtype, fn);
    case ReduceOp::kBor: return withBitwiseReducer<ops::Bor>(dtype, fn);
    case ReduceOp::kBxor: return withBitwiseReducer<ops::Bxor>(dtype, fn);
    default: break;
  }
  throw InvalidUsageError(strCat("reduce: unsupported op ", static_cast<int>(op)));
}

}  // namespace pycomm::cuda
