#include "bucketed_allreduce.h"

#include <algorithm>

#include "collective_op.h"
#include "tensor_checks.h"

namespace pycomm::torch_adapter {

void allreduceNow(Communicator& comm, const at::Tensor& tensor, DataType dtype, const ReduceSpec& spec,
                  std::optional<codecs::Codec> codec) {
  const Contiguous c(tensor);
  if (codec) {
    comm.allreduceCompressed(c.flat.data_ptr<float>(), c.flat.numel(), *codec, spec.average);
  } else {
    comm.allreduce(c.flat.data_ptr(), c.flat.numel(), dtype, spec);
  }
  c.copyBack();
}

void BucketedAllreduce::run(Communicator& comm, const std::vector<at::Tensor>& tensors, const ReduceSpec& spec,
                            std::optional<codecs::Codec> compression) {
  std::map<at::ScalarType, std::vector<at::Tensor>> open;
  std::map<at::ScalarType, size_t> openBytes;
  // The group's codec qualifies float32 buckets of SUM or AVG.
  const bool compressible = spec.op == ReduceOp::kSum && !spec.preScale;
  auto close = [&](at::ScalarType type) {
    auto& bucket = open[type];
    if (bucket.empty()) return;
    flush(comm, bucket, openBytes[type], spec, type == at::kFloat && compressible ? compression : std::nullopt);
    bucket.clear();
    openBytes[type] = 0;
  };
  for (const auto& t : tensors) {
    const auto type = t.scalar_type();
    if (openBytes[type] > 0 && openBytes[type] + t.nbytes() > bucketBytes_) close(type);
    open[type].push_back(t);
    openBytes[type] += t.nbytes();
  }
  // Close the remaining buckets in first-seen dtype order.
  std::vector<at::ScalarType> order;
  for (const auto& t : tensors) {
    if (std::find(order.begin(), order.end(), t.scalar_type()) == order.end()) order.push_back(t.scalar_type());
  }
  for (auto type : order) close(type);
}

void BucketedAllreduce::flush(Communicator& comm, const std::vector<at::Tensor>& bucket, size_t bytes,
                              const ReduceSpec& spec, std::optional<codecs::Codec> codec) {
  const DataType dtype = *mapDtype(bucket[0].scalar_type());
  if (bucket.size() == 1) return allreduceNow(comm, bucket[0], dtype, spec, codec);
  if (!codec && allreducePieces(comm, bucket, spec)) return;
  at::Tensor flat = staging(bucket[0].scalar_type(), bytes);
  packInto(bucket, flat);
  allreduceNow(comm, flat, dtype, spec, codec);
  scatterInto(flat, bucket);
}

bool BucketedAllreduce::allreducePieces(Communicator& comm, const std::vector<at::Tensor>& bucket,
                                        const ReduceSpec& spec) {
  std::vector<BufferList::Piece> pieces;
  pieces.reserve(bucket.size());
  for (const auto& t : bucket) {
    if (!t.is_contiguous()) return false;
    if (t.nbytes() > 0) pieces.push_back({static_cast<uint8_t*>(t.data_ptr()), t.nbytes()});
  }
  // Tensors that share memory (the same one twice, overlapping views) would read results written
  // for an earlier chunk; packing snapshots them first.
  auto byAddress = pieces;
  std::sort(byAddress.begin(), byAddress.end(),
            [](const auto& a, const auto& b) { return std::less<const uint8_t*>()(a.data, b.data); });
  for (size_t i = 1; i < byAddress.size(); ++i) {
    if (byAddress[i - 1].data + byAddress[i - 1].bytes > byAddress[i].data) return false;
  }
  // The tensors are the buffer: the core scales them in place, only once it runs the bucket.
  return comm.allreducePieces(pieces, *mapDtype(bucket[0].scalar_type()), spec);
}

at::Tensor BucketedAllreduce::staging(at::ScalarType type, size_t nbytes) {
  const int64_t numel = static_cast<int64_t>(nbytes / c10::elementSize(type));
  // Empty tensors do not close a bucket, so one can still outgrow bucket_bytes: not worth keeping.
  if (nbytes > bucketBytes_) return at::empty({numel}, at::TensorOptions().dtype(type));
  at::Tensor& flat = staging_[type];
  if (!flat.defined() || flat.numel() < numel) flat = at::empty({numel}, at::TensorOptions().dtype(type));
  return flat.narrow(0, 0, numel);
}

}  // namespace pycomm::torch_adapter
