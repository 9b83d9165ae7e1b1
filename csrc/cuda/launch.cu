#include "launch.cuh"

#include <map>
#include <mutex>
#include <utility>

#include "core/error.h"

namespace pycomm::cuda::detail {
namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw Error(strCat("pycomm cuda: ", what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
  }
}

}  // namespace

int residentCtas(const void* kernel) {
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, int> cache;
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  const auto key = std::make_pair(device, kernel);
  {
    std::lock_guard<std::mutex> lock(mutex);
    const auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  int sms = 0;
  int perSm = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, kernel, kThreads, 0),
        "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  const int resident = (sms > 0 ? sms : 1) * (perSm > 0 ? perSm : 1);
  std::lock_guard<std::mutex> lock(mutex);
  cache[key] = resident;
  return resident;
}

unsigned gridFor(const void* kernel, size_t items, int itemsPerCta) {
  const size_t per = static_cast<size_t>(itemsPerCta);
  const size_t needed = (items + per - 1) / per;
  const size_t cap = static_cast<size_t>(residentCtas(kernel));
  const size_t grid = needed < cap ? needed : cap;
  return static_cast<unsigned>(grid > 0 ? grid : 1);
}

void checkLaunch(const char* what) { check(cudaGetLastError(), what); }

}  // namespace pycomm::cuda::detail
