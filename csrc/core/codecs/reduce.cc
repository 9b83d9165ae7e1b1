#include "reduce.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../error.h"
#include "half.h"
#include "multiversion.h"

namespace pycomm::codecs {
namespace {

struct Sum {
  template <typename T>
  static T apply(T a, T b) { return a + b; }
};
struct Product {
  template <typename T>
  static T apply(T a, T b) { return a * b; }
};
// MIN/MAX propagate NaN as torch does (a NaN on any rank gives NaN).
template <bool kMax>
struct MinMax {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(a) || std::isnan(b)) return a + b;
    }
    return (kMax ? a < b : b < a) ? b : a;
  }
};
using Min = MinMax<false>;
using Max = MinMax<true>;
struct Band {
  template <typename T>
  static T apply(T a, T b) { return a & b; }
};
struct Bor {
  template <typename T>
  static T apply(T a, T b) { return a | b; }
};
struct Bxor {
  template <typename T>
  static T apply(T a, T b) { return a ^ b; }
};

// dst[i] = a[i] op src[i], where `a` is `dst` (in place) or a buffer apart from it: two loops, as
// the compiler vectorizes a loop whose pointers may alias only behind a runtime overlap check,
// which an in-place call would fail. Out of place saves the copy of `a` into `dst` first: a pass
// over the vector, as long as the reduction's own on the short shared-memory path. Narrow
// integers are computed in int32 (C++ promotes to int anyway) and cast back, which truncates as
// torch does.
template <typename T>
using Wide = std::conditional_t<std::is_integral_v<T> && (sizeof(T) < sizeof(int32_t)), int32_t, T>;

template <typename Op, typename T>
PYCOMM_LOOP T applyWide(T a, T b) {
  return static_cast<T>(Op::apply(static_cast<Wide<T>>(a), static_cast<Wide<T>>(b)));
}

template <typename Op, typename T>
PYCOMM_LOOP void reduceTyped(T* __restrict dst, const T* __restrict src, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = applyWide<Op>(dst[i], src[i]);
}

template <typename Op, typename T>
PYCOMM_LOOP void combineTyped(T* __restrict dst, const T* __restrict a, const T* __restrict src, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = applyWide<Op>(a[i], src[i]);
}

template <typename Op, typename T>
PYCOMM_LOOP void reduceAs(void* dst, const void* a, const void* src, size_t count) {
  if (a == dst) {
    reduceTyped<Op>(static_cast<T*>(dst), static_cast<const T*>(src), count);
  } else {
    combineTyped<Op>(static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(src), count);
  }
}

template <typename Op, float (*toFloat)(uint16_t), uint16_t (*fromFloat)(float)>
PYCOMM_LOOP void reduceHalfInPlace(uint16_t* __restrict dst, const uint16_t* __restrict src, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = fromFloat(Op::apply(toFloat(dst[i]), toFloat(src[i])));
}

template <typename Op, float (*toFloat)(uint16_t), uint16_t (*fromFloat)(float)>
PYCOMM_LOOP void reduceHalf(void* dst, const void* a, const void* src, size_t count) {
  // Out of place only from reduceMany, which sends its half types to reduceManyHalf: no loop of its own.
  if (a != dst) std::memcpy(dst, a, count * sizeof(uint16_t));
  reduceHalfInPlace<Op, toFloat, fromFloat>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), count);
}

// bool: SUM and MAX are logical or, PRODUCT and MIN logical and (torch's semantics for bool).
template <typename Op>
PYCOMM_LOOP void reduceBool(uint8_t* __restrict dst, const uint8_t* __restrict src, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    const uint8_t a = dst[i] != 0;
    const uint8_t b = src[i] != 0;
    dst[i] = static_cast<uint8_t>(Op::apply(a, b) != 0);
  }
}

