// torch.ops.pycomm.direct_all_reduce_: a synchronous in-place all-reduce on a pycomm group, for
// programs that call it in a tight loop (tensor-parallel inference on CPU). It skips what
// dist.all_reduce costs besides the exchange: torch's Python wrapper, the c10d op, the Work and its
// future. What it keeps: the same checks and reduction as dist.all_reduce (so the same bits), the
// group's issue order (it runs on the caller's thread when the group's worker is idle, else queues
// behind the ops issued before it and waits), and the core's per-op agreement, timeout and failure
// reports. It records no flight-recorder entry and no c10d Work event (a profiler sees it as the
// torch op it is).
//
// The schema marks the tensor as written, and a Meta kernel lets torch.compile trace it: the op is
// one node of the graph (functionalized around the write) and runs this kernel. In eager mode
// pycomm.direct_all_reduce calls it from C++ (directAllreduceEager): through torch.ops from Python,
// torch's parsing of the arguments against the schema costs more than a 4 KiB exchange.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/library.h>

#include <condition_variable>
#include <mutex>

#include "backend.h"
#include "bucketed_allreduce.h"

namespace pycomm::torch_adapter {
namespace {

::c10d::ReduceOp reduceOpNamed(const Validator& v, c10::string_view name) {
  static const std::pair<const char*, ::c10d::ReduceOp::RedOpType> kOps[] = {
      {"sum", ::c10d::ReduceOp::SUM}, {"avg", ::c10d::ReduceOp::AVG},   {"product", ::c10d::ReduceOp::PRODUCT},
      {"min", ::c10d::ReduceOp::MIN}, {"max", ::c10d::ReduceOp::MAX},   {"band", ::c10d::ReduceOp::BAND},
      {"bor", ::c10d::ReduceOp::BOR}, {"bxor", ::c10d::ReduceOp::BXOR},
  };
  for (const auto& [known, op] : kOps) {
    if (name == known) return ::c10d::ReduceOp(op);
  }
  TORCH_CHECK_VALUE(false, v.where(), "unknown reduce op '", name,
                    "' (valid: sum, avg, product, min, max, band, bor, bxor)");
}

// The group's pycomm backend, held for the op's length (a destroy_process_group on another thread
// may drop the group's handles meanwhile: the dispatcher released the GIL).
c10::intrusive_ptr<PycommBackend> pycommBackendOf(::c10d::ProcessGroup& group) {
  auto backend = group.getBackend(c10::DeviceType::CPU);
  auto* pycomm = dynamic_cast<PycommBackend*>(backend.get());
  // TORCH_DISTRIBUTED_DEBUG=DETAIL wraps every backend of a plugin in torch's ProcessGroupWrapper,
  // which this op cannot see through: it says so.
  TORCH_CHECK_VALUE(pycomm != nullptr, "pycomm direct_all_reduce_: group '", group.getGroupName(), "' runs ",
                    backend->getBackendName(), " on the CPU, not pycomm");
  return c10::intrusive_ptr<PycommBackend>::reclaim_copy(pycomm);
}

void directAllreduce(at::Tensor& self, c10::string_view reduceOp, c10::string_view groupName) {
  pycommBackendOf(*::c10d::resolve_process_group(std::string(groupName)))->allreduceDirect(self, reduceOp);
}

void directAllreduceMeta(at::Tensor&, c10::string_view, c10::string_view) {}

// One direct all-reduce, run on the caller's thread or, queued behind earlier ops, on the worker
// while the caller waits for it: either way it lives on the caller's stack, and a small op
// allocates nothing for it (the queued task holds one pointer).
struct DirectJob {
  // Held: a task that runs after its caller's group was destroyed (from a completion callback, say)
  // still has its communicator.
  std::shared_ptr<Communicator> comm;
  const at::Tensor& tensor;
  DataType dtype;
  const ReduceSpec& spec;
  const std::optional<codecs::Codec>& codec;
  std::mutex mutex;
  std::condition_variable done;
  bool finished = false;
  std::exception_ptr error;

