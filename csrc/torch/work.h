// The c10d::Work pycomm returns for every op, with a future holding the op's outputs.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "core/communicator.h"
#include "device_staging.h"

namespace pycomm::torch_adapter {

// `tensors` when a profiler may be recording (torch's Work records their shapes), else nothing:
// with no profiler an op pays no copy of its tensor handles. `tensors` is called only then.
std::optional<std::vector<at::Tensor>> profiledInputs(const std::function<std::vector<at::Tensor>()>& tensors);

class PycommWork : public ::c10d::Work {
 public:
  // `outputs` is what the future yields: a list of tensors, or a list of lists for allgather.
  // `stagings`: device tensors of the op (or of a coalesced block's ops) went through host memory;
  // the future is then device-aware and wait() orders the caller's current stream after the copies
  // back. `profiled`: the inputs whose shapes an active profiler records (profiledInputs()).
  PycommWork(int rank, ::c10d::OpType opType, const char* profilingTitle, c10::IValue outputs,
             c10::TypePtr futureType, std::vector<std::shared_ptr<DeviceStaging>> stagings = {},
             const std::optional<std::vector<at::Tensor>>& profiled = std::nullopt);

  // Made on first use, completed if the op is: a synchronous op's caller waits on the Work and
  // never asks, and a future it never reads costs an allocation, a lock and a wake-up per op.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::vector<at::Tensor> result() override;
  // c10d's wait() calls this once the op completed: the caller's current stream then waits for the
  // copies back of a staged op.
  void synchronize() override;
  void blockCurrentStream() override;
  // Completed, and without an error.
  bool succeeded() const;
  // Waits on the host only, with no stream ordered after the op: for pycomm's own worker.
  virtual void waitHost();
  const std::vector<std::shared_ptr<DeviceStaging>>& stagings() const { return stagings_; }

  // Marks the op done (error == nullptr) or failed, waking waiters and completing the future.
  void complete(std::exception_ptr error);
  // The op's flight-recorder entry, marked completed when the op succeeds.
  void setTraceId(std::optional<uint64_t> id) { traceId_ = id; }
  const std::optional<uint64_t>& traceId() const { return traceId_; }

 private:
  // Staged ops: waits (host) until the copies back are queued, then orders the current stream
  // after them.
  void orderCurrentStreamAfterCopies();

  // Finishes the Work (wakes wait()) when it goes out of scope.
  class FinishOnExit {
   public:
    FinishOnExit(PycommWork& work, std::exception_ptr error) : work_(work), error_(std::move(error)) {}
    ~FinishOnExit();
    FinishOnExit(const FinishOnExit&) = delete;
    FinishOnExit& operator=(const FinishOnExit&) = delete;

   private:
    PycommWork& work_;
    const std::exception_ptr error_;
  };

  c10::IValue outputs_;
  const std::vector<std::shared_ptr<DeviceStaging>> stagings_;
  // Staged ops: set once the copies back are queued (their `done` events recorded).
  std::mutex copiesMutex_;
  std::condition_variable copiesCv_;
  bool copiesQueued_ = false;
  std::atomic<bool> completedOnce_{false};
  std::optional<uint64_t> traceId_;
  const c10::TypePtr futureType_;
  // The future, once made (at once for a staged op: it is device-aware), and the outcome it takes
  // when made after complete().
  std::mutex futureMutex_;
  bool outcomeKnown_ = false;
  std::exception_ptr outcome_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// A send or receive: completes when its transport request does (and, for a staged receive, once
// the copy back is queued); waiting honours the group timeout.
//
// The request's outcome becomes the Work's once (finishFromRequest): on the thread that waits for
// the Work, or else on the group's completion thread (Communicator::onComplete), never on the
// transport's event loop, since completing runs the future's callbacks.
class PointToPointWork final : public PycommWork {
 public:
  // `onReceived` runs before a successful receive completes (copies back into the caller's tensor).
  PointToPointWork(std::shared_ptr<Communicator> comm, std::shared_ptr<transport::Request> request,
                   ::c10d::OpType opType, at::Tensor tensor, std::string what,
                   std::shared_ptr<DeviceStaging> staging = nullptr, std::function<void()> onReceived = nullptr);
  // Completes the Work with the request's outcome, once the request is done; later calls do nothing.
  void finishFromRequest();
  // Whether a thread is in wait() or waitHost(), which completes the Work itself once the request
  // is done (so the completion thread need not be woken for it).
  bool awaited() const { return awaited_.load(); }
  bool wait(std::chrono::milliseconds timeout) override;
  void waitHost() override;
  // waitHost() by `timeout` (c10d's kNoTimeout, 0: the group's).
  void waitHostFor(std::chrono::milliseconds timeout);
  int sourceRank() const override;

 private:
  // Waits for the request up to `timeout` (c10d's kNoTimeout, 0: the group's); a failure (or the
  // timeout, which detaches the request) completes the Work with it.
  void awaitRequest(std::chrono::milliseconds timeout);

  std::shared_ptr<Communicator> comm_;
  std::shared_ptr<transport::Request> request_;
  std::string what_;
  std::function<void()> onReceived_;
  std::atomic<bool> finishing_{false};
  std::atomic<bool> awaited_{false};  // set for good by the first wait: it always finishes the Work
};

// A coalesced block's Work (batch_isend_irecv, _coalescing_manager), which torch returns in place of
// its ops' Works: done once every op of the block is (PycommBackend::endCoalescing completes it).
// Its waits first wait for each send and receive of the block as that op's own Work would, so a
// receive nobody sends to ends by the group's timeout (or the wait's own) and is detached, as a lone
// irecv's is; c10d's wait alone would wait for it for good. Collectives end by the group's timeout.
class CoalescedWork final : public PycommWork {
 public:
  // `groupTimeout`: what a wait with c10d's kNoTimeout (0) waits for the block's sends and receives.
  CoalescedWork(int rank, std::vector<c10::intrusive_ptr<PycommWork>> members,
                std::chrono::milliseconds groupTimeout);
  bool wait(std::chrono::milliseconds timeout) override;
  void waitHost() override;

 private:
  // Waits for the block's sends and receives, by one deadline `timeout` from now (0: groupTimeout).
  void waitPointToPoint(std::chrono::milliseconds timeout);

  const std::vector<c10::intrusive_ptr<PycommWork>> members_;
  const std::chrono::milliseconds groupTimeout_;
};

}  // namespace pycomm::torch_adapter
