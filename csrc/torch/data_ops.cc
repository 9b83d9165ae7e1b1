// The collectives that move data without reducing it, as descriptors (collective_op.h) and their
// overrides. Any dtype moves, as bytes where the core has no type for it (Layout).
#include "backend.h"
#include "coalesced_layout.h"
#include "device_collectives.h"
#include "split_layout.h"

namespace pycomm::torch_adapter {
namespace {

using ::c10d::OpType;
using transport::OpKind;

struct BroadcastOp final : CollectiveOp {
  BroadcastOp(const std::vector<at::Tensor>& tensors, const ::c10d::BroadcastOptions& opts, int rank)
      : CollectiveOp(OpType::BROADCAST, "broadcast", "pycomm:broadcast", !opts.asyncOp, true), list(tensors),
        root(opts.rootRank) {
    tensors_.add(list, rank == root, rank != root);
    setOutputs(tensors);
  }
  void prepare(const Validator& v, const Config&) override {
    layout = movable(v.single(list));
    v.root(root);
  }
  void run(Communicator& comm) override {
    const Contiguous c(list[0]);
    comm.broadcast(c.flat.data_ptr(), layout.count(c.flat), layout.dtype, static_cast<int>(root));
    c.copyBack();
  }
  algorithms::QueuedStamp stamp() const override {
    return stampOf(OpKind::kBroadcast, layout.dtype, layout.count(list[0]), nullptr, std::nullopt,
                   static_cast<int>(root));
  }
  void runOnDevice(algorithms::QueuedLink& link, const Config& config) override {
    deviceBroadcast(link, list[0], static_cast<int>(root), config.deviceChunkBytes);
  }

  std::vector<at::Tensor> list;
  int64_t root;
  Layout layout{};
};

struct AllgatherOp final : CollectiveOp {
  AllgatherOp(const std::vector<std::vector<at::Tensor>>& outputs, const std::vector<at::Tensor>& inputs)
      : CollectiveOp(OpType::ALLGATHER, "allgather", "pycomm:all_gather"), outputs(outputs), inputs(inputs) {
    readsInto(this->inputs, this->outputs);
  }
  void prepare(const Validator& v, const Config&) override {
    const at::Tensor& in = v.single(inputs);
    TORCH_CHECK_VALUE(outputs.size() == 1 && outputs[0].size() == static_cast<size_t>(v.size()), v.where(),
                      "expects one list of ", v.size(), " output tensors");
    v.allLike(in, outputs[0], "output", "input");
  }
  void run(Communicator& comm) override {
    const Contiguous c(inputs[0]);
    const Layout layout = movable(c.flat);
    at::Tensor flat = at::empty({c.flat.numel() * comm.size()}, c.flat.options());
    comm.allgather(c.flat.data_ptr(), flat.data_ptr(), layout.count(c.flat), layout.dtype);
    scatterInto(flat, outputs[0]);
  }

  std::vector<std::vector<at::Tensor>> outputs;
  std::vector<at::Tensor> inputs;
};

// all_gather_into_tensor: FSDP's.
struct AllgatherTensorOp final : CollectiveOp {
  AllgatherTensorOp(const at::Tensor& output, const at::Tensor& input)
      : CollectiveOp(OpType::_ALLGATHER_BASE, "allgather_into_tensor", "pycomm:all_gather_into_tensor", false, true),
        output(output), input(input) {
    readsInto(this->input, this->output);
  }
  void prepare(const Validator& v, const Config& config) override {
    v.tensor(input);
    v.sameType(input, output);
    v.holdsOnePerRank(output, "output", input, "input");
    layout = movable(input);
    codec = compressionFor(config, input.scalar_type(), nullptr);
  }
  void run(Communicator& comm) override {
    const Contiguous in(input), out(output);
    if (codec) {
      comm.allgatherCompressed(in.flat.data_ptr<float>(), out.flat.data_ptr<float>(), in.flat.numel(), *codec);
    } else {
      comm.allgather(in.flat.data_ptr(), out.flat.data_ptr(), layout.count(in.flat), layout.dtype);
    }
    out.copyBack();
  }
  algorithms::QueuedStamp stamp() const override {
    return stampOf(OpKind::kAllgather, layout.dtype, layout.count(input), nullptr, codec, -1);
  }
  void runOnDevice(algorithms::QueuedLink& link, const Config&) override { deviceAllgather(link, input, output, codec); }

