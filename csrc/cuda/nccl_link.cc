#include "nccl_link.h"

#include "codec_kernels.cuh"
#include "current_device.h"
#include "reduce_kernels.cuh"

namespace pycomm::cuda {

void NcclLink::post(const std::vector<algorithms::QueuedTransfer>& transfers, const char* what) {
  std::vector<NcclComm::Transfer> group;
  group.reserve(transfers.size());
  for (const auto& t : transfers) {
    const auto kind = t.kind == algorithms::QueuedTransfer::Kind::kSend ? NcclComm::Transfer::Kind::kSend
                                                                         : NcclComm::Transfer::Kind::kRecv;
    group.push_back({kind, t.peer, t.data, t.bytes});
  }
  comm_.post(group, stream_, what);
}

void NcclLink::reduce(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op) {
  reduceInto(dst, src, count, dtype, op, stream_);
}

void NcclLink::encode(codecs::Codec codec, const float* in, size_t count, uint8_t* out) {
  cuda::encode(codec, in, count, out, stream_);
}

void NcclLink::decode(codecs::Codec codec, const uint8_t* in, size_t count, float* out) {
  cuda::decode(codec, in, count, out, stream_);
}

void NcclLink::decodeAdd(codecs::Codec codec, const uint8_t* in, size_t count, float* acc) {
  cuda::decodeAdd(codec, in, count, acc, stream_);
}

void NcclLink::scale(float* data, size_t count, float factor) { cuda::scale(data, count, factor, stream_); }

void NcclLink::copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  checkCuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "copy: cudaMemcpyAsync");
}

void NcclLink::decodeAddEncode(codecs::Codec codec, const uint8_t* in, const float* acc, size_t count, uint8_t* out,
                               float scale) {
  cuda::decodeAddEncode(codec, in, acc, count, out, stream_, scale);
}

}  // namespace pycomm::cuda
