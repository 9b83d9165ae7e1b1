#include "launch.cuh"

#include <atomic>

#include "core/error.h"

namespace pycomm::cuda::detail {
namespace {

constexpr int kMaxDevices = 64;
std::atomic<int> residentCache[kMaxDevices];  // 0: not yet known

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw Error(strCat("pycomm cuda: ", what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
  }
}

}  // namespace

int residentCtas() {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  if (device >= 0 && device < kMaxDevices) {
    const int cached = residentCache[device].load(std::memory_order_relaxed);
    if (cached > 0) return cached;
  }
  int sms = 0;
  int threadsPerSm = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  check(cudaDeviceGetAttribute(&threadsPerSm, cudaDevAttrMaxThreadsPerMultiProcessor, device),
        "cudaDeviceGetAttribute");
  int ctasPerSm = threadsPerSm / kThreads;
  if (ctasPerSm < 1) ctasPerSm = 1;
  int resident = sms * ctasPerSm;
  if (resident < 1) resident = 1;
  if (device >= 0 && device < kMaxDevices) residentCache[device].store(resident, std::memory_order_relaxed);
  return resident;
}

unsigned gridFor(size_t items, int itemsPerCta) {
  const size_t needed = (items + static_cast<size_t>(itemsPerCta) - 1) / static_cast<size_t>(itemsPerCta);
  const size_t cap = static_cast<size_t>(residentCtas());
  const size_t grid = needed < cap ? needed : cap;
  return static_cast<unsigned>(grid > 0 ? grid : 1);
}

void checkLaunch(const char* what) { check(cudaGetLastError(), what); }

}  // namespace pycomm::cuda::detail
