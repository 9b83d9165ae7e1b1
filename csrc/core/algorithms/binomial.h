// Binomial-tree broadcast and reduce: ceil(log2 p) hops, for short messages where the chain's
// p-1 hops (broadcast) or the ring's 2(p-1) steps (reduce) cost more than the bytes.
#pragma once

#include "../dtype.h"
#include "op.h"

namespace pycomm::algorithms {

void binomialBroadcast(Op& op, uint8_t* data, size_t nbytes, int root);

// The reduction lands in `data` at the root; elsewhere `work` (count elements) is used as the
// running sum so `data` stays unchanged. `tmp` holds count elements.
void binomialReduce(Op& op, uint8_t* data, uint8_t* work, uint8_t* tmp, size_t count, DataType dtype,
                    ReduceOp reduceOp, int root);

}  // namespace pycomm::algorithms
