#include "codec_kernels.cuh"

#include <cstdint>
#include <type_traits>

#include "core/error.h"
#include "element_ops.cuh"
#include "launch.cuh"

namespace pycomm::cuda {
namespace {

using detail::kThreads;
using detail::kWarpsPerCta;
using detail::Peel;

constexpr size_t kBlock = codecs::kFp8BlockElements;
constexpr size_t kScaleBytes = codecs::kFp8ScaleBytes;
constexpr size_t kBlockBytes = kScaleBytes + kBlock;
static_assert(kBlock == 256 && kScaleBytes == 4, "the warp layout below is written for 256-element blocks");

bool isAligned(const void* p, size_t alignment) { return reinterpret_cast<uintptr_t>(p) % alignment == 0; }

// ---- fp16 / bf16: elementwise, 8 elements (16 bytes of codes, 32 of floats) per vector step ----------

union Codes8 {
  uint4 u;
  uint16_t h[8];
};

__device__ __forceinline__ void load8(const float* p, float (&v)[8]) {
  const float4 a = *reinterpret_cast<const float4*>(p);
  const float4 b = *reinterpret_cast<const float4*>(p + 4);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
  v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

__device__ __forceinline__ void store8(float* p, const float (&v)[8]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  *reinterpret_cast<float4*>(p + 4) = make_float4(v[4], v[5], v[6], v[7]);
}

// A single code at any byte offset (little-endian, as the CPU's memcpy on the platforms pycomm supports).
__device__ __forceinline__ uint16_t loadCode16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}

__device__ __forceinline__ void storeCode16(uint8_t* p, uint16_t h) {
  p[0] = static_cast<uint8_t>(h);
  p[1] = static_cast<uint8_t>(h >> 8);
}

template <typename C>
__global__ void __launch_bounds__(kThreads)
    encode16Kernel(const float* __restrict__ in, size_t count, uint8_t* __restrict__ out, Peel peel) {
  detail::peeledLoop<8>(
      detail::gridThread(), detail::gridThreads(), count, peel,
      [&](size_t i) {
        float v[8];
        load8(in + i, v);
        Codes8 c;
#pragma unroll
        for (int k = 0; k < 8; ++k) c.h[k] = C::encode(v[k]);
        *reinterpret_cast<uint4*>(out + 2 * i) = c.u;
      },
      [&](size_t i) { storeCode16(out + 2 * i, C::encode(in[i])); });
}

template <typename C>
__global__ void __launch_bounds__(kThreads)
    decode16Kernel(const uint8_t* __restrict__ in, size_t count, float* __restrict__ out, Peel peel) {
  detail::peeledLoop<8>(
      detail::gridThread(), detail::gridThreads(), count, peel,
      [&](size_t i) {
        Codes8 c;
        c.u = *reinterpret_cast<const uint4*>(in + 2 * i);
        float v[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = C::decode(c.h[k]);
        store8(out + i, v);
      },
      [&](size_t i) { out[i] = C::decode(loadCode16(in + 2 * i)); });
}

template <typename C>
__global__ void __launch_bounds__(kThreads)
    decodeAdd16Kernel(const uint8_t* __restrict__ in, size_t count, float* __restrict__ acc, Peel peel) {
  detail::peeledLoop<8>(
      detail::gridThread(), detail::gridThreads(), count, peel,
      [&](size_t i) {
        Codes8 c;
        c.u = *reinterpret_cast<const uint4*>(in + 2 * i);
        float a[8];
        load8(acc + i, a);
#pragma unroll
        for (int k = 0; k < 8; ++k) a[k] = ops::add(a[k], C::decode(c.h[k]));
        store8(acc + i, a);
      },
      [&](size_t i) { acc[i] = ops::add(acc[i], C::decode(loadCode16(in + 2 * i))); });
}

// in and out may be the same buffer: each element is read before it is written, by the same thread.
template <typename C>
__global__ void __launch_bounds__(kThreads) decodeAddEncode16Kernel(const uint8_t* in, const float* __restrict__ acc,
                                                                   size_t count, uint8_t* out, float scale, Peel peel) {
  const bool scaled = scale != 1.0f;
  auto sum = [&](float a, uint16_t h) {
    const float s = ops::add(a, C::decode(h));
    return scaled ? ops::mul(s, scale) : s;
  };
  detail::peeledLoop<8>(
      detail::gridThread(), detail::gridThreads(), count, peel,
      [&](size_t i) {
        Codes8 c;
        c.u = *reinterpret_cast<const uint4*>(in + 2 * i);
        float a[8];
        load8(acc + i, a);
#pragma unroll
        for (int k = 0; k < 8; ++k) c.h[k] = C::encode(sum(a[k], c.h[k]));
        *reinterpret_cast<uint4*>(out + 2 * i) = c.u;
      },
      [&](size_t i) { storeCode16(out + 2 * i, C::encode(sum(acc[i], loadCode16(in + 2 * i)))); });
}

template <typename Kernel>
unsigned grid16(Kernel* kernel, size_t count, Peel peel) {
  const size_t scalars = count - peel.nvec * 8;
  return detail::gridFor(kernel, peel.nvec > scalars ? peel.nvec : scalars);
}

template <typename C>
void encode16(const float* in, size_t count, uint8_t* out, cudaStream_t stream) {
  const Peel peel = detail::peelFor(count, 8, {{in, 4}, {out, 2}});
  auto* kernel = encode16Kernel<C>;
  kernel<<<grid16(kernel, count, peel), kThreads, 0, stream>>>(in, count, out, peel);
}

template <typename C>
void decode16(const uint8_t* in, size_t count, float* out, cudaStream_t stream) {
  const Peel peel = detail::peelFor(count, 8, {{in, 2}, {out, 4}});
  auto* kernel = decode16Kernel<C>;
  kernel<<<grid16(kernel, count, peel), kThreads, 0, stream>>>(in, count, out, peel);
}

template <typename C>
void decodeAdd16(const uint8_t* in, size_t count, float* acc, cudaStream_t stream) {
  const Peel peel = detail::peelFor(count, 8, {{in, 2}, {acc, 4}});
  auto* kernel = decodeAdd16Kernel<C>;
  kernel<<<grid16(kernel, count, peel), kThreads, 0, stream>>>(in, count, acc, peel);
}

template <typename C>
void decodeAddEncode16(const uint8_t* in, const float* acc, size_t count, uint8_t* out, float scale,
                       cudaStream_t stream) {
  const Peel peel = detail::peelFor(count, 8, {{in, 2}, {acc, 4}, {out, 2}});
  auto* kernel = decodeAddEncode16Kernel<C>;
  kernel<<<grid16(kernel, count, peel), kThreads, 0, stream>>>(in, acc, count, out, scale, peel);
}

// ---- fp8: one warp per 256-element block -------------------------------------------------------------
//
// Each lane holds 8 of the block's elements in registers. Vector layout (a full block, aligned
// pointers): slots 0-3 are elements 4*lane .. 4*lane+3, slots 4-7 are 128+4*lane .. 128+4*lane+3, so
// one instruction of the warp reads 512 contiguous bytes of floats or writes 128 bytes of codes.
// Scalar layout (the partial last block, or unaligned pointers): slot k is element lane + 32k.
// Slots past the end of a partial block hold 0.0f, which changes neither amax nor the flags.

template <bool kVec>
__device__ __forceinline__ size_t slot(int lane, int k) {
  if constexpr (kVec) {
    return static_cast<size_t>((k < 4 ? 0 : 128) + 4 * lane + (k & 3));
  } else {
    return static_cast<size_t>(lane + 32 * k);
  }
}

template <bool kVec>
__device__ __forceinline__ float loadScale(const uint8_t* block) {
  if constexpr (kVec) {
    return *reinterpret_cast<const float*>(block);
  } else {
    return ops::bitsToFloat(static_cast<uint32_t>(block[0]) | (static_cast<uint32_t>(block[1]) << 8) |
                            (static_cast<uint32_t>(block[2]) << 16) | (static_cast<uint32_t>(block[3]) << 24));
  }
}

template <bool kVec>
__device__ __forceinline__ void storeScale(uint8_t* block, float scale) {
  if constexpr (kVec) {
    *reinterpret_cast<float*>(block) = scale;
  } else {
    const uint32_t w = ops::floatToBits(scale);
    block[0] = static_cast<uint8_t>(w);
    block[1] = static_cast<uint8_t>(w >> 8);
    block[2] = static_cast<uint8_t>(w >> 16);
    block[3] = static_cast<uint8_t>(w >> 24);
  }
}

template <bool kVec>
__device__ __forceinline__ void loadFloats(const float* x, size_t n, int lane, float (&v)[8]) {
  if constexpr (kVec) {
    const float4 a = *reinterpret_cast<const float4*>(x + 4 * lane);
    const float4 b = *reinterpret_cast<const float4*>(x + 128 + 4 * lane);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const size_t j = slot<false>(lane, k);
      v[k] = j < n ? x[j] : 0.0f;
    }
  }
}

template <bool kVec>
__device__ __forceinline__ void storeFloats(float* x, size_t n, int lane, const float (&v)[8]) {
  if constexpr (kVec) {
    *reinterpret_cast<float4*>(x + 4 * lane) = make_float4(v[0], v[1], v[2], v[3]);
    *reinterpret_cast<float4*>(x + 128 + 4 * lane) = make_float4(v[4], v[5], v[6], v[7]);
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const size_t j = slot<false>(lane, k);
      if (j < n) x[j] = v[k];
    }
  }
}

// Decoded values of the lane's slots of one encoded block (0.0f past n).
template <typename F, bool kVec>
__device__ __forceinline__ void decodeBlock(const uint8_t* block, size_t n, int lane, float (&v)[8]) {
  const float scale = loadScale<kVec>(block);
  const bool infBlock = F::kHasInfBlocks && ops::isInfBlockScale(scale);
  const uint8_t* codes = block + kScaleBytes;
  if constexpr (kVec) {
    const uchar4 a = *reinterpret_cast<const uchar4*>(codes + 4 * lane);
    const uchar4 b = *reinterpret_cast<const uchar4*>(codes + 128 + 4 * lane);
    const uint8_t c[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = ops::decodeElement<F>(c[k], scale, infBlock);
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const size_t j = slot<false>(lane, k);
      v[k] = j < n ? ops::decodeElement<F>(codes[j], scale, infBlock) : 0.0f;
    }
  }
}

// Encodes the block whose values the warp holds in v (all 32 lanes must call it).
template <typename F, bool kVec>
__device__ __forceinline__ void encodeBlock(const float (&v)[8], size_t n, int lane, uint8_t* block) {
  // |x| orders as its bit pattern, and every non-finite |x| is >= 0x7f800000: one max in the common
  // case, a second one over the finite values only for a block holding NaN or Inf (warp-uniform).
  uint32_t top = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const uint32_t a = ops::floatToBits(v[k]) & 0x7fffffffu;
    top = a > top ? a : top;
  }
  top = detail::warpMax(top);
  const bool nonFinite = top >= 0x7f800000u;
  uint32_t amax = top;
  bool infBlock = false;
  if (nonFinite) {
    uint32_t finiteTop = 0;
    bool hasInf = false;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint32_t a = ops::floatToBits(v[k]) & 0x7fffffffu;
      const uint32_t f = a < 0x7f800000u ? a : 0u;
      finiteTop = f > finiteTop ? f : finiteTop;
      hasInf = hasInf || a == 0x7f800000u;
    }
    amax = detail::warpMax(finiteTop);
    if constexpr (F::kHasInfBlocks) infBlock = __any_sync(0xffffffffu, hasInf);
  }
  const float s = ops::blockScale<F>(ops::bitsToFloat(amax));
  const float d = ops::blockDivisor(s);
  uint8_t c[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) c[k] = ops::encodeElement<F>(v[k], d, infBlock);
  uint8_t* codes = block + kScaleBytes;
  if constexpr (kVec) {
    *reinterpret_cast<uchar4*>(codes + 4 * lane) = make_uchar4(c[0], c[1], c[2], c[3]);
    *reinterpret_cast<uchar4*>(codes + 128 + 4 * lane) = make_uchar4(c[4], c[5], c[6], c[7]);
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const size_t j = slot<false>(lane, k);
      if (j < n) codes[j] = c[k];
    }
  }
  if (lane == 0) storeScale<kVec>(block, ops::blockScaleWord(s, d, nonFinite, infBlock));
}

