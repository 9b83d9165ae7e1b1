#include "allreduce_plan.h"

#include <algorithm>

#include "tree.h"

namespace pycomm::algorithms {

AllreducePlan planAllreduce(Algorithm requested, const CostModel* model, size_t nbytes, int size, DataType dtype,
                            size_t chunkBytes) {
  Algorithm algorithm = requested;
  if (algorithm == Algorithm::kAuto) {
    algorithm = model != nullptr ? chooseAllreduce(*model, nbytes, size) : Algorithm::kRing;
  }
  return {algorithm, std::max<size_t>(1, chunkBytes / elementSize(dtype))};
}

size_t TreeOn<OpSteps>::scratchBytes(size_t count, size_t chunkElems, DataType dtype) {
  return treeScratchBytes(count, chunkElems, dtype);
}

void TreeOn<OpSteps>::run(OpSteps& x, uint8_t* data, uint8_t* scratch, size_t count, DataType dtype, ReduceOp op,
                          size_t chunkElems) {
  treeAllreduce(x.op(), data, scratch, count, dtype, op, chunkElems);
}

}  // namespace pycomm::algorithms
