#include "queued_allreduce.h"

#include "allreduce_plan.h"
#include "queued_collectives.h"

namespace pycomm::algorithms::queued {
namespace {

// No measured GPU costs yet: the plan's auto is the ring on a link.
AllreducePlan planFor(const Config& config, size_t count, int size, DataType dtype) {
  return planAllreduce(config.algorithm, nullptr, count * elementSize(dtype), size, dtype, config.deviceChunkBytes);
}

}  // namespace

Algorithm allreduceAlgorithm(const Config& config) {
  return planAllreduce(config.algorithm, nullptr, 0, 1, DataType::kFloat32, config.deviceChunkBytes).algorithm;
}

size_t allreduceScratchBytes(int size, int rank, size_t count, DataType dtype, std::optional<codecs::Codec> codec,
                             const Config& config) {
  if (codec) return compressedScratchBytes(count, size, rank, *codec, config.deviceChunkBytes);
  return allreduceScratchBytes(planFor(config, count, size, dtype), count, size, dtype);
}

void allreduce(QueuedLink& link, uint8_t* data, uint8_t* scratch, size_t count, DataType dtype, ReduceOp op,
               std::optional<codecs::Codec> codec, bool average, const Config& config) {
  if (codec) {
    compressedAllreduce(link, reinterpret_cast<float*>(data), scratch, count, *codec, average, config.deviceChunkBytes);
    return;
  }
  allreduce(link, planFor(config, count, link.size(), dtype), data, scratch, count, dtype, op);
}

}  // namespace pycomm::algorithms::queued
