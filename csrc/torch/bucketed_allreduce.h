// The all-reduces of the worker's tasks: one tensor, and allreduce_coalesced's tensors in buckets.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <optional>
#include <vector>

#include "core/communicator.h"

namespace pycomm::torch_adapter {

// `tensor` all-reduced in place: compressed with `codec` (float32) or by `spec`.
void allreduceNow(Communicator& comm, const at::Tensor& tensor, DataType dtype, const ReduceSpec& spec,
                  std::optional<codecs::Codec> codec);

// allreduce_coalesced's body. Used by the group's tasks only, which run one at a time.
class BucketedAllreduce {
 public:
  explicit BucketedAllreduce(size_t bucketBytes) : bucketBytes_(bucketBytes) {}

  // Buckets of one dtype each, filled in the order given (the same on every rank), closed when the
  // next tensor would overflow bucket_bytes; one all-reduce per bucket. `spec` holds for every
  // dtype; `compression` is the group's codec, used for float32 buckets when `spec` allows it.
  void run(Communicator& comm, const std::vector<at::Tensor>& tensors, const ReduceSpec& spec,
           std::optional<codecs::Codec> compression);

 private:
  void flush(Communicator& comm, const std::vector<at::Tensor>& bucket, size_t bytes, const ReduceSpec& spec,
             std::optional<codecs::Codec> codec);
  // A bucket of one dtype all-reduced in place, unpacked, when the group's ranks share memory;
  // false (nothing done) otherwise.
  bool allreducePieces(Communicator& comm, const std::vector<at::Tensor>& bucket, const ReduceSpec& spec);
  // A flat tensor of `nbytes` for a bucket of `type`: kept for the group's life (at most
  // bucket_bytes per dtype), so a bucket's copies do not fault in fresh pages every call.
  at::Tensor staging(at::ScalarType type, size_t nbytes);

  const size_t bucketBytes_;
  std::map<at::ScalarType, at::Tensor> staging_;
};

}  // namespace pycomm::torch_adapter
