#include "chain.h"

#include <algorithm>
#include <vector>

namespace pycomm::algorithms {

void chainBroadcast(Op& op, uint8_t* data, size_t nbytes, int root, size_t chunkBytes) {
  const int p = op.size();
  if (p == 1) return;
  const int position = (op.rank() - root + p) % p;  // 0 is the root
  const int next = (op.rank() + 1) % p;
  const int prev = (op.rank() - 1 + p) % p;
  const size_t chunks = std::max<size_t>(1, (nbytes + chunkBytes - 1) / chunkBytes);
  auto bounds = [&](size_t c) {
    const size_t begin = std::min(nbytes, c * chunkBytes);
    return std::make_pair(begin, std::min(nbytes, begin + chunkBytes) - begin);
  };
  if (position == 0) {
    for (size_t c = 0; c < chunks; ++c) {
      auto [offset, length] = bounds(c);
      op.send(next, static_cast<uint32_t>(c), data + offset, length);
    }
    op.recv(next, kAckSlot, nullptr, 0);
    op.waitAll();
    return;
  }
  std::vector<std::shared_ptr<Request>> recvs;
  recvs.reserve(chunks);
  for (size_t c = 0; c < chunks; ++c) {
    auto [offset, length] = bounds(c);
    recvs.push_back(op.recv(prev, static_cast<uint32_t>(c), data + offset, length));
  }
  for (size_t c = 0; c < chunks; ++c) {
    op.wait(recvs[c]);
    if (position + 1 < p) {
      auto [offset, length] = bounds(c);
      op.send(next, static_cast<uint32_t>(c), data + offset, length);
    }
  }
  op.send(prev, kAckSlot, nullptr, 0);
  if (position + 1 < p) op.recv(next, kAckSlot, nullptr, 0);
  op.waitAll();
}

}  // namespace pycomm::algorithms
