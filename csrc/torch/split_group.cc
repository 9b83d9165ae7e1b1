// Backend::split: the subgroup torch's split path asks for (ProcessGroup.split_group; dist.split_group
// and DeviceMesh on a group bound to a device). The child takes this group's settings (transport,
// algorithm, chunking, host id, limits) instead of the creator's options, and its global ranks and
// name for the flight recorder; it forms over the store torch gives it like any group.
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>

#include "backend.h"
#include "core/error.h"
#include "core/shrink.h"

namespace pycomm::torch_adapter {

c10::intrusive_ptr<::c10d::Backend> PycommBackend::split(const c10::intrusive_ptr<::c10d::Store>& store,
                                                         const std::vector<int>& ranks,
                                                         const c10::intrusive_ptr<Options>& opts) {
  const std::string context = strCat("[rank ", rank_, "/", size_, "] split");
  PYCOMM_CHECK(!ranks.empty(), InvalidUsageError, context, ": the split group has no ranks");
  PYCOMM_CHECK(!comm_->shutDown(), InvalidUsageError, context, ": this group was shut down");
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    PYCOMM_CHECK(sorted[i] >= 0 && sorted[i] < size_, InvalidUsageError, context, ": rank ", sorted[i],
                 " is not in this group of ", size_, " ranks");
    PYCOMM_CHECK(i == 0 || sorted[i] != sorted[i - 1], InvalidUsageError, context, ": rank ", sorted[i],
                 " is named twice");
  }
  const auto me = std::find(sorted.begin(), sorted.end(), rank_);
  PYCOMM_CHECK(me != sorted.end(), InvalidUsageError, context, ": this rank is not in the split group (ranks ",
               describeRanks(sorted), ")");
  Config next = comm_->config();
  next.rank = static_cast<int>(me - sorted.begin());
  next.size = static_cast<int>(sorted.size());
  const std::string parentName = comm_->config().groupName.empty() ? "default" : comm_->config().groupName;
  next.groupName = opts && !opts->group_name.empty() ? opts->group_name : parentName + ":split";
  if (opts && opts->timeout.count() > 0) next.timeout = clampTimeout(opts->timeout);
  // Keys of its own for each child: torch hands every child of one split the same store, so two
  // children formed at once (split by parity) read each other's addresses without a prefix. Every
  // rank of the parent splits the same number of times (split_group is collective over it).
  const std::string key = strCat("pycomm/split/", splits_++, "/", next.groupName);
  auto keys = c10::make_intrusive<::c10d::PrefixStore>(key, store);
  next.lineage = lineageFor(key, next.rank, next.size, sorted);
  auto child = c10::make_intrusive<PycommBackend>(keys, next);
  child->setTraceGroup(next.groupName, opts && !opts->group_desc.empty() ? opts->group_desc : "pycomm",
                       globalRanksOf(sorted));
  return child;
}

Lineage PycommBackend::lineageFor(const std::string& key, int rank, int size, const std::vector<int>& members) const {
  PYCOMM_CHECK(size >= 1 && members.size() == static_cast<size_t>(size) && rank >= 0 && rank < size &&
                   members[static_cast<size_t>(rank)] == rank_,
               InvalidUsageError, "[rank ", rank_, "/", size_, "] a group formed from this one must name its ", size,
               " ranks in this group, this rank as its rank ", rank, "; got ", describeRanks(members));
  for (int member : members) {
    PYCOMM_CHECK(member >= 0 && member < size_, InvalidUsageError, "[rank ", rank_, "/", size_, "] rank ", member,
                 " of a group formed from this one is not in this group");
  }
  return comm_->lineageFor(key);
}

c10::intrusive_ptr<::c10d::Backend::Options> PycommBackend::getBackendOptions() {
  auto options = c10::make_intrusive<Options>(getBackendName(), comm_->timeout());
  options->group_name = comm_->config().groupName;
  if (traceGroup_) {
    for (int64_t r : traceGroup_->ranks) options->global_ranks_in_group.push_back(static_cast<uint64_t>(r));
  }
  return options;
}

}  // namespace pycomm::torch_adapter
