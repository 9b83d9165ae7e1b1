// Ring reduce-scatter, all-gather, and all-reduce (the first followed by the second) on the CPU:
// the schedule of ring_schedule.h run by the CPU executor (op_steps.h), chunks pipelined.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../dtype.h"
#include "op.h"
#include "ring_schedule.h"

namespace pycomm::algorithms {

struct RingBuffers {
  uint8_t* data;        // the buffer being reduced and gathered, segments laid out by `segments`
  uint8_t* scratch;     // at least ringScratchBytes(...) bytes
};

size_t ringScratchBytes(const Segments& segments, size_t chunkElems, DataType dtype);

// Reduce-scatter and then (if `allgather`) all-gather over the ring. Slots [0, 2(p-1)C) are used.
void ringAllreduce(Op& op, const RingBuffers& buffers, const Segments& segments, DataType dtype,
                   ReduceOp reduceOp, size_t chunkElems, bool allgather);

// All-gather alone: segment `rank` of `data` must already hold this rank's contribution.
void ringAllgather(Op& op, uint8_t* data, const Segments& segments, size_t elementBytes,
                   size_t chunkElems);

}  // namespace pycomm::algorithms
