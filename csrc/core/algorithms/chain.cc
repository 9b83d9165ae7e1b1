#include "chain.h"

#include "chain_schedule.h"
#include "op_steps.h"

namespace pycomm::algorithms {

void chainBroadcast(Op& op, uint8_t* data, size_t nbytes, int root, size_t chunkBytes) {
  OpSteps steps(op);
  chainBroadcastSchedule(steps, data, nbytes, root, chunkBytes);
}

}  // namespace pycomm::algorithms
