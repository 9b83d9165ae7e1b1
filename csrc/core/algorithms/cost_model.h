// The alpha-beta model behind algorithm="auto": time = alpha * steps(p) + beta * bytes(n, p), with
// alpha (seconds per step) and beta (seconds per byte a rank moves) fitted per algorithm and per
// band of message sizes from measurements on the machine (python -m pycomm.bench --tune). steps and
// bytes follow each algorithm's schedule, so constants measured at one world size predict the others.
#pragma once

#include <array>
#include <cstddef>

#include "../config.h"

namespace pycomm::algorithms {

// steps(p) and bytes per rank for an n-byte all-reduce.
double modelSteps(Algorithm algorithm, int p);
double modelBytes(Algorithm algorithm, double n, int p);

// Whole-vector recursive doubling below this size, Rabenseifner's halving-doubling above it.
constexpr size_t kRhdHalvingThreshold = 64 * 1024;

double predictSeconds(const CostModel& model, Algorithm algorithm, size_t nbytes, int p);
Algorithm chooseAllreduce(const CostModel& model, size_t nbytes, int p);

}  // namespace pycomm::algorithms
