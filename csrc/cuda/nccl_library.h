// The part of NCCL's C API pycomm uses, loaded at run time from libnccl.so.2.
//
// torch's CUDA wheels depend on the nvidia-nccl wheel that matches their CUDA; its library is what
// pycomm uses. Loading it with dlopen keeps NCCL out of the build: the extension needs neither
// NCCL's headers nor its library to compile, and a machine without NCCL still gets the staged
// CUDA path. The declarations below restate NCCL's stable C ABI (nccl.h since 2.7): results and
// data types are C enums (int), the unique id a 128-byte struct passed by value.
//
// Plain C++ (the CUDA runtime's headers for cudaStream_t only).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <string>

namespace pycomm::cuda {

struct NcclUniqueId {
  char internal[128];
};
struct NcclCommOpaque;  // ncclComm
using NcclCommHandle = NcclCommOpaque*;

constexpr int kNcclSuccess = 0;
constexpr int kNcclInProgress = 7;
constexpr int kNcclUint8 = 1;  // ncclUint8: byte transfers

class NcclLibrary {
 public:
  // The library, loaded once per process: `path` if not empty, else $PYCOMM_NCCL_LIBRARY, else
  // "libnccl.so.2" through the dynamic loader (torch's own dependency, already mapped when torch
  // imported it). Throws pycomm::Error naming what was tried and dlerror()'s reason.
  static const NcclLibrary& load(const std::string& path = "");

  // Throws pycomm::Error "<what>: NCCL error <code> (<NCCL's text>)" unless `result` is success.
  void check(int result, const std::string& what) const;
  // NCCL's version as an integer (e.g. 22703 for 2.27.3).
  int version() const { return version_; }
  const std::string& path() const { return path_; }

  int (*getUniqueId)(NcclUniqueId* id) = nullptr;
  int (*commInitRank)(NcclCommHandle* comm, int nranks, NcclUniqueId id, int rank) = nullptr;
  int (*commDestroy)(NcclCommHandle comm) = nullptr;
  int (*commAbort)(NcclCommHandle comm) = nullptr;
  int (*commGetAsyncError)(NcclCommHandle comm, int* result) = nullptr;
  int (*send)(const void* data, size_t count, int dtype, int peer, NcclCommHandle comm, cudaStream_t stream) = nullptr;
  int (*recv)(void* data, size_t count, int dtype, int peer, NcclCommHandle comm, cudaStream_t stream) = nullptr;
  int (*groupStart)() = nullptr;
  int (*groupEnd)() = nullptr;
  const char* (*getErrorString)(int result) = nullptr;

  struct Closer {
    void operator()(void* handle) const;
  };
  // Resolves every entry point from a dlopen()ed `handle`; use load().
  NcclLibrary(std::unique_ptr<void, Closer> handle, std::string path);

 private:
  template <typename Fn>
  void resolve(Fn*& fn, const char* name);

  std::unique_ptr<void, Closer> handle_;
  std::string path_;
  int version_ = 0;
};

}  // namespace pycomm::cuda
