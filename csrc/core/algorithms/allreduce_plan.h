// The one place that decides how an uncompressed all-reduce runs over a transport of point-to-point
// transfers, and the one dispatch that runs the decision on either executor (steps.h).
//
//   requested algorithm --(auto: cost_model.h's alpha-beta model)--> ring | tree | rhd
//   rhd's mode: whole-vector recursive doubling below rhdHalvingThreshold(p) bytes, halving from it
//   chunk: the group's chunk bytes in elements (the pipelining grain of the CPU ring and the tree)
//
// The communicator plans with its measured cost model; the device path (NCCL, csrc/torch) plans
// with none, where auto means the ring, until GPU costs are measured. Whether shared memory or the
// two-level (hierarchical) route is taken comes before this, from what the group has set up
// (communicator.cc); the cross-host step of the hierarchical route runs this plan too.
#pragma once

#include <cstddef>

#include "../config.h"
#include "../dtype.h"
#include "cost_model.h"
#include "op_steps.h"
#include "queued_steps.h"
#include "rhd_schedule.h"
#include "ring_schedule.h"
#include "tree_schedule.h"

namespace pycomm::algorithms {

struct AllreducePlan {
  Algorithm algorithm;  // kRing, kTree or kRhd, never kAuto
  size_t chunkElems;    // at least 1
};

// `model`: the costs auto chooses by, or nullptr where none were measured (auto is then the ring).
// `nbytes` and `size`: the whole op's, which the choice is made for.
AllreducePlan planAllreduce(Algorithm requested, const CostModel* model, size_t nbytes, int size, DataType dtype,
                            size_t chunkBytes);

// rhd's mode for an all-reduce of `count` elements over `size` ranks: the same rule on every
// executor, so a queued rhd gives the CPU rhd's bits.
inline bool rhdHalvingFor(size_t count, DataType dtype, int size) {
  return rhdHalvingFor(static_cast<double>(count) * elementSize(dtype), size);
}

// Scratch bytes runAllreduce needs for `count` elements over `size` ranks.
template <class Steps>
size_t allreduceScratchBytes(const AllreducePlan& plan, size_t count, int size, DataType dtype) {
  switch (plan.algorithm) {
    case Algorithm::kTree: return treeScratchFor<Steps>(count, plan.chunkElems, dtype);
    case Algorithm::kRhd: return rhdScratchFor(count, dtype);
    // Segments(count, size)'s longest, without building it (no allocation on the small-message path).
    default: return ringScratchFor<Steps>(size > 0 ? (count + size - 1) / size : count, plan.chunkElems, dtype);
  }
}

// The planned all-reduce of `count` elements in place in `data`.
template <class Steps>
void runAllreduce(Steps& x, const AllreducePlan& plan, uint8_t* data, uint8_t* scratch, size_t count, DataType dtype,
                  ReduceOp op) {
  if (x.size() == 1) return;
  switch (plan.algorithm) {
    case Algorithm::kTree:
      treeAllreduceSchedule(x, data, scratch, count, dtype, op, plan.chunkElems);
      break;
    case Algorithm::kRhd:
      rhdAllreduceSchedule(x, data, scratch, count, dtype, op, rhdHalvingFor(count, dtype, x.size()));
      break;
    default:
      ringAllreduceSchedule(x, data, scratch, Segments(count, x.size()), dtype, op, plan.chunkElems, true);
  }
}

}  // namespace pycomm::algorithms
