// The reducing collectives as descriptors (collective_op.h) and their overrides. PREMUL_SUM and
// AVG travel as the core's ReduceSpec; the core applies them.
#include <ATen/MemoryOverlap.h>

#include "backend.h"
#include "coalesced_layout.h"
#include "bucketed_allreduce.h"
#include "core/error.h"
#include "device_collectives.h"
#include "sparse_allreduce.h"

namespace pycomm::torch_adapter {
namespace {

using ::c10d::OpType;
using transport::OpKind;

struct AllreduceOp final : CollectiveOp {
  AllreduceOp(const std::vector<at::Tensor>& tensors, const ::c10d::AllreduceOptions& opts)
      : CollectiveOp(OpType::ALLREDUCE, "allreduce", "pycomm:all_reduce", !opts.asyncOp, true), list(tensors),
        op(opts.reduceOp) {
    tensors_.add(list, true, true);
    setOutputs(tensors);
  }
  void prepare(const Validator& v, const Config& config) override {
    spec = v.reduceSpec(op, v.single(list));
    dtype = v.reducible(list[0]);
    codec = compressionFor(config, list[0].scalar_type(), &op);
  }
  void run(Communicator& comm) override { allreduceNow(comm, list[0], dtype, spec, codec); }
  algorithms::QueuedStamp stamp() const override {
    return stampOf(OpKind::kAllreduce, dtype, static_cast<size_t>(list[0].numel()), &spec, codec, -1);
  }
  void runOnDevice(algorithms::QueuedLink& link, const Config& config) override {
    deviceAllreduce(link, list[0], spec, dtype, codec, config);
  }

  std::vector<at::Tensor> list;
  ::c10d::ReduceOp op;
  ReduceSpec spec;
  DataType dtype = DataType::kFloat32;
  std::optional<codecs::Codec> codec;
};

// What gloo does for sparse gradients; CPU only, so its tensor takes no part in the device route.
struct SparseAllreduceOp final : CollectiveOp {
  SparseAllreduceOp(const at::Tensor& tensor, const ::c10d::AllreduceOptions& opts)
      : CollectiveOp(OpType::ALLREDUCE, "allreduce", "pycomm:all_reduce_sparse", !opts.asyncOp), t(tensor),
        op(opts.reduceOp) {
    setOutputs({tensor});
  }
  void prepare(const Validator& v, const Config&) override {
    TORCH_CHECK_VALUE(t.device().is_cpu(), v.where(), "sparse tensors are supported on the CPU only, got one on ",
                      t.device());
    TORCH_CHECK_VALUE(op == ::c10d::ReduceOp::SUM, v.where(), "sparse tensors support SUM only");
    TORCH_CHECK_VALUE(t.dim() <= 8, v.where(), "sparse tensors of at most 8 dims, got ", t.dim());
  }
  void run(Communicator& comm) override { allreduceSparse(comm, t); }

  at::Tensor t;
  ::c10d::ReduceOp op;
};

struct AllreduceCompressedOp final : CollectiveOp {
  AllreduceCompressedOp(const at::Tensor& tensor, const ::c10d::ReduceOp& reduceOp, const std::string& codecName,
                        const std::optional<at::Tensor>& residual)
      : CollectiveOp(OpType::ALLREDUCE, "allreduce", "pycomm:all_reduce_compressed", false, true), t(tensor),
        op(reduceOp), codecName(codecName), residual(residual) {
    tensors_.add(t, true, true);
    setOutputs({tensor});
  }
  bool checksBeforeRoute() const override { return true; }
  void prepare(const Validator& v, const Config&) override {
    v.tensor(t);
    if (residual) checkResidual(v, *residual);
    TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat, v.where(), "compression needs a float32 tensor, got ",
                     t.scalar_type());
    TORCH_CHECK_VALUE(op.op_ == ::c10d::ReduceOp::SUM || op.op_ == ::c10d::ReduceOp::AVG, v.where(),
                      "compressed all-reduce supports SUM and AVG only");
    try {
      codec = codecs::codecFromName(codecName);
    } catch (const InvalidUsageError& e) {
      TORCH_CHECK_VALUE(false, v.where(), e.what());
    }
    spec.average = op.op_ == ::c10d::ReduceOp::AVG;
  }
  void checkResidual(const Validator& v, const at::Tensor& r) const {
    TORCH_CHECK_VALUE(t.device().is_cpu() && r.device().is_cpu(), v.where(),
                      "error feedback in the core (residual=) takes CPU tensors; got ", t.device(), " and ",
                      r.device());
    TORCH_CHECK_VALUE(r.scalar_type() == at::kFloat && r.is_contiguous() && r.numel() == t.numel(), v.where(),
                      "residual must be a contiguous float32 tensor of ", t.numel(), " elements, got ",
                      r.scalar_type(), " of ", r.numel(), r.is_contiguous() ? "" : " (not contiguous)");
    TORCH_CHECK_VALUE(!r.requires_grad(), v.where(), "residual must not require grad (it is state the op writes)");
    // The core writes both; a non-contiguous tensor is also written back through its views.
    const bool sameStorage = r.storage().is_alias_of(t.storage());
    TORCH_CHECK_VALUE(t.numel() == 0 || !sameStorage || at::get_overlap_status(r, t) == at::MemOverlapStatus::No,
                      v.where(), "residual must not share memory with the tensor");
  }
  void run(Communicator& comm) override {
    const Contiguous c(t);
    comm.allreduceCompressed(c.flat.data_ptr<float>(), c.flat.numel(), codec, spec.average,
                             residual ? residual->data_ptr<float>() : nullptr);
    c.copyBack();
  }
  algorithms::QueuedStamp stamp() const override {
    return stampOf(OpKind::kAllreduce, DataType::kFloat32, static_cast<size_t>(t.numel()), &spec, codec, -1);
  }
  void runOnDevice(algorithms::QueuedLink& link, const Config& config) override {
    deviceAllreduce(link, t, spec, DataType::kFloat32, codec, config);
  }