  void run() {
    std::exception_ptr failure;
    try {
      const at::AutoDispatchBelowADInplaceOrView belowAutograd;  // as PycommBackend::submit's tasks
      allreduceNow(*comm, tensor, dtype, spec, codec);
    } catch (const std::exception&) {
      failure = std::current_exception();
    }
    // Notified under the lock: once the caller sees `finished` it may return and free this job.
    const std::lock_guard<std::mutex> lock(mutex);
    error = failure;
    finished = true;
    done.notify_all();
  }
};

}  // namespace

void PycommBackend::allreduceDirect(const at::Tensor& tensor, c10::string_view reduceOpName) {
  ReduceSpec spec;
  DataType dtype = DataType::kFloat32;
  std::optional<codecs::Codec> codec;
  try {
    const Validator v(rank_, size_, "direct_all_reduce_");
    TORCH_CHECK_VALUE(tensor.defined() && tensor.device().is_cpu(), v.where(),
                      "takes a dense CPU tensor (dist.all_reduce takes the others), got ",
                      tensor.defined() ? tensor.toString() : std::string("an undefined tensor"));
    TORCH_CHECK_VALUE(tensor.layout() == at::kStrided && !tensor.is_quantized() && !tensor.is_mkldnn(), v.where(),
                      "takes a dense CPU tensor (dist.all_reduce takes the others), got ", tensor.toString());
    v.tensor(tensor);
    const auto reduceOp = reduceOpNamed(v, reduceOpName);
    spec = v.reduceSpec(reduceOp, tensor);
    dtype = v.reducible(tensor);
    codec = compressionFor(comm_->config(), tensor.scalar_type(), &reduceOp);
  } catch (const std::exception& error) {
    rejectOnPeers(error);  // the peers' op fails at once, as for dist.all_reduce
    throw;
  }
  DirectJob job{comm_, tensor, dtype, spec, codec};
  comm_->runOrEnqueue([&job] { job.run(); });
  {
    // Queued tasks always run, even after an abort or a shutdown (they fail at once then), and each
    // op ends by the group's timeout: so this wait ends (tests/test_direct_all_reduce.py, silent peer).
    std::unique_lock<std::mutex> lock(job.mutex);
    job.done.wait(lock, [&] { return job.finished; });
  }
  if (job.error) std::rethrow_exception(job.error);
}

// Whether the dispatcher, given this tensor on this thread, would go straight to the op's kernel:
// a dense CPU tensor (or an inference one) with no Python subclass key, no key a mode or
// functionalization adds, nothing for autograd to record, and no profiler or other observer that
// the dispatcher would report the op to.
bool dispatchesStraightToKernel(const at::Tensor& tensor) {
  if (at::hasCallbacks()) return false;
  static const c10::DispatchKeySet plainCpu = c10::DispatchKeySet(c10::DispatchKey::CPU) |
                                              c10::getAutogradRelatedKeySetFromBackend(c10::BackendComponent::CPUBit) |
                                              c10::getAutocastRelatedKeySetFromBackend(c10::BackendComponent::CPUBit);
  if (!plainCpu.isSupersetOf(tensor.key_set())) return false;
  // Modes and functionalization add keys to the thread's included set; inference mode only takes
  // ADInplaceOrView out of it, which leaves even less before the kernel.
  if (!c10::default_included_set.isSupersetOf(c10::impl::tls_local_dispatch_key_set().included_)) return false;
  return !(tensor.requires_grad() && at::GradMode::is_enabled());
}

void directAllreduceEager(at::Tensor tensor, const std::string& reduceOp,
                          const c10::intrusive_ptr<::c10d::ProcessGroup>& group) {
  TORCH_CHECK_VALUE(group, "pycomm direct_all_reduce_: expected a process group, got None");
  if (tensor.defined() && dispatchesStraightToKernel(tensor)) {
    pycommBackendOf(*group)->allreduceDirect(tensor, reduceOp);
    return;
  }
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("pycomm::direct_all_reduce_", "")
                             .typed<void(at::Tensor&, c10::string_view, c10::string_view)>();
  op.call(tensor, reduceOp, group->getGroupName());
}

TORCH_LIBRARY(pycomm, m) {
  // Returns nothing: functionalization (torch.compile) takes a custom op that writes its input, but
  // not one that also returns it as an alias.
  m.def("direct_all_reduce_(Tensor(a!) self, str reduce_op, str group_name) -> ()");
}

// Every backend's tensors reach the one kernel, whose checks refuse what is not a dense CPU
// tensor and tell the peers, as dist.all_reduce's do: a kernel for CPU alone would leave a rank
// that passes a sparse or CUDA tensor failing in the dispatcher and its peers waiting for the
// timeout. Meta tensors (torch.compile's tracing) take the kernel registered for them.
TORCH_LIBRARY_IMPL(pycomm, CompositeExplicitAutograd, m) { m.impl("direct_all_reduce_", &directAllreduce); }

TORCH_LIBRARY_IMPL(pycomm, Meta, m) { m.impl("direct_all_reduce_", &directAllreduceMeta); }

}  // namespace pycomm::torch_adapter