// Grid-stride over the blocks, one warp per block; body(vecTag, b, start, n, lane) with vecTag a
// std::bool_constant: the vector layout for full blocks when the kernel's pointers are aligned.
template <bool kAligned, typename Body>
__device__ __forceinline__ void forEachBlock(size_t count, Body&& body) {
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const size_t warps = static_cast<size_t>(gridDim.x) * kWarpsPerCta;
  const size_t nblocks = (count + kBlock - 1) / kBlock;
  for (size_t b = static_cast<size_t>(blockIdx.x) * kWarpsPerCta + (threadIdx.x >> 5); b < nblocks; b += warps) {
    const size_t start = b * kBlock;
    const size_t n = count - start < kBlock ? count - start : kBlock;
    if constexpr (kAligned) {
      if (n == kBlock) {
        body(std::true_type{}, b, start, n, lane);
        continue;
      }
    }
    body(std::false_type{}, b, start, n, lane);
  }
}

template <typename F, bool kAligned>
__global__ void __launch_bounds__(kThreads)
    encodeFp8Kernel(const float* __restrict__ in, size_t count, uint8_t* __restrict__ out) {
  forEachBlock<kAligned>(count, [&](auto vec, size_t b, size_t start, size_t n, int lane) {
    constexpr bool kVec = decltype(vec)::value;
    float v[8];
    loadFloats<kVec>(in + start, n, lane, v);
    encodeBlock<F, kVec>(v, n, lane, out + b * kBlockBytes);
  });
}

