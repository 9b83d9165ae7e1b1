// Launch helpers shared by the kernels of this folder: grid sizing, launch checks and a warp max.
// Internal to csrc/cuda (needs nvcc for the device part).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "peel.cuh"

namespace pycomm::cuda::detail {

constexpr int kThreads = 256;  // threads per CTA of every kernel here
constexpr int kWarpsPerCta = kThreads / 32;

// CTAs of `kernel` (launched with kThreads threads, no dynamic shared memory) resident on the
// current device at once: SMs x the kernel's occupancy, cached per (device, kernel). Throws
// pycomm::Error if the runtime fails.
int residentCtas(const void* kernel);

// Grid of a grid-stride launch of `kernel` over `items` work items, itemsPerCta per CTA and step:
// enough CTAs to cover them, at most one full wave (residentCtas), so every CTA gets the same share.
unsigned gridFor(const void* kernel, size_t items, int itemsPerCta);

template <typename Kernel>
unsigned gridFor(Kernel* kernel, size_t items, int itemsPerCta = kThreads) {
  return gridFor(reinterpret_cast<const void*>(kernel), items, itemsPerCta);
}

// Throws pycomm::Error naming `what` if the launch just made failed (cudaGetLastError).
void checkLaunch(const char* what);

#if defined(__CUDACC__)

// Max over the 32 lanes of a warp (all lanes must call it).
__device__ __forceinline__ uint32_t warpMax(uint32_t v) {
#if __CUDA_ARCH__ >= 800
  return __reduce_max_sync(0xffffffffu, v);
#else
  for (int offset = 16; offset > 0; offset >>= 1) {
    const uint32_t other = __shfl_xor_sync(0xffffffffu, v, offset);
    v = other > v ? other : v;
  }
  return v;
#endif
}

#endif  // __CUDACC__

}  // namespace pycomm::cuda::detail
