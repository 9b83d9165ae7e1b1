// Sends and receives: posted to the transport at once, outside the collective queue; a device
// tensor goes through a pinned host stand-in.
#include "backend.h"
#include "core/error.h"

namespace pycomm::torch_adapter {
namespace {

// The one tensor of a send (`sending`) or receive, checked: the caller's, or the host stand-in of
// a device tensor with its staging.
struct PointToPointTensor {
  std::shared_ptr<DeviceStaging> staging;  // null for a CPU tensor
  at::Tensor tensor;
};

PointToPointTensor pointToPointTensorOf(const Validator& v, const std::vector<at::Tensor>& tensors, bool sending,
                                        const std::function<std::shared_ptr<DeviceStaging>(c10::Device)>& beginStaging) {
  bool sawDevice = false;
  auto device = v.deviceOf(tensors, sawDevice);
  const at::Tensor& t = v.single(tensors);
  if (!device) return {nullptr, t};
  auto staging = beginStaging(*device);
  return {staging, staging->stage(t, sending, !sending)};
}

}  // namespace

void PycommBackend::trace(PycommWork& work, bool sending, int peer, const at::Tensor& tensor) {
  auto& recorder = FlightRecorder::instance();
  if (!recorder.enabled() || !traceGroup_) return;
  std::string what = sending ? strCat("send ", rank_, "->", peer) : strCat("recv ", rank_, "<-", peer);
  // Posted at once: started when recorded.
  work.setTraceId(recorder.record(traceGroup_, tracedCollectives_.load(), ++tracedPointToPoint_,
                                  sending ? "pycomm:send" : "pycomm:recv", std::move(what), true, {tensor}, {tensor},
                                  comm_->timeout().count()));
  recorder.started(work.traceId());
}

void PycommBackend::joinCoalescing(const c10::intrusive_ptr<PycommWork>& work) {
  std::lock_guard<std::mutex> lock(coalesceMutex_);
  if (coalescing_) coalesced_.push_back(work);
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  Validator v(rank_, size_, "send");
  const auto p2p = pointToPointTensorOf(v, tensors, true, [this](c10::Device d) { return beginStaging(d); });
  const auto& staging = p2p.staging;
  TORCH_CHECK_VALUE(dstRank >= 0 && dstRank < size_ && dstRank != rank_, v.where(), "invalid destination rank ",
                    dstRank, " (group of ", size_, ", this rank ", rank_, ")");
  // A device tensor's bytes must be on the host before the send is posted: this thread waits for
  // its stream to get there.
  if (staging) staging->copyIn();
  at::Tensor flat = p2p.tensor.contiguous();  // kept alive by the Work until the bytes are on the wire
  auto request = comm_->send(flat.data_ptr(), flat.nbytes(), dstRank, static_cast<uint64_t>(tag));
  auto work = c10::make_intrusive<PointToPointWork>(comm_, request, ::c10d::OpType::SEND, staging ? tensors[0] : flat,
                                                    strCat("send to peer ", dstRank, " (tag ", tag, ")"), staging);
  trace(*work, true, dstRank, flat);
  joinCoalescing(work);
  // The host copy of a device tensor lives as long as the request, which holds this callback.
  comm_->onComplete(
      request, [work, flat] { work->finishFromRequest(); }, [raw = work.get()] { return raw->awaited(); });
  return work;
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::postReceive(std::vector<at::Tensor>& tensors, int srcRank, int tag,
                                                            bool anyPeer) {
  Validator v(rank_, size_, "recv");
  const auto p2p = pointToPointTensorOf(v, tensors, false, [this](c10::Device d) { return beginStaging(d); });
  const auto& staging = p2p.staging;
  const at::Tensor& t = p2p.tensor;
  TORCH_CHECK_VALUE(anyPeer || (srcRank >= 0 && srcRank < size_ && srcRank != rank_), v.where(),
                    "invalid source rank ", srcRank, " (group of ", size_, ", this rank ", rank_, ")");
  // The copy back may not overwrite the device tensor before the caller's stream is done with it.
  if (staging) staging->copyIn();
  Contiguous c(t);
  auto request = comm_->recv(c.flat.data_ptr(), c.flat.nbytes(), srcRank, static_cast<uint64_t>(tag));
  auto onReceived = [c, staging] {
    const at::AutoDispatchBelowADInplaceOrView belowAutograd;  // as in submit()'s tasks
    c.copyBack();
    if (staging) staging->copyOut();
  };
  auto work = c10::make_intrusive<PointToPointWork>(
      comm_, request, anyPeer ? ::c10d::OpType::RECVANYSOURCE : ::c10d::OpType::RECV, staging ? tensors[0] : t,
      anyPeer ? strCat("recv from any peer (tag ", tag, ")") : strCat("recv from peer ", srcRank, " (tag ", tag, ")"),
      staging, onReceived);
  // A receive from any peer is not recorded: the analyzer needs the source's rank in the name.
  if (!anyPeer) trace(*work, false, srcRank, t);
  joinCoalescing(work);
  comm_->onComplete(
      request, [work] { work->finishFromRequest(); }, [raw = work.get()] { return raw->awaited(); });
  return work;
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  return postReceive(tensors, srcRank, tag, false);
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return postReceive(tensors, transport::Transport::kAnyPeer, tag, true);
}

}  // namespace pycomm::torch_adapter
