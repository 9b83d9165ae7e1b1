// Shrinking a group that lost ranks: the survivors form a new, smaller group without them, over the
// store the group was made with (no second rendezvous service), renumbered in the old order.
//
// Every survivor must exclude the same ranks. Each one publishes its excluded set under the
// shrink's keys and reads the sets of the ranks it keeps: a survivor that disagrees is seen by
// every rank it keeps (their sets differ from its own), so all of them fail naming both sets
// instead of waiting for a rank that will never come. A rank excluded here that still calls
// shrink sees this rank exclude it and fails the same way.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "config.h"
#include "store.h"

namespace pycomm {

struct ShrinkPlan {
  std::vector<int> excluded;   // old ranks, sorted, no duplicates
  std::vector<int> survivors;  // old ranks, in order: a survivor's new rank is its index here
  int newRank = -1;
};

// Checks `excluded` for the group (`rank` of `size`): each rank in range and listed once, not this
// rank, not every rank. Throws InvalidUsageError naming the set and the group otherwise.
ShrinkPlan planShrink(int rank, int size, const std::vector<int64_t>& excluded, const std::string& context);

// Waits until every survivor published the same excluded set under `keyPrefix` (InvalidUsageError
// naming both sets as soon as one differs; TimeoutError naming the survivors that did not come).
void agreeOnShrink(Store& store, const std::string& keyPrefix, const ShrinkPlan& plan, int rank,
                   std::chrono::milliseconds timeout, const std::string& context);

// The new group's configuration: the old one's, with the new rank, size and name.
Config shrunkConfig(const Config& config, const ShrinkPlan& plan);

// "[1, 3]"
std::string describeRanks(const std::vector<int>& ranks);

}  // namespace pycomm
