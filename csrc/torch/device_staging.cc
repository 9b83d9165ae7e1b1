#include "device_staging.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace pycomm::torch_adapter {

DeviceStaging::DeviceStaging(c10::Device device, c10::Stream stream)
    : device_(device), stream_(stream), callerReady_(device.type()), done_(device.type()) {
  const c10::impl::VirtualGuardImpl impl(device_.type());
  callerReady_.record(impl.getStream(device_));
}

at::Tensor DeviceStaging::stage(const at::Tensor& deviceTensor, bool read, bool write) {
  TORCH_INTERNAL_ASSERT(deviceTensor.device() == device_, "staging a tensor on ", deviceTensor.device(),
                        " for an op on ", device_);
  // A plain tensor even if the caller is in inference mode: the worker writes it outside that mode.
  const c10::InferenceMode notInference(false);
  at::Tensor host = at::empty(deviceTensor.sizes(),
                              deviceTensor.options().device(at::kCPU).pinned_memory(true).memory_format(
                                  at::MemoryFormat::Contiguous));
  recordUse(deviceTensor);
  entries_.push_back({deviceTensor, host, read, write});
  return host;
}

void DeviceStaging::recordUse(const at::Tensor& deviceTensor) {
  TORCH_INTERNAL_ASSERT(deviceTensor.device() == device_, "using a tensor on ", deviceTensor.device(),
                        " for an op on ", device_);
  if (deviceTensor.storage().data_ptr().get() != nullptr) {
    const c10::impl::VirtualGuardImpl impl(device_.type());
    impl.recordDataPtrOnStream(deviceTensor.storage().data_ptr(), stream_);
  }
}

void DeviceStaging::copyIn() {
  // The copies are not part of any autograd graph: a leaf that requires grad (a parameter being
  // broadcast) may be written, and the host copy must not record a backward node.
  const at::AutoDispatchBelowADInplaceOrView belowAutograd;
  const c10::StreamGuard guard(stream_);
  callerReady_.block(stream_);
  bool any = false;
  for (const auto& e : entries_) {
    if (!e.read || e.host.numel() == 0) continue;
    e.host.copy_(e.device, /*non_blocking=*/true);
    any = true;
  }
  if (!any) return;
  c10::Event copied(device_.type());
  copied.record(stream_);
  copied.synchronize();
}

void DeviceStaging::copyOut() {
  const at::AutoDispatchBelowADInplaceOrView belowAutograd;
  const c10::StreamGuard guard(stream_);
  // The host tensors may be freed once this returns: the pinned-memory allocator keeps each block
  // until the copies queued from it have run.
  for (const auto& e : entries_) {
    if (e.write && e.host.numel() > 0) e.device.copy_(e.host, /*non_blocking=*/true);
  }
  done_.record(stream_);
}

void DeviceStaging::blockCurrentStream() const {
  const c10::impl::VirtualGuardImpl impl(device_.type());
  done_.block(impl.getStream(device_));
}

}  // namespace pycomm::torch_adapter
