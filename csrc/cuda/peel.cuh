// The loop shape of the elementwise kernels, host and device (plain C++ under a C++ compiler, so
// tests/cuda/test_element_ops_host.cc checks its coverage without a GPU).
//
// A loop over `count` elements is split into a scalar head, nvec vectors of V elements whose every
// access is 16-byte aligned, and a scalar tail. Each pointer advances `stride` bytes per element,
// and V * stride is a multiple of 16 for each, so once all pointers are aligned at the head they stay
// aligned. head == count and nvec == 0 when no head shorter than V aligns every pointer at once (the
// whole loop is then scalar: pointers whose offsets modulo 16 disagree).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "element_ops.cuh"  // PYCOMM_HD

namespace pycomm::cuda::detail {

struct Peel {
  size_t head;
  size_t nvec;
};

struct Stream {
  const void* ptr;
  size_t stride;  // bytes per element
};

inline Peel peelFor(size_t count, size_t V, std::initializer_list<Stream> streams) {
  for (size_t h = 0; h < V && h < count; ++h) {
    bool aligned = true;
    for (const Stream& s : streams) {
      aligned = aligned && ((reinterpret_cast<uintptr_t>(s.ptr) + h * s.stride) % 16 == 0);
    }
    if (aligned) return {h, (count - h) / V};
  }
  return {count, 0};
}

// Thread `tid` of `nthreads` (grid-stride): vec(i) handles elements [i, i + V) (aligned), scalar(i)
// one element. Vectors first (the bulk), then the scalar elements: at most 2V - 2, or all of them.
// Every element of [0, count) is handled exactly once over all threads.
template <size_t V, typename VecFn, typename ScalarFn>
PYCOMM_HD void peeledLoop(size_t tid, size_t nthreads, size_t count, Peel peel, VecFn&& vec, ScalarFn&& scalar) {
  for (size_t v = tid; v < peel.nvec; v += nthreads) vec(peel.head + v * V);
  const size_t body = peel.nvec * V;
  const size_t nscalar = count - body;
  for (size_t i = tid; i < nscalar; i += nthreads) scalar(i < peel.head ? i : i + body);
}

#if defined(__CUDACC__)
// The calling thread's share of a 1-D grid-stride loop.
__device__ __forceinline__ size_t gridThread() { return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ size_t gridThreads() { return static_cast<size_t>(gridDim.x) * blockDim.x; }
#endif

}  // namespace pycomm::cuda::detail
