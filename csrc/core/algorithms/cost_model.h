// The alpha-beta model behind algorithm="auto": time = alpha * steps(p) + beta * bytes(n, p), with
// alpha (seconds per step) and beta (seconds per byte a rank moves) fitted per algorithm and per
// band of message sizes from measurements on the machine (python -m pycomm.bench --tune). steps and
// bytes follow each algorithm's schedule, so constants measured at one world size predict the others.
#pragma once

#include <cstddef>

#include "../config.h"

namespace pycomm::algorithms {

// steps(p) and bytes per rank for an n-byte all-reduce. rhd's steps are 2 log2 q in both of its
// modes, though its whole-vector doubling takes log2 q: at a power of two the factor is alpha's,
// and a table refitted with log2 q extrapolated worse to world 3 (it picked the ring at 4 KiB, 94
// us against rhd's 52 over TCP).
double modelSteps(Algorithm algorithm, int p);
double modelBytes(Algorithm algorithm, double n, int p);

// rhd runs whole-vector recursive doubling (log2 q exchanges of the whole vector, q the largest
// power of two <= p) below this many bytes and Rabenseifner's halving-doubling (2 log2 q exchanges
// of shrinking parts) from it. With q = 2 both move the whole vector once each way, and doubling
// does it in one exchange instead of two: it is the faster until the vector is too large to
// receive in one piece (loopback TCP at world 2, doubling against the ring, which halving matches
// there: 128 KiB 46 against 53 us, 256 KiB 74-77 against 81-85, 512 KiB 140-171 against 147-149,
// 1 MiB 421 against 212, halving 215). With q >= 4 doubling moves log2 q times the vector against
// under twice it, so it stops at 64 KiB.
size_t rhdHalvingThreshold(int p);
inline bool rhdHalvingFor(double nbytes, int p) { return nbytes >= static_cast<double>(rhdHalvingThreshold(p)); }

double predictSeconds(const CostModel& model, Algorithm algorithm, size_t nbytes, int p);
Algorithm chooseAllreduce(const CostModel& model, size_t nbytes, int p);

}  // namespace pycomm::algorithms
