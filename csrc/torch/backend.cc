#include "backend.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <optional>

#include <c10/core/impl/VirtualGuardImpl.h>

#include "core/algorithms/cost_model.h"
#include "core/algorithms/queued_collectives.h"
#include "core/error.h"
#include "split_layout.h"
#include "store_adapter.h"

#if PYCOMM_WITH_CUDA
#include <cuda_runtime_api.h>

#include <future>

#include "cuda/nccl_comm.h"
#include "cuda/nccl_link.h"
#endif

namespace pycomm::torch_adapter {
namespace {

using ::c10d::OpType;

std::optional<DataType> mapDtype(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return DataType::kFloat32;
    case at::kDouble: return DataType::kFloat64;
    case at::kHalf: return DataType::kFloat16;
    case at::kBFloat16: return DataType::kBFloat16;
    case at::kChar: return DataType::kInt8;
    case at::kByte: return DataType::kUInt8;
    case at::kShort: return DataType::kInt16;
    case at::kInt: return DataType::kInt32;
    case at::kLong: return DataType::kInt64;
    case at::kBool: return DataType::kBool;
    default: return std::nullopt;
  }
}

// How the core sees a tensor's elements. Ops that only move data accept any dtype, as bytes.
struct Layout {
  DataType dtype;
  size_t scale;  // core elements per tensor element (element size when moved as bytes)
  size_t count(const at::Tensor& t) const { return static_cast<size_t>(t.numel()) * scale; }
};

Layout movable(const at::Tensor& t) {
  if (auto dtype = mapDtype(t.scalar_type())) return {*dtype, 1};
  return {DataType::kUInt8, static_cast<size_t>(t.element_size())};
}

// A contiguous tensor for the core; results are copied back if the caller's was not contiguous.
struct Contiguous {
  at::Tensor original;
  at::Tensor flat;
  explicit Contiguous(const at::Tensor& t) : original(t), flat(t.is_contiguous() ? t : t.contiguous()) {}
  void copyBack() const {
    if (!flat.is_same(original)) original.copy_(flat);
  }
};

// What the core runs for a torch ReduceOp: AVG is SUM then a division, PREMUL_SUM a scale then SUM.
struct ReduceSpec {
  ReduceOp op = ReduceOp::kSum;
  std::optional<double> preScale;
  bool average = false;
};

// What the outermost collective override on this thread has done so far (rejectOnPeers): an op
// staged through host memory runs the CPU override again inside it.
struct OverrideCall {
  int depth = 0;
  bool submitted = false;    // a Work was queued: the op takes its sequence number there
  bool deviceRoute = false;  // ncclFor ran: its decision or the NCCL op is the op's
};
thread_local OverrideCall overrideCall;

// Opened first in each collective override; the outermost one starts a fresh OverrideCall.
class OverrideScope {
 public:
  OverrideScope() {
    if (overrideCall.depth++ == 0) overrideCall = OverrideCall{1, false, false};
  }
  ~OverrideScope() { --overrideCall.depth; }
  OverrideScope(const OverrideScope&) = delete;
  OverrideScope& operator=(const OverrideScope&) = delete;
};

class Validator {
 public:
  Validator(int rank, int size, const char* op) : rank_(rank), size_(size), op_(op) {}

  std::string where() const { return strCat("pycomm [rank ", rank_, "/", size_, "] ", op_, ": "); }

  void tensor(const at::Tensor& t) const {
    TORCH_CHECK_VALUE(t.defined(), where(), "got an undefined tensor");
    TORCH_CHECK_VALUE(t.layout() == at::kStrided, where(), "sparse tensors are not supported");
    TORCH_CHECK_VALUE(t.device().is_cpu(), where(), "got a tensor on ", t.device(),
                      "; pycomm supports CPU and CUDA tensors");
  }

  // The device of an op's tensors if they are not on the CPU: then all on one CUDA device.
  std::optional<c10::Device> deviceOf(const std::vector<at::Tensor>& tensors) const {
    std::optional<c10::Device> device;
    bool anyCpu = false;
    for (const auto& t : tensors) {
      if (!t.defined()) continue;
      if (t.device().is_cpu()) {
        anyCpu = true;
        continue;
      }
      // A CUDA op may go to NCCL, which takes no CPU sequence number: no reject (rejectOnPeers)
      // unless ncclFor says the op is staged.
      overrideCall.deviceRoute = true;
      TORCH_CHECK_VALUE(t.device().is_cuda(), where(), "got a tensor on ", t.device(),
                        "; pycomm supports CPU and CUDA tensors");
      TORCH_CHECK_VALUE(t.layout() == at::kStrided, where(), "sparse tensors are not supported");
      TORCH_CHECK_VALUE(!device || *device == t.device(), where(), "got tensors on ", *device, " and ",
                        t.device(), "; an op's tensors must be on one device");
      device = t.device();
    }
    TORCH_CHECK_VALUE(!(device && anyCpu), where(), "got tensors on cpu and on ", *device,
                      "; an op's tensors must be on one device");
    return device;
  }

  // One tensor, of any device deviceOf() accepted.
  const at::Tensor& one(const std::vector<at::Tensor>& tensors) const {
    TORCH_CHECK_VALUE(tensors.size() == 1, where(), "expects exactly one tensor per rank, got ",
                      tensors.size());
    return tensors[0];
  }

  const at::Tensor& single(const std::vector<at::Tensor>& tensors) const {
    const at::Tensor& t = one(tensors);
    tensor(t);
    return t;
  }

  void sameType(const at::Tensor& a, const at::Tensor& b) const {
    tensor(b);
    sameDtype(a, b);
  }

  // sameType() for tensors deviceOf() accepted (CUDA ones too).
  void sameDtype(const at::Tensor& a, const at::Tensor& b) const {
    TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type(), where(), "input dtype ", a.scalar_type(),
                     " differs from output dtype ", b.scalar_type());
  }

  // all_gather_into_tensor's output, reduce_scatter_tensor's input: one `each` per rank.
  void holdsOnePerRank(const at::Tensor& whole, const char* wholeName, const at::Tensor& each,
                       const char* eachName) const {
    TORCH_CHECK_VALUE(whole.defined() && each.defined(), where(), "got an undefined tensor");
    TORCH_CHECK_VALUE(whole.numel() == each.numel() * size_, where(), wholeName, " has ", whole.numel(),
                      " elements but the group of ", size_, " ranks with ", each.numel(), " ", eachName,
                      " elements each needs ", each.numel() * size_);
  }

  void root(int64_t root) const {
    TORCH_CHECK_VALUE(root >= 0 && root < size_, where(), "root rank ", root,
                      " is outside the group of ", size_);
  }

  DataType reducible(const at::Tensor& t) const {
    auto dtype = mapDtype(t.scalar_type());
    TORCH_CHECK_TYPE(dtype.has_value(), where(), "unsupported dtype ", t.scalar_type(),
                     " for a reduction (supported: float64, float32, float16, bfloat16, int8, "
                     "uint8, int16, int32, int64, bool)");
    return *dtype;
  }

  ReduceSpec reduceOp(const ::c10d::ReduceOp& op, const at::Tensor& t) const {
    const DataType dtype = reducible(t);
    const bool floating = isFloating(dtype);
    ReduceSpec spec;
    switch (op.op_) {
      case ::c10d::ReduceOp::SUM: spec.op = ReduceOp::kSum; break;
      case ::c10d::ReduceOp::PRODUCT: spec.op = ReduceOp::kProduct; break;
      case ::c10d::ReduceOp::MIN: spec.op = ReduceOp::kMin; break;
      case ::c10d::ReduceOp::MAX: spec.op = ReduceOp::kMax; break;
      case ::c10d::ReduceOp::BAND: spec.op = ReduceOp::kBand; break;
      case ::c10d::ReduceOp::BOR: spec.op = ReduceOp::kBor; break;
      case ::c10d::ReduceOp::BXOR: spec.op = ReduceOp::kBxor; break;
      case ::c10d::ReduceOp::AVG:
        TORCH_CHECK_TYPE(dtype != DataType::kBool, where(), "AVG is not defined for bool");
        spec.average = true;
        break;
      case ::c10d::ReduceOp::PREMUL_SUM: {
        TORCH_CHECK_TYPE(floating, where(), "PREMUL_SUM needs a floating dtype, got ", t.scalar_type());
        // Newer torch (2.13) calls it PreMulSumSupplement and keeps the old name as an alias;
        // torch 2.11 has only the old name.
        auto* supplement = dynamic_cast<::c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
        TORCH_CHECK_VALUE(supplement != nullptr, where(), "PREMUL_SUM without a factor");
        spec.preScale = supplement->tensor_factor.defined()
                            ? supplement->tensor_factor.item<double>()
                            : supplement->double_factor;
        break;
      }
      default:
        TORCH_CHECK_VALUE(false, where(), "unsupported reduce op ", static_cast<int>(op.op_));
    }
    const bool bitwise = spec.op == ReduceOp::kBand || spec.op == ReduceOp::kBor || spec.op == ReduceOp::kBxor;
    TORCH_CHECK_TYPE(!(bitwise && floating), where(), "bitwise reduce ops need an integer or bool dtype, got ",
                     t.scalar_type());
    return spec;
  }

 private:
  int rank_;
  int size_;
  const char* op_;
};

void applyAverage(const at::Tensor& t, int size) {
  if (at::isFloatingType(t.scalar_type())) {
    t.div_(size);
  } else {
    t.div_(size, "trunc");
  }
}

at::Tensor preScaled(const at::Tensor& t, const ReduceSpec& spec, bool inPlace) {
  if (!spec.preScale) return t;
  return inPlace ? t.mul_(*spec.preScale) : t.mul(*spec.preScale);
}

