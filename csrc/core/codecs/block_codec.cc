#include "block_codec.h"
#include "multiversion.h"

#include <algorithm>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <cstring>
#include <type_traits>

#include "../error.h"
#include "fp8.h"
#include "half.h"

namespace pycomm::codecs {
namespace {

constexpr size_t kBlock = kFp8BlockElements;
constexpr size_t kBlockBytes = kFp8ScaleBytes + kFp8BlockElements;

// ---- fp16 / bf16 ---------------------------------------------------------------------------------
//
// The conversions of half.h, restated with mask selects so that the loops below vectorize (half.h's
// early returns leave a branch in the loop). The results are identical bit for bit, NaN payloads
// included; test_block_codec checks this against half.h.

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

// Codes are stored through memcpy: the output buffer has no alignment guarantee.
template <uint16_t (*Convert)(float)>
void encode16(const float* __restrict in, size_t count, uint8_t* __restrict out) {
  for (size_t i = 0; i < count; ++i) {
    const uint16_t h = Convert(in[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

template <float (*Convert)(uint16_t)>
void decode16(const uint8_t* __restrict in, size_t count, float* __restrict out) {
  for (size_t i = 0; i < count; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    out[i] = Convert(h);
  }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PYCOMM_HAVE_F16C_PATH 1
// fp16 encoding through the F16C instruction, 8 at a time: vcvtps2ph with round-to-nearest-even
// gives the same bits as fp16Bits (NaN payloads included: both keep the top 9 mantissa bits and set
// the quiet bit); test_codec_exactness checks it against torch. Decoding stays scalar: vcvtph2ps
// quiets signalling NaNs, which the portable decode keeps as they are.
__attribute__((target("avx,f16c"))) void encodeFp16F16c(const float* in, size_t count, uint8_t* out) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), h);
  }
  for (; i < count; ++i) {
    const uint16_t h = fp16Bits(in[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

bool hasF16c() {
  static const bool has = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return has;
}
#endif

template <float (*Convert)(uint16_t)>
void decodeAdd16(const uint8_t* __restrict in, size_t count, float* __restrict acc) {
  for (size_t i = 0; i < count; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    acc[i] += Convert(h);
  }
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

// ---- fp8 -----------------------------------------------------------------------------------------

struct E4M3 {
  static constexpr float kMax = kFp8E4M3Max;
  static uint8_t encode(float q) { return floatToFp8E4M3(q); }  // saturates at +-448 by itself
  static float decode(uint8_t c) { return fp8E4M3ToFloat(c); }
};

struct E5M2 {
  static constexpr float kMax = kFp8E5M2Max;
  // For finite q only: clamp to +-57344 first, so a value pushed out of range by a subnormal scale
  // saturates instead of becoming Inf. Without effect in every other case (see block_codec.h).
  // (x / d is finite here or, with a subnormal d, may overflow to +-Inf: that saturates too.)
  static uint8_t encode(float q) {
    const uint32_t bits = floatToBits(q);
    const uint32_t abs = bits & 0x7fffffffu;
    constexpr uint32_t kMaxBits = 0x47600000u;  // 57344.0f
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

struct BlockStats {
  float amax;      // max |x| over finite x, 0 if none
  bool nonFinite;  // any NaN or Inf
};

// On bit patterns: |x| orders as its bits, and every non-finite |x| is >= 0x7f800000. One max
// reduction in the common case; a second pass, skipping non-finite values, only when there are any.
inline BlockStats scanBlock(const float* __restrict x, size_t n) {
  int32_t top = 0;
  for (size_t i = 0; i < n; ++i) {
    top = std::max(top, static_cast<int32_t>(floatToBits(x[i]) & 0x7fffffffu));
  }
  if (top < 0x7f800000) return {bitsToFloat(static_cast<uint32_t>(top)), false};
  int32_t amax = 0;
  for (size_t i = 0; i < n; ++i) {
    const int32_t a = static_cast<int32_t>(floatToBits(x[i]) & 0x7fffffffu);
    amax = std::max(amax, a < 0x7f800000 ? a : 0);
  }
  return {bitsToFloat(static_cast<uint32_t>(amax)), true};
}

template <typename F>
void encodeFiniteBlock(const float* __restrict x, size_t n, float d, uint8_t* __restrict codes) {
  for (size_t i = 0; i < n; ++i) codes[i] = F::encode(x[i] / d);
}

// A block holding NaN or Inf: rare, element by element. Returns the scale word to store.
template <typename F>
float encodeSpecialBlock(const float* x, size_t n, float d, uint8_t* codes) {
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

template <typename F>
void encodeFp8(const float* in, size_t count, uint8_t* out) {
  for (size_t start = 0; start < count; start += kBlock) {
    const size_t n = std::min(kBlock, count - start);
    const float* x = in + start;
    uint8_t* block = out + (start / kBlock) * kBlockBytes;
    const BlockStats stats = scanBlock(x, n);
    const float s = stats.amax / F::kMax;
    const float d = s > 0.0f ? s : 1.0f;
    if (!stats.nonFinite) {
      encodeFiniteBlock<F>(x, n, d, block + kFp8ScaleBytes);
      storeScale(block, s);
    } else {
      storeScale(block, encodeSpecialBlock<F>(x, n, d, block + kFp8ScaleBytes));
    }
  }
}

template <typename F>
void decodeFiniteBlock(const uint8_t* __restrict codes, size_t n, float scale, float* __restrict out) {
  for (size_t i = 0; i < n; ++i) out[i] = F::decode(codes[i]) * scale;
}

// An E4M3 Inf block (negative scale word).
void decodeInfBlock(const uint8_t* codes, size_t n, float scale, float* out) {
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
    if ((floatToBits(scale) >> 31) != 0) return decodeInfBlock(codes, n, scale, out);
  }
  decodeFiniteBlock<F>(codes, n, scale, out);
}

template <typename F>
void decodeFp8(const uint8_t* in, size_t count, float* out) {
  for (size_t start = 0; start < count; start += kBlock) {
    const size_t n = std::min(kBlock, count - start);
    decodeBlock<F>(in + (start / kBlock) * kBlockBytes, n, out + start);
  }
}

// Decoded into a block-sized buffer first, then added: the product is rounded before the sum, so the
// compiler cannot contract the two into a fused multiply-add (which GCC does by default where the
// target has FMA), and decodeAdd agrees bit for bit with decode followed by an addition.
template <typename F>
void decodeAddFp8(const uint8_t* in, size_t count, float* acc) {
  alignas(64) float tmp[kBlock];
  for (size_t start = 0; start < count; start += kBlock) {
    const size_t n = std::min(kBlock, count - start);
    decodeBlock<F>(in + (start / kBlock) * kBlockBytes, n, tmp);
    float* __restrict dst = acc + start;
    for (size_t i = 0; i < n; ++i) dst[i] += tmp[i];
  }
}

[[noreturn]] void badCodec(Codec codec) {
  throw InvalidUsageError(strCat("unknown codec ", static_cast<int>(codec)));
}

void checkFloat32(Codec codec, DataType dtype, const char* what) {
  PYCOMM_CHECK(dtype == DataType::kFloat32, InvalidUsageError, "codec ", codecName(codec), " ", what,
               " float32 tensors only, got ", dtypeName(dtype));
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
      return count + kFp8ScaleBytes * ((count + kBlock - 1) / kBlock);
  }
  badCodec(codec);
}

PYCOMM_MULTIVERSION
void encode(Codec codec, const float* in, size_t count, uint8_t* out) {
#ifdef PYCOMM_HAVE_F16C_PATH
  if (codec == Codec::kFp16 && hasF16c()) return encodeFp16F16c(in, count, out);
#endif
  switch (codec) {
    case Codec::kFp16: return encode16<fp16Bits>(in, count, out);
    case Codec::kBf16: return encode16<bf16Bits>(in, count, out);
    case Codec::kFp8E4M3: return encodeFp8<E4M3>(in, count, out);
    case Codec::kFp8E5M2: return encodeFp8<E5M2>(in, count, out);
  }
  badCodec(codec);
}

PYCOMM_MULTIVERSION
void decode(Codec codec, const uint8_t* in, size_t count, float* out) {
  switch (codec) {
    case Codec::kFp16: return decode16<fp16Value>(in, count, out);
    case Codec::kBf16: return decode16<bf16ToFloat>(in, count, out);
    case Codec::kFp8E4M3: return decodeFp8<E4M3>(in, count, out);
    case Codec::kFp8E5M2: return decodeFp8<E5M2>(in, count, out);
  }
  badCodec(codec);
}

PYCOMM_MULTIVERSION
void decodeAdd(Codec codec, const uint8_t* in, size_t count, float* acc) {
  switch (codec) {
    case Codec::kFp16: return decodeAdd16<fp16Value>(in, count, acc);
    case Codec::kBf16: return decodeAdd16<bf16ToFloat>(in, count, acc);
    case Codec::kFp8E4M3: return decodeAddFp8<E4M3>(in, count, acc);
    case Codec::kFp8E5M2: return decodeAddFp8<E5M2>(in, count, acc);
  }
  badCodec(codec);
}

void encode(Codec codec, DataType dtype, const void* in, size_t count, uint8_t* out) {
  checkFloat32(codec, dtype, "encodes");
  encode(codec, static_cast<const float*>(in), count, out);
}

void decode(Codec codec, const uint8_t* in, size_t count, DataType dtype, void* out) {
  checkFloat32(codec, dtype, "decodes to");
  decode(codec, in, count, static_cast<float*>(out));
}

void decodeAdd(Codec codec, const uint8_t* in, size_t count, DataType dtype, void* acc) {
  checkFloat32(codec, dtype, "decodes into");
  decodeAdd(codec, in, count, static_cast<float*>(acc));
}

}  // namespace pycomm::codecs
