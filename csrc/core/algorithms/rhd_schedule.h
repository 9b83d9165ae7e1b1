// The rhd all-reduce's schedule (rhd.h), written once against the step interface (steps.h): the
// CPU runs it through allreduce_plan.h's runAllreduce, a stream-ordered link through queued_collectives.h.
//
// Slots: 0 for the fold-in, 1 + step for the exchanges, 1 + 2*32 for the fold-out (after every
// step of both modes). Each exchange is one step with the partner, and the reductions run in one
// fixed order (the lower virtual rank's vector first), so both partners, and both executors, get
// the same bits.
#pragma once

#include <algorithm>

#include "../dtype.h"
#include "op.h"
#include "rhd.h"
#include "steps.h"

namespace pycomm::algorithms {

// Scratch for rhdAllreduceSchedule: one vector, with room to align it like its target.
inline size_t rhdScratchFor(size_t count, DataType dtype) {
  return std::max<size_t>(count, 1) * elementSize(dtype) + 16;
}

template <class Steps>
void rhdAllreduceSchedule(Steps& x, uint8_t* data, uint8_t* scratch, size_t count, DataType dtype,
                          ReduceOp reduceOp, bool halving) {
  const int p = x.size();
  if (p == 1) return;
  const int r = x.rank();
  const size_t esize = elementSize(dtype);
  const RhdRanks ranks(r, p);
  const int q = ranks.q, vrank = ranks.vrank;
  const ReceiveAreas areas{scratch, 1, 0};
  uint8_t* incoming = areas.at(0, 0, data);
  uint32_t slot = 0;

  // Fold-in: of each pair that folds (RhdRanks), the even rank hands its vector to the odd one.
  x.phase("rhd fold-in");
  if (ranks.folds(r)) {
    if (vrank < 0) {
      x.send(r + 1, slot, data, count * esize);
      x.step();
    } else {
      x.arrived(x.recv(r - 1, slot, incoming, count * esize));
      x.reduce(data, incoming, count, dtype, reduceOp);
    }
  }
  ++slot;

  if (vrank >= 0 && !halving) {
    x.phase("rhd exchange");
    for (int mask = 1; mask < q; mask <<= 1, ++slot) {
      const int partner = ranks.realRank(vrank ^ mask);
      auto recv = x.recv(partner, slot, incoming, count * esize);
      auto send = x.send(partner, slot, data, count * esize);
      x.arrived(recv);
      x.left(send);  // the send reads `data`, which the reduction below may overwrite
      if ((vrank & mask) == 0) {
        x.reduce(data, incoming, count, dtype, reduceOp);
      } else {
        x.reduce(incoming, data, count, dtype, reduceOp);
        x.copy(data, incoming, count * esize);
      }
    }
  } else if (vrank >= 0) {
    const Segments segments(count, q);
    int lo = 0, hi = q;  // window of segments this rank is responsible for
    // Recursive halving: keep the half of the window that holds our own segment.
    x.phase("rhd halving");
    for (int mask = q / 2; mask >= 1; mask >>= 1, ++slot) {
      const int partner = ranks.realRank(vrank ^ mask);
      const RhdHalves h = rhdHalve(lo, hi, (vrank & mask) != 0);
      const size_t keepOff = segments.offset(h.keepLo), keepLen = segments.offset(h.keepHi) - keepOff;
      const size_t sendOff = segments.offset(h.sendLo), sendLen = segments.offset(h.sendHi) - sendOff;
      uint8_t* kept = data + keepOff * esize;
      uint8_t* got = areas.at(0, 0, kept);
      auto recv = x.recv(partner, slot, got, keepLen * esize);
      x.send(partner, slot, data + sendOff * esize, sendLen * esize);
      x.arrived(recv);
      x.reduce(kept, got, keepLen, dtype, reduceOp);
      x.drain();
      lo = h.keepLo;
      hi = h.keepHi;
    }
    // Recursive doubling: swap windows with the partner until every rank holds everything.
    x.phase("rhd doubling");
    for (int mask = 1; mask < q; mask <<= 1, ++slot) {
      const int partner = ranks.realRank(vrank ^ mask);
      const auto [otherLo, otherHi] = rhdPartnerWindow(lo, hi, (vrank & mask) != 0);
      const size_t myOff = segments.offset(lo), myLen = segments.offset(hi) - myOff;
      const size_t otherOff = segments.offset(otherLo), otherLen = segments.offset(otherHi) - otherOff;
      auto recv = x.recv(partner, slot, data + otherOff * esize, otherLen * esize);
      x.send(partner, slot, data + myOff * esize, myLen * esize);
      x.arrived(recv);
      x.drain();
      lo = std::min(lo, otherLo);
      hi = std::max(hi, otherHi);
    }
  }
  // Fold-out: hand the result back to the ranks that sat out.
  x.phase("rhd fold-out");
  const uint32_t outSlot = static_cast<uint32_t>(1 + 2 * 32);
  if (ranks.folds(r)) {
    if (vrank < 0) {
      x.arrived(x.recv(r + 1, outSlot, data, count * esize));
    } else {
      x.send(r - 1, outSlot, data, count * esize);
    }
  }
  x.drain();
}

}  // namespace pycomm::algorithms
