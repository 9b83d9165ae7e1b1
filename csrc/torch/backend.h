// pycomm as a c10d::Backend. Each override validates its tensors, maps them to (pointer, count,
// dtype), queues the core call on the communicator's worker and returns a Work. Algorithm choice,
// chunking and error detection live in the core.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "core/algorithms/queued_link.h"
#include "core/algorithms/queued_stamp.h"
#include "core/communicator.h"
#include "device_staging.h"
#include "work.h"

namespace pycomm::cuda {
class NcclComm;  // csrc/cuda/nccl_comm.h, in CUDA builds only
}

namespace pycomm::torch_adapter {

class PycommBackend final : public ::c10d::Backend {
 public:
  PycommBackend(const c10::intrusive_ptr<::c10d::Store>& store, const Config& config);
  ~PycommBackend() override;

  const std::string getBackendName() const override { return "pycomm"; }
  bool supportsSplitting() const override { return false; }
  bool supportsCoalescing() const override { return false; }
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
  std::map<std::string, Communicator::OpStats> stats() const { return comm_->stats(); }

  // Applies to every all-reduce issued after it, in issue order (so the same on every rank).
  void setAlgorithm(const std::string& name);
  void shutdown() override;
  void abort() override;

 private:
  // A strong reference for a queued task that calls back into this backend: the group may be
  // destroyed (even from a completion callback) while the task still waits in the queue.
  c10::intrusive_ptr<PycommBackend> selfRef() { return c10::intrusive_ptr<PycommBackend>::reclaim_copy(this); }
  // Called by a collective override whose validation threw `error` (its function-try-block, after
  // its OverrideScope closed): if the outermost override submitted nothing and the op was for the
  // CPU transports (not NCCL), this rank's next collective is rejected with the error
  // (Communicator::rejectCollective), so the peers fail their op at once instead of waiting for
  // this rank, and sequence numbers stay in step. The override then rethrows.
  void rejectOnPeers(const std::exception& error);
  // Queues `body` on the worker; the Work completes with its outcome. `outputs` feed the future.
  // `inlineOk`: the caller waits at once (a synchronous op), so the op may run on its thread.
  c10::intrusive_ptr<PycommWork> submit(::c10d::OpType opType, const char* title,
                                        std::vector<at::Tensor> outputs, std::function<void()> body,
                                        bool inlineOk = false);
  c10::intrusive_ptr<PycommWork> submitNested(::c10d::OpType opType, const char* title,
                                              std::vector<std::vector<at::Tensor>> outputs,
                                              std::function<void()> body);
  void enqueueWork(const c10::intrusive_ptr<PycommWork>& work, std::function<void()> body, bool inlineOk,
                   std::shared_ptr<DeviceStaging> staging);
  // Device tensors: a staging on the group's communication stream for `device`. runStaged runs the
  // op's CPU form (`cpuOp`, on the host stand-ins) and the Work it submits adopts the staging.
  std::shared_ptr<DeviceStaging> beginStaging(c10::Device device);
  c10::intrusive_ptr<::c10d::Work> runStaged(std::shared_ptr<DeviceStaging> staging,
                                             const std::function<c10::intrusive_ptr<::c10d::Work>()>& cpuOp);
  // The group's NCCL communicator for collectives on `device`, or null when they are staged. The
  // first call decides for the whole group (collective: every rank's first all-reduce, compressed
  // all-reduce, broadcast, all_gather_into_tensor, reduce_scatter_tensor or all_to_all_single of a
  // CUDA tensor calls it at the same point of its sequence): NCCL when every rank can load it and
  // has a GPU of its own, staging otherwise. Needs a CUDA build; null in a CPU one.
  std::shared_ptr<cuda::NcclComm> ncclFor(c10::Device device);
  // A collective on CUDA tensors run by `body` over the group's NCCL link (a queued schedule on the
  // communication stream, which is current while it runs): ordered after the caller's stream,
  // waited for by the worker with the group's timeout, and the Work orders the caller's stream after
  // it like a staged op's. `output` is the future's value; `inputs` are kept alive for the stream.
  // `stamp` says what the op is: the ranks' stamps are exchanged ahead of the schedule and compared
  // after it (core/algorithms/queued_stamp.h), so ranks that run different ops fail saying so.
  c10::intrusive_ptr<::c10d::Work> submitOnDevice(::c10d::OpType opType, const char* title, const at::Tensor& output,
                                                  const std::vector<at::Tensor>& inputs,
                                                  std::shared_ptr<cuda::NcclComm> nccl,
                                                  const algorithms::QueuedStamp& stamp,
                                                  std::function<void(algorithms::QueuedLink& link)> body);
  // A receive, posted at once like a send; `anyPeer`: srcRank is Transport::kAnyPeer.
  c10::intrusive_ptr<::c10d::Work> postReceive(std::vector<at::Tensor>& tensors, int srcRank, int tag, bool anyPeer);
  void allreduceNow(const at::Tensor& tensor, const ::c10d::ReduceOp& op);
  // SUM of a sparse COO tensor over the group, written back into it (nnz may change).
  void allreduceSparseNow(const at::Tensor& tensor);
  // A coalesced bucket of one dtype all-reduced in place, unpacked, when the group's ranks share
  // memory; false (nothing done) otherwise.
  bool allreducePiecesNow(const std::vector<at::Tensor>& bucket, const ::c10d::ReduceOp& op);
  // A flat tensor of `nbytes` for a coalesced bucket of `type`: kept for the group's life (at most
  // bucket_bytes per dtype), so a bucket's copies do not fault in fresh pages every call. Used by
  // tasks only, which run one at a time.
  at::Tensor bucketStaging(at::ScalarType type, size_t nbytes);
  // The group's codec if `t` and `op` qualify for compression (fp32, SUM or AVG).
  std::optional<codecs::Codec> compressionFor(const at::Tensor& t, const ::c10d::ReduceOp* op) const;

  std::shared_ptr<Communicator> comm_;
  std::mutex coalesceMutex_;
  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<PycommWork>> coalesced_;
  std::map<at::ScalarType, at::Tensor> bucketStaging_;
  std::mutex streamsMutex_;
  std::map<c10::DeviceIndex, c10::Stream> commStreams_;
  // The rendezvous store, kept for the NCCL communicator's setup (made at the first CUDA collective).
  c10::intrusive_ptr<::c10d::Store> store_;
  std::mutex deviceRouteMutex_;
  bool deviceRouteDecided_ = false;
  std::exception_ptr deviceRouteError_;
  std::shared_ptr<cuda::NcclComm> nccl_;  // null: CUDA collectives are staged; set once (atomic_store)
};

}  // namespace pycomm::torch_adapter
