// Ring schedules: reduce-scatter, all-gather, and all-reduce as the first followed by the second.
//
// The buffer is cut into one segment per rank and each segment into chunks of `chunkElems`. At step s
// a rank sends segment (rank-1-s) to its right neighbour and receives segment (rank-2-s) from its
// left, chunk by chunk: as soon as chunk c of a step is reduced it goes out as chunk c of the next
// step, so reduction, sending and receiving of successive chunks overlap. After p-1 steps each rank
// owns segment `rank` fully reduced; the all-gather then passes the owned segments around the ring,
// received straight into the caller's buffer.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../dtype.h"
#include "op.h"

namespace pycomm::algorithms {

struct RingBuffers {
  uint8_t* data;        // the buffer being reduced and gathered, segments laid out by `segments`
  uint8_t* scratch;     // at least ringScratchBytes(...) bytes
};

size_t ringChunkCount(const Segments& segments, size_t chunkElems);
size_t ringScratchBytes(const Segments& segments, size_t chunkElems, DataType dtype);

// Reduce-scatter and then (if `allgather`) all-gather over the ring. Slots [0, 2(p-1)C) are used.
void ringAllreduce(Op& op, const RingBuffers& buffers, const Segments& segments, DataType dtype,
                   ReduceOp reduceOp, size_t chunkElems, bool allgather);

// All-gather alone: segment `rank` of `data` must already hold this rank's contribution.
void ringAllgather(Op& op, uint8_t* data, const Segments& segments, size_t elementBytes,
                   size_t chunkElems);

}  // namespace pycomm::algorithms
