// pycomm as a c10d::Backend. Each collective override makes its op's descriptor (collective_op.h)
// and dispatches it: one path checks and maps the tensors, picks the route (CPU, staged, NCCL),
// queues the core call on the communicator's worker and returns a Work. Algorithm choice,
// chunking and error detection live in the core.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "collective_op.h"
#include "core/communicator.h"
#include "device_staging.h"
#include "flight_recorder.h"
#include "work.h"

namespace pycomm::cuda {
class NcclComm;   // csrc/cuda/nccl_comm.h, in CUDA builds only
class NcclRoute;  // csrc/cuda/nccl_route.h, in CUDA builds only
}

namespace pycomm::torch_adapter {

class BucketedAllreduce;  // bucketed_allreduce.h

class PycommBackend final : public ::c10d::Backend {
 public:
  PycommBackend(const c10::intrusive_ptr<::c10d::Store>& store, const Config& config);
  ~PycommBackend() override;

  const std::string getBackendName() const override { return "pycomm"; }
  // torch's split path (split_group, DeviceMesh on a device-bound group): split_group.cc.
  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<::c10d::Backend> split(const c10::intrusive_ptr<::c10d::Store>& store,
                                            const std::vector<int>& ranks,
                                            const c10::intrusive_ptr<Options>& opts) override;
  // What torch copies into a split's options: the timeout, the group's name and global ranks.
  c10::intrusive_ptr<Options> getBackendOptions() override;
  // torch's _coalescing_manager and batch_isend_irecv: a block of ops runs as one schedule (the
  // coalesced entry points) or completes as one Work (endCoalescing).
  bool supportsCoalescing() const override { return true; }
  // dist.shrink_group (shrink.cc): the survivors' new group, over this group's store.
  bool supportsShrinking() const override { return true; }
  c10::intrusive_ptr<::c10d::Backend> shrink(const std::vector<int64_t>& ranksToExclude, int shrinkFlags = 0,
                                             const c10::intrusive_ptr<Options>& optsOverride = nullptr) override;
  // The last fault: TIMEOUT, COMM_ERROR (a connection lost), REMOTE_ERROR (a peer's report), or SUCCESS.
  ::c10d::ErrorType getError() override;
  // The ranks this rank lost, waited for past the timeout, or heard lost from a peer (ascending).
  std::vector<int> failedRanks() const { return comm_->lostRanks(); }
  // What the group of `size` ranks in which this rank is `rank`, formed from this one, inherits
  // (config.h: Lineage); `members` are its ranks in this group. Checks that the members are this
  // group's ranks and name this rank at `rank`.
  Lineage lineageFor(const std::string& key, int rank, int size, const std::vector<int>& members) const;
  // How many shrinks made this group from one torch created (0 for that one).
  int shrinkDepth() const { return shrinkDepth_; }
  void setTimeout(std::chrono::milliseconds timeout) override;
  void startCoalescing() override;
  c10::intrusive_ptr<::c10d::Work> endCoalescing() override;

  c10::intrusive_ptr<::c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                             const ::c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                             const ::c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const ::c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                          const ::c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                             std::vector<at::Tensor>& inputs,
                                             const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                   const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const ::c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                           std::vector<std::vector<at::Tensor>>& inputs,
                                           const ::c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                  const ::c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const ::c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const ::c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                                 std::vector<int64_t>& outputSplits,
                                                 std::vector<int64_t>& inputSplits,
                                                 const ::c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                            std::vector<at::Tensor>& inputs,
                                            const ::c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> barrier(const ::c10d::BarrierOptions& opts) override;
  // ProcessGroup.monitored_barrier (monitored_barrier.cc): rank 0 names the ranks that did not
  // arrive within the timeout (the first one, or every one with waitAllRanks).
  void monitoredBarrier(const ::c10d::BarrierOptions& opts, bool waitAllRanks = false) override;
  c10::intrusive_ptr<::c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<::c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  c10::intrusive_ptr<::c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return comm_->sequenceNumber(); }
  // An all-reduce compressed with `codec` ("fp16", "bf16", "fp8_e4m3", "fp8_e5m2"), SUM or AVG.
  // `residual` (CPU tensors only): a contiguous float32 tensor of the same size that this rank keeps
  // between calls, zeros at first, for error feedback in the core (algorithms/compressed.h).
  c10::intrusive_ptr<::c10d::Work> allreduceCompressed(const at::Tensor& tensor, const ::c10d::ReduceOp& op,
                                                       const std::string& codec,
                                                       const std::optional<at::Tensor>& residual = std::nullopt);
  // torch.ops.pycomm.direct_all_reduce_ (direct_allreduce.cc): `tensor` (CPU) all-reduced in place,
  // returning once it is done, with no Work. `reduceOp`: sum, avg, product, min, max, band, bor, bxor.
  void allreduceDirect(const at::Tensor& tensor, c10::string_view reduceOp);
  std::map<std::string, Communicator::OpStats> stats() const { return comm_->stats(); }

