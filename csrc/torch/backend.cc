#include "backend.h"

#include "bucketed_allreduce.h"
#include "store_adapter.h"

#if PYCOMM_WITH_CUDA
#include "cuda/nccl_route.h"
#endif

namespace pycomm::torch_adapter {

PycommBackend::PycommBackend(const c10::intrusive_ptr<::c10d::Store>& store, const Config& config)
    : Backend(config.rank, config.size) {
  C10dStore adapter(store);
  comm_ = std::make_shared<Communicator>(config, adapter);
  buckets_ = std::make_shared<BucketedAllreduce>(comm_->config().bucketBytes);
  store_ = store;
#if PYCOMM_WITH_CUDA
  ncclRoute_ = std::make_shared<cuda::NcclRoute>();
#endif
}

PycommBackend::~PycommBackend() { comm_->shutdown(); }

void PycommBackend::setTimeout(std::chrono::milliseconds timeout) { comm_->setTimeout(timeout); }

void PycommBackend::shutdown() { comm_->shutdown(); }

void PycommBackend::setAlgorithm(const std::string& name) {
  const Algorithm algorithm = parseAlgorithm(name);
  auto comm = comm_;
  comm_->enqueue([comm, algorithm] { comm->setAlgorithm(algorithm); });
}

void PycommBackend::setTraceGroup(const std::string& name, const std::string& desc,
                                  const std::vector<int64_t>& globalRanks) {
  TORCH_CHECK_VALUE(globalRanks.empty() || globalRanks.size() == static_cast<size_t>(size_), "pycomm: ",
                    globalRanks.size(), " global ranks for a group of ", size_);
  auto group = std::make_shared<FlightRecorder::Group>();
  group->name = name;
  group->desc = desc;
  group->ranks = globalRanks;
  if (group->ranks.empty()) {
    for (int r = 0; r < size_; ++r) group->ranks.push_back(r);
  }
  traceGroup_ = group;
  FlightRecorder::instance().addGroup(group);
}

int64_t PycommBackend::globalRank() const {
  return traceGroup_ ? traceGroup_->ranks[static_cast<size_t>(rank_)] : rank_;
}

std::vector<int64_t> PycommBackend::globalRanksOf(const std::vector<int>& groupRanks) const {
  std::vector<int64_t> global;
  for (int r : groupRanks) global.push_back(traceGroup_ ? traceGroup_->ranks[static_cast<size_t>(r)] : r);
  return global;
}

void PycommBackend::abort() {
  FlightRecorder::instance().dumpOnFault(globalRank(), "abort()");
#if PYCOMM_WITH_CUDA
  // The worker may be waiting for an NCCL op: it aborts the NCCL communicator itself.
  ncclRoute_->requestAbort();
#endif
  comm_->abort("abort() was called");
}

void PycommBackend::startCoalescing() {
  std::lock_guard<std::mutex> lock(coalesceMutex_);
  coalescing_ = true;
  coalesced_.clear();
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::endCoalescing() {
  std::vector<c10::intrusive_ptr<PycommWork>> works;
  {
    std::lock_guard<std::mutex> lock(coalesceMutex_);
    coalescing_ = false;
    works.swap(coalesced_);
  }
  // Completes once every op of the block did, from their futures' callbacks: never from the worker,
  // where waiting for a receive would hold up the collectives queued behind the block (a receive
  // whose send comes after such a collective on the peer would never complete).
  auto work = c10::make_intrusive<CoalescedWork>(rank_, works, comm_->timeout());
  struct Countdown {
    std::mutex mutex;
    size_t left;
    std::exception_ptr error;
  };
  auto countdown = std::make_shared<Countdown>();
  countdown->left = works.size();
  if (works.empty()) {
    work->complete(nullptr);
    return work;
  }
  for (const auto& w : works) {
    w->getFuture()->addCallback([countdown, work](c10::ivalue::Future& done) {
      bool last = false;
      std::exception_ptr error;
      {
        std::lock_guard<std::mutex> lock(countdown->mutex);
        if (done.hasError() && !countdown->error) countdown->error = done.exception_ptr();
        last = --countdown->left == 0;
        error = countdown->error;
      }
      if (last) work->complete(error);
    });
  }
  return work;
}

}  // namespace pycomm::torch_adapter
