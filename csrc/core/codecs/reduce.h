// Reduction kernels over raw buffers: dst[i] = dst[i] op src[i].
//
// Type-erased at this boundary (dtype and op are values, not template parameters) so that algorithms
// are written once; inside, one loop is instantiated per (dtype, op) pair and vectorized by the
// compiler. fp16 and bf16 are widened to fp32 for the arithmetic and rounded once per element.
#pragma once

#include <cstddef>

#include "../dtype.h"

namespace pycomm::codecs {

void reduceInto(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op);

// dst[i] = srcs[0][i] op srcs[1][i] op ... in source order. fp16/bf16 are accumulated in fp32 across
// all sources and rounded once; dst may not alias any source.
void reduceMany(void* dst, const void* const* srcs, size_t nsrcs, size_t count, DataType dtype, ReduceOp op);

// buf[i] *= factor, in the element type (fp16/bf16 through fp32, integers truncate toward zero as
// torch's integer division does for AVG). Used for AVG (after) and PREMUL_SUM (before).
void scaleBuffer(void* buf, size_t count, DataType dtype, double factor);

}  // namespace pycomm::codecs
