#include "work.h"

namespace pycomm::torch_adapter {

PycommWork::PycommWork(int rank, ::c10d::OpType opType, const char* profilingTitle,
                       c10::IValue outputs, c10::TypePtr futureType)
    : Work(rank, opType, profilingTitle),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(std::move(futureType))) {}

std::vector<at::Tensor> PycommWork::result() {
  if (outputs_.isTensorList()) return outputs_.toTensorVector();
  return {};
}

void PycommWork::complete(std::exception_ptr error) {
  // A send or receive can fail by timeout on the waiting thread and then be failed again by the
  // transport; only the first outcome counts.
  if (completedOnce_.exchange(true)) return;
  finish(error);
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(outputs_);
  }
}

PointToPointWork::PointToPointWork(std::shared_ptr<Communicator> comm,
                                   std::shared_ptr<transport::Request> request, ::c10d::OpType opType,
                                   at::Tensor tensor, std::string what)
    : PycommWork(comm->rank(), opType,
                 opType == ::c10d::OpType::SEND ? "pycomm:send" : "pycomm:recv",
                 c10::IValue(std::vector<at::Tensor>{std::move(tensor)}),
                 c10::ListType::create(c10::TensorType::get())),
      comm_(std::move(comm)),
      request_(std::move(request)),
      what_(std::move(what)) {}

bool PointToPointWork::wait(std::chrono::milliseconds timeout) {
  try {
    comm_->waitPointToPoint(request_, what_);
  } catch (const std::exception&) {
    complete(std::current_exception());
    throw;
  }
  return Work::wait(timeout);
}

int PointToPointWork::sourceRank() const { return request_->peer(); }

}  // namespace pycomm::torch_adapter
