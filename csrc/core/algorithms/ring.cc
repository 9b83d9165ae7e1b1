#include "ring.h"

#include "op_steps.h"

namespace pycomm::algorithms {

size_t ringScratchBytes(const Segments& segments, size_t chunkElems, DataType dtype) {
  return ringScratchFor<OpSteps>(segments, chunkElems, dtype);
}

void ringAllreduce(Op& op, const RingBuffers& buffers, const Segments& segments, DataType dtype,
                   ReduceOp reduceOp, size_t chunkElems, bool allgather) {
  OpSteps steps(op);
  ringAllreduceSchedule(steps, buffers.data, buffers.scratch, segments, dtype, reduceOp, chunkElems, allgather);
}

void ringAllgather(Op& op, uint8_t* data, const Segments& segments, size_t esize, size_t chunkElems) {
  OpSteps steps(op);
  ringAllgatherSchedule(steps, data, segments, esize, chunkElems);
}

}  // namespace pycomm::algorithms
