// The scalar codec table (codec_kernels.h): portable loops over scalar_kernels.h, the reference of
// the SIMD tables and the fallback on CPUs without AVX2. On x86-64 each loop is compiled twice
// (multiversion.h), so even this table runs vectorized by the compiler on an AVX2 CPU: that is how the
// codecs ran before the SIMD tables existed, and what the benchmarks compare them with.
#include "codec_kernels.h"
#include "multiversion.h"
#include "scalar_kernels.h"

namespace pycomm::codecs {
namespace {

using scalar::kBlock;
using scalar::kBlockBytes;

template <uint16_t (*Convert)(float)>
PYCOMM_MULTIVERSION void encode16(const float* __restrict in, size_t count, uint8_t* __restrict out) {
  for (size_t i = 0; i < count; ++i) scalar::storeCode16(out + 2 * i, Convert(in[i]));
}

template <float (*Convert)(uint16_t)>
PYCOMM_MULTIVERSION void decode16(const uint8_t* __restrict in, size_t count, float* __restrict out) {
  for (size_t i = 0; i < count; ++i) out[i] = Convert(scalar::loadCode16(in + 2 * i));
}

template <float (*Convert)(uint16_t)>
PYCOMM_MULTIVERSION void decodeAdd16(const uint8_t* __restrict in, size_t count, float* __restrict acc) {
  for (size_t i = 0; i < count; ++i) acc[i] += Convert(scalar::loadCode16(in + 2 * i));
}

template <typename F>
PYCOMM_MULTIVERSION void encodeFp8(const float* in, size_t count, uint8_t* out) {
  for (size_t start = 0; start < count; start += kBlock) {
    scalar::encodeBlock<F>(in + start, std::min(kBlock, count - start), out + (start / kBlock) * kBlockBytes);
  }
}

template <typename F>
PYCOMM_MULTIVERSION void decodeFp8(const uint8_t* in, size_t count, float* out) {
  for (size_t start = 0; start < count; start += kBlock) {
    scalar::decodeBlock<F>(in + (start / kBlock) * kBlockBytes, std::min(kBlock, count - start), out + start);
  }
}

template <typename F>
PYCOMM_MULTIVERSION void decodeAddFp8(const uint8_t* in, size_t count, float* acc) {
  for (size_t start = 0; start < count; start += kBlock) {
    scalar::decodeAddBlock<F>(in + (start / kBlock) * kBlockBytes, std::min(kBlock, count - start), acc + start);
  }
}

template <uint8_t (*Convert)(float)>
PYCOMM_MULTIVERSION void toFp8(const float* __restrict in, size_t count, uint8_t* __restrict out) {
  for (size_t i = 0; i < count; ++i) out[i] = Convert(in[i]);
}

template <float (*Convert)(uint8_t)>
PYCOMM_MULTIVERSION void fromFp8(const uint8_t* __restrict in, size_t count, float* __restrict out) {
  for (size_t i = 0; i < count; ++i) out[i] = Convert(in[i]);
}

// Pointers to the inline conversions of fp8.h (their names are overloaded with the array forms).
uint8_t e4m3Code(float f) { return floatToFp8E4M3(f); }
uint8_t e5m2Code(float f) { return floatToFp8E5M2(f); }
float e4m3Value(uint8_t c) { return fp8E4M3ToFloat(c); }
float e5m2Value(uint8_t c) { return fp8E5M2ToFloat(c); }

const CodecKernels kScalarKernels = {
    "scalar",
    {encode16<scalar::fp16Bits>, encode16<scalar::bf16Bits>, encodeFp8<scalar::E4M3>, encodeFp8<scalar::E5M2>},
    {decode16<scalar::fp16Value>, decode16<bf16ToFloat>, decodeFp8<scalar::E4M3>, decodeFp8<scalar::E5M2>},
    {decodeAdd16<scalar::fp16Value>, decodeAdd16<bf16ToFloat>, decodeAddFp8<scalar::E4M3>,
     decodeAddFp8<scalar::E5M2>},
    {toFp8<e4m3Code>, toFp8<e5m2Code>},
    {fromFp8<e4m3Value>, fromFp8<e5m2Value>},
};

}  // namespace

const CodecKernels& scalarKernels() { return kScalarKernels; }

}  // namespace pycomm::codecs
