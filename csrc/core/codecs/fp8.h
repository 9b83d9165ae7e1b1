// FP8 scalar conversions to and from fp32: E4M3FN and E5M2 (the OCP 8-bit formats torch calls
// float8_e4m3fn and float8_e5m2).
//
//   E4M3FN  S.EEEE.MMM  bias 7,  max 448,   smallest subnormal 2^-9,  no infinity,
//           NaN = S.1111.111 (0x7f / 0xff).
//   E5M2    S.EEEEE.MM  bias 15, max 57344, smallest subnormal 2^-16, IEEE-like:
//           +-Inf = S.11111.00 (0x7c / 0xfc), NaN = S.11111.{01,10,11}. E5M2 is the top byte of fp16.
//
// float -> fp8 rounds to nearest even and is bit-identical to torch's CPU casts
// `.to(torch.float8_e4m3fn)` / `.to(torch.float8_e5m2)` for every fp32 input, NaN included (NaN keeps
// its sign: 0x7f | sign); checked exhaustively over all 2^32 inputs against torch 2.13:
//   E4M3FN: a finite value that rounds above 448, and +-Inf, saturate to +-448 (0x7e / 0xfe), as
//           torch 2.13 does. (Older torch releases returned NaN for |x| > 464 instead; the block
//           codecs never convert an out-of-range finite value, so they do not depend on this.)
//   E5M2:   |x| >= 61440 (the midpoint above 57344, ties to even) and +-Inf give +-Inf.
// fp8 -> float is exact. Subnormals on both sides follow IEEE (they are not flushed to zero, unless
// the calling thread itself runs with FTZ/DAZ set, which torch would then share).
//
// Written as branch-free integer arithmetic (selects, no intrinsics, no tables) so that loops calling
// these functions are vectorized by the compiler at -O3 with the baseline instruction set.
#pragma once

#include <cstddef>
#include <cstdint>

#include "half.h"

namespace pycomm::codecs {

constexpr float kFp8E4M3Max = 448.0f;
constexpr float kFp8E5M2Max = 57344.0f;

namespace detail {
// cond ? a : b on bit patterns, as mask arithmetic. GCC will not if-convert a `?:` whose arms hold
// fp32 arithmetic (with the default -ftrapping-math it may not speculate it), which would leave a
// branch in the loop and stop vectorization; both arms here are computed unconditionally anyway.
inline uint32_t select(bool cond, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(cond);
  return (a & mask) | (b & ~mask);
}
}  // namespace detail

inline uint8_t floatToFp8E4M3(float f) {
  const uint32_t bits = floatToBits(f);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t abs = bits & 0x7fffffffu;
  // |f| < 2^-6 (below the smallest normal): adding 2^(141-127) = 2^14 lines the subnormal's bits up
  // at the bottom of the fp32 mantissa, and the fp32 addition rounds to nearest even for us.
  constexpr uint32_t kDenormMagic = 141u << 23;
  const uint32_t sub = floatToBits(bitsToFloat(abs) + bitsToFloat(kDenormMagic)) - kDenormMagic;
  // Normal: rebias the exponent (127 -> 7) and round the 20 dropped mantissa bits to nearest even.
  uint32_t norm = (abs + (static_cast<uint32_t>(7 - 127) << 23) + 0x7ffffu + ((abs >> 20) & 1u)) >> 20;
  norm = norm < 0x7eu ? norm : 0x7eu;  // a carry into the NaN pattern (|f| in (464, 480)) saturates
  uint32_t r = detail::select(abs < (121u << 23), sub, norm);
  // |f| >= 480 (first value past the range): saturate finite values and Inf; NaN stays NaN.
  r = detail::select(abs >= (1087u << 20), 0x7eu + static_cast<uint32_t>(abs > 0x7f800000u), r);
  return static_cast<uint8_t>(r | sign);
}

inline uint8_t floatToFp8E5M2(float f) {
  const uint32_t bits = floatToBits(f);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t abs = bits & 0x7fffffffu;
  constexpr uint32_t kDenormMagic = 134u << 23;  // 2^7: below 2^-14, round at 2^-16
  const uint32_t sub = floatToBits(bitsToFloat(abs) + bitsToFloat(kDenormMagic)) - kDenormMagic;
  // Normal: rebias (127 -> 15), round 21 bits to nearest even; a carry out of 57344 reaches 0x7c = Inf.
  const uint32_t norm =
      (abs + (static_cast<uint32_t>(15 - 127) << 23) + 0xfffffu + ((abs >> 21) & 1u)) >> 21;
  uint32_t r = detail::select(abs < (113u << 23), sub, norm);
  // |f| >= 65536: Inf (0x7c), or NaN (0x7f).
  r = detail::select(abs >= (143u << 23), 0x7cu + 3u * static_cast<uint32_t>(abs > 0x7f800000u), r);
  return static_cast<uint8_t>(r | sign);
}

inline float fp8E4M3ToFloat(uint8_t code) {
  const uint32_t c = code;
  const uint32_t sign = (c & 0x80u) << 24;
  const uint32_t em = c & 0x7fu;
  const uint32_t normal = (em << 20) + (120u << 23);  // exponent 7-bias -> 127-bias
  // Subnormal (exponent field 0): mantissa * 2^-9, computed exactly from the integer.
  const uint32_t sub = floatToBits(static_cast<float>(static_cast<int32_t>(em)) * 0.001953125f);
  uint32_t mag = detail::select(em < 8u, sub, normal);
  mag = detail::select(em == 0x7fu, 0x7fc00000u, mag);
  return bitsToFloat(sign | mag);
}

inline float fp8E5M2ToFloat(uint8_t code) {
  const uint32_t c = code;
  const uint32_t sign = (c & 0x80u) << 24;
  const uint32_t em = c & 0x7fu;
  const uint32_t normal = (em << 21) + (112u << 23);  // exponent 15-bias -> 127-bias
  const uint32_t sub = floatToBits(static_cast<float>(static_cast<int32_t>(em)) * 1.52587890625e-05f);
  uint32_t mag = detail::select(em < 4u, sub, normal);
  // Exponent field all ones: Inf (mantissa 0) or NaN.
  mag = detail::select(em >= 0x7cu, 0x7f800000u | (static_cast<uint32_t>(em > 0x7cu) << 22), mag);
  return bitsToFloat(sign | mag);
}

inline bool fp8E4M3IsNan(uint8_t code) { return (code & 0x7fu) == 0x7fu; }
inline bool fp8E5M2IsNan(uint8_t code) { return (code & 0x7fu) > 0x7cu; }

// Array forms of the conversions above (unscaled, element by element), vectorized: through the
// kernel table of codec_kernels.h, so with AVX2/AVX-512 intrinsics where the CPU has them.
void floatToFp8E4M3(const float* in, size_t count, uint8_t* out);
void floatToFp8E5M2(const float* in, size_t count, uint8_t* out);
void fp8E4M3ToFloat(const uint8_t* in, size_t count, float* out);
void fp8E5M2ToFloat(const uint8_t* in, size_t count, float* out);

}  // namespace pycomm::codecs
