// Whether a group's CUDA collectives run over NCCL or are staged through host memory.
//
// Decided once per group and alike on every rank: at its first CUDA collective that has an NCCL
// form (all-reduce, compressed all-reduce, broadcast, all_gather_into_tensor,
// reduce_scatter_tensor, all_to_all_single), each rank states whether it can load NCCL, which GPU
// on which host it has, and the options the NCCL schedules depend on; the records are all-gathered
// over the group's CPU transports, in issue order with its other ops, and every rank decides from
// the same records: NCCL when every rank can use it and has a GPU of its own, staging otherwise.
// Torch-free: the adapter passes the group's communicator and store.
#pragma once

#include <exception>
#include <memory>
#include <mutex>

#include "core/communicator.h"
#include "core/store.h"

namespace pycomm::cuda {

class NcclComm;

class NcclRoute {
 public:
  // The group's NCCL communicator for collectives on CUDA device `device`, or null when they are
  // staged. The first call is collective (every rank makes it at the same point of its sequence)
  // and sets the communicator up through `store`; a failure there fails every later call the same
  // way, since deciding again on one rank alone would part it from the others. Throws
  // InvalidUsageError for ranks with different options and for tensors on another GPU than the
  // group's, Error otherwise (cuda_transport=nccl that cannot be honoured, NCCL's setup).
  std::shared_ptr<NcclComm> forDevice(Communicator& comm, Store& store, int device);
  // From any thread: the worker, if it waits for an NCCL op, aborts the NCCL communicator.
  void requestAbort();

 private:
  std::shared_ptr<NcclComm> decide(Communicator& comm, Store& store, int device);

  std::mutex mutex_;
  bool decided_ = false;
  std::exception_ptr error_;
  std::shared_ptr<NcclComm> nccl_;  // null: staged; set once (atomic_store), read by requestAbort
};

}  // namespace pycomm::cuda
