#include "device_collectives.h"

#include <algorithm>

#include "core/algorithms/queued_allreduce.h"
#include "core/algorithms/queued_collectives.h"
#include "tensor_checks.h"

namespace pycomm::torch_adapter {
namespace queued = algorithms::queued;
namespace {

// A scratch area of `bytes` on the device of `like`, for a queued schedule.
at::Tensor deviceScratch(const at::Tensor& like, size_t bytes) {
  return at::empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))}, like.options().dtype(at::kByte));
}

// torch's own PREMUL_SUM factor and AVG division on a device tensor (a CUDA kernel's rounding).
void preScaleOnDevice(const at::Tensor& t, const ReduceSpec& spec) {
  if (spec.preScale) t.mul_(*spec.preScale);
}

void averageOnDevice(const at::Tensor& t, const ReduceSpec& spec, int size) {
  if (!spec.average) return;
  if (at::isFloatingType(t.scalar_type())) {
    t.div_(size);
  } else {
    t.div_(size, "trunc");
  }
}

}  // namespace

algorithms::QueuedStamp stampOf(transport::OpKind kind, DataType dtype, size_t count, const ReduceSpec* spec,
                                std::optional<codecs::Codec> codec, int root) {
  transport::OpSignature signature;
  signature.kind = kind;
  signature.dtype = static_cast<uint8_t>(dtype);
  signature.reduceOp = spec != nullptr ? static_cast<uint8_t>(spec->op) : 0;
  signature.codec = transport::signatureCodec(codec);
  signature.root = root;
  signature.count = count;
  return algorithms::makeQueuedStamp(signature, spec != nullptr && spec->average);
}

void deviceAllreduce(algorithms::QueuedLink& link, const at::Tensor& tensor, const ReduceSpec& spec, DataType dtype,
                     std::optional<codecs::Codec> codec, const Config& config) {
  const Contiguous c(tensor);
  const size_t count = static_cast<size_t>(c.flat.numel());
  at::Tensor scratch =
      deviceScratch(c.flat, queued::allreduceScratchBytes(link.size(), link.rank(), count, dtype, codec, config));
  if (!codec) preScaleOnDevice(c.flat, spec);
  queued::allreduce(link, static_cast<uint8_t*>(c.flat.data_ptr()), scratch.data_ptr<uint8_t>(), count, dtype, spec.op,
                    codec, spec.average, config);
  if (!codec) averageOnDevice(c.flat, spec, link.size());
  c.copyBack();
}

void deviceAllgather(algorithms::QueuedLink& link, const at::Tensor& input, const at::Tensor& output,
                     std::optional<codecs::Codec> codec) {
  const Contiguous in(input), out(output);
  const int64_t n = in.flat.numel();
  if (codec) {
    at::Tensor area = deviceScratch(out.flat, queued::compressedAllgatherScratchBytes(n, link.size(), *codec));
    queued::compressedAllgather(link, in.flat.data_ptr<float>(), out.flat.data_ptr<float>(), area.data_ptr<uint8_t>(),
                                n, *codec);
  } else {
    out.flat.view(-1).narrow(0, link.rank() * n, n).copy_(in.flat.view(-1));
    queued::ringAllgather(link, static_cast<uint8_t*>(out.flat.data_ptr()),
                          algorithms::Segments(in.flat.nbytes(), link.size(), true), 1);
  }
  out.copyBack();
}

void deviceReduceScatter(algorithms::QueuedLink& link, const at::Tensor& input, const at::Tensor& output,
                         const ReduceSpec& spec, DataType dtype, std::optional<codecs::Codec> codec) {
  const int p = link.size();
  const Contiguous out(output);
  const size_t n = static_cast<size_t>(out.flat.numel());
  if (codec) {
    const at::Tensor in = input.contiguous();
    at::Tensor area = deviceScratch(out.flat, queued::compressedReduceScatterScratchBytes(n, p, *codec));
    queued::compressedReduceScatter(link, in.data_ptr<float>(), out.flat.data_ptr<float>(), area.data_ptr<uint8_t>(),
                                    n, *codec, spec.average);
  } else {
    const at::Tensor flat = input.contiguous().view(-1);
    at::Tensor work = spec.preScale ? flat.mul(*spec.preScale) : flat;
    if (work.data_ptr() == input.data_ptr()) work = work.clone();
    const algorithms::Segments blocks(n, p, true);
    at::Tensor area = deviceScratch(out.flat, queued::ringScratchBytes(blocks, dtype));
    queued::ringReduceScatter(link, static_cast<uint8_t*>(work.data_ptr()), area.data_ptr<uint8_t>(), blocks, dtype,
                              spec.op);
    out.flat.view(-1).copy_(work.narrow(0, link.rank() * static_cast<int64_t>(n), static_cast<int64_t>(n)));
    averageOnDevice(out.flat, spec, p);
  }
  out.copyBack();
}

void deviceBroadcast(algorithms::QueuedLink& link, const at::Tensor& tensor, int root, size_t chunkBytes) {
  const Contiguous c(tensor);
  queued::chainBroadcast(link, static_cast<uint8_t*>(c.flat.data_ptr()), c.flat.nbytes(), root, chunkBytes);
  c.copyBack();
}

void deviceAlltoall(algorithms::QueuedLink& link, const at::Tensor& input, const at::Tensor& output,
                    const std::vector<size_t>& sendBytes, const std::vector<size_t>& sendOffsets,
                    const std::vector<size_t>& recvBytes, const std::vector<size_t>& recvOffsets) {
  const Contiguous in(input), out(output);
  const at::Tensor source = apartFrom(in.flat, out.flat);
  queued::directAlltoall(link, static_cast<const uint8_t*>(source.data_ptr()), sendOffsets, sendBytes,
                         static_cast<uint8_t*>(out.flat.data_ptr()), recvOffsets, recvBytes);
  out.copyBack();
}

// Both are contiguous, so comparing address ranges is exact, whichever storages they belong to.
at::Tensor apartFrom(const at::Tensor& in, const at::Tensor& out) {
  const auto* a = static_cast<const uint8_t*>(in.data_ptr());
  const auto* b = static_cast<const uint8_t*>(out.data_ptr());
  const size_t aBytes = in.nbytes(), bBytes = out.nbytes();
  const bool overlap = aBytes > 0 && bBytes > 0 && a < b + bBytes && b < a + aBytes;
  return overlap ? in.clone() : in;
}

}  // namespace pycomm::torch_adapter
