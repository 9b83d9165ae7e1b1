#include "queued_allreduce.h"

#include <algorithm>

#include "queued_collectives.h"
#include "cost_model.h"

namespace pycomm::algorithms::queued {
namespace {

size_t chunkElements(const Config& config, DataType dtype) {
  return std::max<size_t>(1, config.chunkBytes / elementSize(dtype));
}

}  // namespace

Algorithm allreduceAlgorithm(const Config& config) {
  return config.algorithm == Algorithm::kTree || config.algorithm == Algorithm::kRhd ? config.algorithm
                                                                                      : Algorithm::kRing;
}

size_t allreduceScratchBytes(int size, int rank, size_t count, DataType dtype, std::optional<codecs::Codec> codec,
                             const Config& config) {
  if (codec) return compressedScratchBytes(count, size, rank, *codec, config.chunkBytes);
  switch (allreduceAlgorithm(config)) {
    case Algorithm::kTree: return treeScratchBytes(count, chunkElements(config, dtype), dtype);
    case Algorithm::kRhd: return rhdScratchBytes(count, dtype);
    default: return ringScratchBytes(Segments(count, size), dtype);
  }
}

void allreduce(QueuedLink& link, uint8_t* data, uint8_t* scratch, size_t count, DataType dtype, ReduceOp op,
               std::optional<codecs::Codec> codec, bool average, const Config& config) {
  if (codec) {
    compressedAllreduce(link, reinterpret_cast<float*>(data), scratch, count, *codec, average, config.chunkBytes);
    return;
  }
  switch (allreduceAlgorithm(config)) {
    case Algorithm::kTree: return treeAllreduce(link, data, scratch, count, dtype, op, chunkElements(config, dtype));
    case Algorithm::kRhd:
      // The CPU rhd's choice of mode, so the bits are its bits.
      return rhdAllreduce(link, data, scratch, count, dtype, op, count * elementSize(dtype) >= kRhdHalvingThreshold);
    default: return ringAllreduce(link, data, scratch, count, dtype, op);
  }
}

}  // namespace pycomm::algorithms::queued