// This rank's queued op as the op stamps compare it (core/algorithms/queued_stamp.h); the worker
// adds what depends on the group's options when the op runs (stampForRun). `spec` is null for ops
// that reduce nothing.
algorithms::QueuedStamp stampOf(transport::OpKind kind, DataType dtype, size_t count, const ReduceSpec* spec,
                                std::optional<codecs::Codec> codec, int root) {
  transport::OpSignature signature;
  signature.kind = kind;
  signature.dtype = static_cast<uint8_t>(dtype);
  signature.reduceOp = spec != nullptr ? static_cast<uint8_t>(spec->op) : 0;
  signature.codec = transport::signatureCodec(codec);
  signature.root = root;
  signature.count = count;
  return algorithms::makeQueuedStamp(signature, spec != nullptr && spec->average);
}

// The queued all-reduce a group's options run: tree or rhd when it asks for one, else the ring (auto
// has no measured GPU costs to choose by yet).
Algorithm queuedAllreduceAlgorithm(const Config& config) {
  return config.algorithm == Algorithm::kTree || config.algorithm == Algorithm::kRhd ? config.algorithm
                                                                                      : Algorithm::kRing;
}

#if PYCOMM_WITH_CUDA
// `stamp` completed with the options it runs under, read on the worker as the op's body reads them
// (set_algorithm takes effect there): the algorithm where it decides the transfers (an
// uncompressed all-reduce), and the chunk size.
algorithms::QueuedStamp stampForRun(algorithms::QueuedStamp stamp, const Config& config) {
  if (stamp.signature.kind == transport::OpKind::kAllreduce && stamp.signature.codec == 0) {
    stamp.algorithm = static_cast<uint8_t>(queuedAllreduceAlgorithm(config));
  }
  stamp.chunkBytes = config.chunkBytes;
  return stamp;
}
#endif

// A scratch area of `bytes` on the device of `like`, for a queued schedule.
at::Tensor deviceScratch(const at::Tensor& like, size_t bytes) {
  return at::empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))}, like.options().dtype(at::kByte));
}

// An all-reduce of a device tensor over a queued link (NCCL), in place: the group's compression
// when it applies, else queuedAllreduceAlgorithm's. Each gives the bits the CPU algorithm of the
// same name gives.
void deviceAllreduce(algorithms::QueuedLink& link, const at::Tensor& tensor, const ReduceSpec& spec, DataType dtype,
                     std::optional<codecs::Codec> codec, const Config& config) {
  namespace queued = algorithms::queued;
  const Contiguous c(tensor);
  const at::Tensor& flat = c.flat;
  const size_t count = static_cast<size_t>(flat.numel());
  auto scratch = [&](size_t bytes) { return deviceScratch(flat, bytes); };
  if (codec) {
    at::Tensor area = scratch(queued::compressedScratchBytes(count, link.size(), link.rank(), *codec, config.chunkBytes));
    queued::compressedAllreduce(link, flat.data_ptr<float>(), area.data_ptr<uint8_t>(), count, *codec, spec.average,
                                config.chunkBytes);
    c.copyBack();
    return;
  }
  preScaled(flat, spec, true);
  auto* data = static_cast<uint8_t*>(flat.data_ptr());
  const Algorithm algorithm = queuedAllreduceAlgorithm(config);
  if (algorithm == Algorithm::kTree) {
    const size_t chunkElems = std::max<size_t>(1, config.chunkBytes / elementSize(dtype));
    at::Tensor area = scratch(queued::treeScratchBytes(count, chunkElems, dtype));
    queued::treeAllreduce(link, data, area.data_ptr<uint8_t>(), count, dtype, spec.op, chunkElems);
  } else if (algorithm == Algorithm::kRhd) {
    // The CPU rhd's choice of mode, so the bits are its bits.
    const bool halving = count * elementSize(dtype) >= algorithms::kRhdHalvingThreshold;
    at::Tensor area = scratch(queued::rhdScratchBytes(count, dtype));
    queued::rhdAllreduce(link, data, area.data_ptr<uint8_t>(), count, dtype, spec.op, halving);
  } else {
    at::Tensor area = scratch(queued::ringScratchBytes(algorithms::Segments(count, link.size()), dtype));
    queued::ringAllreduce(link, data, area.data_ptr<uint8_t>(), count, dtype, spec.op);
  }
  if (spec.average) applyAverage(flat, link.size());
  c.copyBack();
}

// all_gather_into_tensor over a queued link: the ring, or the group's compression (float32).
// `input` may be this rank's block of `output` (FSDP's pattern).
void deviceAllgather(algorithms::QueuedLink& link, const at::Tensor& input, const at::Tensor& output,
                     std::optional<codecs::Codec> codec) {
  namespace queued = algorithms::queued;
  const Contiguous in(input), out(output);
  const int64_t n = in.flat.numel();
  if (codec) {
    at::Tensor area = deviceScratch(out.flat, queued::compressedAllgatherScratchBytes(n, link.size(), *codec));
    queued::compressedAllgather(link, in.flat.data_ptr<float>(), out.flat.data_ptr<float>(), area.data_ptr<uint8_t>(),
                                n, *codec);
  } else {
    out.flat.view(-1).narrow(0, link.rank() * n, n).copy_(in.flat.view(-1));
    queued::ringAllgather(link, static_cast<uint8_t*>(out.flat.data_ptr()),
                          algorithms::Segments(in.flat.nbytes(), link.size(), true), 1);
  }
  out.copyBack();
}

// reduce_scatter_tensor over a queued link: the ring on a copy of `input` (it reduces in place), or
// the group's compression (float32, SUM or AVG). `input` is left as it was.
void deviceReduceScatter(algorithms::QueuedLink& link, const at::Tensor& input, const at::Tensor& output,
                         const ReduceSpec& spec, DataType dtype, std::optional<codecs::Codec> codec) {
  namespace queued = algorithms::queued;
  const int p = link.size();
  const Contiguous out(output);
  const size_t n = static_cast<size_t>(out.flat.numel());
  if (codec) {
    const at::Tensor in = input.contiguous();
    at::Tensor area = deviceScratch(out.flat, queued::compressedReduceScatterScratchBytes(n, p, *codec));
    queued::compressedReduceScatter(link, in.data_ptr<float>(), out.flat.data_ptr<float>(), area.data_ptr<uint8_t>(),
                                    n, *codec, spec.average);
  } else {
    at::Tensor work = preScaled(input.contiguous().view(-1), spec, false);
    if (work.data_ptr() == input.data_ptr()) work = work.clone();
    const algorithms::Segments blocks(n, p, true);
    at::Tensor area = deviceScratch(out.flat, queued::ringScratchBytes(blocks, dtype));
    queued::ringReduceScatter(link, static_cast<uint8_t*>(work.data_ptr()), area.data_ptr<uint8_t>(), blocks, dtype,
                              spec.op);
    out.flat.view(-1).copy_(work.narrow(0, link.rank() * static_cast<int64_t>(n), static_cast<int64_t>(n)));
    if (spec.average) applyAverage(out.flat, p);
  }
  out.copyBack();
}

c10::TypePtr tensorListType() { return c10::ListType::create(c10::TensorType::get()); }

// Every tensor of an op, for the device check.
std::vector<at::Tensor> allOf(std::initializer_list<std::vector<at::Tensor>> lists,
                              std::initializer_list<std::vector<std::vector<at::Tensor>>> nested = {}) {
  std::vector<at::Tensor> all;
  for (const auto& list : lists) all.insert(all.end(), list.begin(), list.end());
  for (const auto& outer : nested) {
    for (const auto& list : outer) all.insert(all.end(), list.begin(), list.end());
  }
  return all;
}

// Set by runStaged for the submit() of the op it runs, on the same thread.
thread_local std::shared_ptr<DeviceStaging> pendingStaging;

std::vector<std::shared_ptr<DeviceStaging>> stagingsOf(const std::shared_ptr<DeviceStaging>& staging) {
  if (!staging) return {};
  return {staging};
}

// Copies `tensors` end to end into `flat` (their total size). memcpy for contiguous ones: a
// dispatched copy_ per tensor costs microseconds, which a thousand small gradients add up.
void packInto(const std::vector<at::Tensor>& tensors, const at::Tensor& flat) {
  auto* out = static_cast<uint8_t*>(flat.data_ptr());
  int64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.is_contiguous() && t.scalar_type() == flat.scalar_type()) {
      if (t.numel() > 0) std::memcpy(out + offset * t.element_size(), t.data_ptr(), t.nbytes());
    } else {
      flat.narrow(0, offset, t.numel()).view(t.sizes()).copy_(t);
    }
    offset += t.numel();
  }
}

// The inverse of packInto: `flat` (contiguous) into tensors laid out one after another.
void scatterInto(const at::Tensor& flat, const std::vector<at::Tensor>& tensors) {
  const auto* in = static_cast<const uint8_t*>(flat.data_ptr());
  int64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.is_contiguous() && t.scalar_type() == flat.scalar_type()) {
      if (t.numel() > 0) std::memcpy(t.data_ptr(), in + offset * t.element_size(), t.nbytes());
    } else {
      t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
    }
    offset += t.numel();
  }
}

at::Tensor flatten(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> parts;
  parts.reserve(tensors.size());
  for (const auto& t : tensors) parts.push_back(t.reshape({-1}));
  return at::cat(parts);
}

}  // namespace

PycommBackend::PycommBackend(const c10::intrusive_ptr<::c10d::Store>& store, const Config& config)
    : Backend(config.rank, config.size) {
  C10dStore adapter(store);
  comm_ = std::make_shared<Communicator>(config, adapter);
  store_ = store;
}

PycommBackend::~PycommBackend() { comm_->shutdown(); }

void PycommBackend::setTimeout(std::chrono::milliseconds timeout) { comm_->setTimeout(timeout); }

void PycommBackend::shutdown() { comm_->shutdown(); }

