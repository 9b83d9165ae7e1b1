// The codec kernels as a table of function pointers, one table per instruction set, and the one
// place that picks the table this process uses.
//
// block_codec.h specifies what the kernels compute; every table gives the same bytes and the same
// fp32 bits for every input (the scalar table is the reference, the SIMD tables are checked against
// it bit for bit by tests/native/test_codec_simd). The tables:
//
//   "scalar"  portable C++ (scalar_kernels.cc): runs anywhere; on x86-64 its loops are still
//             compiled twice (multiversion.h) and vectorized by the compiler for x86-64-v3.
//   "avx2"    AVX2 + F16C intrinsics (simd_avx2.cc), on CPUs that have both.
//   "avx512"  AVX-512F intrinsics (simd_avx512.cc), on CPUs that have it (and AVX2, F16C).
//
// The SIMD tables are compiled with per-function target attributes, not with global -m flags, so the
// core builds and runs on any x86-64 (and on other architectures, where only "scalar" exists). The
// fastest table the CPU supports is chosen once, when the library is loaded (__builtin_cpu_supports),
// and never changes afterwards; kernelsForIsa hands out the others so the tests can run every path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "block_codec.h"

namespace pycomm::codecs {

using EncodeKernel = void (*)(const float* in, size_t count, uint8_t* out);
using DecodeKernel = void (*)(const uint8_t* in, size_t count, float* out);

constexpr size_t kCodecCount = 4;  // Codec::kFp16 .. Codec::kFp8E5M2, the index of the arrays below
constexpr size_t kFp8FormatCount = 2;  // 0: E4M3FN, 1: E5M2

struct CodecKernels {
  const char* isa;  // "scalar", "avx2", "avx512"
  // The block codecs of block_codec.h, indexed by static_cast<size_t>(Codec).
  EncodeKernel encode[kCodecCount];
  DecodeKernel decode[kCodecCount];
  DecodeKernel decodeAdd[kCodecCount];  // acc[i] += decoded[i], the product rounded first
  // Unscaled fp8 element conversions (the array forms of fp8.h), indexed E4M3 = 0, E5M2 = 1: the
  // conversion the block encoders apply after dividing by the scale, exposed so that it can be
  // compared with the scalar one over every fp32 input.
  EncodeKernel toFp8[kFp8FormatCount];
  DecodeKernel fromFp8[kFp8FormatCount];
};

// The table every codec call of this process goes through (block_codec.cc: block_codec.h and the array forms of fp8.h).
const CodecKernels& activeKernels();

// The table of an instruction set by name ("scalar", "avx2", "avx512"), or nullptr where it was not
// compiled in or this CPU cannot run it. For tests and benchmarks.
const CodecKernels* kernelsForIsa(const char* isa);

// Every instruction set name this build knows, whether this CPU runs it or not, slowest first.
std::vector<const char*> knownCodecIsas();

// Each table; the SIMD ones return nullptr where the compiler could not build them (not x86-64, or
// not GCC/Clang). They do not check the CPU: that is kernelsForIsa's job.
const CodecKernels& scalarKernels();
const CodecKernels* avx2Kernels();
const CodecKernels* avx512Kernels();

}  // namespace pycomm::codecs
