// Reduction of device buffers: dst[i] = dst[i] op src[i], the CUDA counterpart of
// pycomm::codecs::reduceInto (csrc/core/codecs/reduce.h) with the same semantics and the same bits:
//
//   * every (dtype, op) pair the CPU supports: float32, float64, float16, bfloat16, int8, uint8,
//     int16, int32, int64 with SUM, PRODUCT, MIN, MAX; the integers also with BAND, BOR, BXOR; bool
//     with all seven (SUM/MAX/BOR = or, PRODUCT/MIN/BAND = and, BXOR = xor; results 0 or 1);
//   * fp16/bf16 are widened to fp32 per pair, combined with one fp32 operation, rounded once (RNE);
//   * integers wrap (narrow ones are computed in int32 and truncated, as the CPU does);
//   * MIN/MAX propagate NaN; NaN results carry the bits x86 gives (see element_ops.cuh).
//
// Asynchronous on `stream` (no synchronization, no allocation; capturable in a CUDA graph). dst and
// src are device pointers aligned to the element size that do not overlap (as on the CPU). Any
// alignment works: 16-byte vector accesses are used where dst and src share their offset modulo 16,
// scalar ones otherwise. Throws pycomm::InvalidUsageError for a pair the CPU rejects (a bitwise op
// on a floating type) and pycomm::Error if the launch fails. count == 0 launches nothing.
//
// Plain C++ header: includable from host code compiled by any C++17 compiler with the CUDA runtime
// headers on its include path.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "core/dtype.h"

namespace pycomm::cuda {

void reduceInto(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op, cudaStream_t stream);

}  // namespace pycomm::cuda