template <typename F, bool kAligned>
__global__ void __launch_bounds__(kThreads)
    decodeFp8Kernel(const uint8_t* __restrict__ in, size_t count, float* __restrict__ out) {
  forEachBlock<kAligned>(count, [&](auto vec, size_t b, size_t start, size_t n, int lane) {
    constexpr bool kVec = decltype(vec)::value;
    float v[8];
    decodeBlock<F, kVec>(in + b * kBlockBytes, n, lane, v);
    storeFloats<kVec>(out + start, n, lane, v);
  });
}

template <typename F, bool kAligned>
__global__ void __launch_bounds__(kThreads)
    decodeAddFp8Kernel(const uint8_t* __restrict__ in, size_t count, float* __restrict__ acc) {
  forEachBlock<kAligned>(count, [&](auto vec, size_t b, size_t start, size_t n, int lane) {
    constexpr bool kVec = decltype(vec)::value;
    float v[8];
    float a[8];
    decodeBlock<F, kVec>(in + b * kBlockBytes, n, lane, v);
    loadFloats<kVec>(acc + start, n, lane, a);
#pragma unroll
    for (int k = 0; k < 8; ++k) a[k] = ops::add(a[k], v[k]);
    storeFloats<kVec>(acc + start, n, lane, a);
  });
}

