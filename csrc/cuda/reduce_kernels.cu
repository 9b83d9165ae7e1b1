#include "reduce_kernels.cuh"

#include <cstdint>

#include "core/error.h"
#include "element_ops.cuh"
#include "launch.cuh"
#include "reducer_dispatch.cuh"

namespace pycomm::cuda {
namespace {

using detail::kThreads;
using detail::Peel;

// dst[i] = R::apply(dst[i], src[i]): 16 bytes per access in the aligned body, grid-stride.
template <typename R>
__global__ void __launch_bounds__(kThreads)
    reduceKernel(typename R::T* __restrict__ dst, const typename R::T* __restrict__ src, size_t count, Peel peel) {
  using T = typename R::T;
  constexpr size_t V = 16 / sizeof(T);
  union Pack {
    uint4 u;
    T v[V];
  };
  detail::peeledLoop<V>(
      detail::gridThread(), detail::gridThreads(), count, peel,
      [&](size_t i) {
        Pack a;
        Pack b;
        a.u = *reinterpret_cast<const uint4*>(dst + i);
        b.u = *reinterpret_cast<const uint4*>(src + i);
#pragma unroll
        for (size_t k = 0; k < V; ++k) a.v[k] = R::apply(a.v[k], b.v[k]);
        *reinterpret_cast<uint4*>(dst + i) = a.u;
      },
      [&](size_t i) { dst[i] = R::apply(dst[i], src[i]); });
}

}  // namespace

void reduceInto(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op, cudaStream_t stream) {
  if (count == 0) return;
  withReducer(dtype, op, [&](auto reducer) {
    using R = decltype(reducer);
    using T = typename R::T;
    constexpr size_t V = 16 / sizeof(T);
    const Peel peel = detail::peelFor(count, V, {{dst, sizeof(T)}, {src, sizeof(T)}});
    const size_t scalars = count - peel.nvec * V;
    auto* kernel = reduceKernel<R>;
    kernel<<<detail::gridFor(kernel, peel.nvec > scalars ? peel.nvec : scalars), kThreads, 0, stream>>>(
        static_cast<T*>(dst), static_cast<const T*>(src), count, peel);
  });
  detail::checkLaunch("reduceInto");
}

}  // namespace pycomm::cuda
