#include "collective_op.h"

#include <ATen/core/jit_type.h>

#include <cstring>

namespace pycomm::torch_adapter {
namespace {

// Made once: a new ListType per op is an allocation and two reference counts.
const c10::TypePtr& tensorListType() {
  static const c10::TypePtr type = c10::ListType::create(c10::TensorType::get());
  return type;
}

}  // namespace

void OpTensors::add(std::vector<at::Tensor>& list, bool read, bool write) {
  for (auto& t : list) add(t, read, write);
}

void OpTensors::add(std::vector<std::vector<at::Tensor>>& lists, bool read, bool write) {
  for (auto& list : lists) add(list, read, write);
}

OpTensors::List OpTensors::all() const {
  List all;
  all.reserve(slots_.size());
  for (const auto& slot : slots_) all.push_back(*slot.tensor);
  return all;
}

OpTensors::List OpTensors::profiled() const {
  List read;
  for (const auto& slot : slots_) {
    if (slot.read) read.push_back(*slot.tensor);
  }
  if (read.empty()) return all();
  return read;
}

OpTensors::List OpTensors::written() const {
  List written;
  for (const auto& slot : slots_) {
    if (slot.write) written.push_back(*slot.tensor);
  }
  return written;
}

void OpTensors::stage(DeviceStaging& staging) {
  for (auto& slot : slots_) *slot.tensor = staging.stage(*slot.tensor, slot.read, slot.write);
}

void OpTensors::recordUse(DeviceStaging& staging) const {
  for (const auto& slot : slots_) staging.recordUse(*slot.tensor);
}

algorithms::QueuedStamp CollectiveOp::stamp() const {
  TORCH_INTERNAL_ASSERT(false, "pycomm: ", name_, " has no NCCL form");
  return {};
}

void CollectiveOp::runOnDevice(algorithms::QueuedLink&, const Config&) {
  TORCH_INTERNAL_ASSERT(false, "pycomm: ", name_, " has no NCCL form");
}

void CollectiveOp::setOutputs(std::vector<at::Tensor> outputs) {
  outputs_ = c10::IValue(std::move(outputs));
  outputType_ = tensorListType();
}

void CollectiveOp::setOutputs(std::vector<std::vector<at::Tensor>> outputs) {
  outputs_ = c10::IValue(std::move(outputs));
  outputType_ = c10::ListType::create(tensorListType());
}

// memcpy for contiguous tensors: a dispatched copy_ per tensor costs microseconds, which a
// thousand small gradients add up.
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

}  // namespace pycomm::torch_adapter
