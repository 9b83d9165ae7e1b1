#include "fp8.h"

namespace pycomm::codecs {

void floatToFp8E4M3(const float* __restrict in, size_t count, uint8_t* __restrict out) {
  for (size_t i = 0; i < count; ++i) out[i] = floatToFp8E4M3(in[i]);
}

void floatToFp8E5M2(const float* __restrict in, size_t count, uint8_t* __restrict out) {
  for (size_t i = 0; i < count; ++i) out[i] = floatToFp8E5M2(in[i]);
}

void fp8E4M3ToFloat(const uint8_t* __restrict in, size_t count, float* __restrict out) {
  for (size_t i = 0; i < count; ++i) out[i] = fp8E4M3ToFloat(in[i]);
}

void fp8E5M2ToFloat(const uint8_t* __restrict in, size_t count, float* __restrict out) {
  for (size_t i = 0; i < count; ++i) out[i] = fp8E5M2ToFloat(in[i]);
}

}  // namespace pycomm::codecs
