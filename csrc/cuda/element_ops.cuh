// Per-element operations of the CUDA kernels, written once for host and device.
//
// Every function here restates, bit for bit, a CPU function of csrc/core/codecs (reduce.cc, half.h,
// fp8.h, block_codec.cc). They are __host__ __device__ (plain inline under a C++ compiler) so that
// tests/cuda/test_element_ops_host.cc can check them against the CPU core exhaustively on a machine
// without a GPU; tests/cuda/test_kernels.cu checks the compiled kernels on a GPU.
//
// Floating-point rules that make the device results identical to the CPU's:
//   * every fp32/fp64 operation is one correctly rounded IEEE operation: __fadd_rn, __fmul_rn,
//     __fdiv_rn, __dadd_rn, __dmul_rn, which nvcc never contracts into a fused multiply-add (a plain
//     `a * b + c` in device code would be contracted by default, -fmad=true);
//   * subnormals are kept: the folder must be compiled without -ftz=true / --use_fast_math (CMake
//     and benchmarks/gpu_check.sh do not pass them; fast math is refused below). With FTZ only blocks
//     whose fp8 scale is itself subnormal (amax below ~5e-36) would differ;
//   * a NaN result gets the bits an x86-64 SSE instruction gives (the first NaN operand, quieted;
//     the default NaN 0xffc00000 / 0xfff8000000000000 for an invalid operation such as Inf - Inf),
//     where a GPU would return its canonical 0x7fffffff. The CPU core's results are those of x86,
//     so NaN payloads, and the sign of a NaN that an fp8/fp16 code keeps, match too. (When both
//     operands are NaN x86 returns the first; which one is "first" in the CPU's vectorized loops is the
//     compiler's choice, so only that case, two NaNs with different bits, may differ in payload.)
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__CUDACC__)
#define PYCOMM_HD __host__ __device__ __forceinline__
#else
#define PYCOMM_HD inline
#endif

#if defined(__USE_FAST_MATH__)
#error "csrc/cuda must be compiled without --use_fast_math: its kernels are bit-identical to the CPU's"
#endif