  // Applies to every all-reduce issued after it, in issue order (so the same on every rank).
  void setAlgorithm(const std::string& name);
  void shutdown() override;
  void abort() override;
  // The group as the flight recorder's dumps name it (flight_recorder.h): torch's group name and
  // the group's global ranks, from the creator's options.
  void setTraceGroup(const std::string& name, const std::string& desc, const std::vector<int64_t>& globalRanks);
  // This process's rank in the default group, as the dump's file name carries it.
  int64_t globalRank() const;
  // The global ranks of some of this group's ranks (a split's or a shrink's members).
  std::vector<int64_t> globalRanksOf(const std::vector<int>& groupRanks) const;

 private:
  // The one path of every collective (collective_op.h says which steps it takes). A check that
  // fails before the op was queued, on an op for the CPU transports, is told to the peers
  // (rejectOnPeers) before the error is rethrown. Returns no Work for a synchronous CPU op that ran
  // on this thread and succeeded, outside torch's graph-input mode (c10d's contract for
  // async_op=False, which ProcessGroupNCCL uses too).
  c10::intrusive_ptr<::c10d::Work> dispatch(std::shared_ptr<CollectiveOp> op);
  // This rank's next collective is rejected with `error` (Communicator::rejectCollective), so the
  // peers fail their op at once instead of waiting for this rank, and sequence numbers stay in step.
  void rejectOnPeers(const std::exception& error);
  // Queues `task` on the worker; the Work completes with its outcome. A synchronous op
  // (op.inlineOk()) with no staging, outside a coalesced block, may run on the caller's thread:
  // *ranHere then says it did (it is over).
  c10::intrusive_ptr<PycommWork> submit(const CollectiveOp& op, std::function<void()> task,
                                        std::shared_ptr<DeviceStaging> staging, bool* ranHere = nullptr);
  // Device tensors: a staging on the group's communication stream for `device`.
  std::shared_ptr<DeviceStaging> beginStaging(c10::Device device);
  // The group's NCCL communicator for collectives on `device`, or null when they are staged
  // (cuda/nccl_route.h). Needs a CUDA build; null in a CPU one.
  std::shared_ptr<cuda::NcclComm> ncclFor(c10::Device device);
  // The worker's task running `op` over `nccl`, on the staging's communication stream (current
  // while it runs): ordered after the caller's stream, waited for with the group's timeout, its
  // stamp exchanged ahead of the schedule and compared after it, so ranks that run different ops
  // fail saying so.
  std::function<void()> deviceTask(std::shared_ptr<CollectiveOp> op, std::shared_ptr<cuda::NcclComm> nccl,
                                   std::shared_ptr<DeviceStaging> staging);
  // A send or receive's flight-recorder entry ("send 0->1", "recv 1<-0": group ranks).
  void trace(PycommWork& work, bool sending, int peer, const at::Tensor& tensor);
  // A send or receive's Work joins an open coalescing block.
  void joinCoalescing(const c10::intrusive_ptr<PycommWork>& work);
  // A receive, posted at once like a send; `anyPeer`: srcRank is Transport::kAnyPeer.
  c10::intrusive_ptr<::c10d::Work> postReceive(std::vector<at::Tensor>& tensors, int srcRank, int tag, bool anyPeer);

  std::shared_ptr<Communicator> comm_;
  std::shared_ptr<BucketedAllreduce> buckets_;
  std::mutex coalesceMutex_;
  std::atomic<bool> coalescing_{false};  // written under coalesceMutex_; read first without it
  std::vector<c10::intrusive_ptr<PycommWork>> coalesced_;
  std::mutex streamsMutex_;
  std::map<c10::DeviceIndex, c10::Stream> commStreams_;
  // The rendezvous store, kept for the NCCL communicator's setup (made at the first CUDA collective).
  c10::intrusive_ptr<::c10d::Store> store_;
  std::shared_ptr<cuda::NcclRoute> ncclRoute_;  // CUDA builds only
  // Flight recorder (flight_recorder.h): the group its entries name, and its sequence numbers:
  // every collective and every send or receive issued here, in issue order.
  std::shared_ptr<const FlightRecorder::Group> traceGroup_;
  std::atomic<uint64_t> tracedCollectives_{0};
  std::atomic<uint64_t> tracedPointToPoint_{0};
  std::atomic<uint64_t> shrinks_{0};            // shrink() calls so far: each one's store keys
  std::atomic<uint64_t> monitoredBarriers_{0};  // monitoredBarrier calls so far: each one's tags
  std::atomic<uint64_t> splits_{0};             // split() calls so far: each one's store keys
  int shrinkDepth_ = 0;
};

// pycomm.direct_all_reduce's eager path (direct_allreduce.cc): torch.ops.pycomm.direct_all_reduce_
// on `group`, with the kernel called at once when the dispatcher would call nothing before it (a
// plain CPU tensor outside autograd and modes), and dispatched otherwise. A call through torch.ops
// from Python parses its arguments against the schema, most of a 4 KiB op's time.
void directAllreduceEager(at::Tensor tensor, const std::string& reduceOp,
                          const c10::intrusive_ptr<::c10d::ProcessGroup>& group);
// Whether the dispatcher, given `tensor` on this thread, would call nothing before the op's kernel
// (so directAllreduceEager calls it at once).
bool dispatchesStraightToKernel(const at::Tensor& tensor);

}  // namespace pycomm::torch_adapter
