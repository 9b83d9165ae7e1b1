#include "work.h"

#include "flight_recorder.h"

#include <ATen/record_function.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>

#include <algorithm>

namespace pycomm::torch_adapter {

namespace {

std::vector<c10::Device> devicesOf(const std::vector<std::shared_ptr<DeviceStaging>>& stagings) {
  std::vector<c10::Device> devices;
  for (const auto& s : stagings) {
    if (std::find(devices.begin(), devices.end(), s->device()) == devices.end()) devices.push_back(s->device());
  }
  return devices;
}

}  // namespace

std::optional<std::vector<at::Tensor>> profiledInputs(const std::function<std::vector<at::Tensor>()>& tensors) {
  if (!at::hasCallbacks()) return std::nullopt;
  return tensors();
}

PycommWork::PycommWork(int rank, ::c10d::OpType opType, const char* profilingTitle,
                       c10::IValue outputs, c10::TypePtr futureType,
                       std::vector<std::shared_ptr<DeviceStaging>> stagings,
                       const std::optional<std::vector<at::Tensor>>& profiled)
    // The title makes c10d's Work start a profiler event: only when a profiler may record one
    // (profiledInputs() is set then), as a RecordFunction per op costs even when none is active.
    : Work(rank, opType, profiled ? profilingTitle : nullptr, profiled),
      outputs_(std::move(outputs)),
      stagings_(std::move(stagings)),
      futureType_(std::move(futureType)),
      future_(stagings_.empty() ? nullptr
                                : c10::make_intrusive<c10::ivalue::Future>(futureType_, devicesOf(stagings_))) {}

c10::intrusive_ptr<c10::ivalue::Future> PycommWork::getFuture() {
  std::lock_guard<std::mutex> lock(futureMutex_);
  if (!future_) {
    future_ = c10::make_intrusive<c10::ivalue::Future>(futureType_);
    // No callback can be attached yet, so completing it under the lock runs none.
    if (outcomeKnown_ && outcome_) {
      future_->setError(outcome_);
    } else if (outcomeKnown_) {
      future_->markCompleted(outputs_);
    }
  }
  return future_;
}

void PycommWork::synchronize() {
  Work::synchronize();
  orderCurrentStreamAfterCopies();
}

void PycommWork::blockCurrentStream() {
  if (stagings_.empty()) {
    Work::blockCurrentStream();
    return;
  }
  // c10d's version releases the stream when the future completes, which is not ordered after the
  // copies back on the communication stream.
  orderCurrentStreamAfterCopies();
}

void PycommWork::orderCurrentStreamAfterCopies() {
  if (stagings_.empty()) return;
  // The event the stream waits for is recorded just before the op completes: a caller that did not
  // wait first (c10d allows synchronize() without it) waits here, on the host, for that. Not on
  // Work's own mutex: c10d's wait() holds it while it calls synchronize().
  {
    std::unique_lock<std::mutex> lock(copiesMutex_);
    copiesCv_.wait(lock, [&] { return copiesQueued_; });
  }
  for (const auto& s : stagings_) s->blockCurrentStream();
}

bool PycommWork::succeeded() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ && !exception_;
}

void PycommWork::waitHost() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return completed_; });
  if (exception_) std::rethrow_exception(exception_);
}

PycommWork::FinishOnExit::~FinishOnExit() { work_.finish(error_); }

std::vector<at::Tensor> PycommWork::result() {
  if (outputs_.isTensorList()) return outputs_.toTensorVector();
  return {};
}

void PycommWork::complete(std::exception_ptr error) {
  // A send or receive can fail by timeout on the waiting thread and then be failed again by the
  // transport; only the first outcome counts.
  if (completedOnce_.exchange(true)) return;
  // A failed op stays started in the recorder: what the analyzer reads as not completed.
  if (!error) FlightRecorder::instance().completed(traceId_);
  if (!stagings_.empty()) {
    {
      std::lock_guard<std::mutex> lock(copiesMutex_);
      copiesQueued_ = true;
    }
    copiesCv_.notify_all();
  }
  // The future first, then the Work (gloo's order): a caller that wait() wakes may read the
  // future's value at once. The future's callbacks run here; the Work finishes however they end.
  const FinishOnExit finishOnExit(*this, error);
  c10::intrusive_ptr<c10::ivalue::Future> future;
  {
    std::lock_guard<std::mutex> lock(futureMutex_);
    outcomeKnown_ = true;
    outcome_ = error;
    future = future_;
  }
  if (!future) {
    // Not asked for yet: getFuture() makes it completed.
  } else if (error) {
    future->setError(error);
  } else if (!stagings_.empty()) {
    // A device-aware future records its events on the current streams: the ones the copies back
    // run on.
    std::vector<c10::Stream> streams;
    for (const auto& s : stagings_) {
      if (std::find(streams.begin(), streams.end(), s->stream()) == streams.end()) streams.push_back(s->stream());
    }
    try {
      // The future keeps the current device for its callbacks: the op's, not this thread's.
      const c10::DeviceGuard device(stagings_.front()->device());
      const c10::MultiStreamGuard guard(streams);
      future->markCompleted(outputs_);
    } catch (const std::exception&) {
      // A device error while recording the future's events: the future fails instead of never
      // completing (called from the worker and from transport threads, which must not throw).
      if (!future->completed()) future->setError(std::current_exception());
    }
  } else {
    future->markCompleted(outputs_);
  }
}