  at::Tensor t;
  ::c10d::ReduceOp op;
  std::string codecName;
  std::optional<at::Tensor> residual;
  codecs::Codec codec{};
  ReduceSpec spec;
};

struct AllreduceCoalescedOp final : CollectiveOp {
  AllreduceCoalescedOp(const std::vector<at::Tensor>& tensors, const ::c10d::AllreduceCoalescedOptions& opts,
                       std::shared_ptr<BucketedAllreduce> buckets)
      : CollectiveOp(OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", "pycomm:all_reduce_coalesced"),
        list(tensors), op(opts.reduceOp), buckets(std::move(buckets)) {
    tensors_.add(list, true, true);
    setOutputs(tensors);
  }
  void prepare(const Validator& v, const Config& config) override {
    for (const auto& t : list) {
      v.tensor(t);
      spec = v.reduceSpec(op, t);
    }
    compression = config.compression;
  }
  void run(Communicator& comm) override { buckets->run(comm, list, spec, compression); }

  std::vector<at::Tensor> list;
  ::c10d::ReduceOp op;
  std::shared_ptr<BucketedAllreduce> buckets;
  ReduceSpec spec;
  std::optional<codecs::Codec> compression;
};

struct ReduceToRootOp final : CollectiveOp {
  ReduceToRootOp(const std::vector<at::Tensor>& tensors, const ::c10d::ReduceOptions& opts, int rank)
      : CollectiveOp(OpType::REDUCE, "reduce", "pycomm:reduce"), list(tensors), opts(opts),
        isRoot(rank == opts.rootRank) {
    tensors_.add(list, true, isRoot);
    setOutputs(tensors);
  }
  void prepare(const Validator& v, const Config&) override {
    const at::Tensor& t = v.single(list);
    v.root(opts.rootRank);
    spec = v.reduceSpec(opts.reduceOp, t);
    dtype = v.reducible(t);
  }
  void run(Communicator& comm) override {
    const Contiguous c(list[0]);
    comm.reduce(c.flat.data_ptr(), c.flat.numel(), dtype, spec, static_cast<int>(opts.rootRank));
    if (isRoot) c.copyBack();
  }

  std::vector<at::Tensor> list;
  ::c10d::ReduceOptions opts;
  bool isRoot;
  ReduceSpec spec;
  DataType dtype = DataType::kFloat32;
};

struct ReduceScatterOp final : CollectiveOp {
  ReduceScatterOp(const std::vector<at::Tensor>& outputs, const std::vector<std::vector<at::Tensor>>& inputs,
                  const ::c10d::ReduceScatterOptions& opts)
      : CollectiveOp(OpType::REDUCE_SCATTER, "reduce_scatter", "pycomm:reduce_scatter"), outputs(outputs),
        inputs(inputs), op(opts.reduceOp) {
    tensors_.add(this->outputs, false, true);
    tensors_.add(this->inputs, true, false);
    setOutputs(outputs);
  }
  void prepare(const Validator& v, const Config&) override {
    const at::Tensor& out = v.single(outputs);
    TORCH_CHECK_VALUE(inputs.size() == 1 && inputs[0].size() == static_cast<size_t>(v.size()), v.where(),
                      "expects one list of ", v.size(), " input tensors");
    v.allLike(out, inputs[0], "input", "output");
    spec = v.reduceSpec(op, out);
    dtype = v.reducible(out);
  }
  void run(Communicator& comm) override {
    const Contiguous c(outputs[0]);
    const at::Tensor flat = flatten(inputs[0]);
    comm.reduceScatter(flat.data_ptr(), c.flat.data_ptr(), c.flat.numel(), dtype, spec);
    c.copyBack();
  }