namespace pycomm::cuda::ops {

// ---- bit casts and correctly rounded arithmetic ----------------------------------------------------

template <typename To, typename From>
PYCOMM_HD To bitCast(From from) {
  static_assert(sizeof(To) == sizeof(From), "a bit cast keeps the size");
  To to;
  std::memcpy(&to, &from, sizeof to);
  return to;
}

// Device code uses the intrinsics (single register moves, and the _rn forms that nvcc never fuses);
// host code the plain operators, which the CPU core's -ffp-contract=off keeps unfused too.
#if defined(__CUDA_ARCH__)
PYCOMM_HD float bitsToFloat(uint32_t bits) { return __uint_as_float(bits); }
PYCOMM_HD uint32_t floatToBits(float f) { return __float_as_uint(f); }
PYCOMM_HD double bitsToDouble(uint64_t bits) { return __longlong_as_double(static_cast<long long>(bits)); }
PYCOMM_HD uint64_t doubleToBits(double d) { return static_cast<uint64_t>(__double_as_longlong(d)); }
PYCOMM_HD float addRn(float a, float b) { return __fadd_rn(a, b); }
PYCOMM_HD float mulRn(float a, float b) { return __fmul_rn(a, b); }
PYCOMM_HD float divRn(float a, float b) { return __fdiv_rn(a, b); }
PYCOMM_HD double addRn(double a, double b) { return __dadd_rn(a, b); }
PYCOMM_HD double mulRn(double a, double b) { return __dmul_rn(a, b); }
#else
PYCOMM_HD float bitsToFloat(uint32_t bits) { return bitCast<float>(bits); }
PYCOMM_HD uint32_t floatToBits(float f) { return bitCast<uint32_t>(f); }
PYCOMM_HD double bitsToDouble(uint64_t bits) { return bitCast<double>(bits); }
PYCOMM_HD uint64_t doubleToBits(double d) { return bitCast<uint64_t>(d); }
template <typename T>
PYCOMM_HD T addRn(T a, T b) { return a + b; }
template <typename T>
PYCOMM_HD T mulRn(T a, T b) { return a * b; }
template <typename T>
PYCOMM_HD T divRn(T a, T b) { return a / b; }
#endif

PYCOMM_HD bool isNan(float f) { return (floatToBits(f) & 0x7fffffffu) > 0x7f800000u; }
PYCOMM_HD bool isNan(double d) { return (doubleToBits(d) & 0x7fffffffffffffffull) > 0x7ff0000000000000ull; }

// The NaN x86 SSE returns for `a op b` when the result is NaN: the first NaN operand quieted, or the
// default NaN when neither operand is one.
PYCOMM_HD float x86Nan(float a, float b) {
  if (isNan(a)) return bitsToFloat(floatToBits(a) | 0x00400000u);
  if (isNan(b)) return bitsToFloat(floatToBits(b) | 0x00400000u);
  return bitsToFloat(0xffc00000u);
}

PYCOMM_HD double x86Nan(double a, double b) {
  if (isNan(a)) return bitsToDouble(doubleToBits(a) | 0x0008000000000000ull);
  if (isNan(b)) return bitsToDouble(doubleToBits(b) | 0x0008000000000000ull);
  return bitsToDouble(0xfff8000000000000ull);
}

// a + b and a * b, one rounding, NaN as on x86.
template <typename T>
PYCOMM_HD T add(T a, T b) {
  const T r = addRn(a, b);
  return isNan(r) ? x86Nan(a, b) : r;
}

template <typename T>
PYCOMM_HD T mul(T a, T b) {
  const T r = mulRn(a, b);
  return isNan(r) ? x86Nan(a, b) : r;
}

// ---- reduce operations (reduce.cc) -------------------------------------------------------------------
//
// One struct per op, with an overload per arithmetic type the op is applied in: float and double;
// int32_t (for int8, uint8, int16 promoted, and int32) and int64_t. Signed wraparound goes through
// unsigned arithmetic (defined behaviour; the same bits as the CPU's wrapping add and multiply).

struct Sum {
  PYCOMM_HD static float apply(float a, float b) { return add(a, b); }
  PYCOMM_HD static double apply(double a, double b) { return add(a, b); }
  PYCOMM_HD static int32_t apply(int32_t a, int32_t b) {
    return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
  }
  PYCOMM_HD static int64_t apply(int64_t a, int64_t b) {
    return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
  }
};

struct Product {
  PYCOMM_HD static float apply(float a, float b) { return mul(a, b); }
  PYCOMM_HD static double apply(double a, double b) { return mul(a, b); }
  PYCOMM_HD static int32_t apply(int32_t a, int32_t b) {
    return static_cast<int32_t>(static_cast<uint32_t>(a) * static_cast<uint32_t>(b));
  }
  PYCOMM_HD static int64_t apply(int64_t a, int64_t b) {
    return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
  }
};

// MIN/MAX propagate NaN: the CPU returns a + b when either is NaN, which is x86Nan(a, b).
template <bool kMax>
struct MinMax {
  template <typename T>
  PYCOMM_HD static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      if (isNan(a) || isNan(b)) return x86Nan(a, b);
    }
    return (kMax ? a < b : b < a) ? b : a;
  }
};
using Min = MinMax<false>;
using Max = MinMax<true>;

struct Band {
  template <typename T>
  PYCOMM_HD static T apply(T a, T b) { return a & b; }
};
struct Bor {
  template <typename T>
  PYCOMM_HD static T apply(T a, T b) { return a | b; }
};
struct Bxor {
  template <typename T>
  PYCOMM_HD static T apply(T a, T b) { return a ^ b; }
};

