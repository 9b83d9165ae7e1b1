// The direct all-to-all's schedule (direct.h), written once against the step interface (steps.h):
// one step in which every rank receives from and sends to every other rank, straight between the
// caller's buffers, and its own block copied meanwhile. Slot 0 for every transfer: a peer sends
// this rank one block.
#pragma once

#include <vector>

#include "op.h"
#include "steps.h"

namespace pycomm::algorithms {

// sendOffsets/sendBytes and recvOffsets/recvBytes are per peer, in bytes; `in` and `out` may
// overlap only in this rank's own block (the copy is a memmove on the CPU).
template <class Steps>
void directAlltoallSchedule(Steps& x, const uint8_t* in, const std::vector<size_t>& sendOffsets,
                            const std::vector<size_t>& sendBytes, uint8_t* out, const std::vector<size_t>& recvOffsets,
                            const std::vector<size_t>& recvBytes) {
  const int p = x.size();
  const int r = x.rank();
  x.phase("all-to-all");
  for (int i = 1; i < p; ++i) {
    const int peer = (r - i + p) % p;
    x.recv(peer, 0, out + recvOffsets[peer], recvBytes[peer]);
  }
  // Start with the next rank, so that not every rank sends to rank 0 first.
  for (int i = 1; i < p; ++i) {
    const int peer = (r + i) % p;
    x.send(peer, 0, in + sendOffsets[peer], sendBytes[peer]);
  }
  x.step();
  x.copy(out + recvOffsets[r], in + sendOffsets[r], recvBytes[r]);
  x.drain();
}

}  // namespace pycomm::algorithms
