// Shrinking a group and reporting its faults (torch's dist.shrink_group and getError): the
// survivors agree on the ranks to exclude and form the new group over the old group's store
// (core/shrink.h); the old group lives on until torch destroys it.
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "backend.h"
#include "core/shrink.h"
#include "store_adapter.h"

#if PYCOMM_WITH_CUDA
#include "cuda/nccl_route.h"
#endif

namespace pycomm::torch_adapter {
namespace {

// torch.distributed.SHRINK_ABORT: fail what is still in flight on the old group first.
constexpr int kShrinkAbort = 0x01;

}  // namespace

c10::intrusive_ptr<::c10d::Backend> PycommBackend::shrink(const std::vector<int64_t>& ranksToExclude,
                                                          int shrinkFlags,
                                                          const c10::intrusive_ptr<Options>& optsOverride) {
  const std::string context = strCat("[rank ", rank_, "/", size_, "]");
  PYCOMM_CHECK((shrinkFlags & ~kShrinkAbort) == 0, InvalidUsageError, context, " shrink: unknown flags ",
               shrinkFlags, " (SHRINK_DEFAULT is 0, SHRINK_ABORT 1)");
  PYCOMM_CHECK(!comm_->shutDown(), InvalidUsageError, context,
               " shrink: this group was shut down (destroyed); shrink the group before destroying it");
  const ShrinkPlan plan = planShrink(rank_, size_, ranksToExclude, context);
  Config next = shrunkConfig(comm_->config(), plan);
  if (optsOverride) next.timeout = clampTimeout(optsOverride->timeout);
  // Keys of their own for each shrink of this group, under the group's store: a second shrink
  // (after a failed one, or of a group made by a shrink) never reads an earlier one's keys.
  const std::string key = strCat("pycomm/shrink/", shrinks_++);
  auto store = c10::make_intrusive<::c10d::PrefixStore>(key, store_);
  C10dStore adapter(store);
  // The survivors see the failure at times up to a timeout and a probe apart: room for that.
  agreeOnShrink(adapter, "", plan, rank_, next.timeout + std::chrono::seconds(10), context);
  next.lineage = lineageFor(key, next.rank, next.size, plan.survivors);
  // After the agreement: aborting closes this rank's connections, which a survivor that had not
  // read its lost ranks yet would count as this rank lost.
  if ((shrinkFlags & kShrinkAbort) != 0) {
#if PYCOMM_WITH_CUDA
    ncclRoute_->requestAbort();
#endif
    comm_->abort("shrink_group(SHRINK_ABORT) ended what was in flight");
  }
  auto shrunk = c10::make_intrusive<PycommBackend>(store, next);
  shrunk->shrinkDepth_ = shrinkDepth_ + 1;
  shrunk->setTraceGroup(next.groupName, "pycomm:shrunk", globalRanksOf(plan.survivors));
  return shrunk;
}

::c10d::ErrorType PycommBackend::getError() {
  switch (comm_->lastFault()) {
    case OpLedger::Fault::kNone:
      return ::c10d::ErrorType::SUCCESS;
    case OpLedger::Fault::kTimeout:
      return ::c10d::ErrorType::TIMEOUT;
    case OpLedger::Fault::kConnection:
      return ::c10d::ErrorType::COMM_ERROR;
    case OpLedger::Fault::kRemote:
      return ::c10d::ErrorType::REMOTE_ERROR;
  }
  return ::c10d::ErrorType::COMM_ERROR;
}

}  // namespace pycomm::torch_adapter