// bool (one byte, any non-zero is true): SUM/MAX/BOR are or, PRODUCT/MIN/BAND and, BXOR xor; the
// result is 0 or 1.
struct BoolOr {
  PYCOMM_HD static uint8_t apply(uint8_t a, uint8_t b) { return static_cast<uint8_t>((a != 0) | (b != 0)); }
};
struct BoolAnd {
  PYCOMM_HD static uint8_t apply(uint8_t a, uint8_t b) { return static_cast<uint8_t>((a != 0) & (b != 0)); }
};
struct BoolXor {
  PYCOMM_HD static uint8_t apply(uint8_t a, uint8_t b) { return static_cast<uint8_t>((a != 0) ^ (b != 0)); }
};

// ---- fp16 / bf16 (half.h, block_codec.cc) ----------------------------------------------------------

PYCOMM_HD uint16_t floatToFp16(float f) {
  const uint32_t bits = floatToBits(f);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs = bits & 0x7fffffffu;
  uint32_t r;
  if (abs > 0x7f800000u) {
    r = 0x7e00u | ((abs >> 13) & 0x1ffu);  // NaN, quiet, payload kept
  } else if (abs >= 0x477ff000u) {
    r = 0x7c00u;  // rounds to >= 65520: Inf
  } else if (abs < 0x38800000u) {
    // Subnormal or zero: adding 0.5 aligns the bits at the bottom of the mantissa and the fp32
    // addition rounds to nearest even. (An fp32 subnormal input gives 0 either way.)
    r = floatToBits(addRn(bitsToFloat(abs), 0.5f)) - 0x3f000000u;
  } else {
    r = (abs + 0xc8000fffu + ((abs >> 13) & 1u)) >> 13;  // rebias exponent, round to nearest even
  }
  return static_cast<uint16_t>(sign | (r & 0xffffu));
}

PYCOMM_HD float fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;
  uint32_t mag;
  if (em >= 0x7c00u) {
    mag = 0x7f800000u | ((em & 0x3ffu) << 13);  // Inf, NaN (payload kept, not quieted)
  } else if (em < 0x400u) {
    // Zero or subnormal: em * 2^-24, exact.
    mag = floatToBits(mulRn(static_cast<float>(static_cast<int32_t>(em)), 5.9604644775390625e-08f));
  } else {
    mag = (em << 13) + (112u << 23);
  }
  return bitsToFloat(sign | mag);
}

