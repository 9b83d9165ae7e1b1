#include "queued_collectives.h"

#include <cstdint>
#include <vector>

#include "../error.h"
#include "allreduce_plan.h"
#include "alltoall_schedule.h"
#include "chain_schedule.h"
#include "compressed.h"
#include "compressed_schedule.h"
#include "queued_steps.h"
#include "rhd_schedule.h"
#include "ring_schedule.h"
#include "tree_schedule.h"

namespace pycomm::algorithms::queued {
size_t ringScratchBytes(const Segments& segments, DataType dtype) {
  return ringScratchFor<QueuedSteps>(segments, 0, dtype);
}

void ringReduceScatter(QueuedLink& link, uint8_t* data, uint8_t* scratch, const Segments& segments, DataType dtype,
                       ReduceOp op) {
  QueuedSteps steps(link, "ring reduce-scatter");
  ringAllreduceSchedule(steps, data, scratch, segments, dtype, op, 0, false);
}

void ringAllgather(QueuedLink& link, uint8_t* data, const Segments& segments, size_t elementBytes) {
  QueuedSteps steps(link, "ring all-gather");
  ringAllgatherSchedule(steps, data, segments, elementBytes, ringChunkFor<QueuedSteps>(segments, 0));
}

void directAlltoall(QueuedLink& link, const uint8_t* in, const std::vector<size_t>& sendOffsets,
                    const std::vector<size_t>& sendBytes, uint8_t* out, const std::vector<size_t>& recvOffsets,
                    const std::vector<size_t>& recvBytes) {
  QueuedSteps steps(link, "all-to-all");
  directAlltoallSchedule(steps, in, sendOffsets, sendBytes, out, recvOffsets, recvBytes);
}

size_t allreduceScratchBytes(const AllreducePlan& plan, size_t count, int size, DataType dtype) {
  return algorithms::allreduceScratchBytes<QueuedSteps>(plan, count, size, dtype);
}

void allreduce(QueuedLink& link, const AllreducePlan& plan, uint8_t* data, uint8_t* scratch, size_t count,
               DataType dtype, ReduceOp op) {
  if (link.size() == 1 || count == 0) return;
  QueuedSteps steps(link, "all-reduce");
  runAllreduce(steps, plan, data, scratch, count, dtype, op);
}

void chainBroadcast(QueuedLink& link, uint8_t* data, size_t bytes, int root, size_t chunkBytes) {
  const int p = link.size();
  PYCOMM_CHECK(root >= 0 && root < p, InvalidUsageError, "broadcast root ", root, " outside a group of ", p);
  if (p == 1 || bytes == 0) return;
  PYCOMM_CHECK(chunkBytes > 0, InvalidUsageError, "broadcast chunk size must be positive");
  QueuedSteps steps(link, "chain broadcast");
  chainBroadcastSchedule(steps, data, bytes, root, chunkBytes);
}

size_t compressedScratchBytes(size_t count, int size, int rank, codecs::Codec codec, size_t chunkBytes) {
  return compressedAllreduceScratchFor<QueuedSteps>(compressedPieces(count, size, codec, chunkBytes), size, rank, false)
      .bytes();
}

void compressedAllreduce(QueuedLink& link, float* data, uint8_t* scratch, size_t count, codecs::Codec codec,
                         bool average, size_t chunkBytes) {
  QueuedSteps steps(link, "compressed all-reduce");
  compressedAllreduceSchedule(steps, data, compressedPieces(count, link.size(), codec, chunkBytes), codec, average,
                              1.0f / static_cast<float>(link.size()), scratch, nullptr);
}

size_t compressedReduceScatterScratchBytes(size_t count, int size, codecs::Codec codec) {
  return compressedReduceScatterScratchFor(count, size, codec);
}

void compressedReduceScatter(QueuedLink& link, const float* in, float* out, uint8_t* scratch, size_t count,
                             codecs::Codec codec, bool average) {
  QueuedSteps steps(link, "compressed reduce-scatter");
  compressedReduceScatterSchedule(steps, in, out, scratch, count, codec, average, 1.0f / static_cast<float>(link.size()));
}

size_t compressedAllgatherScratchBytes(size_t count, int size, codecs::Codec codec) {
  return compressedAllgatherScratchFor(count, size, codec);
}

void compressedAllgather(QueuedLink& link, const float* in, float* out, uint8_t* scratch, size_t count,
                         codecs::Codec codec) {
  QueuedSteps steps(link, "compressed all-gather");
  compressedAllgatherSchedule(steps, in, out, scratch, count, codec, 0);
}

}  // namespace pycomm::algorithms::queued
