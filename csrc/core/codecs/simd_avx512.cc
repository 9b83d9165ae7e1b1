// The AVX-512 codec table (codec_kernels.h): simd_kernels.inc over 16 lanes of 32 bits in zmm
// registers. Only AVX-512F instructions are used (comparisons into mask registers, vpmovdb/vpmovdw
// to narrow, vcvtps2ph on zmm), so any AVX-512 CPU runs it; codec_kernels.cc hands it out when the
// CPU has AVX-512F (and AVX2 and F16C, which every such CPU has).
//
// Per-function target attributes, as in simd_avx2.cc. AVX-512F brings zmm fused multiply-adds with
// it, which is why simd_kernels.inc shields the decodeAdd product (roundedProduct) and the core
// builds with -ffp-contract=off.
#include "codec_kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#include "scalar_kernels.h"

// GCC 12's avx512fintrin.h fills "don't care" operands with a self-initialized variable
// (_mm512_undefined_epi32), which -Wmaybe-uninitialized reports at every use outside a -mavx512f
// build (GCC bug 105593, fixed in GCC 13). The warning is about the header, not this code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define PYCOMM_SIMD_TARGET __attribute__((target("avx512f,avx2,f16c")))
#define PYCOMM_SIMD_ISA "avx512"

namespace pycomm::codecs {
namespace {

// The primitives of simd_kernels.inc: each one intrinsic, or a short fixed sequence.
struct V {
  static constexpr size_t kLanes = 16;
  using I = __m512i;
  using F = __m512;
  using M = __mmask16;  // one bit per lane

  PYCOMM_SIMD_TARGET static I set1(uint32_t v) { return _mm512_set1_epi32(static_cast<int>(v)); }
  PYCOMM_SIMD_TARGET static I zero() { return _mm512_setzero_si512(); }
  PYCOMM_SIMD_TARGET static F setF(float v) { return _mm512_set1_ps(v); }

  PYCOMM_SIMD_TARGET static F loadF(const float* p) { return _mm512_loadu_ps(p); }
  PYCOMM_SIMD_TARGET static I loadBits(const float* p) { return _mm512_castps_si512(_mm512_loadu_ps(p)); }
  PYCOMM_SIMD_TARGET static void storeF(float* p, F v) { _mm512_storeu_ps(p, v); }

  // 16 one-byte codes, zero-extended to lanes.
  PYCOMM_SIMD_TARGET static I load8(const uint8_t* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  // 16 two-byte codes, zero-extended to lanes.
  PYCOMM_SIMD_TARGET static I load16(const uint8_t* p) {
    return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  PYCOMM_SIMD_TARGET static void storeFp16(uint8_t* p, F v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  // vpmovdw / vpmovdb truncate each lane, in lane order; the lanes already hold values in range.
  PYCOMM_SIMD_TARGET static void store16x2(uint8_t* p, I a, I b) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(a));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + 32), _mm512_cvtepi32_epi16(b));
  }
  PYCOMM_SIMD_TARGET static void storeCodes4(uint8_t* p, I a, I b, I c, I d) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(a));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 16), _mm512_cvtepi32_epi8(b));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 32), _mm512_cvtepi32_epi8(c));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 48), _mm512_cvtepi32_epi8(d));
  }

  PYCOMM_SIMD_TARGET static I and_(I a, I b) { return _mm512_and_si512(a, b); }
  PYCOMM_SIMD_TARGET static I or_(I a, I b) { return _mm512_or_si512(a, b); }
  PYCOMM_SIMD_TARGET static I add(I a, I b) { return _mm512_add_epi32(a, b); }
  PYCOMM_SIMD_TARGET static I sub(I a, I b) { return _mm512_sub_epi32(a, b); }
  template <int kBits>
  PYCOMM_SIMD_TARGET static I srli(I a) { return _mm512_srli_epi32(a, kBits); }
  template <int kBits>
  PYCOMM_SIMD_TARGET static I slli(I a) { return _mm512_slli_epi32(a, kBits); }
  PYCOMM_SIMD_TARGET static I minu(I a, I b) { return _mm512_min_epu32(a, b); }
  PYCOMM_SIMD_TARGET static I max(I a, I b) { return _mm512_max_epi32(a, b); }  // signed

  PYCOMM_SIMD_TARGET static M gt(I a, I b) { return _mm512_cmpgt_epi32_mask(a, b); }  // signed a > b
  PYCOMM_SIMD_TARGET static M eq(I a, I b) { return _mm512_cmpeq_epi32_mask(a, b); }
  // m ? ifTrue : ifFalse per lane: mask_blend(k, a, b) takes b where k is set.
  PYCOMM_SIMD_TARGET static I select(M m, I ifTrue, I ifFalse) { return _mm512_mask_blend_epi32(m, ifFalse, ifTrue); }

  PYCOMM_SIMD_TARGET static int32_t hmax(I v) { return _mm512_reduce_max_epi32(v); }  // signed

  PYCOMM_SIMD_TARGET static F asF(I v) { return _mm512_castsi512_ps(v); }
  PYCOMM_SIMD_TARGET static I asI(F v) { return _mm512_castps_si512(v); }
  PYCOMM_SIMD_TARGET static F toFloat(I v) { return _mm512_cvtepi32_ps(v); }  // exact below 2^24
  PYCOMM_SIMD_TARGET static F addF(F a, F b) { return _mm512_add_ps(a, b); }
  PYCOMM_SIMD_TARGET static F mulF(F a, F b) { return _mm512_mul_ps(a, b); }
  PYCOMM_SIMD_TARGET static F divF(F a, F b) { return _mm512_div_ps(a, b); }  // IEEE, correctly rounded
};

#include "simd_kernels.inc"

}  // namespace

const CodecKernels* avx512Kernels() { return &kSimdKernels; }

}  // namespace pycomm::codecs

#else  // no x86-64 intrinsics with this compiler: the table does not exist

namespace pycomm::codecs {
const CodecKernels* avx512Kernels() { return nullptr; }
}  // namespace pycomm::codecs

#endif
