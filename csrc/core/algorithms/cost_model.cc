#include "cost_model.h"

#include <cmath>
#include <limits>

namespace pycomm::algorithms {
namespace {

double log2Ceil(int p) { return std::ceil(std::log2(static_cast<double>(p))); }

int largestPowerOfTwo(int p) {
  int q = 1;
  while (q * 2 <= p) q *= 2;
  return q;
}

}  // namespace

size_t rhdHalvingThreshold(int p) { return largestPowerOfTwo(p) == 2 ? 512 * 1024 : 64 * 1024; }

double modelSteps(Algorithm algorithm, int p) {
  if (p <= 1) return 0;
  const int q = largestPowerOfTwo(p);
  const double fold = q == p ? 0 : 2;
  switch (algorithm) {
    case Algorithm::kRing: return 2.0 * (p - 1);
    case Algorithm::kTree: return 2.0 * log2Ceil(p);
    case Algorithm::kRhd: return 2.0 * std::log2(q) + fold;
    default: return 0;
  }
}

double modelBytes(Algorithm algorithm, double n, int p) {
  if (p <= 1) return 0;
  const int q = largestPowerOfTwo(p);
  const double fold = q == p ? 0 : 2 * n;
  switch (algorithm) {
    case Algorithm::kRing: return 2.0 * (p - 1) / p * n;
    case Algorithm::kTree: return 2.0 * n;  // each half goes up and down once per link
    case Algorithm::kRhd:
      if (!rhdHalvingFor(n, p)) return n * std::log2(q) + fold;
      return 2.0 * (q - 1) / q * n + fold;
    default: return 0;
  }
}

double predictSeconds(const CostModel& model, Algorithm algorithm, size_t nbytes, int p) {
  const AlgorithmCost& cost = model.bandFor(nbytes).of(algorithm);
  return cost.alpha * modelSteps(algorithm, p) + cost.beta * modelBytes(algorithm, static_cast<double>(nbytes), p);
}

Algorithm chooseAllreduce(const CostModel& model, size_t nbytes, int p) {
  // Two ranks below the halving threshold: rhd is one exchange of the whole vector, where the ring
  // and rhd's halving make two of half of it and the tree two of all of it. The same bytes or fewer
  // in half the round trips, whatever the constants a table fitted at another world size says.
  if (p == 2 && !rhdHalvingFor(static_cast<double>(nbytes), p)) return Algorithm::kRhd;
  Algorithm best = Algorithm::kRing;
  double bestTime = std::numeric_limits<double>::infinity();
  for (Algorithm a : {Algorithm::kRing, Algorithm::kTree, Algorithm::kRhd}) {
    const double t = predictSeconds(model, a, nbytes, p);
    if (t < bestTime) {
      bestTime = t;
      best = a;
    }
  }
  return best;
}

}  // namespace pycomm::algorithms
