// The ring's schedule, written once against the step interface (steps.h) and run by both
// executors: OpSteps through ring.h on the CPU, QueuedSteps through queued_collectives.h on a
// stream-ordered link.
//
// The buffer is cut into one segment per rank and each segment into chunks. At reduce-scatter
// step s a rank sends segment (rank-1-s) to its right neighbour and receives segment (rank-2-s)
// from its left, chunk by chunk: as soon as chunk c of a step is reduced it goes out as chunk c of
// the next step, so on the CPU reduction, sending and receiving of successive chunks overlap.
// After p-1 steps each rank owns segment `rank` fully reduced; the all-gather then passes the
// owned segments around the ring, received straight into the caller's buffer.
//
// Slots: reduce-scatter step s chunk c is s*C + c, all-gather step s chunk c is (p-1)*C + s*C + c
// (C chunks per segment); an all-gather alone starts at 0.
#pragma once

#include <algorithm>
#include <vector>

#include "../dtype.h"
#include "op.h"
#include "steps.h"

namespace pycomm::algorithms {
namespace ring_detail {

inline int mod(int a, int p) { return ((a % p) + p) % p; }

// Chunk c of segment `seg`: an element offset into the buffer and a length (possibly 0).
struct Chunk {
  size_t offset;
  size_t length;
};

inline Chunk chunkOf(const Segments& segments, int seg, size_t c, size_t chunkElems) {
  const size_t begin = std::min(segments.length(seg), c * chunkElems);
  const size_t end = std::min(segments.length(seg), (c + 1) * chunkElems);
  return {segments.offset(seg) + begin, end - begin};
}

}  // namespace ring_detail

inline size_t ringChunkCount(const Segments& segments, size_t chunkElems) {
  return std::max<size_t>(1, (segments.maxLength() + chunkElems - 1) / chunkElems);
}

// The chunk an executor cuts segments with: the caller's on the CPU, whole segments on a link.
// `longest`: the longest segment's length.
template <class Steps>
size_t ringChunkFor(size_t longest, size_t chunkElems) {
  return Steps::kPipelinesChunks ? chunkWithin(chunkElems, longest) : std::max<size_t>(1, longest);
}
template <class Steps>
size_t ringChunkFor(const Segments& segments, size_t chunkElems) {
  return ringChunkFor<Steps>(segments.maxLength(), chunkElems);
}

template <class Steps>
size_t ringScratchFor(size_t longest, size_t chunkElems, DataType dtype) {
  chunkElems = ringChunkFor<Steps>(longest, chunkElems);
  const size_t chunks = std::max<size_t>(1, (longest + chunkElems - 1) / chunkElems);  // ringChunkCount's
  return ReceiveAreas::bytes(Steps::kReceiveAhead, chunks, chunkElems * elementSize(dtype));
}
template <class Steps>
size_t ringScratchFor(const Segments& segments, size_t chunkElems, DataType dtype) {
  return ringScratchFor<Steps>(segments.maxLength(), chunkElems, dtype);
}

// Posts every all-gather receive up front, straight into the caller's buffer. Safe although the
// same bytes are still being sent in the reduce-scatter: a segment's final value can only come back
// after this rank's contribution to it left, so the send has already read it.
template <class Steps>
void ringPostAllgatherRecvs(Steps& x, uint8_t* data, const Segments& segments, size_t esize, size_t chunkElems,
                            size_t chunks, uint32_t slotBase, std::vector<typename Steps::Handle>& recvs) {
  const int p = x.size();
  const int r = x.rank();
  const int left = ring_detail::mod(r - 1, p);
  recvs.reserve((p - 1) * chunks);
  for (int s = 0; s < p - 1; ++s) {
    const int seg = ring_detail::mod(r - 1 - s, p);
    for (size_t c = 0; c < chunks; ++c) {
      const ring_detail::Chunk ch = ring_detail::chunkOf(segments, seg, c, chunkElems);
      recvs.push_back(x.recv(left, slotBase + static_cast<uint32_t>(s * chunks + c), data + ch.offset * esize,
                             ch.length * esize));
    }
  }
}

// Receives and forwards the all-gather steps; the step-0 sends were issued by the caller.
template <class Steps>
void ringAllgatherSteps(Steps& x, uint8_t* data, const Segments& segments, size_t esize, size_t chunkElems,
                        size_t chunks, uint32_t slotBase, const std::vector<typename Steps::Handle>& recvs) {
  const int p = x.size();
  const int r = x.rank();
  const int right = ring_detail::mod(r + 1, p);
  for (int s = 0; s < p - 1; ++s) {
    const int seg = ring_detail::mod(r - 1 - s, p);
    for (size_t c = 0; c < chunks; ++c) {
      x.arrived(recvs[s * chunks + c]);
      if (s + 1 < p - 1) {
        const ring_detail::Chunk ch = ring_detail::chunkOf(segments, seg, c, chunkElems);
        x.send(right, slotBase + static_cast<uint32_t>((s + 1) * chunks + c), data + ch.offset * esize,
               ch.length * esize);
      }
    }
  }
}

// Reduce-scatter and then (if `allgather`) all-gather over the ring, in place in `data`. `scratch`
// holds ringScratchFor<Steps>(segments, chunkElems, dtype) bytes. Reduction is dst = dst op
// incoming at every step, in step order: the bits do not depend on the chunking.
template <class Steps>
void ringAllreduceSchedule(Steps& x, uint8_t* data, uint8_t* scratch, const Segments& segments, DataType dtype,
                           ReduceOp reduceOp, size_t chunkElems, bool allgather) {
  using ring_detail::chunkOf;
  using ring_detail::mod;
  const int p = x.size();
  if (p == 1) return;
  chunkElems = ringChunkFor<Steps>(segments, chunkElems);
  const int r = x.rank();
  const int left = mod(r - 1, p);
  const int right = mod(r + 1, p);
  const size_t esize = elementSize(dtype);
  const size_t chunks = ringChunkCount(segments, chunkElems);
  const uint32_t agBase = static_cast<uint32_t>((p - 1) * chunks);
  constexpr int kAhead = static_cast<int>(Steps::kReceiveAhead);
  const ReceiveAreas areas{scratch, chunks, ReceiveAreas::stride(chunkElems * esize)};
  auto slot = [&](int s, size_t c) { return static_cast<uint32_t>(s * chunks + c); };
  auto tmp = [&](int s, size_t c, const ring_detail::Chunk& ch) {
    return areas.at(static_cast<size_t>(s % kAhead), c, data + ch.offset * esize);
  };

  x.phase("ring reduce-scatter");
  // Receives for the first steps; later ones are posted as scratch frees up.
  std::vector<typename Steps::Handle> rsRecvs((p - 1) * chunks);
  for (int s = 0; s < std::min(kAhead, p - 1); ++s) {
    const int seg = mod(r - 2 - s, p);
    for (size_t c = 0; c < chunks; ++c) {
      const ring_detail::Chunk ch = chunkOf(segments, seg, c, chunkElems);
      rsRecvs[slot(s, c)] = x.recv(left, slot(s, c), tmp(s, c, ch), ch.length * esize);
    }
  }
  std::vector<typename Steps::Handle> agRecvs;
  if (allgather) ringPostAllgatherRecvs(x, data, segments, esize, chunkElems, chunks, agBase, agRecvs);

  const int firstSeg = mod(r - 1, p);
  for (size_t c = 0; c < chunks; ++c) {
    const ring_detail::Chunk ch = chunkOf(segments, firstSeg, c, chunkElems);
    x.send(right, slot(0, c), data + ch.offset * esize, ch.length * esize);
  }
  for (int s = 0; s < p - 1; ++s) {
    const int seg = mod(r - 2 - s, p);
    for (size_t c = 0; c < chunks; ++c) {
      x.arrived(rsRecvs[slot(s, c)]);
      const ring_detail::Chunk ch = chunkOf(segments, seg, c, chunkElems);
      uint8_t* mine = data + ch.offset * esize;
      x.reduce(mine, tmp(s, c, ch), ch.length, dtype, reduceOp);
      if (s + 1 < p - 1) {
        x.send(right, slot(s + 1, c), mine, ch.length * esize);
      } else if (allgather) {
        x.phase("ring all-gather");
        x.send(right, agBase + static_cast<uint32_t>(c), mine, ch.length * esize);
      }
      if (s + kAhead < p - 1) {
        const ring_detail::Chunk next = chunkOf(segments, mod(r - 2 - (s + kAhead), p), c, chunkElems);
        rsRecvs[slot(s + kAhead, c)] = x.recv(left, slot(s + kAhead, c), tmp(s + kAhead, c, next), next.length * esize);
      }
    }
  }
  if (allgather) ringAllgatherSteps(x, data, segments, esize, chunkElems, chunks, agBase, agRecvs);
  x.drain();
}

// All-gather alone: segment `rank` of `data` must already hold this rank's contribution.
template <class Steps>
void ringAllgatherSchedule(Steps& x, uint8_t* data, const Segments& segments, size_t esize, size_t chunkElems) {
  const int p = x.size();
  if (p == 1) return;
  const int r = x.rank();
  const int right = ring_detail::mod(r + 1, p);
  const size_t chunks = ringChunkCount(segments, chunkElems);
  x.phase("ring all-gather");
  std::vector<typename Steps::Handle> recvs;
  ringPostAllgatherRecvs(x, data, segments, esize, chunkElems, chunks, 0, recvs);
  for (size_t c = 0; c < chunks; ++c) {
    const ring_detail::Chunk ch = ring_detail::chunkOf(segments, r, c, chunkElems);
    x.send(right, static_cast<uint32_t>(c), data + ch.offset * esize, ch.length * esize);
  }
  ringAllgatherSteps(x, data, segments, esize, chunkElems, chunks, 0, recvs);
  x.drain();
}

}  // namespace pycomm::algorithms