  std::vector<at::Tensor> outputs;
  std::vector<std::vector<at::Tensor>> inputs;
  ::c10d::ReduceOp op;
  ReduceSpec spec;
  DataType dtype = DataType::kFloat32;
};

// reduce_scatter_tensor: FSDP's.
struct ReduceScatterTensorOp final : CollectiveOp {
  ReduceScatterTensorOp(const at::Tensor& output, const at::Tensor& input, const ::c10d::ReduceScatterOptions& opts)
      : CollectiveOp(OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", "pycomm:reduce_scatter_tensor", false,
                     true),
        output(output), input(input), op(opts.reduceOp) {
    readsInto(this->input, this->output);
  }
  void prepare(const Validator& v, const Config& config) override {
    v.tensor(output);
    v.sameType(output, input);
    v.holdsOnePerRank(input, "input", output, "output");
    spec = v.reduceSpec(op, output);
    dtype = v.reducible(output);
    codec = compressionFor(config, output.scalar_type(), &op);
  }
  void run(Communicator& comm) override {
    const Contiguous in(input), out(output);
    if (codec) {
      comm.reduceScatterCompressed(in.flat.data_ptr<float>(), out.flat.data_ptr<float>(), out.flat.numel(), *codec,
                                   spec.average);
    } else {
      comm.reduceScatter(in.flat.data_ptr(), out.flat.data_ptr(), out.flat.numel(), dtype, spec);
    }
    out.copyBack();
  }
  algorithms::QueuedStamp stamp() const override {
    return stampOf(OpKind::kReduceScatter, dtype, static_cast<size_t>(output.numel()), &spec, codec, -1);
  }
  void runOnDevice(algorithms::QueuedLink& link, const Config&) override {
    deviceReduceScatter(link, input, output, spec, dtype, codec);
  }

  at::Tensor output;
  at::Tensor input;
  ::c10d::ReduceOp op;
  ReduceSpec spec;
  DataType dtype = DataType::kFloat32;
  std::optional<codecs::Codec> codec;
};

struct ReduceScatterTensorCoalescedOp final : CollectiveOp {
  ReduceScatterTensorCoalescedOp(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                                 const ::c10d::ReduceScatterOptions& opts)
      : CollectiveOp(OpType::COALESCED, "reduce_scatter_tensor_coalesced", "pycomm:reduce_scatter_tensor_coalesced"),
        outputs(outputs), inputs(inputs), op(opts.reduceOp) {
    readsInto(this->inputs, this->outputs);
  }
  void prepare(const Validator& v, const Config&) override {
    v.holdOnePerRank(inputs, outputs, false);
    for (size_t i = 0; i < inputs.size(); ++i) {
      specs.push_back(v.reduceSpec(op, outputs[i]));
      dtypes.push_back(v.reducible(outputs[i]));
    }
  }
  void run(Communicator& comm) override { reduceScatterCoalesced(comm, outputs, inputs, dtypes, specs); }

  std::vector<at::Tensor> outputs;
  std::vector<at::Tensor> inputs;
  ::c10d::ReduceOp op;
  std::vector<ReduceSpec> specs;
  std::vector<DataType> dtypes;
};

}  // namespace

c10::intrusive_ptr<::c10d::Work> PycommBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                          const ::c10d::AllreduceOptions& opts) {
  if (tensors.size() == 1 && tensors[0].defined() && tensors[0].layout() == at::kSparse) {
    return dispatch(std::make_shared<SparseAllreduceOp>(tensors[0], opts));
  }
  return dispatch(std::make_shared<AllreduceOp>(tensors, opts));
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::allreduceCompressed(const at::Tensor& tensor,
                                                                    const ::c10d::ReduceOp& op,
                                                                    const std::string& codecName,
                                                                    const std::optional<at::Tensor>& residual) {
  return dispatch(std::make_shared<AllreduceCompressedOp>(tensor, op, codecName, residual));
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                    const ::c10d::AllreduceCoalescedOptions& opts) {
  return dispatch(std::make_shared<AllreduceCoalescedOp>(tensors, opts, buckets_));
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::reduce(std::vector<at::Tensor>& tensors,
                                                       const ::c10d::ReduceOptions& opts) {
  return dispatch(std::make_shared<ReduceToRootOp>(tensors, opts, rank_));
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                               std::vector<std::vector<at::Tensor>>& inputs,
                                                               const ::c10d::ReduceScatterOptions& opts) {
  return dispatch(std::make_shared<ReduceScatterOp>(outputs, inputs, opts));
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                     const ::c10d::ReduceScatterOptions& opts) {
  return dispatch(std::make_shared<ReduceScatterTensorOp>(output, input, opts));
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const ::c10d::ReduceScatterOptions& opts) {
  return dispatch(std::make_shared<ReduceScatterTensorCoalescedOp>(outputs, inputs, opts));
}

}  // namespace pycomm::torch_adapter
