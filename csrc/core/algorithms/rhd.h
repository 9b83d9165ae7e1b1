// Recursive halving-doubling all-reduce (Rabenseifner), and recursive doubling for short messages.
//
// With p' the largest power of two not above p, the first 2(p - p') ranks pair up and the even one
// of each pair folds its vector into the odd one, which stands in for both (the standard fold-in for
// world sizes that are not powers of two); at the end it hands the result back. Among the p' ranks:
//  - long messages: log2 p' steps of recursive halving (exchange half of the current window with the
//    partner at distance p'/2, p'/4, ..., reduce the half kept) leave each rank one reduced segment;
//    log2 p' steps of recursive doubling gather them back. 2(p'-1)/p' n bytes per rank.
//  - short messages: log2 p' steps of exchanging the whole vector with the partner and reducing.
//    Fewest hops of all; n log2 p' bytes per rank.
#pragma once

#include "../dtype.h"
#include "op.h"

namespace pycomm::algorithms {

size_t rhdScratchBytes(size_t count, DataType dtype);

// `halving` selects Rabenseifner (long messages) over whole-vector recursive doubling (short).
void rhdAllreduce(Op& op, uint8_t* data, uint8_t* scratch, size_t count, DataType dtype,
                  ReduceOp reduceOp, bool halving);

}  // namespace pycomm::algorithms
