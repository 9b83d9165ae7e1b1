// The op stamps of csrc/core/algorithms/queued_stamp.h on a GPU: before each queued op, this rank's
// stamp goes to the next rank and the previous rank's comes back to pinned host memory, all queued
// on the op's stream ahead of its schedule; the host compares the two once the op has run, or once
// it failed or timed out (a mismatch is then the reason, and the error says so).
//
// One per NCCL communicator, used by the thread that runs its ops one at a time: an op's buffers
// are reused by the next op only after its stream ran (waitFor returned) or the communicator was
// aborted, after which nothing is posted.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "core/algorithms/queued_link.h"
#include "core/algorithms/queued_stamp.h"

namespace pycomm::cuda {

class OpStamps {
 public:
  // Allocates on `device`.
  explicit OpStamps(int device);
  ~OpStamps();
  OpStamps(const OpStamps&) = delete;
  OpStamps& operator=(const OpStamps&) = delete;

  // Numbers `stamp` (1, 2, ... op after op) and queues, on `stream`: its copy to the device, the
  // exchange group on `link` (whose stream it must be), and the copy back of what arrived. The
  // caller's device must be this one's.
  void post(algorithms::QueuedLink& link, algorithms::QueuedStamp stamp, cudaStream_t stream, const std::string& what);

  // After the op: queued::checkStamps with what arrived. `ran`: the stream ran to its end.
  void check(int rank, int size, bool ran, const std::string& what) const;

  // Leaves the memory allocated at destruction: freeing it synchronizes the device, which may never
  // finish after an abort. A few bytes, once per failed communicator.
  void abandon();

 private:
  struct DeviceFree {
    void operator()(void* p) const { cudaFree(p); }
  };
  struct HostFree {
    void operator()(void* p) const { cudaFreeHost(p); }
  };
  struct EventDestroy {
    void operator()(CUevent_st* e) const { cudaEventDestroy(e); }
  };

  const int device_;
  std::unique_ptr<void, DeviceFree> onDevice_;  // [mine, previous]
  std::unique_ptr<void, HostFree> onHost_;      // [mine, previous], pinned
  std::unique_ptr<CUevent_st, EventDestroy> arrived_;
  algorithms::QueuedStamp mine_;
  uint64_t seq_ = 0;
};

}  // namespace pycomm::cuda
