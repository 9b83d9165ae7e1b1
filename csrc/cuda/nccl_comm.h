// An NCCL communicator used for point-to-point transfers between device buffers only: pycomm's own
// schedules (csrc/core/algorithms/queued_collectives.h, through NcclLink) run on top of
// ncclSend/ncclRecv, as its CPU schedules run on top of the TCP and shared-memory transports.
//
// Everything is ordered on the stream the caller passes: transfers posted together form one NCCL
// group, so a rank's sends and receives of a step never wait on each other. Nothing here blocks the
// host after setup; the caller waits for an event with the group's timeout and calls abort() when
// it passes (which makes NCCL's kernels return).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/store.h"
#include "nccl_library.h"
#include "op_stamps.h"

namespace pycomm::cuda {

class NcclComm {
 public:
  // Collective over the group's `size` ranks, each on its own `device`. Rank 0 makes NCCL's id and
  // publishes it in `store` under `key`; every rank then checks in under `key`/<rank> and waits for
  // all the others (each wait bounded by `timeout`), so that NCCL's own blocking setup starts only
  // once every rank is there. Throws pycomm::Error (or TimeoutError) naming rank and key.
  NcclComm(const NcclLibrary& nccl, Store& store, const std::string& key, int rank, int size, int device,
           std::chrono::milliseconds timeout);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }

  struct Transfer {
    enum class Kind { kSend, kRecv };
    Kind kind;
    int peer;
    void* data;  // device memory of device()
    size_t bytes;
  };
  // Posts `transfers` as one NCCL group on `stream`. Transfers of 0 bytes are skipped.
  void post(const std::vector<Transfer>& transfers, cudaStream_t stream, const std::string& what);

  // Waits on the host until what is queued on `stream` so far has run, watching NCCL's asynchronous
  // error and requestAbort(). On an error or a request, and after `timeout` (pycomm::TimeoutError),
  // it aborts the communicator (NCCL's kernels then return) and throws naming `what`.
  void waitFor(cudaStream_t stream, std::chrono::milliseconds timeout, const std::string& what);
  // Aborts every operation in flight; the communicator is unusable afterwards. Idempotent, and
  // does not throw (it is what a timeout calls). On the thread that uses the communicator.
  void abort();
  // From any thread: the thread in waitFor() aborts the communicator and fails its op.
  void requestAbort() { abortRequested_.store(true); }
  bool aborted() const { return aborted_.load(); }

  // The op stamps every queued op on this communicator starts with (op_stamps.h).
  OpStamps& stamps() { return *stamps_; }

 private:
  std::string prefix() const;

  const NcclLibrary& nccl_;
  const int rank_;
  const int size_;
  const int device_;
  NcclCommHandle comm_ = nullptr;
  std::unique_ptr<OpStamps> stamps_;  // made on the communicator's device
  std::atomic<bool> aborted_{false};
  std::atomic<bool> abortRequested_{false};
};

}  // namespace pycomm::cuda
