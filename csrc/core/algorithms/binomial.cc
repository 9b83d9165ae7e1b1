#include "binomial.h"

#include <cstring>

#include "../codecs/reduce.h"

namespace pycomm::algorithms {

void binomialBroadcast(Op& op, uint8_t* data, size_t nbytes, int root) {
  const int p = op.size();
  const int vrank = (op.rank() - root + p) % p;
  auto real = [&](int v) { return (v + root) % p; };
  int mask = 1;
  while (mask < p) {
    if (vrank & mask) {
      op.wait(op.recv(real(vrank - mask), 0, data, nbytes));
      op.send(real(vrank - mask), kAckSlot, nullptr, 0);
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (vrank + mask < p) {
      op.send(real(vrank + mask), 0, data, nbytes);
      op.recv(real(vrank + mask), kAckSlot, nullptr, 0);
    }
  }
  op.waitAll();
}

void binomialReduce(Op& op, uint8_t* data, uint8_t* work, uint8_t* tmp, size_t count, DataType dtype,
                    ReduceOp reduceOp, int root) {
  const int p = op.size();
  const size_t nbytes = count * elementSize(dtype);
  const int vrank = (op.rank() - root + p) % p;
  auto real = [&](int v) { return (v + root) % p; };
  if (vrank == 0) {
    for (int mask = 1; mask < p; mask <<= 1) op.send(real(mask), kAnnounceSlot, nullptr, 0);
  }
  uint8_t* acc = vrank == 0 ? data : work;
  if (acc != data && nbytes > 0) std::memcpy(acc, data, nbytes);
  for (int mask = 1; mask < p; mask <<= 1) {
    if (vrank & mask) {
      op.send(real(vrank - mask), 0, acc, nbytes);
      op.recv(real(vrank - mask), kAckSlot, nullptr, 0);
      break;
    }
    if (vrank + mask < p) {
      op.wait(op.recv(real(vrank + mask), 0, tmp, nbytes));
      op.send(real(vrank + mask), kAckSlot, nullptr, 0);
      codecs::reduceInto(acc, tmp, count, dtype, reduceOp);
    }
  }
  op.waitAll();
}

}  // namespace pycomm::algorithms