// The integer cases are written out in both switches rather than shared: one switch per dispatch
// compiles to one jump table, and a shared helper changes the code GCC generates around the loops.
template <typename Op>
PYCOMM_LOOP void dispatchArithmetic(void* dst, const void* a, const void* src, size_t count, DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return reduceAs<Op, float>(dst, a, src, count);
    case DataType::kFloat64: return reduceAs<Op, double>(dst, a, src, count);
    case DataType::kFloat16: return reduceHalf<Op, fp16ToFloat, floatToFp16>(dst, a, src, count);
    case DataType::kBFloat16: return reduceHalf<Op, bf16ToFloat, floatToBf16>(dst, a, src, count);
    case DataType::kInt8: return reduceAs<Op, int8_t>(dst, a, src, count);
    case DataType::kUInt8: return reduceAs<Op, uint8_t>(dst, a, src, count);
    case DataType::kInt16: return reduceAs<Op, int16_t>(dst, a, src, count);
    case DataType::kInt32: return reduceAs<Op, int32_t>(dst, a, src, count);
    case DataType::kInt64: return reduceAs<Op, int64_t>(dst, a, src, count);
    default: throw InternalError(strCat("reduce: unexpected dtype ", dtypeName(dtype)));
  }
}

template <typename Op>
PYCOMM_LOOP void dispatchBitwise(void* dst, const void* a, const void* src, size_t count, DataType dtype) {
  switch (dtype) {
    case DataType::kInt8: return reduceAs<Op, int8_t>(dst, a, src, count);
    case DataType::kUInt8: return reduceAs<Op, uint8_t>(dst, a, src, count);
    case DataType::kInt16: return reduceAs<Op, int16_t>(dst, a, src, count);
    case DataType::kInt32: return reduceAs<Op, int32_t>(dst, a, src, count);
    case DataType::kInt64: return reduceAs<Op, int64_t>(dst, a, src, count);
    default: throw InvalidUsageError(strCat("reduce: bitwise op on non-integer dtype ", dtypeName(dtype)));
  }
}

template <typename T>
PYCOMM_LOOP void scaleTyped(T* buf, size_t count, double factor) {
  for (size_t i = 0; i < count; ++i) buf[i] = static_cast<T>(static_cast<double>(buf[i]) * factor);
}

template <float (*toFloat)(uint16_t), uint16_t (*fromFloat)(float)>
PYCOMM_LOOP void scaleHalf(uint16_t* buf, size_t count, double factor) {
  const float f = static_cast<float>(factor);
  for (size_t i = 0; i < count; ++i) buf[i] = fromFloat(toFloat(buf[i]) * f);
}

// dst = a op src, elementwise; `a` is `dst` or apart from it (reduceAs).
PYCOMM_LOOP void reduceTo(void* dst, const void* a, const void* src, size_t count, DataType dtype, ReduceOp op) {
  if (count == 0) return;
  if (dtype == DataType::kBool) {
    if (a != dst) std::memcpy(dst, a, count);
    auto* d = static_cast<uint8_t*>(dst);
    const auto* s = static_cast<const uint8_t*>(src);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kMax:
      case ReduceOp::kBor:
        return reduceBool<Bor>(d, s, count);
      case ReduceOp::kProduct:
      case ReduceOp::kMin:
      case ReduceOp::kBand:
        return reduceBool<Band>(d, s, count);
      case ReduceOp::kBxor:
        return reduceBool<Bxor>(d, s, count);
      default:
        break;
    }
    throw InvalidUsageError(strCat("reduce: unsupported op ", reduceOpName(op), " for bool"));
  }
  switch (op) {
    case ReduceOp::kSum:
      return dispatchArithmetic<Sum>(dst, a, src, count, dtype);
    case ReduceOp::kProduct:
      return dispatchArithmetic<Product>(dst, a, src, count, dtype);
    case ReduceOp::kMin:
      return dispatchArithmetic<Min>(dst, a, src, count, dtype);
    case ReduceOp::kMax:
      return dispatchArithmetic<Max>(dst, a, src, count, dtype);
    case ReduceOp::kBand:
      return dispatchBitwise<Band>(dst, a, src, count, dtype);
    case ReduceOp::kBor:
      return dispatchBitwise<Bor>(dst, a, src, count, dtype);
    case ReduceOp::kBxor:
      return dispatchBitwise<Bxor>(dst, a, src, count, dtype);
    default:
      break;
  }
  throw InvalidUsageError(strCat("reduce: unsupported op ", static_cast<int>(op)));
}

}  // namespace

PYCOMM_MULTIVERSION
void reduceInto(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op) {
  reduceTo(dst, dst, src, count, dtype, op);
}

