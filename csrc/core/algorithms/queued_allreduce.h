// The all-reduce a group's options run over a queued link (NCCL): the codec's compressed schedule,
// or the plan of allreduce_plan.h (the one place that decides), so that the adapter only maps and
// calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "../codecs/block_codec.h"
#include "../config.h"
#include "../dtype.h"
#include "queued_link.h"

namespace pycomm::algorithms::queued {

// Tree or rhd when the options ask for one, else the ring (planAllreduce without a cost model: auto
// has no measured GPU costs to choose by yet).
Algorithm allreduceAlgorithm(const Config& config);

// Bytes of scratch `allreduce` needs for `count` elements on a link of `size` ranks.
size_t allreduceScratchBytes(int size, int rank, size_t count, DataType dtype, std::optional<codecs::Codec> codec,
                             const Config& config);

// `data` (count elements of the link's memory) all-reduced in place: the codec's compressed
// all-reduce (float32, SUM; `average` divides inside it), else allreduceAlgorithm's schedule with
// `op`, cut by config.deviceChunkBytes (cuda_chunk_bytes). Each gives the bits the CPU algorithm of
// the same name gives at the same chunk: the compressed one's fp8 block scales follow the pieces, so
// its bits match the CPU's only where chunk_bytes equals cuda_chunk_bytes.
void allreduce(QueuedLink& link, uint8_t* data, uint8_t* scratch, size_t count, DataType dtype, ReduceOp op,
               std::optional<codecs::Codec> codec, bool average, const Config& config);

}  // namespace pycomm::algorithms::queued