  at::Tensor output;
  at::Tensor input;
  Layout layout{};
  std::optional<codecs::Codec> codec;
};

struct AllgatherCoalescedOp final : CollectiveOp {
  AllgatherCoalescedOp(const std::vector<std::vector<at::Tensor>>& outputs, const std::vector<at::Tensor>& inputs)
      : CollectiveOp(OpType::ALLGATHER_COALESCED, "allgather_coalesced", "pycomm:all_gather_coalesced"),
        outputs(outputs), inputs(inputs) {
    readsInto(this->inputs, this->outputs);
  }
  void prepare(const Validator& v, const Config&) override {
    TORCH_CHECK_VALUE(outputs.size() == static_cast<size_t>(v.size()), v.where(), "expects ", v.size(),
                      " output lists, got ", outputs.size());
    for (const auto& list : outputs) {
      TORCH_CHECK_VALUE(list.size() == inputs.size(), v.where(), "each output list needs ", inputs.size(), " tensors");
      for (size_t i = 0; i < inputs.size(); ++i) {
        v.sameType(inputs[i], list[i]);
        TORCH_CHECK_VALUE(list[i].numel() == inputs[i].numel(), v.where(), "output ", i, " has ", list[i].numel(),
                          " elements, input has ", inputs[i].numel());
      }
    }
  }
  void run(Communicator& comm) override {
    for (size_t i = 0; i < inputs.size(); ++i) {
      const Contiguous c(inputs[i]);
      const Layout layout = movable(c.flat);
      at::Tensor flat = at::empty({c.flat.numel() * comm.size()}, c.flat.options());
      comm.allgather(c.flat.data_ptr(), flat.data_ptr(), layout.count(c.flat), layout.dtype);
      for (int r = 0; r < comm.size(); ++r) {
        outputs[r][i].copy_(flat.narrow(0, r * c.flat.numel(), c.flat.numel()).view(outputs[r][i].sizes()));
      }
    }
  }

  std::vector<std::vector<at::Tensor>> outputs;
  std::vector<at::Tensor> inputs;
};

struct AllgatherTensorCoalescedOp final : CollectiveOp {
  AllgatherTensorCoalescedOp(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs)
      : CollectiveOp(OpType::COALESCED, "allgather_into_tensor_coalesced", "pycomm:all_gather_into_tensor_coalesced"),
        outputs(outputs), inputs(inputs) {
    readsInto(this->inputs, this->outputs);
  }
  void prepare(const Validator& v, const Config&) override { v.holdOnePerRank(outputs, inputs, true); }
  void run(Communicator& comm) override {
    if (inputs.size() == 1) {
      const Contiguous in(inputs[0]), out(outputs[0]);
      const Layout layout = movable(in.flat);
      comm.allgather(in.flat.data_ptr(), out.flat.data_ptr(), layout.count(in.flat), layout.dtype);
      out.copyBack();
      return;
    }
    if (!inputs.empty()) allgatherCoalesced(comm, outputs, inputs);
  }

  std::vector<at::Tensor> outputs;
  std::vector<at::Tensor> inputs;
};

// gather and scatter: the root's list of one tensor per rank, the root checked first.
struct RootedOp : CollectiveOp {
  RootedOp(OpType type, const char* name, const char* title, int64_t root, int rank)
      : CollectiveOp(type, name, title), root(root), isRoot(rank == root) {}
  // The root's list (`lists` holds one list of size() tensors like `single`); nothing elsewhere.
  void checkRootList(const Validator& v, const std::vector<std::vector<at::Tensor>>& lists, const at::Tensor& single,
                     const char* listName, const char* singleName) const {
    v.root(root);
    if (!isRoot) {
      TORCH_CHECK_VALUE(lists.empty() || (lists.size() == 1 && lists[0].empty()), v.where(), "only the root passes ",
                        listName, " tensors");
      return;
    }
    TORCH_CHECK_VALUE(lists.size() == 1 && lists[0].size() == static_cast<size_t>(v.size()), v.where(),
                      "the root expects one list of ", v.size(), " ", listName, " tensors");
    v.allLike(single, lists[0], listName, singleName);
  }

