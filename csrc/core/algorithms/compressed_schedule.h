// The compressed reduce-scatter and all-gather of compressed.h, written once against the step
// interface (steps.h): the CPU runs them through compressed.h, a stream-ordered link through
// queued_collectives.h. (The compressed all-reduce is still written twice: the CPU one pipelines
// pieces in software and feeds errors back, the queued one runs piece after piece.)
//
// Reduce-scatter: every rank encodes its p blocks once, an all-to-all (alltoall_schedule.h) hands
// each rank every rank's encoding of its block, which it decodes and sums in fp32 in rank order
// (its own first), then scales by `factor` if `average`: one rounding. All-gather: each rank
// encodes its block once, the encodings go round the ring (ring_schedule.h), and every rank decodes
// all of them, its own too, so all ranks end with the same bits.
#pragma once

#include <algorithm>
#include <vector>

#include "../codecs/block_codec.h"
#include "alltoall_schedule.h"
#include "op.h"
#include "ring_schedule.h"
#include "steps.h"

namespace pycomm::algorithms {

inline size_t compressedAlignUp(size_t n) { return (n + 63) & ~size_t{63}; }

// Scratch of compressedReduceScatterSchedule: the p encoded blocks, then p encodings of ours.
inline size_t compressedReduceScatterScratchFor(size_t count, int size, codecs::Codec codec) {
  return 2 * compressedAlignUp(size * codecs::encodedBytes(codec, count));
}

// `in`: p blocks of `count` floats; this rank's block, reduced, lands in `out`.
template <class Steps>
void compressedReduceScatterSchedule(Steps& x, const float* in, float* out, uint8_t* scratch, size_t count,
                                     codecs::Codec codec, bool average, float factor) {
  const int p = x.size();
  const int r = x.rank();
  const size_t each = codecs::encodedBytes(codec, count);
  uint8_t* encoded = scratch;                                   // block i's encoding at i * each
  uint8_t* received = scratch + compressedAlignUp(p * each);    // rank q's encoding of block r at q * each
  x.phase("compressed reduce-scatter");
  for (int i = 0; i < p; ++i) x.encode(codec, in + i * count, count, encoded + i * each);
  std::vector<size_t> sendOffsets(p), sendBytes(p, each), recvOffsets(p), recvBytes(p, each);
  for (int q = 0; q < p; ++q) {
    sendOffsets[q] = q * each;
    recvOffsets[q] = q * each;
  }
  recvBytes[r] = 0;  // our own encoding is decoded where it was written, not copied first
  directAlltoallSchedule(x, encoded, sendOffsets, sendBytes, received, recvOffsets, recvBytes);
  x.decode(codec, encoded + r * each, count, out);
  for (int q = 0; q < p; ++q) {
    if (q != r) x.decodeAdd(codec, received + q * each, count, out);
  }
  if (average) x.scale(out, count, factor);
}

// Scratch of compressedAllgatherSchedule: the p encodings.
inline size_t compressedAllgatherScratchFor(size_t count, int size, codecs::Codec codec) {
  return compressedAlignUp(size * codecs::encodedBytes(codec, count));
}

// `out`: p blocks of `count` floats. `in` may be block r of `out`: it is encoded before anything is
// written. `chunkBytes`: the ring's chunk where the executor pipelines chunks.
template <class Steps>
void compressedAllgatherSchedule(Steps& x, const float* in, float* out, uint8_t* scratch, size_t count,
                                 codecs::Codec codec, size_t chunkBytes) {
  const int p = x.size();
  const size_t each = codecs::encodedBytes(codec, count);
  x.encode(codec, in, count, scratch + x.rank() * each);
  const Segments blocks(each, p, true);
  ringAllgatherSchedule(x, scratch, blocks, 1,
                        Steps::kPipelinesChunks ? chunkBytes : ringChunkFor<Steps>(blocks, chunkBytes));
  for (int i = 0; i < p; ++i) x.decode(codec, scratch + i * each, count, out + i * count);
}

}  // namespace pycomm::algorithms
