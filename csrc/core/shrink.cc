#include "shrink.h"

#include <algorithm>
#include <thread>

#include "error.h"

namespace pycomm {
namespace {

// How often a survivor looks for the others' sets while it waits.
constexpr auto kPollInterval = std::chrono::milliseconds(2);

std::vector<uint8_t> bytesOf(const std::string& text) { return std::vector<uint8_t>(text.begin(), text.end()); }

}  // namespace

std::string describeRanks(const std::vector<int>& ranks) {
  std::string out = "[";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out + "]";
}

ShrinkPlan planShrink(int rank, int size, const std::vector<int64_t>& excluded, const std::string& context) {
  ShrinkPlan plan;
  std::vector<bool> out(static_cast<size_t>(size), false);
  for (int64_t r : excluded) {
    PYCOMM_CHECK(r >= 0 && r < size, InvalidUsageError, context, " shrink: rank ", r,
                 " is not in the group of ", size, " (ranks to exclude: ", excluded.size(), " given)");
    PYCOMM_CHECK(!out[static_cast<size_t>(r)], InvalidUsageError, context, " shrink: rank ", r,
                 " is listed twice in the ranks to exclude");
    out[static_cast<size_t>(r)] = true;
  }
  for (int r = 0; r < size; ++r) (out[static_cast<size_t>(r)] ? plan.excluded : plan.survivors).push_back(r);
  PYCOMM_CHECK(!plan.excluded.empty(), InvalidUsageError, context, " shrink: no rank to exclude");
  PYCOMM_CHECK(!plan.survivors.empty(), InvalidUsageError, context, " shrink: excluding ",
               describeRanks(plan.excluded), " leaves no rank of the group of ", size);
  PYCOMM_CHECK(!out[static_cast<size_t>(rank)], InvalidUsageError, context, " shrink: this rank (", rank,
               ") is among the ranks to exclude ", describeRanks(plan.excluded),
               "; only the ranks that stay call shrink");
  plan.newRank = static_cast<int>(std::find(plan.survivors.begin(), plan.survivors.end(), rank) - plan.survivors.begin());
  return plan;
}

void agreeOnShrink(Store& store, const std::string& keyPrefix, const ShrinkPlan& plan, int rank,
                   std::chrono::milliseconds timeout, const std::string& context) {
  const std::string mine = describeRanks(plan.excluded);
  auto keyOf = [&](int r) { return keyPrefix + "excluded/" + std::to_string(r); };
  store.set(keyOf(rank), bytesOf(mine));
  std::vector<int> missing;
  for (int r : plan.survivors) {
    if (r != rank) missing.push_back(r);
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!missing.empty()) {
    for (auto it = missing.begin(); it != missing.end();) {
      if (!store.check(keyOf(*it))) {
        ++it;
        continue;
      }
      const std::vector<uint8_t> raw = store.get(keyOf(*it), timeout);
      const std::string theirs(raw.begin(), raw.end());
      PYCOMM_CHECK(theirs == mine, InvalidUsageError, context, " shrink: the ranks that stay disagree on the ranks "
                   "to exclude: this rank (", rank, ") excludes ", mine, " but rank ", *it, " excludes ", theirs);
      it = missing.erase(it);
    }
    if (missing.empty()) break;
    PYCOMM_CHECK(std::chrono::steady_clock::now() < deadline, TimeoutError, context, " shrink: ranks ",
                 describeRanks(missing), " did not join the shrink excluding ", mine, " within ", timeout.count(),
                 " ms (lost too, or not calling shrink)");
    std::this_thread::sleep_for(kPollInterval);
  }
}

Config shrunkConfig(const Config& config, const ShrinkPlan& plan) {
  Config next = config;
  next.rank = plan.newRank;
  next.size = static_cast<int>(plan.survivors.size());
  next.groupName = (config.groupName.empty() ? std::string("default") : config.groupName) + ":shrunk";
  return next;
}

}  // namespace pycomm