  int64_t root;
  bool isRoot;
};

struct GatherOp final : RootedOp {
  GatherOp(const std::vector<std::vector<at::Tensor>>& outputs, const std::vector<at::Tensor>& inputs,
           const ::c10d::GatherOptions& opts, int rank)
      : RootedOp(OpType::GATHER, "gather", "pycomm:gather", opts.rootRank, rank), outputs(outputs), inputs(inputs) {
    readsInto(this->inputs, this->outputs);
  }
  void prepare(const Validator& v, const Config&) override { checkRootList(v, outputs, v.single(inputs), "output", "input"); }
  void run(Communicator& comm) override {
    const Contiguous c(inputs[0]);
    const Layout layout = movable(c.flat);
    at::Tensor flat = isRoot ? at::empty({c.flat.numel() * comm.size()}, c.flat.options()) : at::Tensor();
    comm.gather(c.flat.data_ptr(), isRoot ? flat.data_ptr() : nullptr, layout.count(c.flat), layout.dtype,
                static_cast<int>(root));
    if (isRoot) scatterInto(flat, outputs[0]);
  }

  std::vector<std::vector<at::Tensor>> outputs;
  std::vector<at::Tensor> inputs;
};

struct ScatterOp final : RootedOp {
  ScatterOp(const std::vector<at::Tensor>& outputs, const std::vector<std::vector<at::Tensor>>& inputs,
            const ::c10d::ScatterOptions& opts, int rank)
      : RootedOp(OpType::SCATTER, "scatter", "pycomm:scatter", opts.rootRank, rank), outputs(outputs),
        inputs(inputs) {
    tensors_.add(this->outputs, false, true);
    tensors_.add(this->inputs, true, false);
    setOutputs(outputs);
  }
  void prepare(const Validator& v, const Config&) override { checkRootList(v, inputs, v.single(outputs), "input", "output"); }
  void run(Communicator& comm) override {
    const Contiguous c(outputs[0]);
    const Layout layout = movable(c.flat);
    const at::Tensor flat = isRoot ? flatten(inputs[0]) : at::Tensor();
    comm.scatter(isRoot ? flat.data_ptr() : nullptr, c.flat.data_ptr(), layout.count(c.flat), layout.dtype,
                 static_cast<int>(root));
    c.copyBack();
  }

  std::vector<at::Tensor> outputs;
  std::vector<std::vector<at::Tensor>> inputs;
};

// all_to_all_single, with torch's split sizes (split_layout.h).
struct AlltoallTensorOp final : CollectiveOp {
  AlltoallTensorOp(const at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& outputSplits,
                   const std::vector<int64_t>& inputSplits)
      : CollectiveOp(OpType::ALLTOALL_BASE, "alltoall_base", "pycomm:all_to_all_single", false, true),
        output(output), input(input), outputSplits(outputSplits), inputSplits(inputSplits) {
    readsInto(this->input, this->output);
  }
  void prepare(const Validator& v, const Config&) override {
    v.tensor(input);
    v.sameType(input, output);
    layout = movable(input);
    splitLayout(input, inputSplits, v.size(), v.where(), "input", layout.scale, sendCounts, sendOffsets);
    splitLayout(output, outputSplits, v.size(), v.where(), "output", layout.scale, recvCounts, recvOffsets);
  }
  void run(Communicator& comm) override {
    const Contiguous in(input), out(output);
    const at::Tensor source = apartFrom(in.flat, out.flat);
    comm.alltoall(source.data_ptr(), sendCounts, sendOffsets, out.flat.data_ptr(), recvCounts, recvOffsets,
                  layout.dtype);
    out.copyBack();
  }
  // NCCL moves bytes: counts and offsets in bytes, and the check the core makes of its own.
  void prepareForDevice(const Validator& v) override {
    const size_t esize = elementSize(layout.dtype);
    for (auto* counts : {&sendCounts, &sendOffsets, &recvCounts, &recvOffsets}) toBytes(*counts, esize, v.where());
    const size_t tensorElementBytes = esize * layout.scale;
    TORCH_CHECK_VALUE(sendCounts[v.rank()] == recvCounts[v.rank()], v.where(), "this rank sends itself ",
                      sendCounts[v.rank()] / tensorElementBytes, " elements but expects ",
                      recvCounts[v.rank()] / tensorElementBytes);
  }
  algorithms::QueuedStamp stamp() const override {
    return stampOf(OpKind::kAlltoall, layout.dtype, 0, nullptr, std::nullopt, -1);
  }
  void runOnDevice(algorithms::QueuedLink& link, const Config&) override {
    deviceAlltoall(link, input, output, sendCounts, sendOffsets, recvCounts, recvOffsets);
  }

