// The c10d::Work pycomm returns for every op, with a future holding the op's outputs.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <functional>
#include <memory>

#include "core/communicator.h"

namespace pycomm::torch_adapter {

class PycommWork : public ::c10d::Work {
 public:
  // `outputs` is what the future yields: a list of tensors, or a list of lists for allgather.
  PycommWork(int rank, ::c10d::OpType opType, const char* profilingTitle, c10::IValue outputs,
             c10::TypePtr futureType);

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override;

  // Marks the op done (error == nullptr) or failed, waking waiters and completing the future.
  void complete(std::exception_ptr error);

 private:
  c10::IValue outputs_;
  std::atomic<bool> completedOnce_{false};
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// A send or receive: completes when its transport request does; waiting honours the group timeout.
class PointToPointWork final : public PycommWork {
 public:
  PointToPointWork(std::shared_ptr<Communicator> comm, std::shared_ptr<transport::Request> request,
                   ::c10d::OpType opType, at::Tensor tensor, std::string what);
  bool wait(std::chrono::milliseconds timeout) override;
  int sourceRank() const override;

 private:
  std::shared_ptr<Communicator> comm_;
  std::shared_ptr<transport::Request> request_;
  std::string what_;
};

}  // namespace pycomm::torch_adapter
