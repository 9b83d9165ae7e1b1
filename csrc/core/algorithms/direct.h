// Collectives where every rank talks to the root or to every other rank directly: gather, scatter,
// all-to-all, and the dissemination barrier. All receives are posted before any send, straight into
// the caller's buffers.
#pragma once

#include <vector>

#include "op.h"

namespace pycomm::algorithms {

// Root receives `nbytes` from every rank into out + rank * nbytes; `out` is used at the root only.
void directGather(Op& op, const uint8_t* in, uint8_t* out, size_t nbytes, int root);
// Root sends in + rank * nbytes to every rank; `in` is used at the root only.
void directScatter(Op& op, const uint8_t* in, uint8_t* out, size_t nbytes, int root);
// sendOffsets/sendBytes and recvOffsets/recvBytes are per peer, in bytes.
void directAlltoall(Op& op, const uint8_t* in, const std::vector<size_t>& sendOffsets,
                    const std::vector<size_t>& sendBytes, uint8_t* out,
                    const std::vector<size_t>& recvOffsets, const std::vector<size_t>& recvBytes);
// ceil(log2 p) rounds of empty messages: in round k, rank r signals r + 2^k and waits for r - 2^k.
void disseminationBarrier(Op& op);

}  // namespace pycomm::algorithms
