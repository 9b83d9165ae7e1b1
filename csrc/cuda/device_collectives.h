// pycomm's schedules on device buffers, over NCCL point-to-point (NcclComm) and the reduction
// kernels of reduce_kernels.cuh: the GPU counterparts of the CPU ring and chain
// (csrc/core/algorithms/ring.cc, chain.cc). NCCL moves bytes; what is added to what, in which order,
// is pycomm's.
//
// Same segments and the same order of reduction as the CPU ring: rank r's segment k is reduced as
// dst = dst op incoming, step by step round the ring. With the kernels bit-identical to the CPU
// reduction, a device all-reduce gives the bits the CPU ring gives on the same inputs.
//
// Everything is queued on `stream` (nothing waits on the host): the caller orders the stream after
// its producers and waits for an event recorded after the call, with the group's timeout.
// Scratch is the caller's (torch's caching allocator, in the adapter), so nothing here allocates.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "core/dtype.h"
#include "nccl_comm.h"

namespace pycomm::cuda {

// Device scratch bytes ringAllreduce needs for `count` elements of `dtype` over `size` ranks.
size_t ringAllreduceScratchBytes(size_t count, int size, DataType dtype);

// In place: every rank's `data` ends as the reduction of all ranks' `data` (count elements).
void ringAllreduce(NcclComm& comm, void* data, void* scratch, size_t count, DataType dtype, ReduceOp op,
                   cudaStream_t stream);

// Root's `bytes` to every rank, down the chain root, root+1, ... in chunks of `chunkBytes`, so a
// rank forwards chunk c while it receives chunk c+1 (NCCL runs a group's transfers concurrently).
void chainBroadcast(NcclComm& comm, void* data, size_t bytes, int root, size_t chunkBytes, cudaStream_t stream);

}  // namespace pycomm::cuda
