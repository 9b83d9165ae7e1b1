// The scalar codec building blocks: per-element conversions and per-block steps of block_codec.h.
//
// This is the reference every codec table is measured against. The scalar table (scalar_kernels.cc)
// is made of these alone; the SIMD tables (simd_*.cc) call them for what they leave scalar on
// purpose: the elements after the last full vector, and the rare fp8 blocks that hold a NaN or an
// Inf (and E4M3 Inf blocks on decode), so those cases are the reference code itself.
//
// Everything here is inline and free of target attributes: inlined into a SIMD function it is
// compiled for that function's target, which changes no result (IEEE fp32 operations, no
// contraction: the core builds with -ffp-contract=off).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "block_codec.h"
#include "fp8.h"
#include "half.h"

namespace pycomm::codecs::scalar {

constexpr size_t kBlock = kFp8BlockElements;
constexpr size_t kBlockBytes = kFp8ScaleBytes + kFp8BlockElements;

// ---- fp16 / bf16 ---------------------------------------------------------------------------------
//
// The conversions of half.h, restated with mask selects so that the loops calling them vectorize
// (half.h's early returns leave a branch in the loop). The results are identical bit for bit, NaN
// payloads included; test_block_codec checks this against half.h.

inline uint16_t fp16Bits(float f) {
  const uint32_t bits = floatToBits(f);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs = bits & 0x7fffffffu;
  const uint32_t nan = 0x7e00u | ((abs >> 13) & 0x1ffu);
  const uint32_t sub = floatToBits(bitsToFloat(abs) + 0.5f) - 0x3f000000u;
  const uint32_t norm = (abs + 0xc8000fffu + ((abs >> 13) & 1u)) >> 13;
  uint32_t r = detail::select(abs < 0x38800000u, sub, norm);
  r = detail::select(abs >= 0x477ff000u, 0x7c00u, r);
  r = detail::select(abs > 0x7f800000u, nan, r);
  return static_cast<uint16_t>(sign | (r & 0xffffu));
}

inline uint16_t bf16Bits(float f) {
  const uint32_t bits = floatToBits(f);
  const uint32_t nan = (bits >> 16) | 0x40u;
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(detail::select((bits & 0x7fffffffu) > 0x7f800000u, nan, rounded));
}

// fp16ToFloat of half.h branches on the exponent; this is the same function with selects.
inline float fp16Value(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;
  const uint32_t normal = (em << 13) + (112u << 23);
  const uint32_t sub = floatToBits(static_cast<float>(static_cast<int32_t>(em)) * 5.9604644775390625e-08f);
  uint32_t mag = detail::select(em < 0x400u, sub, normal);
  mag = detail::select(em >= 0x7c00u, 0x7f800000u | ((em & 0x3ffu) << 13), mag);
  return bitsToFloat(sign | mag);
}

// Codes are stored through memcpy: the output buffer has no alignment guarantee.
inline void storeCode16(uint8_t* out, uint16_t h) { std::memcpy(out, &h, 2); }
inline uint16_t loadCode16(const uint8_t* in) {
  uint16_t h;
  std::memcpy(&h, in, 2);
  return h;
}

// ---- fp8 -----------------------------------------------------------------------------------------

struct E4M3 {
  static constexpr float kMax = kFp8E4M3Max;
  static uint8_t encode(float q) { return floatToFp8E4M3(q); }  // saturates at +-448 by itself
  static float decode(uint8_t c) { return fp8E4M3ToFloat(c); }
};

struct E5M2 {
  static constexpr float kMax = kFp8E5M2Max;
  static constexpr uint32_t kMaxBits = 0x47600000u;  // 57344.0f
  // For finite q only: clamp to +-57344 first, so a value pushed out of range by a subnormal scale
  // saturates instead of becoming Inf. Without effect in every other case (see block_codec.h).
  // (x / d is finite here or, with a subnormal d, may overflow to +-Inf: that saturates too.)
  static uint8_t encode(float q) {
    const uint32_t bits = floatToBits(q);
    const uint32_t abs = bits & 0x7fffffffu;
    return floatToFp8E5M2(bitsToFloat((bits & 0x80000000u) | detail::select(abs > kMaxBits, kMaxBits, abs)));
  }
  static float decode(uint8_t c) { return fp8E5M2ToFloat(c); }
};

constexpr uint8_t kInfBlockPosInf = 0x7f;
constexpr uint8_t kInfBlockNegInf = 0xff;
constexpr uint8_t kInfBlockNan = 0x80;

inline float loadScale(const uint8_t* p) {
  float s;
  std::memcpy(&s, p, sizeof s);
  return s;
}

inline void storeScale(uint8_t* p, float s) { std::memcpy(p, &s, sizeof s); }

// An E4M3 block whose scale word has its sign bit set is an Inf block (block_codec.h).
inline bool isInfBlockScale(float scale) { return (floatToBits(scale) >> 31) != 0; }

// max over |x| as bit patterns: |x| orders as its bits, and every non-finite |x| is >= 0x7f800000.
inline int32_t absBitsMax(const float* x, size_t n, int32_t top) {
  for (size_t i = 0; i < n; ++i) top = std::max(top, static_cast<int32_t>(floatToBits(x[i]) & 0x7fffffffu));
  return top;
}

// The block's scale s = amax / MAX and divisor d = s > 0 ? s : 1, for a block whose amax is known.
template <typename F>
struct BlockScale {
  float s;
  float d;
  explicit BlockScale(float amax) : s(amax / F::kMax), d(s > 0.0f ? s : 1.0f) {}
};

template <typename F>
void encodeFiniteElements(const float* __restrict x, size_t n, float d, uint8_t* __restrict codes) {
  for (size_t i = 0; i < n; ++i) codes[i] = F::encode(x[i] / d);
}

// A block holding NaN or Inf: rare, element by element. Returns the scale word to store.
template <typename F>
float encodeSpecialElements(const float* x, size_t n, float d, uint8_t* codes) {
  constexpr bool kE4M3 = std::is_same_v<F, E4M3>;
  bool infBlock = false;
  if constexpr (kE4M3) {
    for (size_t i = 0; i < n; ++i) infBlock |= (floatToBits(x[i]) & 0x7fffffffu) == 0x7f800000u;
  }
  for (size_t i = 0; i < n; ++i) {
    const float v = x[i];
    const uint32_t abs = floatToBits(v) & 0x7fffffffu;
    uint8_t c;
    if (abs < 0x7f800000u) {
      c = F::encode(v / d);
      if (infBlock && (c & 0x7fu) == 0) c = 0;  // 0x80 means NaN in an Inf block
    } else if (!infBlock) {
      c = kE4M3 ? floatToFp8E4M3(v) : floatToFp8E5M2(v);  // native NaN (and E5M2 Inf) codes
    } else if (abs > 0x7f800000u) {
      c = kInfBlockNan;
    } else {
      c = v > 0 ? kInfBlockPosInf : kInfBlockNegInf;
    }
    codes[i] = c;
  }
  return infBlock ? -d : d;
}

// A block with a NaN or an Inf (absBitsMax found one): amax over the finite elements only, then the
// special encoding. Writes the whole block, scale word included.
template <typename F>
void encodeNonFiniteBlock(const float* x, size_t n, uint8_t* block) {
  int32_t amax = 0;
  for (size_t i = 0; i < n; ++i) {
    const int32_t a = static_cast<int32_t>(floatToBits(x[i]) & 0x7fffffffu);
    amax = std::max(amax, a < 0x7f800000 ? a : 0);
  }
  const BlockScale<F> scale(bitsToFloat(static_cast<uint32_t>(amax)));
  storeScale(block, encodeSpecialElements<F>(x, n, scale.d, block + kFp8ScaleBytes));
}

// One whole block, scalar: the reference of every fp8 block encoder.
template <typename F>
void encodeBlock(const float* x, size_t n, uint8_t* block) {
  const int32_t top = absBitsMax(x, n, 0);
  if (top >= 0x7f800000) return encodeNonFiniteBlock<F>(x, n, block);
  const BlockScale<F> scale(bitsToFloat(static_cast<uint32_t>(top)));
  encodeFiniteElements<F>(x, n, scale.d, block + kFp8ScaleBytes);
  storeScale(block, scale.s);
}

template <typename F>
void decodeScaledElements(const uint8_t* __restrict codes, size_t n, float scale, float* __restrict out) {
  for (size_t i = 0; i < n; ++i) out[i] = F::decode(codes[i]) * scale;
}

// An E4M3 Inf block (negative scale word).
inline void decodeInfBlockElements(const uint8_t* codes, size_t n, float scale, float* out) {
  const float magnitude = -scale;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t c = codes[i];
    float v;
    if (c == kInfBlockPosInf) {
      v = bitsToFloat(0x7f800000u);
    } else if (c == kInfBlockNegInf) {
      v = bitsToFloat(0xff800000u);
    } else if (c == kInfBlockNan) {
      v = bitsToFloat(0x7fc00000u);
    } else {
      v = fp8E4M3ToFloat(c) * magnitude;
    }
    out[i] = v;
  }
}

template <typename F>
void decodeBlock(const uint8_t* block, size_t n, float* out) {
  const float scale = loadScale(block);
  const uint8_t* codes = block + kFp8ScaleBytes;
  if constexpr (std::is_same_v<F, E4M3>) {
    if (isInfBlockScale(scale)) return decodeInfBlockElements(codes, n, scale, out);
  }
  decodeScaledElements<F>(codes, n, scale, out);
}

// Decoded into a block-sized buffer first, then added: the product is rounded before the sum, so the
// compiler cannot contract the two into a fused multiply-add (which GCC does by default where the
// target has FMA), and decodeAdd agrees bit for bit with decode followed by an addition.
template <typename F>
void decodeAddBlock(const uint8_t* block, size_t n, float* __restrict acc) {
  alignas(64) float tmp[kBlock];
  decodeBlock<F>(block, n, tmp);
  for (size_t i = 0; i < n; ++i) acc[i] += tmp[i];
}

}  // namespace pycomm::codecs::scalar