  at::Tensor output;
  at::Tensor input;
  std::vector<int64_t> outputSplits;
  std::vector<int64_t> inputSplits;
  Layout layout{};
  std::vector<size_t> sendCounts, sendOffsets, recvCounts, recvOffsets;  // bytes over NCCL
};

struct AlltoallOp final : CollectiveOp {
  AlltoallOp(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs)
      : CollectiveOp(OpType::ALLTOALL, "alltoall", "pycomm:all_to_all"), outputs(outputs), inputs(inputs) {
    readsInto(this->inputs, this->outputs);
  }
  void prepare(const Validator& v, const Config&) override {
    TORCH_CHECK_VALUE(outputs.size() == static_cast<size_t>(v.size()) && inputs.size() == outputs.size(), v.where(),
                      "expects ", v.size(), " input and output tensors, got ", inputs.size(), " and ", outputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      v.tensor(inputs[i]);
      v.sameType(inputs[0], inputs[i]);
      v.sameType(inputs[0], outputs[i]);
    }
  }
  void run(Communicator& comm) override {
    const Layout layout = movable(inputs[0]);
    const size_t p = inputs.size();
    std::vector<size_t> sendCounts(p), sendOffsets(p), recvCounts(p), recvOffsets(p);
    size_t sendTotal = 0, recvTotal = 0;
    for (size_t i = 0; i < p; ++i) {
      sendCounts[i] = inputs[i].numel() * layout.scale;
      recvCounts[i] = outputs[i].numel() * layout.scale;
      sendOffsets[i] = sendTotal;
      recvOffsets[i] = recvTotal;
      sendTotal += sendCounts[i];
      recvTotal += recvCounts[i];
    }
    at::Tensor in = flatten(inputs);
    at::Tensor out = at::empty({static_cast<int64_t>(recvTotal / layout.scale)}, in.options());
    comm.alltoall(in.data_ptr(), sendCounts, sendOffsets, out.data_ptr(), recvCounts, recvOffsets, layout.dtype);
    scatterInto(out, outputs);
  }

  std::vector<at::Tensor> outputs;
  std::vector<at::Tensor> inputs;
};

struct BarrierOp final : CollectiveOp {
  explicit BarrierOp(const ::c10d::BarrierOptions& opts)
      : CollectiveOp(OpType::BARRIER, "barrier", "pycomm:barrier", !opts.asyncOp) {
    setOutputs(std::vector<at::Tensor>{});
  }
  void prepare(const Validator&, const Config&) override {}
  void run(Communicator& comm) override { comm.barrier(); }
};

}  // namespace

c10::intrusive_ptr<::c10d::Work> PycommBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                          const ::c10d::BroadcastOptions& opts) {
  return dispatch(std::make_shared<BroadcastOp>(tensors, opts, rank_));
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const ::c10d::AllgatherOptions&) {
  return dispatch(std::make_shared<AllgatherOp>(outputs, inputs));
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                const ::c10d::AllgatherOptions&) {
  return dispatch(std::make_shared<AllgatherTensorOp>(output, input));
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                    std::vector<at::Tensor>& inputs,
                                                                    const ::c10d::AllgatherOptions&) {
  return dispatch(std::make_shared<AllgatherCoalescedOp>(outputs, inputs));
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                std::vector<at::Tensor>& inputs,
                                                                                const ::c10d::AllgatherOptions&) {
  return dispatch(std::make_shared<AllgatherTensorCoalescedOp>(outputs, inputs));
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const ::c10d::GatherOptions& opts) {
  return dispatch(std::make_shared<GatherOp>(outputs, inputs, opts, rank_));
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::scatter(std::vector<at::Tensor>& outputs,
                                                        std::vector<std::vector<at::Tensor>>& inputs,
                                                        const ::c10d::ScatterOptions& opts) {
  return dispatch(std::make_shared<ScatterOp>(outputs, inputs, opts, rank_));
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                              std::vector<int64_t>& outputSplits,
                                                              std::vector<int64_t>& inputSplits,
                                                              const ::c10d::AllToAllOptions&) {
  return dispatch(std::make_shared<AlltoallTensorOp>(output, input, outputSplits, inputSplits));
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const ::c10d::AllToAllOptions&) {
  return dispatch(std::make_shared<AlltoallOp>(outputs, inputs));
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::barrier(const ::c10d::BarrierOptions& opts) {
  return dispatch(std::make_shared<BarrierOp>(opts));
}

}  // namespace pycomm::torch_adapter
