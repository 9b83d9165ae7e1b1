// The stream-ordered link of csrc/core/algorithms/queued_link.h on a GPU: transfers are NCCL
// point-to-point groups (NcclComm) and kernels are this folder's reduce and codec kernels, all
// queued on one CUDA stream. pycomm's queued schedules (ring, tree, chain, compressed) run on it,
// as its CPU schedules run on the TCP and shared-memory transports: NCCL moves bytes, and what is
// added to what, in which order, is pycomm's.
#pragma once

#include <cuda_runtime_api.h>

#include "core/algorithms/queued_link.h"
#include "nccl_comm.h"

namespace pycomm::cuda {

class NcclLink final : public algorithms::QueuedLink {
 public:
  NcclLink(NcclComm& comm, cudaStream_t stream) : comm_(comm), stream_(stream) {}

  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  void post(const std::vector<algorithms::QueuedTransfer>& transfers, const char* what) override;
  void reduce(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op) override;
  void encode(codecs::Codec codec, const float* in, size_t count, uint8_t* out) override;
  void decode(codecs::Codec codec, const uint8_t* in, size_t count, float* out) override;
  void decodeAdd(codecs::Codec codec, const uint8_t* in, size_t count, float* acc) override;
  void scale(float* data, size_t count, float factor) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void decodeAddEncode(codecs::Codec codec, const uint8_t* in, const float* acc, size_t count, uint8_t* out,
                       float scale) override;

 private:
  NcclComm& comm_;
  cudaStream_t stream_;
};

}  // namespace pycomm::cuda