PointToPointWork::PointToPointWork(std::shared_ptr<Communicator> comm,
                                   std::shared_ptr<transport::Request> request, ::c10d::OpType opType,
                                   at::Tensor tensor, std::string what, std::shared_ptr<DeviceStaging> staging,
                                   std::function<void()> onReceived)
    : PycommWork(comm->rank(), opType,
                 opType == ::c10d::OpType::SEND ? "pycomm:send" : "pycomm:recv",
                 c10::IValue(std::vector<at::Tensor>{tensor}),
                 c10::ListType::create(c10::TensorType::get()),
                 staging ? std::vector<std::shared_ptr<DeviceStaging>>{staging}
                         : std::vector<std::shared_ptr<DeviceStaging>>{},
                 profiledInputs([&tensor] { return std::vector<at::Tensor>{tensor}; })),
      comm_(std::move(comm)),
      request_(std::move(request)),
      what_(std::move(what)),
      onReceived_(std::move(onReceived)) {}

void PointToPointWork::finishFromRequest() {
  if (finishing_.exchange(true)) return;
  std::exception_ptr error = request_->error();
  if (!error && onReceived_) {
    try {
      onReceived_();
    } catch (const std::exception&) {
      error = std::current_exception();
    }
  }
  complete(error);
}

void PointToPointWork::awaitRequest(std::chrono::milliseconds timeout) {
  try {
    // c10d's kNoTimeout (0) means the group's; any other is this wait's own.
    comm_->waitPointToPoint(request_, what_, timeout == std::chrono::milliseconds(0) ? comm_->timeout() : timeout);
  } catch (const std::exception&) {
    complete(std::current_exception());
    throw;
  }
}

bool PointToPointWork::wait(std::chrono::milliseconds timeout) {
  awaited_.store(true);
  awaitRequest(timeout);
  finishFromRequest();  // here, rather than waiting for the completion thread to get to it
  return PycommWork::wait(timeout);
}

void PointToPointWork::waitHost() { waitHostFor(std::chrono::milliseconds(0)); }

void PointToPointWork::waitHostFor(std::chrono::milliseconds timeout) {
  awaited_.store(true);
  awaitRequest(timeout);
  finishFromRequest();
  PycommWork::waitHost();
}

int PointToPointWork::sourceRank() const { return request_->peer(); }

CoalescedWork::CoalescedWork(int rank, std::vector<c10::intrusive_ptr<PycommWork>> members,
                             std::chrono::milliseconds groupTimeout)
    : PycommWork(rank, ::c10d::OpType::COALESCED, "pycomm:coalesced", c10::IValue(std::vector<at::Tensor>{}),
                 c10::ListType::create(c10::TensorType::get()),
                 [&] {
                   // Its wait() orders the caller's stream after every staged op of the block.
                   std::vector<std::shared_ptr<DeviceStaging>> stagings;
                   for (const auto& w : members) {
                     stagings.insert(stagings.end(), w->stagings().begin(), w->stagings().end());
                   }
                   return stagings;
                 }(),
                 profiledInputs([] { return std::vector<at::Tensor>{}; })),
      members_(std::move(members)),
      groupTimeout_(groupTimeout) {}

void CoalescedWork::waitPointToPoint(std::chrono::milliseconds timeout) {
  // One deadline for the whole block, not one per op: a block of n receives nobody sends to ends
  // after one timeout, not n. Past a failure the rest still wait (out of time, they are detached):
  // a receive left posted would take a later send meant for the next receive.
  if (timeout == std::chrono::milliseconds(0)) timeout = groupTimeout_;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::exception_ptr firstFailure;
  for (const auto& member : members_) {
    auto* pointToPoint = dynamic_cast<PointToPointWork*>(member.get());
    if (pointToPoint == nullptr) continue;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    try {
      pointToPoint->waitHostFor(std::max(left, std::chrono::milliseconds(1)));
    } catch (const std::exception&) {
      if (!firstFailure) firstFailure = std::current_exception();
    }
  }
  if (firstFailure) std::rethrow_exception(firstFailure);
}

bool CoalescedWork::wait(std::chrono::milliseconds timeout) {
  waitPointToPoint(timeout);
  return PycommWork::wait(timeout);
}

void CoalescedWork::waitHost() {
  waitPointToPoint(std::chrono::milliseconds(0));
  PycommWork::waitHost();
}

}  // namespace pycomm::torch_adapter
