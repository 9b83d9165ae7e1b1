// The NCCL forms of the collectives that have one: each maps device tensors to a queued schedule
// of the core (core/algorithms/queued_*.h) run over the group's NCCL link. The schedule and its
// algorithm are the core's choice; here are only the tensors: contiguous copies, scratch on the
// device, and PREMUL_SUM's and AVG's scaling, which the core cannot do to device memory and which
// torch does on the device as it would for any CUDA tensor.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <vector>

#include "core/algorithms/queued_link.h"
#include "core/algorithms/queued_stamp.h"
#include "core/codecs/block_codec.h"
#include "core/config.h"
#include "core/reduce_spec.h"

namespace pycomm::torch_adapter {

// This rank's queued op as the op stamps compare it; the dispatch adds what depends on the group's
// options when the op runs. `spec` is null for ops that reduce nothing.
algorithms::QueuedStamp stampOf(transport::OpKind kind, DataType dtype, size_t count, const ReduceSpec* spec,
                                std::optional<codecs::Codec> codec, int root);

// In place: the group's compression when it applies, else the core's queued all-reduce.
void deviceAllreduce(algorithms::QueuedLink& link, const at::Tensor& tensor, const ReduceSpec& spec, DataType dtype,
                     std::optional<codecs::Codec> codec, const Config& config);
// all_gather_into_tensor: the ring, or the group's compression (float32). `input` may be this
// rank's block of `output` (FSDP's pattern).
void deviceAllgather(algorithms::QueuedLink& link, const at::Tensor& input, const at::Tensor& output,
                     std::optional<codecs::Codec> codec);
// reduce_scatter_tensor: the ring on a copy of `input`, or the group's compression (float32, SUM
// or AVG). `input` is left as it was.
void deviceReduceScatter(algorithms::QueuedLink& link, const at::Tensor& input, const at::Tensor& output,
                         const ReduceSpec& spec, DataType dtype, std::optional<codecs::Codec> codec);
void deviceBroadcast(algorithms::QueuedLink& link, const at::Tensor& tensor, int root, size_t chunkBytes);
// all_to_all_single with byte counts and offsets per peer.
void deviceAlltoall(algorithms::QueuedLink& link, const at::Tensor& input, const at::Tensor& output,
                    const std::vector<size_t>& sendBytes, const std::vector<size_t>& sendOffsets,
                    const std::vector<size_t>& recvBytes, const std::vector<size_t>& recvOffsets);

// `in`, or a copy of it where its bytes overlap those of `out` (all_to_all_single(x, x)): an
// all-to-all receives into the output while other ranks still need blocks of the input.
at::Tensor apartFrom(const at::Tensor& in, const at::Tensor& out);

}  // namespace pycomm::torch_adapter