PYCOMM_HD uint16_t floatToBf16(float f) {
  const uint32_t bits = floatToBits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

PYCOMM_HD float bf16ToFloat(uint16_t h) { return bitsToFloat(static_cast<uint32_t>(h) << 16); }

struct Fp16 {
  PYCOMM_HD static uint16_t encode(float f) { return floatToFp16(f); }
  PYCOMM_HD static float decode(uint16_t h) { return fp16ToFloat(h); }
};

struct Bf16 {
  PYCOMM_HD static uint16_t encode(float f) { return floatToBf16(f); }
  PYCOMM_HD static float decode(uint16_t h) { return bf16ToFloat(h); }
};

// ---- combining two stored elements of a dtype (reduce.cc's loops) ---------------------------------------
//
// R::T is how the dtype is stored, R::apply(a, b) the stored result of a op b; reduceInto's kernel is
// instantiated once per R.
template <typename Op, typename Type>
struct Native {  // float32, float64, int32, int64: the op on the type itself
  using T = Type;
  PYCOMM_HD static T apply(T a, T b) { return Op::apply(a, b); }
};

template <typename Op, typename Conv>
struct Half {  // float16, bfloat16: widened to fp32, one operation, rounded once
  using T = uint16_t;
  PYCOMM_HD static T apply(T a, T b) {
    return Conv::encode(Op::apply(Conv::decode(a), Conv::decode(b)));
  }
};

template <typename Op, typename I>
struct Narrow {  // int8, uint8, int16: computed in int32, truncated back
  using T = I;
  PYCOMM_HD static T apply(T a, T b) {
    return static_cast<T>(Op::apply(static_cast<int32_t>(a), static_cast<int32_t>(b)));
  }
};

template <typename BoolOp>
struct Bool {  // bool: one byte, normalized to 0/1
  using T = uint8_t;
  PYCOMM_HD static T apply(T a, T b) { return BoolOp::apply(a, b); }
};

// ---- fp8 scalar conversions (fp8.h) -----------------------------------------------------------------

PYCOMM_HD uint8_t floatToFp8E4M3(float f) {
  const uint32_t bits = floatToBits(f);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t abs = bits & 0x7fffffffu;
  uint32_t r;
  if (abs >= (1087u << 20)) {
    r = abs > 0x7f800000u ? 0x7fu : 0x7eu;  // |f| >= 480 and Inf saturate to 448; NaN stays NaN
  } else if (abs < (121u << 23)) {
    // |f| < 2^-6: adding 2^14 aligns the subnormal's bits and the fp32 addition rounds to nearest
    // even (an fp32-subnormal |f| gives 0 either way, so this is also right under FTZ).
    constexpr uint32_t kDenormMagic = 141u << 23;
    r = floatToBits(addRn(bitsToFloat(abs), bitsToFloat(kDenormMagic))) - kDenormMagic;
  } else {
    r = (abs + (static_cast<uint32_t>(7 - 127) << 23) + 0x7ffffu + ((abs >> 20) & 1u)) >> 20;
    r = r < 0x7eu ? r : 0x7eu;  // a carry into the NaN pattern (|f| in (464, 480)) saturates
  }
  return static_cast<uint8_t>(r | sign);
}

PYCOMM_HD uint8_t floatToFp8E5M2(float f) {
  const uint32_t bits = floatToBits(f);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t abs = bits & 0x7fffffffu;
  uint32_t r;
  if (abs >= (143u << 23)) {
    r = abs > 0x7f800000u ? 0x7fu : 0x7cu;  // |f| >= 65536: Inf, or NaN
  } else if (abs < (113u << 23)) {
    constexpr uint32_t kDenormMagic = 134u << 23;  // 2^7: below 2^-14, round at 2^-16
    r = floatToBits(addRn(bitsToFloat(abs), bitsToFloat(kDenormMagic))) - kDenormMagic;
  } else {
    // Rebias (127 -> 15), round 21 bits to nearest even; a carry out of 57344 reaches 0x7c = Inf.
    r = (abs + (static_cast<uint32_t>(15 - 127) << 23) + 0xfffffu + ((abs >> 21) & 1u)) >> 21;
  }
  return static_cast<uint8_t>(r | sign);
}

PYCOMM_HD float fp8E4M3ToFloat(uint8_t code) {
  const uint32_t c = code;
  const uint32_t sign = (c & 0x80u) << 24;
  const uint32_t em = c & 0x7fu;
  uint32_t mag;
  if (em == 0x7fu) {
    mag = 0x7fc00000u;
  } else if (em < 8u) {
    mag = floatToBits(mulRn(static_cast<float>(static_cast<int32_t>(em)), 0.001953125f));  // em * 2^-9
  } else {
    mag = (em << 20) + (120u << 23);
  }
  return bitsToFloat(sign | mag);
}

PYCOMM_HD float fp8E5M2ToFloat(uint8_t code) {
  const uint32_t c = code;
  const uint32_t sign = (c & 0x80u) << 24;
  const uint32_t em = c & 0x7fu;
  uint32_t mag;
  if (em >= 0x7cu) {
    mag = 0x7f800000u | (static_cast<uint32_t>(em > 0x7cu) << 22);  // Inf or NaN
  } else if (em < 4u) {
    mag = floatToBits(mulRn(static_cast<float>(static_cast<int32_t>(em)), 1.52587890625e-05f));  // em * 2^-16
  } else {
    mag = (em << 21) + (112u << 23);
  }
  return bitsToFloat(sign | mag);
}

// ---- fp8 block codec elements (block_codec.cc) -------------------------------------------------------

constexpr uint8_t kInfBlockPosInf = 0x7f;
constexpr uint8_t kInfBlockNegInf = 0xff;
constexpr uint8_t kInfBlockNan = 0x80;

struct E4M3 {
  static constexpr bool kHasInfBlocks = true;
  static constexpr float kMax = 448.0f;
  // Finite scaled values: saturates at +-448 by itself.
  PYCOMM_HD static uint8_t encodeFinite(float q) { return floatToFp8E4M3(q); }
  PYCOMM_HD static uint8_t encodeNative(float v) { return floatToFp8E4M3(v); }
  PYCOMM_HD static float decode(uint8_t c) { return fp8E4M3ToFloat(c); }
};

struct E5M2 {
  static constexpr bool kHasInfBlocks = false;
  static constexpr float kMax = 57344.0f;
  // Finite scaled values (or +-Inf from a subnormal divisor): clamp to +-57344 first, so they
  // saturate instead of becoming Inf.
  PYCOMM_HD static uint8_t encodeFinite(float q) {
    const uint32_t bits = floatToBits(q);
    const uint32_t abs = bits & 0x7fffffffu;
    constexpr uint32_t kMaxBits = 0x47600000u;  // 57344.0f
    return floatToFp8E5M2(bitsToFloat((bits & 0x80000000u) | (abs > kMaxBits ? kMaxBits : abs)));
  }
  PYCOMM_HD static uint8_t encodeNative(float v) { return floatToFp8E5M2(v); }
  PYCOMM_HD static float decode(uint8_t c) { return fp8E5M2ToFloat(c); }
};

// Scale of a block: s = amax / MAX, d = s > 0 ? s : 1 (amax from the block's finite elements).
template <typename F>
PYCOMM_HD float blockScale(float amax) { return divRn(amax, F::kMax); }
PYCOMM_HD float blockDivisor(float s) { return s > 0.0f ? s : 1.0f; }

// The scale word stored for a block.
PYCOMM_HD float blockScaleWord(float s, float d, bool nonFinite, bool infBlock) {
  return !nonFinite ? s : (infBlock ? -d : d);
}

// Code of one element v of a block with divisor d; infBlock: an E4M3 block holding +-Inf.
template <typename F>
PYCOMM_HD uint8_t encodeElement(float v, float d, bool infBlock) {
  const uint32_t abs = floatToBits(v) & 0x7fffffffu;
  if (abs < 0x7f800000u) {
    const uint8_t c = F::encodeFinite(divRn(v, d));
    return (infBlock && (c & 0x7fu) == 0) ? uint8_t{0} : c;  // 0x80 means NaN in an Inf block
  }
  if (!infBlock) return F::encodeNative(v);  // native NaN (and E5M2 Inf) codes
  if (abs > 0x7f800000u) return kInfBlockNan;
  return (floatToBits(v) >> 31) ? kInfBlockNegInf : kInfBlockPosInf;
}

PYCOMM_HD bool isInfBlockScale(float scale) { return (floatToBits(scale) >> 31) != 0; }

// Value of code c in a block with scale word `scale`; infBlock = F::kHasInfBlocks &&
// isInfBlockScale(scale) (computed once per block by the caller).
template <typename F>
PYCOMM_HD float decodeElement(uint8_t c, float scale, bool infBlock) {
  if (F::kHasInfBlocks && infBlock) {
    if (c == kInfBlockPosInf) return bitsToFloat(0x7f800000u);
    if (c == kInfBlockNegInf) return bitsToFloat(0xff800000u);
    if (c == kInfBlockNan) return bitsToFloat(0x7fc00000u);
    return mul(F::decode(c), bitsToFloat(floatToBits(scale) ^ 0x80000000u));  // fp8 value * |S|
  }
  return mul(F::decode(c), scale);
}

}  // namespace pycomm::cuda::ops
