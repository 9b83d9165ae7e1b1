#include "op_stamps.h"

#include <cstring>

#include "core/error.h"
#include "current_device.h"

namespace pycomm::cuda {
namespace {

using algorithms::QueuedStamp;
constexpr size_t kStampBytes = sizeof(QueuedStamp);

}  // namespace

OpStamps::OpStamps(int device) : device_(device) {
  const CurrentDevice current(device);
  // Held here until all three exist: if one fails, the others are freed while the guard still
  // makes their device current.
  void* raw = nullptr;
  checkCuda(cudaMalloc(&raw, 2 * kStampBytes), "op stamps: cudaMalloc");
  std::unique_ptr<void, DeviceFree> onDevice(raw);
  raw = nullptr;
  checkCuda(cudaHostAlloc(&raw, 2 * kStampBytes, cudaHostAllocDefault), "op stamps: cudaHostAlloc");
  std::unique_ptr<void, HostFree> onHost(raw);
  cudaEvent_t event = nullptr;
  checkCuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "op stamps: cudaEventCreate");
  arrived_.reset(event);
  onHost_ = std::move(onHost);
  onDevice_ = std::move(onDevice);
}

OpStamps::~OpStamps() {
  const CurrentDevice current(device_, false);  // members freed here, on their device
  arrived_.reset();
  onHost_.reset();
  onDevice_.reset();
}

void OpStamps::abandon() {
  (void)onDevice_.release();
  (void)onHost_.release();
  (void)arrived_.release();
}

void OpStamps::post(algorithms::QueuedLink& link, QueuedStamp stamp, cudaStream_t stream, const std::string& what) {
  stamp.seq = ++seq_;
  mine_ = stamp;
  if (link.size() == 1) return;
  auto* host = static_cast<uint8_t*>(onHost_.get());
  auto* device = static_cast<uint8_t*>(onDevice_.get());
  std::memcpy(host, &stamp, kStampBytes);
  std::memset(host + kStampBytes, 0, kStampBytes);
  checkCuda(cudaMemcpyAsync(device, host, kStampBytes, cudaMemcpyHostToDevice, stream), what + ": stamp copy");
  // Zeros, not the last op's stamp, where an exchange that never happened leaves the buffer unwritten.
  checkCuda(cudaMemsetAsync(device + kStampBytes, 0, kStampBytes, stream), what + ": stamp reset");
  algorithms::queued::exchangeStamps(link, device, device + kStampBytes);
  checkCuda(cudaMemcpyAsync(host + kStampBytes, device + kStampBytes, kStampBytes, cudaMemcpyDeviceToHost, stream),
            what + ": stamp copy back");
  checkCuda(cudaEventRecord(arrived_.get(), stream), what + ": stamp event");
}

void OpStamps::check(int rank, int size, bool ran, const std::string& what) const {
  if (size == 1) return;
  QueuedStamp previous;  // all zeros unless it arrived: checkStamps then decides by `ran`
  std::memset(static_cast<void*>(&previous), 0, kStampBytes);
  const cudaError_t status = cudaEventQuery(arrived_.get());
  if (status == cudaSuccess) {
    std::memcpy(static_cast<void*>(&previous), static_cast<const uint8_t*>(onHost_.get()) + kStampBytes, kStampBytes);
  } else if (ran) {
    PYCOMM_CHECK(status != cudaErrorNotReady, InternalError, "[rank ", rank, "/", size, "] ", what,
                 ": the op ran but the previous rank's op stamp has not arrived");
    checkCuda(status, what + ": stamp event");
  }
  algorithms::queued::checkStamps(rank, size, mine_, previous, ran, what);
}

}  // namespace pycomm::cuda
