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

namespace pycomm::algorithms {

// Who takes part in rhd among `size` ranks, used by its schedule (rhd_schedule.h), which the CPU
// and the queued executor (queued_collectives.h) both run, so that both pair, split and reduce alike.
struct RhdRanks {
  RhdRanks(int rank, int size);
  int q;      // the largest power of two not above size
  int extra;  // size - q: ranks 0 .. 2*extra-1 fold in pairs, the even one into the odd one
  int vrank;  // this rank among the q participants; -1 for one that hands its vector over and sits out
  bool folds(int rank) const { return rank < 2 * extra; }
  int realRank(int v) const { return v < extra ? 2 * v + 1 : v + extra; }
};

// One step of recursive halving over the window [lo, hi) of segments: the half a rank keeps (the
// one holding its own segment, the upper half when its virtual rank has the step's bit) and the half
// it sends.
struct RhdHalves {
  int keepLo, keepHi, sendLo, sendHi;
};
RhdHalves rhdHalve(int lo, int hi, bool upper);
// One step of recursive doubling: the partner's window, as wide as [lo, hi) and next to it.
struct RhdWindow {
  int lo, hi;
};
RhdWindow rhdPartnerWindow(int lo, int hi, bool upper);

}  // namespace pycomm::algorithms