void PycommBackend::setAlgorithm(const std::string& name) {
  const Algorithm algorithm = parseAlgorithm(name);
  auto comm = comm_;
  comm_->enqueue([comm, algorithm] { comm->setAlgorithm(algorithm); });
}

void PycommBackend::abort() {
#if PYCOMM_WITH_CUDA
  // The worker may be waiting for an NCCL op: it aborts the NCCL communicator itself.
  if (auto nccl = std::atomic_load(&nccl_)) nccl->requestAbort();
#endif
  comm_->abort("abort() was called");
}

void PycommBackend::rejectOnPeers(const std::exception& error) {
  if (overrideCall.depth != 0 || overrideCall.submitted || overrideCall.deviceRoute) return;
  const auto* torchError = dynamic_cast<const c10::Error*>(&error);
  std::string message = torchError != nullptr ? torchError->what_without_backtrace() : error.what();
  auto comm = comm_;
  try {
    comm_->enqueue([comm, message = std::move(message)] { comm->rejectCollective(message); });
  } catch (const Error&) {
    // The group was shut down: no peer waits for this op, and the caller gets its own error.
  }
}

void PycommBackend::enqueueWork(const c10::intrusive_ptr<PycommWork>& work, std::function<void()> body,
                                bool inlineOk, std::shared_ptr<DeviceStaging> staging) {
  overrideCall.submitted = true;
  bool coalescing;
  {
    std::lock_guard<std::mutex> lock(coalesceMutex_);
    coalescing = coalescing_;
    if (coalescing) coalesced_.push_back(work);
  }
  auto task = [work, body = std::move(body), staging] {
    try {
      // Results are written below autograd, as a backend does (gloo writes through raw pointers):
      // a leaf that requires grad (a parameter, non-contiguous here) may be written, and so may a
      // tensor made under inference mode, which this thread (the worker, usually) is not in. Only
      // the op's writes: the future's callbacks, run by complete(), get autograd as usual.
      const at::AutoDispatchBelowADInplaceOrView belowAutograd;
      if (staging) staging->copyIn();
      body();
      if (staging) staging->copyOut();
    } catch (const std::exception&) {
      work->complete(std::current_exception());  // rethrown to the caller by wait()
      return;
    }
    work->complete(nullptr);
  };
  // A staged op waits for the caller's stream: on the worker, so the caller's thread does not.
  if (inlineOk && !coalescing && !staging) {
    comm_->runOrEnqueue(std::move(task));
  } else {
    comm_->enqueue(std::move(task));
  }
}

c10::intrusive_ptr<PycommWork> PycommBackend::submit(OpType opType, const char* title,
                                                     std::vector<at::Tensor> outputs,
                                                     std::function<void()> body, bool inlineOk) {
  auto staging = std::exchange(pendingStaging, nullptr);
  if (staging) {
    for (auto& t : outputs) t = staging->deviceFor(t);
  }
  auto work = c10::make_intrusive<PycommWork>(rank_, opType, title, c10::IValue(std::move(outputs)),
                                              tensorListType(), stagingsOf(staging));
  enqueueWork(work, std::move(body), inlineOk, staging);
  return work;
}

