// The pipelined chain broadcast's schedule (chain.h), written once against the step interface
// (steps.h). The chain runs root, root+1, ...: the root sends chunk after chunk to the next rank,
// which forwards each one as soon as it lands. Slot c carries chunk c.
//
// Each receiver ends by acknowledging its sender with an empty frame (op.h's kAckSlot), so that a
// sender whose peer ran another op fails too. The acknowledgements carry no bytes; a stream-ordered
// link skips them (its op stamps, queued_stamp.h, check the ops instead).
#pragma once

#include <algorithm>
#include <vector>

#include "op.h"
#include "steps.h"

namespace pycomm::algorithms {

template <class Steps>
void chainBroadcastSchedule(Steps& x, uint8_t* data, size_t nbytes, int root, size_t chunkBytes) {
  const int p = x.size();
  if (p == 1) return;
  const int position = (x.rank() - root + p) % p;  // 0 is the root
  const int next = (x.rank() + 1) % p;
  const int prev = (x.rank() - 1 + p) % p;
  const size_t chunks = std::max<size_t>(1, (nbytes + chunkBytes - 1) / chunkBytes);
  auto bounds = [&](size_t c) {
    const size_t begin = std::min(nbytes, c * chunkBytes);
    return std::make_pair(begin, std::min(nbytes, begin + chunkBytes) - begin);
  };
  x.phase("chain broadcast");
  if (position == 0) {
    for (size_t c = 0; c < chunks; ++c) {
      auto [offset, length] = bounds(c);
      x.send(next, static_cast<uint32_t>(c), data + offset, length);
      x.step();  // one chunk per step, which the next rank receives in its own
    }
    x.recv(next, kAckSlot, nullptr, 0);
    x.drain();
    return;
  }
  std::vector<typename Steps::Handle> recvs;
  recvs.reserve(chunks);
  for (size_t c = 0; c < chunks; ++c) {
    auto [offset, length] = bounds(c);
    recvs.push_back(x.recv(prev, static_cast<uint32_t>(c), data + offset, length));
  }
  for (size_t c = 0; c < chunks; ++c) {
    x.arrived(recvs[c]);
    if (position + 1 < p) {
      auto [offset, length] = bounds(c);
      x.send(next, static_cast<uint32_t>(c), data + offset, length);
    }
  }
  x.send(prev, kAckSlot, nullptr, 0);
  if (position + 1 < p) x.recv(next, kAckSlot, nullptr, 0);
  x.drain();
}

}  // namespace pycomm::algorithms