// in and out may be the same buffer: a warp reads its whole block (scale and codes) before the warp
// reduction of encodeBlock, and writes it after.
template <typename F, bool kAligned>
__global__ void __launch_bounds__(kThreads) decodeAddEncodeFp8Kernel(const uint8_t* in, const float* __restrict__ acc,
                                                                    size_t count, uint8_t* out, float scale) {
  const bool scaled = scale != 1.0f;
  forEachBlock<kAligned>(count, [&](auto vec, size_t b, size_t start, size_t n, int lane) {
    constexpr bool kVec = decltype(vec)::value;
    float v[8];
    float a[8];
    decodeBlock<F, kVec>(in + b * kBlockBytes, n, lane, v);
    loadFloats<kVec>(acc + start, n, lane, a);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      a[k] = ops::add(a[k], v[k]);
      if (scaled) a[k] = ops::mul(a[k], scale);
    }
    encodeBlock<F, kVec>(a, n, lane, out + b * kBlockBytes);
  });
}

template <typename Kernel>
unsigned gridFp8(Kernel* kernel, size_t count) {
  return detail::gridFor(kernel, (count + kBlock - 1) / kBlock, kWarpsPerCta);
}

template <typename F>
void encodeFp8(const float* in, size_t count, uint8_t* out, cudaStream_t stream) {
  auto* kernel = (isAligned(in, 16) && isAligned(out, 4)) ? encodeFp8Kernel<F, true> : encodeFp8Kernel<F, false>;
  kernel<<<gridFp8(kernel, count), kThreads, 0, stream>>>(in, count, out);
}

template <typename F>
void decodeFp8(const uint8_t* in, size_t count, float* out, cudaStream_t stream) {
  auto* kernel = (isAligned(in, 4) && isAligned(out, 16)) ? decodeFp8Kernel<F, true> : decodeFp8Kernel<F, false>;
  kernel<<<gridFp8(kernel, count), kThreads, 0, stream>>>(in, count, out);
}