c10::intrusive_ptr<PycommWork> PycommBackend::submitNested(OpType opType, const char* title,
                                                           std::vector<std::vector<at::Tensor>> outputs,
                                                           std::function<void()> body) {
  auto staging = std::exchange(pendingStaging, nullptr);
  if (staging) {
    for (auto& list : outputs) {
      for (auto& t : list) t = staging->deviceFor(t);
    }
  }
  auto work = c10::make_intrusive<PycommWork>(rank_, opType, title, c10::IValue(std::move(outputs)),
                                              c10::ListType::create(tensorListType()), stagingsOf(staging));
  enqueueWork(work, std::move(body), false, staging);
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

c10::intrusive_ptr<::c10d::Work> PycommBackend::runStaged(
    std::shared_ptr<DeviceStaging> staging, const std::function<c10::intrusive_ptr<::c10d::Work>()>& cpuOp) {
  struct Handoff {
    explicit Handoff(std::shared_ptr<DeviceStaging> s) { pendingStaging = std::move(s); }
    ~Handoff() { pendingStaging = nullptr; }
  } handoff(std::move(staging));
  auto work = cpuOp();
  TORCH_INTERNAL_ASSERT(pendingStaging == nullptr, "pycomm: a staged op did not submit its work");
  return work;
}

std::shared_ptr<cuda::NcclComm> PycommBackend::ncclFor(c10::Device device) {
#if PYCOMM_WITH_CUDA
  // NCCL ops take no sequence number of the CPU transports; the decision itself runs on the
  // worker for every rank alike. Neither may be followed by a rejected CPU op (see
  // rejectOnPeers); a staged op's CPU override is, as it clears this.
  overrideCall.deviceRoute = true;
  std::lock_guard<std::mutex> lock(deviceRouteMutex_);
  const std::string where = strCat("pycomm [rank ", rank_, "/", size_, "] ");
  // A failed decision or NCCL setup fails every later CUDA collective the same way: deciding
  // again on one rank alone would part it from the others.
  if (deviceRouteError_) std::rethrow_exception(deviceRouteError_);
  if (!deviceRouteDecided_) try {
    // What each rank brings: whether it can use NCCL, and which GPU on which host it has.
    struct Record {
      char canUseNccl;
      char askedForNccl;  // cuda_transport=nccl
      char busId[30];
      char host[96];
      // The options the NCCL schedules depend on. Nothing on NCCL's wire says which schedule a
      // transfer belongs to, so ranks that disagree would pair wrong transfers; the TCP path
      // catches that in each frame's signature.
      uint8_t algorithm;
      uint8_t codec;  // transport::signatureCodec
      uint64_t chunkBytes;
    };
    Record mine{};
    std::string why;
    const DeviceTransport setting = comm_->config().deviceTransport;
    mine.askedForNccl = setting == DeviceTransport::kNccl;
    if (setting == DeviceTransport::kStaged) {
      why = "cuda_transport=staged";
    } else {
      try {
        cuda::NcclLibrary::load();
        mine.canUseNccl = 1;
      } catch (const Error& e) {
        why = e.what();  // every rank learns it from the exchange below, and all stage (or fail)
      }
    }
    TORCH_CHECK(cudaDeviceGetPCIBusId(mine.busId, sizeof(mine.busId), device.index()) == cudaSuccess, where,
                "cannot read the PCI bus id of ", device);
    // The host identity the shared-memory transport uses (host, boot, network namespace).
    std::strncpy(mine.host, comm_->config().hostId.c_str(), sizeof(mine.host) - 1);
    std::vector<Record> all(size_);
    // Through the worker, in issue order with the group's other ops.
    std::promise<void> exchanged;
    comm_->runOrEnqueue([&] {
      try {
        // Read here, on the worker: the options in effect at this point of the group's sequence.
        const Config& config = comm_->config();
        mine.algorithm = static_cast<uint8_t>(config.algorithm);
        mine.codec = transport::signatureCodec(config.compression);
        mine.chunkBytes = config.chunkBytes;
        comm_->allgather(&mine, all.data(), sizeof(Record), DataType::kUInt8);
        exchanged.set_value();
      } catch (const std::exception&) {
        exchanged.set_exception(std::current_exception());
      }
    });
    exchanged.get_future().get();
    // Several ranks on one GPU is NCCL's one refusal that can be seen beforehand; auto stages
    // then. cuda_transport=nccl skips the check: NCCL runs ranks on one GPU when NCCL_HOSTID
    // differs from rank to rank (it takes them for separate hosts), which is how the tests run it
    // on one GPU.
    // Decided from the gathered records only, so every rank decides alike.
    bool askedForNccl = false;
    for (const auto& record : all) askedForNccl = askedForNccl || record.askedForNccl;
    const bool allowSameGpu = askedForNccl;
    bool useNccl = true;
    for (int r = 0; r < size_ && useNccl; ++r) {
      if (!all[r].canUseNccl) {
        useNccl = false;
        if (why.empty()) why = strCat("rank ", r, " cannot use NCCL");
      }
      for (int q = 0; q < r && useNccl && !allowSameGpu; ++q) {
        if (std::strncmp(all[q].host, all[r].host, sizeof(Record::host)) == 0 &&
            std::strncmp(all[q].busId, all[r].busId, sizeof(Record::busId)) == 0) {
          useNccl = false;
          why = strCat("ranks ", q, " and ", r, " share the GPU ", all[r].busId, " (NCCL needs one per rank)");
        }
      }
    }
    TORCH_CHECK(useNccl || !askedForNccl, where, "cuda_transport=nccl, but ", why);
    auto options = [](const Record& record) {
      const auto codec = transport::codecOfSignature(record.codec);
      return strCat("algorithm=", algorithmName(static_cast<Algorithm>(record.algorithm)), ", compression=",
                    codec ? codecs::codecName(*codec) : record.codec == 0 ? "none" : "unknown",
                    ", chunk_bytes=", record.chunkBytes);
    };
    for (int r = 1; r < size_ && useNccl; ++r) {
      TORCH_CHECK_VALUE(options(all[r]) == options(all[0]), where, "ranks 0 and ", r,
                        " would run CUDA collectives over NCCL with different options (", options(all[0]), " vs ",
                        options(all[r]), "); every rank must pass the same Options");
    }
    if (useNccl) {
      const cuda::NcclLibrary& library = cuda::NcclLibrary::load();
      C10dStore adapter(store_);
      std::atomic_store(&nccl_, std::make_shared<cuda::NcclComm>(library, adapter, "pycomm/nccl", rank_, size_,
                                                                 device.index(), comm_->timeout()));
      comm_->logger().log(LogLevel::kInfo,
                          strCat("CUDA all-reduce (compressed too), broadcast, all_gather_into_tensor, "
                                 "reduce_scatter_tensor and all_to_all_single run over NCCL point-to-point (",
                                 library.path(), ", version ", library.version(), ")"));
    } else {
      comm_->logger().log(LogLevel::kInfo, strCat("CUDA collectives are staged through host memory: ", why));
    }
    deviceRouteDecided_ = true;
  } catch (const std::exception&) {
    deviceRouteError_ = std::current_exception();
    throw;
  }
  if (!nccl_) {
    overrideCall.deviceRoute = false;  // staged: the op runs over the CPU transports after all
    return nullptr;
  }
  TORCH_CHECK_VALUE(device.index() == nccl_->device(), where, "this group's NCCL communicator is on cuda:",
                    nccl_->device(), ", the op's tensors on ", device, "; a group uses one GPU per rank");
  return nccl_;
#else
  (void)device;
  TORCH_CHECK(comm_->config().deviceTransport != DeviceTransport::kNccl, "pycomm [rank ", rank_, "/", size_,
              "] cuda_transport=nccl, but this build of pycomm has no CUDA (pycomm.cuda_available() is False)");
  overrideCall.deviceRoute = false;  // always staged in this build: the CPU transports carry it
  return nullptr;
#endif
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::submitOnDevice(OpType opType, const char* title, const at::Tensor& output,
                                                               const std::vector<at::Tensor>& inputs,
                                                               std::shared_ptr<cuda::NcclComm> nccl,
                                                               const algorithms::QueuedStamp& stamp,
                                                               std::function<void(algorithms::QueuedLink& link)> body) {
#if PYCOMM_WITH_CUDA
  auto staging = beginStaging(output.device());  // the caller's stream now; nothing is staged
  staging->recordUse(output);
  for (const auto& t : inputs) staging->recordUse(t);
  auto comm = comm_;
  return runStaged(staging, [&] {
    return submit(opType, title, {output}, [staging, nccl, stamp, body = std::move(body), comm, title] {
      // The worker's copyIn() has ordered the stream after the caller's; allocations made here
      // (contiguous copies, scratch) belong to it.
      const c10::StreamGuard guard(staging->stream());
      const auto stream = static_cast<cudaStream_t>(staging->stream().native_handle());
      // An aborted communicator runs nothing more; checked before the stamps' buffers are touched, as
      // the aborted op's copies into them may still be queued.
      TORCH_CHECK(!nccl->aborted(), "pycomm [rank ", nccl->rank(), "/", nccl->size(), "] ", title,
                  ": the group's NCCL communicator was aborted by an earlier failure");
      try {
        cuda::NcclLink link(*nccl, stream);
        nccl->stamps().post(link, stampForRun(stamp, comm->config()), stream, title);
        body(link);
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
      } catch (const std::exception&) {
        // Part of the schedule may be queued: the peers' next steps would pair with the wrong
        // transfers. The group's CUDA collectives fail from here on.
        nccl->abort();
        throw;
      }
    });
  });
#else
  (void)opType, (void)title, (void)output, (void)inputs, (void)nccl, (void)stamp, (void)body;
  TORCH_INTERNAL_ASSERT(false, "pycomm: a device collective in a build without CUDA");
#endif
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
  // torch hands the caller this Work in place of the block's: its wait() orders the caller's
  // stream after every staged op of the block.
  std::vector<std::shared_ptr<DeviceStaging>> stagings;
  for (const auto& w : works) stagings.insert(stagings.end(), w->stagings().begin(), w->stagings().end());
  // Queued after every op of the block, so it completes after them; point-to-point ones are waited.
  auto work = c10::make_intrusive<PycommWork>(rank_, OpType::COALESCED, "pycomm:coalesced",
                                              c10::IValue(std::vector<at::Tensor>{}), tensorListType(),
                                              std::move(stagings));
  comm_->enqueue([work, works] {
    std::exception_ptr error;
    for (const auto& w : works) {
      try {
        w->waitHost();
      } catch (const std::exception&) {
        if (!error) error = std::current_exception();
      }
    }
    work->complete(error);
  });
  return work;
}

// ---------------------------------------------------------------------------------------------

c10::intrusive_ptr<::c10d::Work> PycommBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                          const ::c10d::BroadcastOptions& opts) try {
  const OverrideScope scope;
  Validator v(rank_, size_, "broadcast");
  if (auto device = v.deviceOf(tensors)) {
    if (auto nccl = ncclFor(*device)) {
      const at::Tensor& t = v.one(tensors);
      v.root(opts.rootRank);
      const int root = static_cast<int>(opts.rootRank);
      const size_t chunkBytes = comm_->config().chunkBytes;
      const Layout layout = movable(t);
      const auto stamp = stampOf(transport::OpKind::kBroadcast, layout.dtype, layout.count(t), nullptr, std::nullopt,
                                 root);
      return submitOnDevice(OpType::BROADCAST, "pycomm:broadcast", t, {}, nccl, stamp,
                            [t, root, chunkBytes](algorithms::QueuedLink& link) {
                              Contiguous c(t);
                              algorithms::queued::chainBroadcast(link, static_cast<uint8_t*>(c.flat.data_ptr()),
                                                                 c.flat.nbytes(), root, chunkBytes);
                              c.copyBack();
                            });
    }
    auto staging = beginStaging(*device);
    auto host = staging->stage(tensors, rank_ == opts.rootRank, rank_ != opts.rootRank);
    return runStaged(staging, [&] { return broadcast(host, opts); });
  }
  const at::Tensor& t = v.single(tensors);
  v.root(opts.rootRank);
  const Layout layout = movable(t);
  Contiguous c(t);
  auto comm = comm_;
  const int root = static_cast<int>(opts.rootRank);
  return submit(OpType::BROADCAST, "pycomm:broadcast", {t}, [comm, c, layout, root] {
    comm->broadcast(c.flat.data_ptr(), layout.count(c.flat), layout.dtype, root);
    c.copyBack();
  }, !opts.asyncOp);
} catch (const std::exception& error) {
  rejectOnPeers(error);
  throw;
}

std::optional<codecs::Codec> PycommBackend::compressionFor(const at::Tensor& t,
                                                            const ::c10d::ReduceOp* op) const {
  const auto& codec = comm_->config().compression;
  if (!codec || t.scalar_type() != at::kFloat) return std::nullopt;
  if (op != nullptr && op->op_ != ::c10d::ReduceOp::SUM && op->op_ != ::c10d::ReduceOp::AVG) return std::nullopt;
  return codec;
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::allreduceCompressed(const at::Tensor& tensor,
                                                                    const ::c10d::ReduceOp& op,
                                                                    const std::string& codecName,
                                                                    const std::optional<at::Tensor>& residual) try {
  const OverrideScope scope;
  Validator v(rank_, size_, "allreduce");
  const auto device = v.deviceOf({tensor});
  if (!device) v.tensor(tensor);
  if (residual) {
    TORCH_CHECK_VALUE(!device && residual->device().is_cpu(), v.where(),
                      "error feedback in the core (residual=) takes CPU tensors; got ", tensor.device(), " and ",
                      residual->device());
    TORCH_CHECK_VALUE(residual->scalar_type() == at::kFloat && residual->is_contiguous() &&
                          residual->numel() == tensor.numel(),
                      v.where(), "residual must be a contiguous float32 tensor of ", tensor.numel(),
                      " elements, got ", residual->scalar_type(), " of ", residual->numel(),
                      residual->is_contiguous() ? "" : " (not contiguous)");
    TORCH_CHECK_VALUE(!residual->requires_grad(), v.where(), "residual must not require grad (it is state the op writes)");
    // The core writes both; a non-contiguous tensor is also written back through its views.
    const bool sameStorage = residual->storage().is_alias_of(tensor.storage());
    TORCH_CHECK_VALUE(tensor.numel() == 0 || !sameStorage ||
                          at::get_overlap_status(*residual, tensor) == at::MemOverlapStatus::No,
                      v.where(), "residual must not share memory with the tensor");
  }
  TORCH_CHECK_TYPE(tensor.scalar_type() == at::kFloat, v.where(), "compression needs a float32 tensor, got ",
                   tensor.scalar_type());
  TORCH_CHECK_VALUE(op.op_ == ::c10d::ReduceOp::SUM || op.op_ == ::c10d::ReduceOp::AVG, v.where(),
                    "compressed all-reduce supports SUM and AVG only");
  codecs::Codec codec;
  try {
    codec = codecs::codecFromName(codecName);
  } catch (const InvalidUsageError& e) {
    TORCH_CHECK_VALUE(false, v.where(), e.what());
  }
  const bool average = op.op_ == ::c10d::ReduceOp::AVG;
  auto comm = comm_;
  if (device) {
    if (auto nccl = ncclFor(*device)) {
      ReduceSpec spec;
      spec.average = average;
      const auto stamp =
          stampOf(transport::OpKind::kAllreduce, DataType::kFloat32, static_cast<size_t>(tensor.numel()), &spec, codec, -1);
      return submitOnDevice(OpType::ALLREDUCE, "pycomm:all_reduce_compressed", tensor, {}, nccl, stamp,
                            [tensor, spec, codec, comm](algorithms::QueuedLink& link) {
                              deviceAllreduce(link, tensor, spec, DataType::kFloat32, codec, comm->config());
                            });
    }
    auto staging = beginStaging(*device);
    auto host = staging->stage(tensor, true, true);
    return runStaged(staging, [&] { return allreduceCompressed(host, op, codecName); });
  }
  Contiguous c(tensor);
  const at::Tensor kept = residual ? *residual : at::Tensor();  // alive until the op ran
  return submit(OpType::ALLREDUCE, "pycomm:all_reduce_compressed", {tensor}, [comm, c, codec, average, kept] {
    comm->allreduceCompressed(c.flat.data_ptr<float>(), c.flat.numel(), codec, average,
                              kept.defined() ? kept.data_ptr<float>() : nullptr);
    c.copyBack();
  });
} catch (const std::exception& error) {
  rejectOnPeers(error);
  throw;
}

bool PycommBackend::allreducePiecesNow(const std::vector<at::Tensor>& bucket, const ::c10d::ReduceOp& op) {
  Validator v(rank_, size_, "allreduce_coalesced");
  if (!comm_->allreducesInSharedMemory() || compressionFor(bucket[0], &op)) return false;
  const ReduceSpec spec = v.reduceOp(op, bucket[0]);
  std::vector<BufferList::Piece> pieces;
  pieces.reserve(bucket.size());
  for (const auto& t : bucket) {
    if (!t.is_contiguous()) return false;
    if (t.nbytes() > 0) pieces.push_back({static_cast<uint8_t*>(t.data_ptr()), t.nbytes()});
  }
  // Tensors that share memory (the same one twice, overlapping views) would read results written
  // for an earlier chunk; packing snapshots them first.
  auto byAddress = pieces;
  std::sort(byAddress.begin(), byAddress.end(),
            [](const auto& a, const auto& b) { return std::less<const uint8_t*>()(a.data, b.data); });
  for (size_t i = 1; i < byAddress.size(); ++i) {
    if (byAddress[i - 1].data + byAddress[i - 1].bytes > byAddress[i].data) return false;
  }
  const DataType dtype = v.reducible(bucket[0]);
  // The tensors are the buffer, so PREMUL_SUM scales them in place; this happens only once the
  // bucket is certain to run here (the packed path would scale its copy a second time).
  for (const auto& t : bucket) preScaled(t, spec, true);
  const bool ran = comm_->allreducePieces(BufferList(pieces), dtype, spec.op);
  TORCH_INTERNAL_ASSERT(ran, v.where(), "shared memory declined a bucket it had accepted");
  if (spec.average) {
    for (const auto& t : bucket) applyAverage(t, size_);
  }
  return true;
}

at::Tensor PycommBackend::bucketStaging(at::ScalarType type, size_t nbytes) {
  const int64_t numel = static_cast<int64_t>(nbytes / c10::elementSize(type));
  // Empty tensors do not close a bucket, so one can still outgrow bucket_bytes: not worth keeping.
  if (nbytes > comm_->config().bucketBytes) return at::empty({numel}, at::TensorOptions().dtype(type));
  at::Tensor& staging = bucketStaging_[type];
  if (!staging.defined() || staging.numel() < numel) staging = at::empty({numel}, at::TensorOptions().dtype(type));
  return staging.narrow(0, 0, numel);
}

void PycommBackend::allreduceNow(const at::Tensor& tensor, const ::c10d::ReduceOp& op) {
  Validator v(rank_, size_, "allreduce");
  if (auto codec = compressionFor(tensor, &op)) {
    Contiguous c(tensor);
    comm_->allreduceCompressed(c.flat.data_ptr<float>(), c.flat.numel(), *codec, op.op_ == ::c10d::ReduceOp::AVG);
    c.copyBack();
    return;
  }
  const ReduceSpec spec = v.reduceOp(op, tensor);
  const DataType dtype = v.reducible(tensor);
  Contiguous c(tensor);
  preScaled(c.flat, spec, true);
  comm_->allreduce(c.flat.data_ptr(), c.flat.numel(), dtype, spec.op);
  if (spec.average) applyAverage(c.flat, size_);
  c.copyBack();
}

void PycommBackend::allreduceSparseNow(const at::Tensor& tensor) {
  const at::Tensor input = tensor.coalesce();
  const at::Tensor indices = input._indices().contiguous();  // [sparse_dim, nnz], int64
  const at::Tensor values = input._values().contiguous();    // [nnz, dense dims...]
  // Every rank's nnz and shape, so mismatched shapes fail here rather than in the sum.
  constexpr int kMaxDims = 8;
  std::vector<int64_t> header(4 + kMaxDims, -1);
  header[0] = values.size(0);
  header[1] = input.sparse_dim();
  header[2] = input.dense_dim();
  header[3] = input.dim();
  for (int64_t d = 0; d < input.dim(); ++d) header[4 + d] = input.size(d);
  std::vector<int64_t> headers(header.size() * size_);
  comm_->allgather(header.data(), headers.data(), header.size(), DataType::kInt64);
  int64_t maxNnz = 0;
  for (int r = 0; r < size_; ++r) {
    const int64_t* theirs = headers.data() + r * header.size();
    TORCH_CHECK_VALUE(std::equal(header.begin() + 1, header.end(), theirs + 1),
                      Validator(rank_, size_, "allreduce (sparse)").where(), "this rank's tensor has shape ",
                      input.sizes(), " with ", header[1], " sparse dims; rank ", r, "'s differs");
    maxNnz = std::max(maxNnz, theirs[0]);
  }
  // Indices and values of every rank, padded to the largest nnz, gathered in rank order.
  const int64_t sparseDim = input.sparse_dim();
  at::Tensor myIndices = at::zeros({sparseDim, maxNnz}, indices.options());
  myIndices.narrow(1, 0, indices.size(1)).copy_(indices);
  at::Tensor allIndices = at::empty({size_, sparseDim, maxNnz}, indices.options());
  comm_->allgather(myIndices.data_ptr(), allIndices.data_ptr(), static_cast<size_t>(myIndices.numel()),
                   DataType::kInt64);
  std::vector<int64_t> paddedShape = values.sizes().vec();
  paddedShape[0] = maxNnz;
  at::Tensor myValues = at::zeros(paddedShape, values.options());
  myValues.narrow(0, 0, values.size(0)).copy_(values);
  std::vector<int64_t> allShape = paddedShape;
  allShape.insert(allShape.begin(), size_);
  at::Tensor allValues = at::empty(allShape, values.options());
  const Layout layout = movable(myValues);
  comm_->allgather(myValues.data_ptr(), allValues.data_ptr(), layout.count(myValues), layout.dtype);
  std::vector<at::Tensor> indexParts, valueParts;
  for (int r = 0; r < size_; ++r) {
    const int64_t nnz = headers[r * header.size()];
    indexParts.push_back(allIndices[r].narrow(1, 0, nnz));
    valueParts.push_back(allValues[r].narrow(0, 0, nnz));
  }
  // The same concatenation on every rank, so coalesce() adds duplicates in the same order everywhere.
  const at::Tensor sum =
      at::_sparse_coo_tensor_unsafe(at::cat(indexParts, 1), at::cat(valueParts, 0), input.sizes(), values.options())
          .coalesce();
  tensor.copy_(sum);
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                          const ::c10d::AllreduceOptions& opts) try {
  const OverrideScope scope;
  Validator v(rank_, size_, "allreduce");
  if (tensors.size() == 1 && tensors[0].defined() && tensors[0].layout() == at::kSparse) {
    // What gloo does for sparse gradients (DDP with sparse embeddings): gather every rank's entries,
    // add them up. SUM only, CPU only, as in gloo.
    const at::Tensor& t = tensors[0];
    TORCH_CHECK_VALUE(t.device().is_cpu(), v.where(), "sparse tensors are supported on the CPU only, got one on ",
                      t.device());
    TORCH_CHECK_VALUE(opts.reduceOp == ::c10d::ReduceOp::SUM, v.where(), "sparse tensors support SUM only");
    TORCH_CHECK_VALUE(t.dim() <= 8, v.where(), "sparse tensors of at most 8 dims, got ", t.dim());
    return submit(OpType::ALLREDUCE, "pycomm:all_reduce_sparse", {t}, [self = selfRef(), t] { self->allreduceSparseNow(t); },
                  !opts.asyncOp);
  }
  if (auto device = v.deviceOf(tensors)) {
    if (auto nccl = ncclFor(*device)) {
      const at::Tensor& t = v.one(tensors);
      const ReduceSpec spec = v.reduceOp(opts.reduceOp, t);
      const DataType dtype = v.reducible(t);
      const auto codec = compressionFor(t, &opts.reduceOp);
      auto comm = comm_;
      const auto stamp = stampOf(transport::OpKind::kAllreduce, dtype, static_cast<size_t>(t.numel()), &spec, codec, -1);
      return submitOnDevice(OpType::ALLREDUCE, "pycomm:all_reduce", t, {}, nccl, stamp,
                            [t, spec, dtype, codec, comm](algorithms::QueuedLink& link) {
                              deviceAllreduce(link, t, spec, dtype, codec, comm->config());
                            });
    }
    auto staging = beginStaging(*device);
    auto host = staging->stage(tensors, true, true);
    return runStaged(staging, [&] { return allreduce(host, opts); });
  }
  const at::Tensor& t = v.single(tensors);
  v.reduceOp(opts.reduceOp, t);  // validate now, on the caller's thread
  const ::c10d::ReduceOp op = opts.reduceOp;
  return submit(OpType::ALLREDUCE, "pycomm:all_reduce", {t}, [self = selfRef(), t, op] { self->allreduceNow(t, op); },
                !opts.asyncOp);
} catch (const std::exception& error) {
  rejectOnPeers(error);
  throw;
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const ::c10d::AllreduceCoalescedOptions& opts) try {
  const OverrideScope scope;
  Validator v(rank_, size_, "allreduce_coalesced");
  if (auto device = v.deviceOf(tensors)) {
    auto staging = beginStaging(*device);
    auto host = staging->stage(tensors, true, true);
    return runStaged(staging, [&] { return allreduce_coalesced(host, opts); });
  }
  for (const auto& t : tensors) {
    v.tensor(t);
    v.reduceOp(opts.reduceOp, t);
  }
  const ::c10d::ReduceOp op = opts.reduceOp;
  const size_t bucketBytes = comm_->config().bucketBytes;
  return submit(OpType::ALLREDUCE_COALESCED, "pycomm:all_reduce_coalesced", tensors,
                [self = selfRef(), tensors, op, bucketBytes] {
                  // Buckets of one dtype each, filled in the order given (the same on every rank),
                  // closed when the next tensor would overflow bucketBytes; one all-reduce per bucket.
                  std::map<at::ScalarType, std::vector<at::Tensor>> open;
                  std::map<at::ScalarType, size_t> openBytes;
                  auto flush = [&](at::ScalarType type) {
                    auto& bucket = open[type];
                    if (bucket.empty()) return;
                    if (bucket.size() == 1) {
                      self->allreduceNow(bucket[0], op);
                    } else if (!self->allreducePiecesNow(bucket, op)) {
                      at::Tensor flat = self->bucketStaging(type, openBytes[type]);
                      packInto(bucket, flat);
                      self->allreduceNow(flat, op);
                      scatterInto(flat, bucket);
                    }
                    bucket.clear();
                    openBytes[type] = 0;
                  };
                  for (const auto& t : tensors) {
                    const auto type = t.scalar_type();
                    if (openBytes[type] > 0 && openBytes[type] + t.nbytes() > bucketBytes) flush(type);
                    open[type].push_back(t);
                    openBytes[type] += t.nbytes();
                  }
                  // Close the remaining buckets in first-seen dtype order.
                  std::vector<at::ScalarType> order;
                  for (const auto& t : tensors) {
                    if (std::find(order.begin(), order.end(), t.scalar_type()) == order.end()) order.push_back(t.scalar_type());
                  }
                  for (auto type : order) flush(type);
                });
} catch (const std::exception& error) {
  rejectOnPeers(error);
  throw;
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::reduce(std::vector<at::Tensor>& tensors,
                                                       const ::c10d::ReduceOptions& opts) try {
  const OverrideScope scope;
  Validator v(rank_, size_, "reduce");
  if (auto device = v.deviceOf(tensors)) {
    auto staging = beginStaging(*device);
    auto host = staging->stage(tensors, true, rank_ == opts.rootRank);
    return runStaged(staging, [&] { return reduce(host, opts); });
  }
  const at::Tensor& t = v.single(tensors);
  v.root(opts.rootRank);
  const ReduceSpec spec = v.reduceOp(opts.reduceOp, t);
  const DataType dtype = v.reducible(t);
  const int root = static_cast<int>(opts.rootRank);
  Contiguous c(t);
  auto comm = comm_;
  const int size = size_;
  const bool isRoot = rank_ == root;
  return submit(OpType::REDUCE, "pycomm:reduce", {t}, [comm, c, spec, dtype, root, size, isRoot] {
    // Scale a copy, so that a non-root rank's tensor stays as it was.
    at::Tensor work = preScaled(c.flat, spec, false);
    comm->reduce(work.data_ptr(), work.numel(), dtype, spec.op, root);
    if (!isRoot) return;
    if (!work.is_same(c.flat)) c.flat.copy_(work);
    if (spec.average) applyAverage(c.flat, size);
    c.copyBack();
  });
} catch (const std::exception& error) {
  rejectOnPeers(error);
  throw;
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const ::c10d::AllgatherOptions& opts) try {
  const OverrideScope scope;
  Validator v(rank_, size_, "allgather");
  if (auto device = v.deviceOf(allOf({inputs}, {outputs}))) {
    auto staging = beginStaging(*device);
    auto hostIn = staging->stage(inputs, true, false);
    auto hostOut = staging->stage(outputs, false, true);
    return runStaged(staging, [&] { return allgather(hostOut, hostIn, opts); });
  }
  const at::Tensor& in = v.single(inputs);
  TORCH_CHECK_VALUE(outputs.size() == 1 && outputs[0].size() == static_cast<size_t>(size_), v.where(),
                    "expects one list of ", size_, " output tensors");
  for (const auto& out : outputs[0]) {
    v.sameType(in, out);
    TORCH_CHECK_VALUE(out.numel() == in.numel(), v.where(), "output tensors must have the input's ",
                      in.numel(), " elements, got ", out.numel());
  }
  const Layout layout = movable(in);
  Contiguous c(in);
  auto comm = comm_;
  auto outs = outputs[0];
  const int size = size_;
  return submitNested(OpType::ALLGATHER, "pycomm:all_gather", outputs, [comm, c, outs, layout, size] {
    at::Tensor flat = at::empty({c.flat.numel() * size}, c.flat.options());
    comm->allgather(c.flat.data_ptr(), flat.data_ptr(), layout.count(c.flat), layout.dtype);
    scatterInto(flat, outs);
  });
} catch (const std::exception& error) {
  rejectOnPeers(error);
  throw;
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                const ::c10d::AllgatherOptions& opts) try {
  const OverrideScope scope;
  Validator v(rank_, size_, "allgather_into_tensor");
  if (auto device = v.deviceOf({input, output})) {
    if (auto nccl = ncclFor(*device)) {
      v.sameDtype(input, output);
      v.holdsOnePerRank(output, "output", input, "input");
      const auto codec = compressionFor(input, nullptr);
      const Layout layout = movable(input);
      const auto stamp = stampOf(transport::OpKind::kAllgather, layout.dtype, layout.count(input), nullptr, codec, -1);
      return submitOnDevice(OpType::_ALLGATHER_BASE, "pycomm:all_gather_into_tensor", output, {input}, nccl, stamp,
                            [input, output, codec](algorithms::QueuedLink& link) {
                              deviceAllgather(link, input, output, codec);
                            });
    }
    auto staging = beginStaging(*device);
    auto hostIn = staging->stage(input, true, false);
    auto hostOut = staging->stage(output, false, true);
    return runStaged(staging, [&] { return _allgather_base(hostOut, hostIn, opts); });
  }
  v.tensor(input);
  v.sameType(input, output);
  v.holdsOnePerRank(output, "output", input, "input");
  const Layout layout = movable(input);
  Contiguous in(input), out(output);
  auto comm = comm_;
  const auto codec = compressionFor(input, nullptr);
  return submit(OpType::_ALLGATHER_BASE, "pycomm:all_gather_into_tensor", {output}, [comm, in, out, layout, codec] {
    if (codec) {
      comm->allgatherCompressed(in.flat.data_ptr<float>(), out.flat.data_ptr<float>(), in.flat.numel(), *codec);
    } else {
      comm->allgather(in.flat.data_ptr(), out.flat.data_ptr(), layout.count(in.flat), layout.dtype);
    }
    out.copyBack();
  });
} catch (const std::exception& error) {
  rejectOnPeers(error);
  throw;
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const ::c10d::AllgatherOptions& opts) try {
  const OverrideScope scope;
  Validator v(rank_, size_, "allgather_coalesced");
  if (auto device = v.deviceOf(allOf({inputs}, {outputs}))) {
    auto staging = beginStaging(*device);
    auto hostIn = staging->stage(inputs, true, false);
    auto hostOut = staging->stage(outputs, false, true);
    return runStaged(staging, [&] { return allgather_coalesced(hostOut, hostIn, opts); });
  }
  TORCH_CHECK_VALUE(outputs.size() == static_cast<size_t>(size_), v.where(), "expects ", size_,
                    " output lists, got ", outputs.size());
  for (const auto& list : outputs) {
    TORCH_CHECK_VALUE(list.size() == inputs.size(), v.where(), "each output list needs ", inputs.size(),
                      " tensors");
    for (size_t i = 0; i < inputs.size(); ++i) {
      v.sameType(inputs[i], list[i]);
      TORCH_CHECK_VALUE(list[i].numel() == inputs[i].numel(), v.where(), "output ", i, " has ",
                        list[i].numel(), " elements, input has ", inputs[i].numel());
    }
  }
  auto comm = comm_;
  const int size = size_;
  return submitNested(OpType::ALLGATHER_COALESCED, "pycomm:all_gather_coalesced", outputs,
                      [comm, outputs, inputs, size] {
                        for (size_t i = 0; i < inputs.size(); ++i) {
                          Contiguous c(inputs[i]);
                          const Layout layout = movable(c.flat);
                          at::Tensor flat = at::empty({c.flat.numel() * size}, c.flat.options());
                          comm->allgather(c.flat.data_ptr(), flat.data_ptr(), layout.count(c.flat), layout.dtype);
                          for (int r = 0; r < size; ++r) {
                            outputs[r][i].copy_(flat.narrow(0, r * c.flat.numel(), c.flat.numel())
                                                    .view(outputs[r][i].sizes()));
                          }
                        }
                      });
} catch (const std::exception& error) {
  rejectOnPeers(error);
  throw;
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const ::c10d::AllgatherOptions& opts) try {
  const OverrideScope scope;
  Validator v(rank_, size_, "allgather_into_tensor_coalesced");
  if (auto device = v.deviceOf(allOf({inputs, outputs}))) {
    auto staging = beginStaging(*device);
    auto hostIn = staging->stage(inputs, true, false);
    auto hostOut = staging->stage(outputs, false, true);
    return runStaged(staging, [&] { return allgather_into_tensor_coalesced(hostOut, hostIn, opts); });
  }
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), v.where(), "got ", outputs.size(), " outputs for ",
                    inputs.size(), " inputs");
  for (size_t i = 0; i < inputs.size(); ++i) {
    v.tensor(inputs[i]);
    v.sameType(inputs[i], outputs[i]);
    TORCH_CHECK_VALUE(outputs[i].numel() == inputs[i].numel() * size_, v.where(), "output ", i, " has ",
                      outputs[i].numel(), " elements, needs ", inputs[i].numel() * size_);
  }
  auto comm = comm_;
  return submit(OpType::COALESCED, "pycomm:all_gather_into_tensor_coalesced", outputs,
                [comm, outputs, inputs] {
                  for (size_t i = 0; i < inputs.size(); ++i) {
                    Contiguous in(inputs[i]), out(outputs[i]);
                    const Layout layout = movable(in.flat);
                    comm->allgather(in.flat.data_ptr(), out.flat.data_ptr(), layout.count(in.flat), layout.dtype);
                    out.copyBack();
                  }
                });
} catch (const std::exception& error) {
  rejectOnPeers(error);
  throw;
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const ::c10d::GatherOptions& opts) try {
  const OverrideScope scope;
  Validator v(rank_, size_, "gather");
  if (auto device = v.deviceOf(allOf({inputs}, {outputs}))) {
    auto staging = beginStaging(*device);
    auto hostIn = staging->stage(inputs, true, false);
    auto hostOut = staging->stage(outputs, false, true);
    return runStaged(staging, [&] { return gather(hostOut, hostIn, opts); });
  }
  const at::Tensor& in = v.single(inputs);
  v.root(opts.rootRank);
  const int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> outs;
  if (rank_ == root) {
    TORCH_CHECK_VALUE(outputs.size() == 1 && outputs[0].size() == static_cast<size_t>(size_), v.where(),
                      "the root expects one list of ", size_, " output tensors");
    for (const auto& out : outputs[0]) {
      v.sameType(in, out);
      TORCH_CHECK_VALUE(out.numel() == in.numel(), v.where(), "output tensors must have the input's ",
                        in.numel(), " elements, got ", out.numel());
    }
    outs = outputs[0];
  } else {
    TORCH_CHECK_VALUE(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()), v.where(),
                      "only the root passes output tensors");
  }
  const Layout layout = movable(in);
  Contiguous c(in);
  auto comm = comm_;
  const int size = size_;
  return submitNested(OpType::GATHER, "pycomm:gather", outputs, [comm, c, outs, layout, root, size] {
    at::Tensor flat = outs.empty() ? at::Tensor() : at::empty({c.flat.numel() * size}, c.flat.options());
    comm->gather(c.flat.data_ptr(), flat.defined() ? flat.data_ptr() : nullptr, layout.count(c.flat),
                 layout.dtype, root);
    if (!outs.empty()) scatterInto(flat, outs);
  });
} catch (const std::exception& error) {
  rejectOnPeers(error);
  throw;
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::scatter(std::vector<at::Tensor>& outputs,
                                                        std::vector<std::vector<at::Tensor>>& inputs,
                                                        const ::c10d::ScatterOptions& opts) try {
  const OverrideScope scope;
  Validator v(rank_, size_, "scatter");
  if (auto device = v.deviceOf(allOf({outputs}, {inputs}))) {
    auto staging = beginStaging(*device);
    auto hostIn = staging->stage(inputs, true, false);
    auto hostOut = staging->stage(outputs, false, true);
    return runStaged(staging, [&] { return scatter(hostOut, hostIn, opts); });
  }
  const at::Tensor& out = v.single(outputs);
  v.root(opts.rootRank);
  const int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> ins;
  if (rank_ == root) {
    TORCH_CHECK_VALUE(inputs.size() == 1 && inputs[0].size() == static_cast<size_t>(size_), v.where(),
                      "the root expects one list of ", size_, " input tensors");
    for (const auto& in : inputs[0]) {
      v.sameType(out, in);
      TORCH_CHECK_VALUE(in.numel() == out.numel(), v.where(), "input tensors must have the output's ",
                        out.numel(), " elements, got ", in.numel());
    }
    ins = inputs[0];
  } else {
    TORCH_CHECK_VALUE(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()), v.where(),
                      "only the root passes input tensors");
  }
  const Layout layout = movable(out);
  Contiguous c(out);
  auto comm = comm_;
  return submit(OpType::SCATTER, "pycomm:scatter", {out}, [comm, c, ins, layout, root] {
    at::Tensor flat = ins.empty() ? at::Tensor() : flatten(ins);
    comm->scatter(flat.defined() ? flat.data_ptr() : nullptr, c.flat.data_ptr(), layout.count(c.flat),
                  layout.dtype, root);
    c.copyBack();
  });
} catch (const std::exception& error) {
  rejectOnPeers(error);
  throw;
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const ::c10d::ReduceScatterOptions& opts) try {
  const OverrideScope scope;
  Validator v(rank_, size_, "reduce_scatter");
  if (auto device = v.deviceOf(allOf({outputs}, {inputs}))) {
    auto staging = beginStaging(*device);
    auto hostIn = staging->stage(inputs, true, false);
    auto hostOut = staging->stage(outputs, false, true);
    return runStaged(staging, [&] { return reduce_scatter(hostOut, hostIn, opts); });
  }
  const at::Tensor& out = v.single(outputs);
  TORCH_CHECK_VALUE(inputs.size() == 1 && inputs[0].size() == static_cast<size_t>(size_), v.where(),
                    "expects one list of ", size_, " input tensors");
  for (const auto& in : inputs[0]) {
    v.sameType(out, in);
    TORCH_CHECK_VALUE(in.numel() == out.numel(), v.where(), "input tensors must have the output's ",
                      out.numel(), " elements, got ", in.numel());
  }
  const ReduceSpec spec = v.reduceOp(opts.reduceOp, out);
  const DataType dtype = v.reducible(out);
  auto ins = inputs[0];
  Contiguous c(out);
  auto comm = comm_;
  const int size = size_;
  return submit(OpType::REDUCE_SCATTER, "pycomm:reduce_scatter", {out}, [comm, c, ins, spec, dtype, size] {
    at::Tensor flat = preScaled(flatten(ins), spec, true);
    comm->reduceScatter(flat.data_ptr(), c.flat.data_ptr(), c.flat.numel(), dtype, spec.op);
    if (spec.average) applyAverage(c.flat, size);
    c.copyBack();
  });
} catch (const std::exception& error) {
  rejectOnPeers(error);
  throw;
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const ::c10d::ReduceScatterOptions& opts) try {
  const OverrideScope scope;
  Validator v(rank_, size_, "reduce_scatter_tensor");
  if (auto device = v.deviceOf({input, output})) {
    if (auto nccl = ncclFor(*device)) {
      v.sameDtype(output, input);
      v.holdsOnePerRank(input, "input", output, "output");
      const ReduceSpec spec = v.reduceOp(opts.reduceOp, output);
      const DataType dtype = v.reducible(output);
      const auto codec = compressionFor(output, &opts.reduceOp);
      const auto stamp =
          stampOf(transport::OpKind::kReduceScatter, dtype, static_cast<size_t>(output.numel()), &spec, codec, -1);
      return submitOnDevice(OpType::_REDUCE_SCATTER_BASE, "pycomm:reduce_scatter_tensor", output, {input}, nccl, stamp,
                            [input, output, spec, dtype, codec](algorithms::QueuedLink& link) {
                              deviceReduceScatter(link, input, output, spec, dtype, codec);
                            });
    }
    auto staging = beginStaging(*device);
    auto hostIn = staging->stage(input, true, false);
    auto hostOut = staging->stage(output, false, true);
    return runStaged(staging, [&] { return _reduce_scatter_base(hostOut, hostIn, opts); });
  }
  v.tensor(output);
  v.sameType(output, input);
  v.holdsOnePerRank(input, "input", output, "output");
  const ReduceSpec spec = v.reduceOp(opts.reduceOp, output);
  const DataType dtype = v.reducible(output);
  Contiguous in(input), out(output);
  auto comm = comm_;
  const int size = size_;
  const auto codec = compressionFor(output, &opts.reduceOp);
  return submit(OpType::_REDUCE_SCATTER_BASE, "pycomm:reduce_scatter_tensor", {output},
                [comm, in, out, spec, dtype, size, codec] {
                  if (codec) {
                    comm->reduceScatterCompressed(in.flat.data_ptr<float>(), out.flat.data_ptr<float>(),
                                                  out.flat.numel(), *codec, spec.average);
                    out.copyBack();
                    return;
                  }
                  at::Tensor src = preScaled(in.flat, spec, false);
                  comm->reduceScatter(src.data_ptr(), out.flat.data_ptr(), out.flat.numel(), dtype, spec.op);
                  if (spec.average) applyAverage(out.flat, size);
                  out.copyBack();
                });
} catch (const std::exception& error) {
  rejectOnPeers(error);
  throw;
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const ::c10d::ReduceScatterOptions& opts) try {
  const OverrideScope scope;
  Validator v(rank_, size_, "reduce_scatter_tensor_coalesced");
  if (auto device = v.deviceOf(allOf({inputs, outputs}))) {
    auto staging = beginStaging(*device);
    auto hostIn = staging->stage(inputs, true, false);
    auto hostOut = staging->stage(outputs, false, true);
    return runStaged(staging, [&] { return reduce_scatter_tensor_coalesced(hostOut, hostIn, opts); });
  }
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), v.where(), "got ", outputs.size(), " outputs for ",
                    inputs.size(), " inputs");
  std::vector<ReduceSpec> specs;
  std::vector<DataType> dtypes;
  for (size_t i = 0; i < inputs.size(); ++i) {
    v.tensor(outputs[i]);
    v.sameType(outputs[i], inputs[i]);
    TORCH_CHECK_VALUE(inputs[i].numel() == outputs[i].numel() * size_, v.where(), "input ", i, " has ",
                      inputs[i].numel(), " elements, needs ", outputs[i].numel() * size_);
    specs.push_back(v.reduceOp(opts.reduceOp, outputs[i]));
    dtypes.push_back(v.reducible(outputs[i]));
  }
  auto comm = comm_;
  const int size = size_;
  return submit(OpType::COALESCED, "pycomm:reduce_scatter_tensor_coalesced", outputs,
                [comm, outputs, inputs, specs, dtypes, size] {
                  for (size_t i = 0; i < inputs.size(); ++i) {
                    Contiguous in(inputs[i]), out(outputs[i]);
                    at::Tensor src = preScaled(in.flat, specs[i], false);
                    comm->reduceScatter(src.data_ptr(), out.flat.data_ptr(), out.flat.numel(), dtypes[i],
                                        specs[i].op);
                    if (specs[i].average) applyAverage(out.flat, size);
                    out.copyBack();
                  }
                });
} catch (const std::exception& error) {
  rejectOnPeers(error);
  throw;
}

