#include "rhd.h"

#include <algorithm>
#include <cstring>

#include "../codecs/reduce.h"

namespace pycomm::algorithms {

RhdRanks::RhdRanks(int rank, int size) : q(1) {
  while (q * 2 <= size) q *= 2;
  extra = size - q;
  vrank = !folds(rank) ? rank - extra : rank % 2 == 1 ? rank / 2 : -1;
}

RhdHalves rhdHalve(int lo, int hi, bool upper) {
  const int mid = lo + (hi - lo) / 2;
  return upper ? RhdHalves{mid, hi, lo, mid} : RhdHalves{lo, mid, mid, hi};
}

RhdWindow rhdPartnerWindow(int lo, int hi, bool upper) {
  const int width = hi - lo;
  return upper ? RhdWindow{lo - width, lo} : RhdWindow{hi, hi + width};
}

size_t rhdScratchBytes(size_t count, DataType dtype) { return std::max<size_t>(count, 1) * elementSize(dtype); }

void rhdAllreduce(Op& op, uint8_t* data, uint8_t* scratch, size_t count, DataType dtype,
                  ReduceOp reduceOp, bool halving) {
  const int p = op.size();
  if (p == 1) return;
  const int r = op.rank();
  const size_t esize = elementSize(dtype);
  const RhdRanks ranks(r, p);
  const int q = ranks.q, vrank = ranks.vrank;
  uint32_t slot = 0;

  // Fold-in: of each pair that folds (RhdRanks), the even rank hands its vector to the odd one.
  if (ranks.folds(r)) {
    if (vrank < 0) {
      op.send(r + 1, slot, data, count * esize);
    } else {
      op.wait(op.recv(r - 1, slot, scratch, count * esize));
      codecs::reduceInto(data, scratch, count, dtype, reduceOp);
    }
  }
  ++slot;

  if (vrank >= 0 && !halving) {
    for (int mask = 1; mask < q; mask <<= 1, ++slot) {
      const int partner = ranks.realRank(vrank ^ mask);
      auto recv = op.recv(partner, slot, scratch, count * esize);
      auto send = op.send(partner, slot, data, count * esize);
      op.wait(recv);
      op.wait(send);  // the send reads `data`, which the reduction below may overwrite
      // Reduce in a fixed order (lower virtual rank first) so both partners get identical bits.
      if ((vrank & mask) == 0) {
        codecs::reduceInto(data, scratch, count, dtype, reduceOp);
      } else {
        codecs::reduceInto(scratch, data, count, dtype, reduceOp);
        if (count > 0) std::memcpy(data, scratch, count * esize);
      }
    }
  } else if (vrank >= 0) {
    Segments segments(count, q);
    int lo = 0, hi = q;  // window of segments this rank is responsible for
    // Recursive halving: keep the half of the window that holds our own segment.
    for (int mask = q / 2; mask >= 1; mask >>= 1, ++slot) {
      const int partner = ranks.realRank(vrank ^ mask);
      const RhdHalves h = rhdHalve(lo, hi, (vrank & mask) != 0);
      const size_t keepOff = segments.offset(h.keepLo), keepLen = segments.offset(h.keepHi) - keepOff;
      const size_t sendOff = segments.offset(h.sendLo), sendLen = segments.offset(h.sendHi) - sendOff;
      auto recv = op.recv(partner, slot, scratch, keepLen * esize);
      op.send(partner, slot, data + sendOff * esize, sendLen * esize);
      op.wait(recv);
      codecs::reduceInto(data + keepOff * esize, scratch, keepLen, dtype, reduceOp);
      op.waitAll();
      lo = h.keepLo;
      hi = h.keepHi;
    }
    // Recursive doubling: swap windows with the partner until every rank holds everything.
    for (int mask = 1; mask < q; mask <<= 1, ++slot) {
      const int partner = ranks.realRank(vrank ^ mask);
      const auto [otherLo, otherHi] = rhdPartnerWindow(lo, hi, (vrank & mask) != 0);
      const size_t myOff = segments.offset(lo), myLen = segments.offset(hi) - myOff;
      const size_t otherOff = segments.offset(otherLo), otherLen = segments.offset(otherHi) - otherOff;
      auto recv = op.recv(partner, slot, data + otherOff * esize, otherLen * esize);
      op.send(partner, slot, data + myOff * esize, myLen * esize);
      op.wait(recv);
      op.waitAll();
      lo = std::min(lo, otherLo);
      hi = std::max(hi, otherHi);
    }
  }
  // Fold-out: hand the result back to the ranks that sat out. Slot after every step of both modes.
  const uint32_t outSlot = static_cast<uint32_t>(1 + 2 * 32);
  if (ranks.folds(r)) {
    if (vrank < 0) {
      op.wait(op.recv(r + 1, outSlot, data, count * esize));
    } else {
      op.send(r - 1, outSlot, data, count * esize);
    }
  }
  op.waitAll();
}

}  // namespace pycomm::algorithms
