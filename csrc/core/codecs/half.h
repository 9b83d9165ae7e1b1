// IEEE fp16 and bfloat16 conversions to and from fp32, round to nearest even, NaN kept NaN.
//
// Written as plain integer arithmetic (no intrinsics) so the compiler can vectorize the loops that
// call them and the core needs no special CPU flags; the results match torch's casts bit for bit.
#pragma once

#include <cstdint>
#include <cstring>

namespace pycomm::codecs {

inline float bitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint32_t floatToBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

inline float bf16ToFloat(uint16_t h) { return bitsToFloat(static_cast<uint32_t>(h) << 16); }

inline uint16_t floatToBf16(float f) {
  uint32_t bits = floatToBits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet NaN, sign kept
  }
  const uint32_t roundingBias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + roundingBias) >> 16);
}

inline float fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) {
    return bitsToFloat(sign | 0x7f800000u | (mant << 13));
  }
  if (exp == 0) {
    // Zero or subnormal: value = mant * 2^-24, exact in fp32.
    const float magnitude = static_cast<float>(mant) * 5.9604644775390625e-08f;
    return sign ? -magnitude : magnitude;
  }
  return bitsToFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline uint16_t floatToFp16(float f) {
  const uint32_t bits = floatToBits(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) {
    return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x1ffu));
  }
  if (abs >= 0x477ff000u) {  // rounds to >= 65520: overflow to infinity
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (abs < 0x38800000u) {  // below the smallest normal fp16 (2^-14): subnormal or zero
    // Adding 0.5 (2^-1) aligns the subnormal's bits at the bottom of the mantissa, and the fp32
    // addition rounds to nearest even for us.
    const float shifted = bitsToFloat(abs) + 0.5f;
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(floatToBits(shifted) - 0x3f000000u));
  }
  const uint32_t mantOdd = (abs >> 13) & 1u;
  const uint32_t rounded = abs + 0xc8000fffu + mantOdd;  // rebias exponent (-112 << 23) and round
  return static_cast<uint16_t>(sign | static_cast<uint16_t>(rounded >> 13));
}

}  // namespace pycomm::codecs