namespace {

// `in`, or a copy of it where its bytes overlap those of `out` (all_to_all_single(x, x)): an
// all-to-all receives into the output while other ranks still need blocks of the input. Both are
// contiguous, so comparing address ranges is exact, whichever storages they belong to.
at::Tensor apartFrom(const at::Tensor& in, const at::Tensor& out) {
  const auto* a = static_cast<const uint8_t*>(in.data_ptr());
  const auto* b = static_cast<const uint8_t*>(out.data_ptr());
  const size_t aBytes = in.nbytes(), bBytes = out.nbytes();
  const bool overlap = aBytes > 0 && bBytes > 0 && a < b + bBytes && b < a + aBytes;
  return overlap ? in.clone() : in;
}


}  // namespace

c10::intrusive_ptr<::c10d::Work> PycommBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                              std::vector<int64_t>& outputSplits,
                                                              std::vector<int64_t>& inputSplits,
                                                              const ::c10d::AllToAllOptions& opts) try {
  const OverrideScope scope;
  Validator v(rank_, size_, "alltoall_base");
  if (auto device = v.deviceOf({input, output})) {
    if (auto nccl = ncclFor(*device)) {
      TORCH_CHECK_VALUE(input.defined() && output.defined(), v.where(), "got an undefined tensor");
      v.sameDtype(input, output);
      const Layout layout = movable(input);
      std::vector<size_t> sendBytes, sendOffsets, recvBytes, recvOffsets;
      splitLayout(input, inputSplits, size_, v.where(), "input", layout.scale, sendBytes, sendOffsets);
      splitLayout(output, outputSplits, size_, v.where(), "output", layout.scale, recvBytes, recvOffsets);
      const size_t esize = elementSize(layout.dtype);
      for (auto* counts : {&sendBytes, &sendOffsets, &recvBytes, &recvOffsets}) toBytes(*counts, esize, v.where());
      const size_t tensorElementBytes = esize * layout.scale;
      TORCH_CHECK_VALUE(sendBytes[rank_] == recvBytes[rank_], v.where(), "this rank sends itself ",
                        sendBytes[rank_] / tensorElementBytes, " elements but expects ",
                        recvBytes[rank_] / tensorElementBytes);
      const auto stamp = stampOf(transport::OpKind::kAlltoall, layout.dtype, 0, nullptr, std::nullopt, -1);
      return submitOnDevice(OpType::ALLTOALL_BASE, "pycomm:all_to_all_single", output, {input}, nccl, stamp,
                            [input, output, sendBytes, sendOffsets, recvBytes, recvOffsets](algorithms::QueuedLink& link) {
                              const Contiguous in(input), out(output);
                              const at::Tensor source = apartFrom(in.flat, out.flat);
                              algorithms::queued::directAlltoall(
                                  link, static_cast<const uint8_t*>(source.data_ptr()), sendOffsets, sendBytes,
                                  static_cast<uint8_t*>(out.flat.data_ptr()), recvOffsets, recvBytes);
                              out.copyBack();
                            });
    }
    auto staging = beginStaging(*device);
    auto hostIn = staging->stage(input, true, false);
    auto hostOut = staging->stage(output, false, true);
    return runStaged(staging, [&] { return alltoall_base(hostOut, hostIn, outputSplits, inputSplits, opts); });
  }
  v.tensor(input);
  v.sameType(input, output);
  const Layout layout = movable(input);
  std::vector<size_t> sendCounts, sendOffsets, recvCounts, recvOffsets;
  splitLayout(input, inputSplits, size_, v.where(), "input", layout.scale, sendCounts, sendOffsets);
  splitLayout(output, outputSplits, size_, v.where(), "output", layout.scale, recvCounts, recvOffsets);
  Contiguous in(input), out(output);
  auto comm = comm_;
  return submit(OpType::ALLTOALL_BASE, "pycomm:all_to_all_single", {output},
                [comm, in, out, layout, sendCounts, sendOffsets, recvCounts, recvOffsets] {
                  const at::Tensor source = apartFrom(in.flat, out.flat);
                  comm->alltoall(source.data_ptr(), sendCounts, sendOffsets, out.flat.data_ptr(),
                                 recvCounts, recvOffsets, layout.dtype);
                  out.copyBack();
                });
} catch (const std::exception& error) {
  rejectOnPeers(error);
  throw;
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const ::c10d::AllToAllOptions& opts) try {
  const OverrideScope scope;
  Validator v(rank_, size_, "alltoall");
  if (auto device = v.deviceOf(allOf({inputs, outputs}))) {
    auto staging = beginStaging(*device);
    auto hostIn = staging->stage(inputs, true, false);
    auto hostOut = staging->stage(outputs, false, true);
    return runStaged(staging, [&] { return alltoall(hostOut, hostIn, opts); });
  }
  TORCH_CHECK_VALUE(outputs.size() == static_cast<size_t>(size_) && inputs.size() == outputs.size(),
                    v.where(), "expects ", size_, " input and output tensors, got ", inputs.size(),
                    " and ", outputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    v.tensor(inputs[i]);
    v.sameType(inputs[0], inputs[i]);
    v.sameType(inputs[0], outputs[i]);
  }
  const Layout layout = movable(inputs[0]);
  std::vector<size_t> sendCounts(size_), sendOffsets(size_), recvCounts(size_), recvOffsets(size_);
  size_t sendTotal = 0, recvTotal = 0;
  for (int i = 0; i < size_; ++i) {
    sendCounts[i] = inputs[i].numel() * layout.scale;
    recvCounts[i] = outputs[i].numel() * layout.scale;
    sendOffsets[i] = sendTotal;
    recvOffsets[i] = recvTotal;
    sendTotal += sendCounts[i];
    recvTotal += recvCounts[i];
  }
  auto comm = comm_;
  return submit(OpType::ALLTOALL, "pycomm:all_to_all", outputs,
                [comm, inputs, outputs, layout, sendCounts, sendOffsets, recvCounts, recvOffsets, recvTotal] {
                  at::Tensor in = flatten(inputs);
                  at::Tensor out = at::empty({static_cast<int64_t>(recvTotal / layout.scale)}, in.options());
                  comm->alltoall(in.data_ptr(), sendCounts, sendOffsets, out.data_ptr(), recvCounts,
                                 recvOffsets, layout.dtype);
                  scatterInto(out, outputs);
                });
} catch (const std::exception& error) {
  rejectOnPeers(error);
  throw;
}

