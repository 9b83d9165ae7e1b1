#include "allreduce_plan.h"

#include <algorithm>

namespace pycomm::algorithms {

AllreducePlan planAllreduce(Algorithm requested, const CostModel* model, size_t nbytes, int size, DataType dtype,
                            size_t chunkBytes) {
  Algorithm algorithm = requested;
  if (algorithm == Algorithm::kAuto) {
    algorithm = model != nullptr ? chooseAllreduce(*model, nbytes, size) : Algorithm::kRing;
  }
  return {algorithm, std::max<size_t>(1, chunkBytes / elementSize(dtype))};
}

}  // namespace pycomm::algorithms
