// The AVX2 codec table (codec_kernels.h): simd_kernels.inc over 8 lanes of 32 bits in ymm registers,
// with F16C for the fp16 encoding.
//
// Every function carries target("avx2,f16c") rather than the file being built with -mavx2, so the
// library still loads and runs on CPUs without AVX2 (codec_kernels.cc only hands this table out when
// the CPU has both). "fma" is deliberately not in the target: the decode product and the addition of
// decodeAdd must stay two roundings.
#include "codec_kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#include "scalar_kernels.h"

#define PYCOMM_SIMD_TARGET __attribute__((target("avx2,f16c")))
#define PYCOMM_SIMD_ISA "avx2"

namespace pycomm::codecs {
namespace {

// The primitives of simd_kernels.inc: each one intrinsic, or a short fixed sequence.
struct V {
  static constexpr size_t kLanes = 8;
  using I = __m256i;
  using F = __m256;
  using M = __m256i;  // all-ones lanes where true

  PYCOMM_SIMD_TARGET static I set1(uint32_t v) { return _mm256_set1_epi32(static_cast<int>(v)); }
  PYCOMM_SIMD_TARGET static I zero() { return _mm256_setzero_si256(); }
  PYCOMM_SIMD_TARGET static F setF(float v) { return _mm256_set1_ps(v); }

  PYCOMM_SIMD_TARGET static F loadF(const float* p) { return _mm256_loadu_ps(p); }
  PYCOMM_SIMD_TARGET static I loadBits(const float* p) { return _mm256_castps_si256(_mm256_loadu_ps(p)); }
  PYCOMM_SIMD_TARGET static void storeF(float* p, F v) { _mm256_storeu_ps(p, v); }

  // 8 one-byte codes, zero-extended to lanes.
  PYCOMM_SIMD_TARGET static I load8(const uint8_t* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  // 8 two-byte codes, zero-extended to lanes.
  PYCOMM_SIMD_TARGET static I load16(const uint8_t* p) {
    return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  PYCOMM_SIMD_TARGET static void storeFp16(uint8_t* p, F v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  // 16 lanes holding values <= 0xffff as 16 two-byte codes, a's then b's. packus works within each
  // 128-bit half ([a0-3 b0-3 | a4-7 b4-7]); the 64-bit permute puts the quarters back in order. Its
  // unsigned saturation never applies: the lanes are already in range.
  PYCOMM_SIMD_TARGET static void store16x2(uint8_t* p, I a, I b) {
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), packed);
  }
  // 32 lanes holding values <= 0xff as 32 bytes, a's, b's, c's then d's. The two packing steps leave
  // the 4-byte groups as [a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7]; one 32-bit permute reorders them.
  PYCOMM_SIMD_TARGET static void storeCodes4(uint8_t* p, I a, I b, I c, I d) {
    const __m256i bytes = _mm256_packus_epi16(_mm256_packus_epi32(a, b), _mm256_packus_epi32(c, d));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_permutevar8x32_epi32(bytes, order));
  }

  PYCOMM_SIMD_TARGET static I and_(I a, I b) { return _mm256_and_si256(a, b); }
  PYCOMM_SIMD_TARGET static I or_(I a, I b) { return _mm256_or_si256(a, b); }
  PYCOMM_SIMD_TARGET static I add(I a, I b) { return _mm256_add_epi32(a, b); }
  PYCOMM_SIMD_TARGET static I sub(I a, I b) { return _mm256_sub_epi32(a, b); }
  template <int kBits>
  PYCOMM_SIMD_TARGET static I srli(I a) { return _mm256_srli_epi32(a, kBits); }
  template <int kBits>
  PYCOMM_SIMD_TARGET static I slli(I a) { return _mm256_slli_epi32(a, kBits); }
  PYCOMM_SIMD_TARGET static I minu(I a, I b) { return _mm256_min_epu32(a, b); }
  PYCOMM_SIMD_TARGET static I max(I a, I b) { return _mm256_max_epi32(a, b); }  // signed

  PYCOMM_SIMD_TARGET static M gt(I a, I b) { return _mm256_cmpgt_epi32(a, b); }  // signed a > b
  PYCOMM_SIMD_TARGET static M eq(I a, I b) { return _mm256_cmpeq_epi32(a, b); }
  // m ? ifTrue : ifFalse per lane (blendv takes its second operand where the mask is set).
  PYCOMM_SIMD_TARGET static I select(M m, I ifTrue, I ifFalse) { return _mm256_blendv_epi8(ifFalse, ifTrue, m); }

  // Signed maximum over the 8 lanes.
  PYCOMM_SIMD_TARGET static int32_t hmax(I v) {
    __m128i m = _mm_max_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    m = _mm_max_epi32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(1, 0, 3, 2)));
    m = _mm_max_epi32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(m);
  }

  PYCOMM_SIMD_TARGET static F asF(I v) { return _mm256_castsi256_ps(v); }
  PYCOMM_SIMD_TARGET static I asI(F v) { return _mm256_castps_si256(v); }
  PYCOMM_SIMD_TARGET static F toFloat(I v) { return _mm256_cvtepi32_ps(v); }  // exact below 2^24
  PYCOMM_SIMD_TARGET static F addF(F a, F b) { return _mm256_add_ps(a, b); }
  PYCOMM_SIMD_TARGET static F mulF(F a, F b) { return _mm256_mul_ps(a, b); }
  PYCOMM_SIMD_TARGET static F divF(F a, F b) { return _mm256_div_ps(a, b); }  // IEEE, correctly rounded
};

#include "simd_kernels.inc"

}  // namespace

const CodecKernels* avx2Kernels() { return &kSimdKernels; }

}  // namespace pycomm::codecs

#else  // no x86-64 intrinsics with this compiler: the table does not exist

namespace pycomm::codecs {
const CodecKernels* avx2Kernels() { return nullptr; }
}  // namespace pycomm::codecs

#endif
