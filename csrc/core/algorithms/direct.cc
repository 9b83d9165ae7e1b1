#include "direct.h"

#include <cstring>

#include "alltoall_schedule.h"
#include "op_steps.h"

namespace pycomm::algorithms {

void directGather(Op& op, const uint8_t* in, uint8_t* out, size_t nbytes, int root) {
  const int p = op.size();
  const int r = op.rank();
  if (r != root) {
    op.send(root, 0, in, nbytes);
    op.recv(root, kAckSlot, nullptr, 0);
  } else {
    std::vector<std::shared_ptr<Request>> recvs;
    for (int peer = 0; peer < p; ++peer) {
      if (peer != r) recvs.push_back(op.recv(peer, 0, out + peer * nbytes, nbytes));
    }
    if (nbytes > 0 && out + r * nbytes != in) std::memmove(out + r * nbytes, in, nbytes);
    for (auto& recv : recvs) {
      op.wait(recv);
      op.send(recv->peer(), kAckSlot, nullptr, 0);
    }
  }
  op.waitAll();
}

void directScatter(Op& op, const uint8_t* in, uint8_t* out, size_t nbytes, int root) {
  const int p = op.size();
  const int r = op.rank();
  if (r != root) {
    op.wait(op.recv(root, 0, out, nbytes));
    op.send(root, kAckSlot, nullptr, 0);
  } else {
    for (int i = 1; i < p; ++i) {
      const int peer = (r + i) % p;
      op.send(peer, 0, in + peer * nbytes, nbytes);
      op.recv(peer, kAckSlot, nullptr, 0);
    }
    if (nbytes > 0 && in + r * nbytes != out) std::memmove(out, in + r * nbytes, nbytes);
  }
  op.waitAll();
}

void directAlltoall(Op& op, const uint8_t* in, const std::vector<size_t>& sendOffsets,
                    const std::vector<size_t>& sendBytes, uint8_t* out,
                    const std::vector<size_t>& recvOffsets, const std::vector<size_t>& recvBytes) {
  OpSteps steps(op);
  directAlltoallSchedule(steps, in, sendOffsets, sendBytes, out, recvOffsets, recvBytes);
}

void disseminationBarrier(Op& op) {
  const int p = op.size();
  const int r = op.rank();
  uint32_t round = 0;
  for (int distance = 1; distance < p; distance *= 2, ++round) {
    auto recv = op.recv((r - distance + p) % p, round, nullptr, 0);
    op.send((r + distance) % p, round, nullptr, 0);
    op.wait(recv);
  }
  op.waitAll();
}

}  // namespace pycomm::algorithms
