#include "codec_kernels.cuh"

#include <cstdint>
#include <initializer_list>
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

// The bodies below run on one vector step of 8 elements starting at i (aligned: 32 bytes of floats,
// 16 of codes) or on the single element i.

template <typename C>
__device__ __forceinline__ void encode8(const float* __restrict__ in, size_t i, uint8_t* __restrict__ out) {
  float v[8];
  load8(in + i, v);
  Codes8 c;
#pragma unroll
  for (int k = 0; k < 8; ++k) c.h[k] = C::encode(v[k]);
  *reinterpret_cast<uint4*>(out + 2 * i) = c.u;
}

template <typename C>
__device__ __forceinline__ void decode8(const uint8_t* __restrict__ in, size_t i, float* __restrict__ out) {
  Codes8 c;
  c.u = *reinterpret_cast<const uint4*>(in + 2 * i);
  float v[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) v[k] = C::decode(c.h[k]);
  store8(out + i, v);
}

template <typename C>
__device__ __forceinline__ void decodeAdd8(const uint8_t* __restrict__ in, size_t i, float* __restrict__ acc) {
  Codes8 c;
  c.u = *reinterpret_cast<const uint4*>(in + 2 * i);
  float a[8];
  load8(acc + i, a);
#pragma unroll
  for (int k = 0; k < 8; ++k) a[k] = ops::add(a[k], C::decode(c.h[k]));
  store8(acc + i, a);
}

// (acc + decode(h)) * scale, the product skipped when scale is 1 (`scaled` false).
template <typename C>
__device__ __forceinline__ float scaledSum(float a, uint16_t h, bool scaled, float scale) {
  const float s = ops::add(a, C::decode(h));
  return scaled ? ops::mul(s, scale) : s;
}

template <typename C>
__device__ __forceinline__ void decodeAddEncode8(const uint8_t* in, const float* __restrict__ acc, size_t i,
                                                 uint8_t* out, bool scaled, float scale) {
  Codes8 c;
  c.u = *reinterpret_cast<const uint4*>(in + 2 * i);
  float a[8];
  load8(acc + i, a);
#pragma unroll
  for (int k = 0; k < 8; ++k) c.h[k] = C::encode(scaledSum<C>(a[k], c.h[k], scaled, scale));
  *reinterpret_cast<uint4*>(out + 2 * i) = c.u;
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

// ---- the kernels: one per operation, for every codec ---------------------------------------------
//
// C is the codec's element type (ops::Fp16, ops::Bf16: elementwise over the peeled loop; ops::E4M3,
// ops::E5M2: one warp per block). kAligned (fp8 only) selects the vector layout for full blocks; the
// peel (fp16/bf16 only) says where the aligned vector steps are.

template <typename C>
constexpr bool kIsFp8 = std::is_same_v<C, ops::E4M3> || std::is_same_v<C, ops::E5M2>;

template <typename C, bool kAligned>
__global__ void __launch_bounds__(kThreads)
    encodeKernel(const float* __restrict__ in, size_t count, uint8_t* __restrict__ out, Peel peel) {
  if constexpr (kIsFp8<C>) {
    forEachBlock<kAligned>(count, [&](auto vec, size_t b, size_t start, size_t n, int lane) {
      constexpr bool kVec = decltype(vec)::value;
      float v[8];
      loadFloats<kVec>(in + start, n, lane, v);
      encodeBlock<C, kVec>(v, n, lane, out + b * kBlockBytes);
    });
  } else {
    detail::peeledLoop<8>(
        detail::gridThread(), detail::gridThreads(), count, peel, [&](size_t i) { encode8<C>(in, i, out); },
        [&](size_t i) { storeCode16(out + 2 * i, C::encode(in[i])); });
  }
}

template <typename C, bool kAligned>
__global__ void __launch_bounds__(kThreads)
    decodeKernel(const uint8_t* __restrict__ in, size_t count, float* __restrict__ out, Peel peel) {
  if constexpr (kIsFp8<C>) {
    forEachBlock<kAligned>(count, [&](auto vec, size_t b, size_t start, size_t n, int lane) {
      constexpr bool kVec = decltype(vec)::value;
      float v[8];
      decodeBlock<C, kVec>(in + b * kBlockBytes, n, lane, v);
      storeFloats<kVec>(out + start, n, lane, v);
    });
  } else {
    detail::peeledLoop<8>(
        detail::gridThread(), detail::gridThreads(), count, peel, [&](size_t i) { decode8<C>(in, i, out); },
        [&](size_t i) { out[i] = C::decode(loadCode16(in + 2 * i)); });
  }
}

template <typename C, bool kAligned>
__global__ void __launch_bounds__(kThreads)
    decodeAddKernel(const uint8_t* __restrict__ in, size_t count, float* __restrict__ acc, Peel peel) {
  if constexpr (kIsFp8<C>) {
    forEachBlock<kAligned>(count, [&](auto vec, size_t b, size_t start, size_t n, int lane) {
      constexpr bool kVec = decltype(vec)::value;
      float v[8];
      float a[8];
      decodeBlock<C, kVec>(in + b * kBlockBytes, n, lane, v);
      loadFloats<kVec>(acc + start, n, lane, a);
#pragma unroll
      for (int k = 0; k < 8; ++k) a[k] = ops::add(a[k], v[k]);
      storeFloats<kVec>(acc + start, n, lane, a);
    });
  } else {
    detail::peeledLoop<8>(
        detail::gridThread(), detail::gridThreads(), count, peel, [&](size_t i) { decodeAdd8<C>(in, i, acc); },
        [&](size_t i) { acc[i] = ops::add(acc[i], C::decode(loadCode16(in + 2 * i))); });
  }
}

// in and out may be the same buffer. fp16/bf16: each element is read before it is written, by the
// same thread; fp8: a warp reads its whole block (scale and codes) before the warp reduction of
// encodeBlock, and writes it after.
template <typename C, bool kAligned>
__global__ void __launch_bounds__(kThreads) decodeAddEncodeKernel(const uint8_t* in, const float* __restrict__ acc,
                                                                 size_t count, uint8_t* out, float scale, Peel peel) {
  const bool scaled = scale != 1.0f;
  if constexpr (kIsFp8<C>) {
    forEachBlock<kAligned>(count, [&](auto vec, size_t b, size_t start, size_t n, int lane) {
      constexpr bool kVec = decltype(vec)::value;
      float v[8];
      float a[8];
      decodeBlock<C, kVec>(in + b * kBlockBytes, n, lane, v);
      loadFloats<kVec>(acc + start, n, lane, a);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        a[k] = ops::add(a[k], v[k]);
        if (scaled) a[k] = ops::mul(a[k], scale);
      }
      encodeBlock<C, kVec>(a, n, lane, out + b * kBlockBytes);
    });
  } else {
    detail::peeledLoop<8>(
        detail::gridThread(), detail::gridThreads(), count, peel,
        [&](size_t i) { decodeAddEncode8<C>(in, acc, i, out, scaled, scale); },
        [&](size_t i) {
          storeCode16(out + 2 * i, C::encode(scaledSum<C>(acc[i], loadCode16(in + 2 * i), scaled, scale)));
        });
  }
}