namespace {

// Half types: widen every source into an fp32 block accumulator, round once at the end.
template <typename Op, float (*toFloat)(uint16_t), uint16_t (*fromFloat)(float)>
PYCOMM_LOOP void reduceManyHalf(uint16_t* dst, const void* const* srcs, size_t nsrcs, size_t count) {
  constexpr size_t kBlock = 1024;
  float acc[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t n = std::min(kBlock, count - base);
    const auto* first = static_cast<const uint16_t*>(srcs[0]) + base;
    for (size_t i = 0; i < n; ++i) acc[i] = toFloat(first[i]);
    for (size_t s = 1; s < nsrcs; ++s) {
      const auto* src = static_cast<const uint16_t*>(srcs[s]) + base;
      for (size_t i = 0; i < n; ++i) acc[i] = Op::apply(acc[i], toFloat(src[i]));
    }
    for (size_t i = 0; i < n; ++i) dst[base + i] = fromFloat(acc[i]);
  }
}

template <float (*toFloat)(uint16_t), uint16_t (*fromFloat)(float)>
PYCOMM_LOOP bool reduceManyHalfDispatch(void* dst, const void* const* srcs, size_t nsrcs, size_t count, ReduceOp op) {
  auto* d = static_cast<uint16_t*>(dst);
  switch (op) {
    case ReduceOp::kSum: reduceManyHalf<Sum, toFloat, fromFloat>(d, srcs, nsrcs, count); return true;
    case ReduceOp::kProduct: reduceManyHalf<Product, toFloat, fromFloat>(d, srcs, nsrcs, count); return true;
    case ReduceOp::kMin: reduceManyHalf<Min, toFloat, fromFloat>(d, srcs, nsrcs, count); return true;
    case ReduceOp::kMax: reduceManyHalf<Max, toFloat, fromFloat>(d, srcs, nsrcs, count); return true;
    default: return false;
  }
}

}  // namespace

PYCOMM_MULTIVERSION
void reduceMany(void* dst, const void* const* srcs, size_t nsrcs, size_t count, DataType dtype, ReduceOp op) {
  if (count == 0 || nsrcs == 0) return;
  if (dtype == DataType::kFloat16 && reduceManyHalfDispatch<fp16ToFloat, floatToFp16>(dst, srcs, nsrcs, count, op)) return;
  if (dtype == DataType::kBFloat16 && reduceManyHalfDispatch<bf16ToFloat, floatToBf16>(dst, srcs, nsrcs, count, op)) return;
  if (nsrcs == 1) {
    if (dst != srcs[0]) std::memcpy(dst, srcs[0], count * elementSize(dtype));
    return;
  }
  reduceTo(dst, srcs[0], srcs[1], count, dtype, op);
  for (size_t s = 2; s < nsrcs; ++s) reduceInto(dst, srcs[s], count, dtype, op);
}

PYCOMM_MULTIVERSION
void scaleBuffer(void* buf, size_t count, DataType dtype, double factor) {
  switch (dtype) {
    case DataType::kFloat32: {
      auto* p = static_cast<float*>(buf);
      const float f = static_cast<float>(factor);
      for (size_t i = 0; i < count; ++i) p[i] *= f;
      return;
    }
    case DataType::kFloat64:
      return scaleTyped(static_cast<double*>(buf), count, factor);
    case DataType::kFloat16:
      return scaleHalf<fp16ToFloat, floatToFp16>(static_cast<uint16_t*>(buf), count, factor);
    case DataType::kBFloat16:
      return scaleHalf<bf16ToFloat, floatToBf16>(static_cast<uint16_t*>(buf), count, factor);
    case DataType::kInt8:
      return scaleTyped(static_cast<int8_t*>(buf), count, factor);
    case DataType::kUInt8:
      return scaleTyped(static_cast<uint8_t*>(buf), count, factor);
    case DataType::kInt16:
      return scaleTyped(static_cast<int16_t*>(buf), count, factor);
    case DataType::kInt32:
      return scaleTyped(static_cast<int32_t*>(buf), count, factor);
    case DataType::kInt64:
      return scaleTyped(static_cast<int64_t*>(buf), count, factor);
    default:
      throw InvalidUsageError(strCat("scale: unsupported dtype ", dtypeName(dtype)));
  }
}

}  // namespace pycomm::codecs
