// Host-side CUDA runtime helpers shared by the NCCL files: an error check, and a guard that makes a
// device current for a scope.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "core/error.h"

namespace pycomm::cuda {

// Throws pycomm::Error "<what>: CUDA error <text>" unless `status` is cudaSuccess.
inline void checkCuda(cudaError_t status, const std::string& what) {
  PYCOMM_CHECK(status == cudaSuccess, Error, what, ": CUDA error ", cudaGetErrorString(status));
}

// Makes `device` current for its lifetime (NCCL binds a communicator to the current device, and
// memory is allocated and freed on it). `orThrow` false: for destructors and abort(), which must
// not throw; failures are left to the calls that follow.
class CurrentDevice {
 public:
  explicit CurrentDevice(int device, bool orThrow = true) {
    const cudaError_t got = cudaGetDevice(&previous_);
    if (orThrow) checkCuda(got, "cudaGetDevice");
    if (got == cudaSuccess && previous_ != device) {
      const cudaError_t set = cudaSetDevice(device);
      if (orThrow) checkCuda(set, strCat("cudaSetDevice(", device, ")"));
      restore_ = set == cudaSuccess;
    }
  }
  ~CurrentDevice() {
    if (restore_) cudaSetDevice(previous_);
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int previous_ = 0;
  bool restore_ = false;  // only what this scope changed, and only to a device that was known
};

}  // namespace pycomm::cuda