template <typename F>
void decodeAddFp8(const uint8_t* in, size_t count, float* acc, cudaStream_t stream) {
  const bool aligned = isAligned(in, 4) && isAligned(acc, 16);
  auto* kernel = aligned ? decodeAddFp8Kernel<F, true> : decodeAddFp8Kernel<F, false>;
  kernel<<<gridFp8(kernel, count), kThreads, 0, stream>>>(in, count, acc);
}

template <typename F>
void decodeAddEncodeFp8(const uint8_t* in, const float* acc, size_t count, uint8_t* out, float scale,
                        cudaStream_t stream) {
  const bool aligned = isAligned(in, 4) && isAligned(acc, 16) && isAligned(out, 4);
  auto* kernel = aligned ? decodeAddEncodeFp8Kernel<F, true> : decodeAddEncodeFp8Kernel<F, false>;
  kernel<<<gridFp8(kernel, count), kThreads, 0, stream>>>(in, acc, count, out, scale);
}

[[noreturn]] void badCodec(Codec codec) {
  throw InvalidUsageError(strCat("unknown codec ", static_cast<int>(codec)));
}

}  // namespace

void encode(Codec codec, const float* in, size_t count, uint8_t* out, cudaStream_t stream) {
  switch (codec) {
    case Codec::kFp16: if (count) encode16<ops::Fp16>(in, count, out, stream); break;
    case Codec::kBf16: if (count) encode16<ops::Bf16>(in, count, out, stream); break;
    case Codec::kFp8E4M3: if (count) encodeFp8<ops::E4M3>(in, count, out, stream); break;
    case Codec::kFp8E5M2: if (count) encodeFp8<ops::E5M2>(in, count, out, stream); break;
    default: badCodec(codec);
  }
  if (count) detail::checkLaunch("encode");
}

void decode(Codec codec, const uint8_t* in, size_t count, float* out, cudaStream_t stream) {
  switch (codec) {
    case Codec::kFp16: if (count) decode16<ops::Fp16>(in, count, out, stream); break;
    case Codec::kBf16: if (count) decode16<ops::Bf16>(in, count, out, stream); break;
    case Codec::kFp8E4M3: if (count) decodeFp8<ops::E4M3>(in, count, out, stream); break;
    case Codec::kFp8E5M2: if (count) decodeFp8<ops::E5M2>(in, count, out, stream); break;
    default: badCodec(codec);
  }
  if (count) detail::checkLaunch("decode");
}

void decodeAdd(Codec codec, const uint8_t* in, size_t count, float* acc, cudaStream_t stream) {
  switch (codec) {
    case Codec::kFp16: if (count) decodeAdd16<ops::Fp16>(in, count, acc, stream); break;
    case Codec::kBf16: if (count) decodeAdd16<ops::Bf16>(in, count, acc, stream); break;
    case Codec::kFp8E4M3: if (count) decodeAddFp8<ops::E4M3>(in, count, acc, stream); break;
    case Codec::kFp8E5M2: if (count) decodeAddFp8<ops::E5M2>(in, count, acc, stream); break;
    default: badCodec(codec);
  }
  if (count) detail::checkLaunch("decodeAdd");
}

void decodeAddEncode(Codec codec, const uint8_t* in, const float* acc, size_t count, uint8_t* out,
                     cudaStream_t stream, float scale) {
  switch (codec) {
    case Codec::kFp16: if (count) decodeAddEncode16<ops::Fp16>(in, acc, count, out, scale, stream); break;
    case Codec::kBf16: if (count) decodeAddEncode16<ops::Bf16>(in, acc, count, out, scale, stream); break;
    case Codec::kFp8E4M3: if (count) decodeAddEncodeFp8<ops::E4M3>(in, acc, count, out, scale, stream); break;
    case Codec::kFp8E5M2: if (count) decodeAddEncodeFp8<ops::E5M2>(in, acc, count, out, scale, stream); break;
    default: badCodec(codec);
  }
  if (count) detail::checkLaunch("decodeAddEncode");
}

namespace {

__global__ void __launch_bounds__(kThreads) scaleKernel(float* data, size_t count, float factor) {
  for (size_t i = detail::gridThread(); i < count; i += detail::gridThreads()) data[i] = ops::mul(data[i], factor);
}

}  // namespace

void scale(float* data, size_t count, float factor, cudaStream_t stream) {
  if (count == 0) return;
  auto* kernel = scaleKernel;
  kernel<<<detail::gridFor(kernel, count), kThreads, 0, stream>>>(data, count, factor);
  detail::checkLaunch("scale");
}

}  // namespace pycomm::cuda
