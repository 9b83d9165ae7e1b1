// The one path every collective takes (collective_op.h), and the Work it submits.
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "backend.h"
#include "core/error.h"
#include "store_adapter.h"

#if PYCOMM_WITH_CUDA
#include <cuda_runtime_api.h>

#include <chrono>

#include "core/algorithms/counting_link.h"
#include "core/algorithms/queued_allreduce.h"
#include "cuda/nccl_comm.h"
#include "cuda/nccl_link.h"
#include "cuda/nccl_route.h"
#endif

namespace pycomm::torch_adapter {
namespace {

#if PYCOMM_WITH_CUDA
// `stamp` completed with the options it runs under, read on the worker as the op's schedule reads
// them (set_algorithm takes effect there): the algorithm where it decides the transfers (an
// uncompressed all-reduce), and the chunk size.
algorithms::QueuedStamp stampForRun(algorithms::QueuedStamp stamp, const Config& config) {
  if (stamp.signature.kind == transport::OpKind::kAllreduce && stamp.signature.codec == 0) {
    stamp.algorithm = static_cast<uint8_t>(algorithms::queued::allreduceAlgorithm(config));
  }
  stamp.chunkBytes = config.deviceChunkBytes;
  return stamp;
}
#endif

}  // namespace

c10::intrusive_ptr<::c10d::Work> PycommBackend::dispatch(std::shared_ptr<CollectiveOp> op) {
  // Told to the peers on a failed check unless the op took its sequence number already (queued)
  // or may belong to NCCL, which takes none of the CPU transports' (a CUDA op, unless the route
  // says it is staged: then the CPU transports carry it after all).
  bool queued = false;
  bool deviceRoute = false;
  try {
    const Validator v(rank_, size_, op->name());
    const auto device = v.deviceOf(op->tensors().all(), deviceRoute);
    std::shared_ptr<cuda::NcclComm> nccl;
    const bool checkedFirst = op->checksBeforeRoute();
    if (checkedFirst) op->prepare(v, comm_->config());
    if (device && op->hasDeviceForm()) {
      nccl = ncclFor(*device);
      deviceRoute = nccl != nullptr;
    }
    if (!checkedFirst) op->prepare(v, comm_->config());
    std::shared_ptr<DeviceStaging> staging;
    std::function<void()> task;
    if (device) {
      staging = beginStaging(*device);
      if (nccl) {
        op->prepareForDevice(v);
        op->tensors().recordUse(*staging);  // used in place on the communication stream
        task = deviceTask(op, nccl, staging);
      } else {
        op->tensors().stage(*staging);
      }
    }
    if (!task) task = [op, comm = comm_] { op->run(*comm); };
    queued = true;
    bool ranHere = false;
    auto work = submit(*op, std::move(task), std::move(staging), &ranHere);
    // A synchronous CPU op that ran on this thread and succeeded is over: c10d's Python wrappers skip
    // wait() when given no Work (torch's contract for async_op=False), and so save the Work's Python
    // object, the GIL released and retaken in wait(), and again when its outputs are dropped without
    // the GIL. Kept: a failed op's Work (wait() raises), a staged op's (wait() orders the caller's
    // stream after the copies back), any op's queued for the worker, and every Work while torch
    // registers them for wait_tensor (its graph-input mode calls wait() on what it registered).
    if (ranHere && work->succeeded() && !::c10d::allow_inflight_collective_as_graph_input()) return {};
    return work;
  } catch (const std::exception& error) {
    if (!queued && !deviceRoute) rejectOnPeers(error);
    throw;
  }
}

void PycommBackend::rejectOnPeers(const std::exception& error) {
  const auto* torchError = dynamic_cast<const c10::Error*>(&error);
  std::string message = torchError != nullptr ? torchError->what_without_backtrace() : error.what();
  auto comm = comm_;
  try {
    comm_->enqueue([comm, message = std::move(message)] { comm->rejectCollective(message); });
  } catch (const Error&) {
    // The group was shut down: no peer waits for this op, and the caller gets its own error.
  }
}

c10::intrusive_ptr<PycommWork> PycommBackend::submit(const CollectiveOp& op, std::function<void()> body,
                                                     std::shared_ptr<DeviceStaging> staging, bool* ranHere) {
  std::vector<std::shared_ptr<DeviceStaging>> stagings;
  if (staging) stagings.push_back(staging);
  auto work = c10::make_intrusive<PycommWork>(rank_, op.type(), op.title(), op.outputs(), op.outputType(),
                                              std::move(stagings),
                                              profiledInputs([&op] {
                                                const auto read = op.tensors().profiled();
                                                return std::vector<at::Tensor>(read.begin(), read.end());
                                              }));
  // The lock only inside a block: taken per op, it is a share of a small op's cost.
  bool coalescing = false;
  if (coalescing_.load()) {
    std::lock_guard<std::mutex> lock(coalesceMutex_);
    coalescing = coalescing_.load();
    if (coalescing) coalesced_.push_back(work);
  }
  auto& recorder = FlightRecorder::instance();
  if (recorder.enabled() && traceGroup_) {
    // Every rank's entry carries the same sizes (the analyzer compares them): a rank that writes
    // nothing (a broadcast's root) records what it reads as its outputs, as torch's backends do.
    auto inputs = op.tensors().profiled();
    auto outputs = op.tensors().written();
    if (outputs.empty()) outputs = inputs;
    work->setTraceId(recorder.record(traceGroup_, ++tracedCollectives_, tracedPointToPoint_.load(), op.title(), {},
                                     false, inputs, outputs, comm_->timeout().count()));
  }
  auto task = [work, body = std::move(body), staging, rank = globalRank()] {
    FlightRecorder::instance().started(work->traceId());
    try {
      // Results are written below autograd, as a backend does (gloo writes through raw pointers):
      // a leaf that requires grad (a parameter, non-contiguous here) may be written, and so may a
      // tensor made under inference mode, which this thread (the worker, usually) is not in. Only
      // the op's writes: the future's callbacks, run by complete(), get autograd as usual.
      const at::AutoDispatchBelowADInplaceOrView belowAutograd;
      if (staging) staging->copyIn();
      body();
      if (staging) staging->copyOut();
    } catch (const std::exception& e) {
      // A timeout, or a peer's failure report or a lost connection (often a rank that is not stuck
      // itself but whose peers are, whose dump the analyzer needs beside theirs); not bad input.
      if (dynamic_cast<const TimeoutError*>(&e) != nullptr || dynamic_cast<const RemoteError*>(&e) != nullptr) {
        FlightRecorder::instance().dumpOnFault(rank, "a collective failed");
      }
      work->complete(std::current_exception());  // rethrown to the caller by wait()
      return;
    }
    work->complete(nullptr);
  };
  // A device op waits for the caller's stream: on the worker, so the caller's thread does not.
  if (op.inlineOk() && !coalescing && !staging) {
    const bool here = comm_->runOrEnqueue(std::move(task));
    if (ranHere != nullptr) *ranHere = here;
  } else {
    comm_->enqueue(std::move(task));
  }
  return work;
}

std::shared_ptr<DeviceStaging> PycommBackend::beginStaging(c10::Device device) {
  c10::Stream stream = [&] {
    std::lock_guard<std::mutex> lock(streamsMutex_);
    auto it = commStreams_.find(device.index());
    if (it == commStreams_.end()) {
      const c10::impl::VirtualGuardImpl impl(device.type());
      it = commStreams_.emplace(device.index(), impl.getStreamFromGlobalPool(device, false)).first;
    }
    return it->second;
  }();
  return std::make_shared<DeviceStaging>(device, stream);
}

std::shared_ptr<cuda::NcclComm> PycommBackend::ncclFor(c10::Device device) {
#if PYCOMM_WITH_CUDA
  C10dStore store(store_);
  std::shared_ptr<cuda::NcclComm> nccl;
  try {
    nccl = ncclRoute_->forDevice(*comm_, store, device.index());
  } catch (const InvalidUsageError& e) {
    TORCH_CHECK_VALUE(false, e.what());  // a ValueError, as torch's own argument checks raise
  }
  return nccl;
#else
  (void)device;
  TORCH_CHECK(comm_->config().deviceTransport != DeviceTransport::kNccl, "pycomm [rank ", rank_, "/", size_,
              "] cuda_transport=nccl, but this build of pycomm has no CUDA (pycomm.cuda_available() is False)");
  return nullptr;  // always staged in this build: the CPU transports carry it
#endif
}

std::function<void()> PycommBackend::deviceTask(std::shared_ptr<CollectiveOp> op, std::shared_ptr<cuda::NcclComm> nccl,
                                                std::shared_ptr<DeviceStaging> staging) {
#if PYCOMM_WITH_CUDA
  return [op, staging, nccl, comm = comm_] {
    const char* title = op->title();
    // The worker's copyIn() has ordered the stream after the caller's; allocations made here
    // (contiguous copies, scratch) belong to it.
    const c10::StreamGuard guard(staging->stream());
    const auto stream = static_cast<cudaStream_t>(staging->stream().native_handle());
    // An aborted communicator runs nothing more; checked before the stamps' buffers are touched, as
    // the aborted op's copies into them may still be queued.
    TORCH_CHECK(!nccl->aborted(), "pycomm [rank ", nccl->rank(), "/", nccl->size(), "] ", title,
                ": the group's NCCL communicator was aborted by an earlier failure");
    try {
      const auto start = std::chrono::steady_clock::now();
      cuda::NcclLink ncclLink(*nccl, stream);
      const auto stamp = stampForRun(op->stamp(), comm->config());
      nccl->stamps().post(ncclLink, stamp, stream, title);
      algorithms::CountingLink link(ncclLink);  // the op's own bytes, for pycomm.stats()
      op->runOnDevice(link, comm->config());
      try {
        nccl->waitFor(stream, comm->timeout(), title);
      } catch (const std::exception& failure) {
        // A timeout, or NCCL's error after a peer gave up: a mismatch, if the stamps show one, is why.
        try {
          nccl->stamps().check(nccl->rank(), nccl->size(), false, title);
        } catch (const InvalidUsageError& mismatch) {
          throw InvalidUsageError(strCat(mismatch.what(), " (the op then failed: ", failure.what(), ")"));
        }
        throw;
      }
      nccl->stamps().check(nccl->rank(), nccl->size(), true, title);
      comm->recordRouted(stamp.signature, link.bytesSent(), link.bytesReceived(),
                         std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    } catch (const std::exception&) {
      // Part of the schedule may be queued: the peers' next steps would pair with the wrong
      // transfers. The group's CUDA collectives fail from here on.
      nccl->abort();
      throw;
    }
  };
#else
  (void)op, (void)nccl, (void)staging;
  TORCH_INTERNAL_ASSERT(false, "pycomm: a device collective in a build without CUDA");
#endif
}

}  // namespace pycomm::torch_adapter
