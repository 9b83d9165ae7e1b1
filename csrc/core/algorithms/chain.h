// Pipelined chain broadcast: the root sends chunks to the next rank, which forwards each chunk as
// soon as it lands. Every link carries the message once, so large broadcasts run at link speed.
#pragma once

#include "op.h"

namespace pycomm::algorithms {

void chainBroadcast(Op& op, uint8_t* data, size_t nbytes, int root, size_t chunkBytes);

}  // namespace pycomm::algorithms
