#include "rhd.h"

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

}  // namespace pycomm::algorithms