c10::intrusive_ptr<::c10d::Work> PycommBackend::barrier(const ::c10d::BarrierOptions& opts) {
  auto comm = comm_;
  return submit(OpType::BARRIER, "pycomm:barrier", {}, [comm] { comm->barrier(); }, !opts.asyncOp);
}

// ---------------------------------------------------------------------------------------------
// Point-to-point: posted at once, outside the collective queue.

namespace {

// The one tensor of a send (`sending`) or receive, validated: the caller's, or the host stand-in of
// a device tensor with its staging.
struct PointToPointTensor {
  std::shared_ptr<DeviceStaging> staging;  // null for a CPU tensor
  at::Tensor tensor;
};

PointToPointTensor pointToPointTensorOf(const Validator& v, const std::vector<at::Tensor>& tensors, bool sending,
                                        const std::function<std::shared_ptr<DeviceStaging>(c10::Device)>& beginStaging) {
  auto device = v.deviceOf(tensors);
  if (!device) return {nullptr, v.single(tensors)};
  const at::Tensor& t = v.one(tensors);
  auto staging = beginStaging(*device);
  at::Tensor host = staging->stage(t, sending, !sending);
  v.tensor(host);
  return {staging, host};
}

}  // namespace

c10::intrusive_ptr<::c10d::Work> PycommBackend::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  Validator v(rank_, size_, "send");
  const auto p2p = pointToPointTensorOf(v, tensors, true, [this](c10::Device d) { return beginStaging(d); });
  const auto& staging = p2p.staging;
  const at::Tensor& t = p2p.tensor;
  TORCH_CHECK_VALUE(dstRank >= 0 && dstRank < size_ && dstRank != rank_, v.where(), "invalid destination rank ",
                    dstRank, " (group of ", size_, ", this rank ", rank_, ")");
  // A device tensor's bytes must be on the host before the send is posted: this thread waits for
  // its stream to get there.
  if (staging) staging->copyIn();
  at::Tensor flat = t.contiguous();  // kept alive by the Work until the bytes are on the wire
  auto request = comm_->send(flat.data_ptr(), flat.nbytes(), dstRank, static_cast<uint64_t>(tag));
  auto work = c10::make_intrusive<PointToPointWork>(comm_, request, OpType::SEND, staging ? tensors[0] : flat,
                                                    strCat("send to peer ", dstRank, " (tag ", tag, ")"), staging);
  {
    std::lock_guard<std::mutex> lock(coalesceMutex_);
    if (coalescing_) coalesced_.push_back(work);
  }
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
    const at::AutoDispatchBelowADInplaceOrView belowAutograd;  // as in enqueueWork's tasks
    c.copyBack();
    if (staging) staging->copyOut();
  };
  auto work = c10::make_intrusive<PointToPointWork>(
      comm_, request, anyPeer ? OpType::RECVANYSOURCE : OpType::RECV, staging ? tensors[0] : t,
      anyPeer ? strCat("recv from any peer (tag ", tag, ")") : strCat("recv from peer ", srcRank, " (tag ", tag, ")"),
      staging, onReceived);
  {
    std::lock_guard<std::mutex> lock(coalesceMutex_);
    if (coalescing_) coalesced_.push_back(work);
  }
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