// ---- launching ------------------------------------------------------------------------------------

// A buffer a kernel reads or writes, as the peel sees it: (pointer, bytes per element in the
// fp16/bf16 encoding), so 4 for fp32 values and 2 for encoded bytes.
using Buffers = std::initializer_list<detail::Stream>;

// fp8's vector layout needs the fp32 buffers 16-byte aligned and the encoded ones 4-byte aligned.
bool fp8Aligned(Buffers buffers) {
  bool aligned = true;
  for (const detail::Stream& b : buffers) aligned = aligned && isAligned(b.ptr, b.stride == 4 ? 16 : 4);
  return aligned;
}

// Launches kernelFor(C{}, std::bool_constant<kAligned>{}) over `count` elements with `args` and the peel.
template <typename C, typename KernelFor, typename... Args>
void launch(KernelFor kernelFor, Buffers buffers, size_t count, cudaStream_t stream, Args... args) {
  if constexpr (kIsFp8<C>) {
    auto* kernel = fp8Aligned(buffers) ? kernelFor(C{}, std::true_type{}) : kernelFor(C{}, std::false_type{});
    const size_t nblocks = (count + kBlock - 1) / kBlock;
    kernel<<<detail::gridFor(kernel, nblocks, kWarpsPerCta), kThreads, 0, stream>>>(args..., Peel{});
  } else {
    const Peel peel = detail::peelFor(count, 8, buffers);
    const size_t scalars = count - peel.nvec * 8;
    auto* kernel = kernelFor(C{}, std::true_type{});
    kernel<<<detail::gridFor(kernel, peel.nvec > scalars ? peel.nvec : scalars), kThreads, 0, stream>>>(args..., peel);
  }
}

// The public operations' common part: the codec's element type, nothing for count == 0 (an unknown
// codec throws all the same), the launch check.
template <typename KernelFor, typename... Args>
void run(const char* what, Codec codec, KernelFor kernelFor, Buffers buffers, size_t count, cudaStream_t stream,
         Args... args) {
  switch (codec) {
    case Codec::kFp16: if (count) launch<ops::Fp16>(kernelFor, buffers, count, stream, args...); break;
    case Codec::kBf16: if (count) launch<ops::Bf16>(kernelFor, buffers, count, stream, args...); break;
    case Codec::kFp8E4M3: if (count) launch<ops::E4M3>(kernelFor, buffers, count, stream, args...); break;
    case Codec::kFp8E5M2: if (count) launch<ops::E5M2>(kernelFor, buffers, count, stream, args...); break;
    default: throw InvalidUsageError(strCat("unknown codec ", static_cast<int>(codec)));
  }
  if (count) detail::checkLaunch(what);
}

}  // namespace

void encode(Codec codec, const float* in, size_t count, uint8_t* out, cudaStream_t stream) {
  auto kernelFor = [](auto c, auto aligned) { return encodeKernel<decltype(c), decltype(aligned)::value>; };
  run("encode", codec, kernelFor, {{in, 4}, {out, 2}}, count, stream, in, count, out);
}

void decode(Codec codec, const uint8_t* in, size_t count, float* out, cudaStream_t stream) {
  auto kernelFor = [](auto c, auto aligned) { return decodeKernel<decltype(c), decltype(aligned)::value>; };
  run("decode", codec, kernelFor, {{in, 2}, {out, 4}}, count, stream, in, count, out);
}

void decodeAdd(Codec codec, const uint8_t* in, size_t count, float* acc, cudaStream_t stream) {
  auto kernelFor = [](auto c, auto aligned) { return decodeAddKernel<decltype(c), decltype(aligned)::value>; };
  run("decodeAdd", codec, kernelFor, {{in, 2}, {acc, 4}}, count, stream, in, count, acc);
}

void decodeAddEncode(Codec codec, const uint8_t* in, const float* acc, size_t count, uint8_t* out,
                     cudaStream_t stream, float scale) {
  auto kernelFor = [](auto c, auto aligned) { return decodeAddEncodeKernel<decltype(c), decltype(aligned)::value>; };
  run("decodeAddEncode", codec, kernelFor, {{in, 2}, {acc, 4}, {out, 2}}, count, stream, in, acc, count, out, scale);
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
