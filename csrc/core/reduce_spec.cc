#include "reduce_spec.h"

#include <cstdint>

#include "codecs/half.h"
#include "codecs/reduce.h"
#include "error.h"

namespace pycomm {
namespace {

// One quotient per element in T: IEEE division for floats (vectorized, and exact like torch's);
// C++'s truncating division for integers, which is torch's "trunc" rounding mode.
template <typename T>
void divideTyped(T* buf, size_t count, int size) {
  const T divisor = static_cast<T>(size);
  PYCOMM_CHECK(divisor != T(0), InvalidUsageError, "AVG over ", size, " ranks divides by zero in this dtype");
  for (size_t i = 0; i < count; ++i) buf[i] = static_cast<T>(buf[i] / divisor);
}

// fp16 and bf16 as torch computes them: widened to fp32, divided by the fp32 divisor, rounded once.
template <float (*toFloat)(uint16_t), uint16_t (*fromFloat)(float)>
void divideHalf(uint16_t* buf, size_t count, int size) {
  const float divisor = static_cast<float>(size);
  for (size_t i = 0; i < count; ++i) buf[i] = fromFloat(toFloat(buf[i]) / divisor);
}

}  // namespace

std::string reduceSpecError(const ReduceSpec& spec, DataType dtype) {
  if (!supportsReduce(dtype, spec.op)) return strCat("op ", reduceOpName(spec.op), " is not defined for ", dtypeName(dtype));
  if (spec.preScale && !isFloating(dtype)) return strCat("PREMUL_SUM needs a floating dtype, got ", dtypeName(dtype));
  if (spec.average && dtype == DataType::kBool) return "AVG is not defined for bool";
  return {};
}

void applyPreScale(const ReduceSpec& spec, void* buf, size_t count, DataType dtype) {
  if (spec.preScale && count > 0) codecs::scaleBuffer(buf, count, dtype, *spec.preScale);
}

void applyAverage(const ReduceSpec& spec, void* buf, size_t count, DataType dtype, int size) {
  if (!spec.average || count == 0) return;
  switch (dtype) {
    case DataType::kFloat32: return divideTyped(static_cast<float*>(buf), count, size);
    case DataType::kFloat64: return divideTyped(static_cast<double*>(buf), count, size);
    case DataType::kFloat16:
      return divideHalf<codecs::fp16ToFloat, codecs::floatToFp16>(static_cast<uint16_t*>(buf), count, size);
    case DataType::kBFloat16:
      return divideHalf<codecs::bf16ToFloat, codecs::floatToBf16>(static_cast<uint16_t*>(buf), count, size);
    case DataType::kInt8: return divideTyped(static_cast<int8_t*>(buf), count, size);
    case DataType::kUInt8: return divideTyped(static_cast<uint8_t*>(buf), count, size);
    case DataType::kInt16: return divideTyped(static_cast<int16_t*>(buf), count, size);
    case DataType::kInt32: return divideTyped(static_cast<int32_t*>(buf), count, size);
    case DataType::kInt64: return divideTyped(static_cast<int64_t*>(buf), count, size);
    default: throw InvalidUsageError(strCat("AVG is not defined for ", dtypeName(dtype)));
  }
}

}  // namespace pycomm
