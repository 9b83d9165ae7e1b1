// The codecs' entry points: block_codec.h's (names, sizes, type checks) and fp8.h's array forms, each
// a call through the kernel table chosen for this CPU (codec_kernels.h). The kernels themselves are
// in scalar_kernels.* (the reference) and simd_*.cc.
#include "block_codec.h"

#include "../error.h"
#include "codec_kernels.h"
#include "fp8.h"

namespace pycomm::codecs {
namespace {

[[noreturn]] void badCodec(Codec codec) {
  throw InvalidUsageError(strCat("unknown codec ", static_cast<int>(codec)));
}

static_assert(static_cast<size_t>(Codec::kFp8E5M2) + 1 == kCodecCount, "the kernel tables index codecs 0..3");

// The index of a codec in the kernel table's arrays; an out-of-range value (a corrupted enum) throws.
size_t kernelIndex(Codec codec) {
  const auto index = static_cast<size_t>(codec);
  if (index >= kCodecCount) badCodec(codec);
  return index;
}

}  // namespace

const char* codecName(Codec codec) {
  switch (codec) {
    case Codec::kFp16: return "fp16";
    case Codec::kBf16: return "bf16";
    case Codec::kFp8E4M3: return "fp8_e4m3";
    case Codec::kFp8E5M2: return "fp8_e5m2";
  }
  return "unknown";
}

Codec codecFromName(const std::string& name) {
  for (Codec c : {Codec::kFp16, Codec::kBf16, Codec::kFp8E4M3, Codec::kFp8E5M2}) {
    if (name == codecName(c)) return c;
  }
  throw InvalidUsageError(strCat("unknown codec \"", name,
                                 "\" (expected one of fp16, bf16, fp8_e4m3, fp8_e5m2)"));
}

size_t encodedBytes(Codec codec, size_t count) {
  switch (codec) {
    case Codec::kFp16:
    case Codec::kBf16:
      return 2 * count;
    case Codec::kFp8E4M3:
    case Codec::kFp8E5M2:
      return count + kFp8ScaleBytes * ((count + kFp8BlockElements - 1) / kFp8BlockElements);
  }
  badCodec(codec);
}

void encode(Codec codec, const float* in, size_t count, uint8_t* out) {
  activeKernels().encode[kernelIndex(codec)](in, count, out);
}

void decode(Codec codec, const uint8_t* in, size_t count, float* out) {
  activeKernels().decode[kernelIndex(codec)](in, count, out);
}

void decodeAdd(Codec codec, const uint8_t* in, size_t count, float* acc) {
  activeKernels().decodeAdd[kernelIndex(codec)](in, count, acc);
}

void floatToFp8E4M3(const float* in, size_t count, uint8_t* out) { activeKernels().toFp8[0](in, count, out); }
void floatToFp8E5M2(const float* in, size_t count, uint8_t* out) { activeKernels().toFp8[1](in, count, out); }
void fp8E4M3ToFloat(const uint8_t* in, size_t count, float* out) { activeKernels().fromFp8[0](in, count, out); }
void fp8E5M2ToFloat(const uint8_t* in, size_t count, float* out) { activeKernels().fromFp8[1](in, count, out); }

}  // namespace pycomm::codecs
