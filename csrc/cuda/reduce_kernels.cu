#include "reduce_kernels.cuh"

#include <cstdint>

#include "core/error.h"
#include "element_ops.cuh"
#include "launch.cuh"

namespace pycomm::cuda {
namespace {

using detail::kThreads;
using detail::Peel;

// dst[i] = R::apply(dst[i], src[i]): 16 bytes per access in the aligned body, grid-stride.
template <typename R>
__global__ void __launch_bounds__(kThreads)
    reduceKernel(typename R::T* __restrict__ dst, const typename R::T* __restrict__ src, size_t count, Peel peel) {
  using T = typename R::T;
  constexpr size_t V = 16 / sizeof(T);
  union Pack {
    uint4 u;
    T v[V];
  };
  detail::peeledLoop<V>(
      detail::gridThread(), detail::gridThreads(), count, peel,
      [&](size_t i) {
        Pack a;
        Pack b;
        a.u = *reinterpret_cast<const uint4*>(dst + i);
        b.u = *reinterpret_cast<const uint4*>(src + i);
#pragma unroll
        for (size_t k = 0; k < V; ++k) a.v[k] = R::apply(a.v[k], b.v[k]);
        *reinterpret_cast<uint4*>(dst + i) = a.u;
      },
      [&](size_t i) { dst[i] = R::apply(dst[i], src[i]); });
}

template <typename R>
void launch(void* dst, const void* src, size_t count, cudaStream_t stream) {
  using T = typename R::T;
  constexpr size_t V = 16 / sizeof(T);
  const Peel peel = detail::peelFor(count, V, {{dst, sizeof(T)}, {src, sizeof(T)}});
  const size_t scalars = count - peel.nvec * V;
  const size_t items = peel.nvec > scalars ? peel.nvec : scalars;
  auto* kernel = reduceKernel<R>;
  kernel<<<detail::gridFor(kernel, items), kThreads, 0, stream>>>(static_cast<T*>(dst), static_cast<const T*>(src),
                                                                  count, peel);
  detail::checkLaunch("reduceInto");
}

template <typename Op>
void dispatchArithmetic(void* dst, const void* src, size_t count, DataType dtype, cudaStream_t stream) {
  switch (dtype) {
    case DataType::kFloat32: return launch<ops::Native<Op, float>>(dst, src, count, stream);
    case DataType::kFloat64: return launch<ops::Native<Op, double>>(dst, src, count, stream);
    case DataType::kFloat16: return launch<ops::Half<Op, ops::Fp16>>(dst, src, count, stream);
    case DataType::kBFloat16: return launch<ops::Half<Op, ops::Bf16>>(dst, src, count, stream);
    case DataType::kInt8: return launch<ops::Narrow<Op, int8_t>>(dst, src, count, stream);
    case DataType::kUInt8: return launch<ops::Narrow<Op, uint8_t>>(dst, src, count, stream);
    case DataType::kInt16: return launch<ops::Narrow<Op, int16_t>>(dst, src, count, stream);
    case DataType::kInt32: return launch<ops::Native<Op, int32_t>>(dst, src, count, stream);
    case DataType::kInt64: return launch<ops::Native<Op, int64_t>>(dst, src, count, stream);
    default: throw InternalError(strCat("cuda reduce: unexpected dtype ", dtypeName(dtype)));
  }
}

template <typename Op>
void dispatchBitwise(void* dst, const void* src, size_t count, DataType dtype, cudaStream_t stream) {
  switch (dtype) {
    case DataType::kInt8: return launch<ops::Narrow<Op, int8_t>>(dst, src, count, stream);
    case DataType::kUInt8: return launch<ops::Narrow<Op, uint8_t>>(dst, src, count, stream);
    case DataType::kInt16: return launch<ops::Narrow<Op, int16_t>>(dst, src, count, stream);
    case DataType::kInt32: return launch<ops::Native<Op, int32_t>>(dst, src, count, stream);
    case DataType::kInt64: return launch<ops::Native<Op, int64_t>>(dst, src, count, stream);
    default: throw InvalidUsageError(strCat("reduce: bitwise op on non-integer dtype ", dtypeName(dtype)));
  }
}

}  // namespace

void reduceInto(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op, cudaStream_t stream) {
  if (count == 0) return;
  if (dtype == DataType::kBool) {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kMax:
      case ReduceOp::kBor:
        return launch<ops::Bool<ops::BoolOr>>(dst, src, count, stream);
      case ReduceOp::kProduct:
      case ReduceOp::kMin:
      case ReduceOp::kBand:
        return launch<ops::Bool<ops::BoolAnd>>(dst, src, count, stream);
      case ReduceOp::kBxor:
        return launch<ops::Bool<ops::BoolXor>>(dst, src, count, stream);
      default:
        break;
    }
    throw InvalidUsageError(strCat("reduce: unsupported op ", reduceOpName(op), " for bool"));
  }
  switch (op) {
    case ReduceOp::kSum: return dispatchArithmetic<ops::Sum>(dst, src, count, dtype, stream);
    case ReduceOp::kProduct: return dispatchArithmetic<ops::Product>(dst, src, count, dtype, stream);
    case ReduceOp::kMin: return dispatchArithmetic<ops::Min>(dst, src, count, dtype, stream);
    case ReduceOp::kMax: return dispatchArithmetic<ops::Max>(dst, src, count, dtype, stream);
    case ReduceOp::kBand: return dispatchBitwise<ops::Band>(dst, src, count, dtype, stream);
    case ReduceOp::kBor: return dispatchBitwise<ops::Bor>(dst, src, count, dtype, stream);
    case ReduceOp::kBxor: return dispatchBitwise<ops::Bxor>(dst, src, count, dtype, stream);
    default: break;
  }
  throw InvalidUsageError(strCat("reduce: unsupported op ", static_cast<int>(op)));
}

}  // namespace pycomm::cuda
